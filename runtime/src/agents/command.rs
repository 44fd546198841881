//! The `command` agent: an external program answers for a role.
//!
//! The program is started directly (never through a shell) with the thread id as its last
//! argument, reads the agent context as JSON on stdin and prints its answer on stdout: plain
//! text, or a JSON object `{"content": "...", "meta": {...}}`, which may report what the call
//! cost as `"usage": {"input_tokens": N, "output_tokens": N, "cached_tokens": N, "model": M}`.
//! Exit status 0 means success;
//! otherwise the error names the program, its status and the tail of its stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::store::records::Usage;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::processes::{AgentProcesses, spawn_group};
use super::{AgentAnswer, AgentContext, AgentFailure};

/// The environment variable a command agent finds its call's trace context in.
pub const TRACEPARENT_ENV: &str = "TRACEPARENT";

/// Default time a command agent may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Exit status by which a program says "try again later" (`EX_TEMPFAIL`): retried.
pub const EXIT_TEMPFAIL: i32 = 75;

/// How much of a failed program's stderr goes into the error.
const STDERR_TAIL: usize = 2000;

/// An external program bound as an agent.
#[derive(Debug, Clone)]
pub struct CommandAgent {
    program: String,
    args: Vec<String>,
    timeout: Duration,
    cwd: Option<PathBuf>,
}

impl CommandAgent {
    /// `program args… <thread-id>` run in `cwd`, killed after `timeout` (default 600 s). The
    /// program must exist and be executable now (see [`find_program`]), so that a mistyped
    /// binding is refused before a thread is created, not when its first role runs.
    pub fn new(
        program: String,
        args: Vec<String>,
        timeout: Option<Duration>,
        cwd: Option<PathBuf>,
    ) -> Result<Self, String> {
        find_program(&program, cwd.as_deref())?;
        Ok(CommandAgent { program, args, timeout: timeout.unwrap_or(DEFAULT_TIMEOUT), cwd })
    }

    /// Runs the program once; its process group is listed in `processes` while it runs.
    pub async fn answer(
        &self,
        context: &AgentContext,
        processes: Option<&Arc<AgentProcesses>>,
    ) -> Result<AgentAnswer, AgentFailure> {
        let program = &self.program;
        let mut command = tokio::process::Command::new(program);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        // The call's trace context, for the agent's own spans (W3C's variable); never one the
        // worker inherited, which would put the agent's spans in some other trace.
        match crate::telemetry::traceparent() {
            Some(traceparent) => command.env(TRACEPARENT_ENV, traceparent),
            None => command.env_remove(TRACEPARENT_ENV),
        };
        command.args(&self.args).arg(&context.thread_id);
        // The agent must not outlive the worker that waits for it: if the worker dies (`kill
        // -9`, a crash), `resume` asks again, and two agents would work on one workspace. A
        // killed or timed-out thread drops this future: the agent and its children go too.
        let (mut child, _group) = spawn_group(&mut command, processes)
            .map_err(|e| AgentFailure::Unavailable(format!("cannot start `{program}`: {e}")))?;

        let input = serde_json::to_vec(context).expect("agent context serializes");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        // Collected where a timeout can still read it.
        let err = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let err_sink = err.clone();
        let run = async {
            // Write and read concurrently: a program that answers before reading all of its
            // input must not deadlock on a full pipe. A program that ignores stdin may close
            // it early; that is its business, not an error.
            let write = async {
                let _ = stdin.write_all(&input).await;
                drop(stdin);
            };
            let read_err = async {
                let mut chunk = [0u8; 4096];
                loop {
                    match stderr.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => err_sink.lock().extend_from_slice(&chunk[..n]),
                    }
                }
            };
            let mut out = Vec::new();
            let (_, out_res, _, status) =
                tokio::join!(write, stdout.read_to_end(&mut out), read_err, child.wait());
            out_res.and(status).map(|status| (status, out))
        };
        let outcome = tokio::time::timeout(self.timeout, run).await;
        let tail = stderr_tail(&err.lock());
        let with_tail =
            |message: String| if tail.is_empty() { message } else { format!("{message}: {tail}") };
        let (status, out) = match outcome {
            Err(_) => {
                let limit = humantime::format_duration(self.timeout);
                return Err(AgentFailure::Timeout(with_tail(format!(
                    "`{program}` did not answer within {limit}"
                ))));
            }
            Ok(Err(e)) => return Err(AgentFailure::failed(format!("`{program}`: {e}"))),
            Ok(Ok(done)) => done,
        };
        if !status.success() {
            let (status_text, transient) = match status.code() {
                Some(code) => (format!("exit status {code}"), code == EXIT_TEMPFAIL),
                None => ("a signal".to_string(), false),
            };
            let message = with_tail(format!("`{program}` failed with {status_text}"));
            return Err(AgentFailure::Failed { message, transient });
        }
        let text = String::from_utf8(out)
            .map_err(|_| AgentFailure::failed(format!("`{program}` printed invalid UTF-8")))?;
        Ok(parse_answer(text))
    }
}

/// Where `program` is: a path (with a `/`, relative to `cwd`) to an executable file, or the
/// name of one on `PATH`, as the operating system will look it up when the agent starts.
pub fn find_program(program: &str, cwd: Option<&Path>) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = match cwd {
            Some(cwd) => cwd.join(program),
            None => PathBuf::from(program),
        };
        return match std::fs::metadata(&path) {
            Err(_) => Err(format!("program `{program}` does not exist")),
            Ok(_) if !executable(&path) => {
                Err(format!("program `{program}` is not an executable file"))
            }
            Ok(_) => Ok(path),
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|path| executable(path))
        .ok_or_else(|| format!("program `{program}` is not on PATH"))
}

/// The `usage` a command may print with its answer, in the words of OpenAI's API.
#[derive(serde::Deserialize)]
struct ReportedUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cached_tokens: u64,
    model: Option<String>,
}

/// `{"content": ..., "meta": ...}` is taken apart; anything else is the content itself.
pub(crate) fn parse_answer(text: String) -> AgentAnswer {
    if let Ok(serde_json::Value::Object(mut object)) = serde_json::from_str(text.trim())
        && let Some(serde_json::Value::String(content)) = object.remove("content")
    {
        // `usage` is the documented field a command reports its tokens in.
        let usage = object
            .remove("usage")
            .and_then(|u| serde_json::from_value::<ReportedUsage>(u).ok())
            .map(|u| Usage {
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cached_tokens: u.cached_tokens,
                calls: 1,
                model: u.model,
                cost_usd: None,
            });
        return AgentAnswer { content, meta: object.remove("meta"), usage };
    }
    AgentAnswer { content: text, meta: None, usage: None }
}

pub(crate) fn stderr_tail(err: &[u8]) -> String {
    let text = String::from_utf8_lossy(err);
    let text = text.trim();
    let start = text.len().saturating_sub(STDERR_TAIL);
    let start = (start..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    let tail = &text[start..];
    let tail = tail.split('\n').map(str::trim_end).collect::<Vec<_>>().join(" | ");
    if start > 0 { format!("…{tail}") } else { tail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_text_or_content_and_meta() {
        assert_eq!(
            parse_answer("plain".into()),
            AgentAnswer { content: "plain".into(), meta: None, usage: None }
        );
        let answer = parse_answer(r#"{"content": "done", "meta": {"ok": true}}"#.into());
        assert_eq!(answer.content, "done");
        assert_eq!(answer.meta, Some(serde_json::json!({"ok": true})));
        // A JSON answer without `content` is the content.
        assert_eq!(parse_answer(r#"{"ok": true}"#.into()).content, r#"{"ok": true}"#);
    }

    #[test]
    fn stderr_tail_keeps_the_end_on_one_line() {
        assert_eq!(stderr_tail(b"first\nsecond\n"), "first | second");
        let long = "é".repeat(3000);
        let tail = stderr_tail(long.as_bytes());
        assert!(tail.starts_with('…') && tail.len() <= STDERR_TAIL + 4);
    }
}
