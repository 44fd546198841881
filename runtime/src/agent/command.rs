//! The `command` agent: an external program answers for a role.
//!
//! The program is started directly (never through a shell) with the thread id as its last
//! argument, reads the agent context as JSON on stdin and prints its answer on stdout: plain
//! text, or a JSON object `{"content": "...", "meta": {...}}`. Exit status 0 means success;
//! otherwise the error names the program, its status and the tail of its stderr.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{AgentAnswer, AgentContext, AgentFailure};

/// Default time a command agent may take, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;

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
    /// `program args… <thread-id>` run in `cwd`, killed after `timeout_secs` (default 600).
    pub fn new(
        program: String,
        args: Vec<String>,
        timeout_secs: Option<u64>,
        cwd: Option<PathBuf>,
    ) -> Self {
        let timeout = Duration::from_secs(timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS));
        CommandAgent { program, args, timeout, cwd }
    }

    /// Runs the program once.
    pub async fn answer(&self, context: &AgentContext) -> Result<AgentAnswer, AgentFailure> {
        let program = &self.program;
        let mut command = tokio::process::Command::new(program);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .args(&self.args)
            .arg(&context.thread_id)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that stopping it stops whatever it started too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| AgentFailure::Unavailable(format!("cannot start `{program}`: {e}")))?;
        // A killed or timed-out thread drops this future: the agent and its children go too.
        let _group = child.id().map(ProcessGroupGuard);

        let input = serde_json::to_vec(context).expect("agent context serializes");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let run = async {
            // Write and read concurrently: a program that answers before reading all of its
            // input must not deadlock on a full pipe. A program that ignores stdin may close
            // it early; that is its business, not an error.
            let write = async {
                let _ = stdin.write_all(&input).await;
                drop(stdin);
            };
            let mut out = Vec::new();
            let mut err = Vec::new();
            let (_, out_res, err_res, status) = tokio::join!(
                write,
                stdout.read_to_end(&mut out),
                stderr.read_to_end(&mut err),
                child.wait()
            );
            out_res.and(err_res).and(status).map(|status| (status, out, err))
        };
        let (status, out, err) = match tokio::time::timeout(self.timeout, run).await {
            Err(_) => {
                return Err(AgentFailure::Timeout(format!(
                    "`{program}` did not answer within {}s",
                    self.timeout.as_secs()
                )));
            }
            Ok(Err(e)) => return Err(AgentFailure::Failed(format!("`{program}`: {e}"))),
            Ok(Ok(done)) => done,
        };
        if !status.success() {
            let tail = stderr_tail(&err);
            let status = match status.code() {
                Some(code) => format!("exit status {code}"),
                None => "a signal".to_string(),
            };
            return Err(AgentFailure::Failed(if tail.is_empty() {
                format!("`{program}` failed with {status}")
            } else {
                format!("`{program}` failed with {status}: {tail}")
            }));
        }
        let text = String::from_utf8(out)
            .map_err(|_| AgentFailure::Failed(format!("`{program}` printed invalid UTF-8")))?;
        Ok(parse_answer(text))
    }
}

/// Kills a process group when dropped (SIGKILL to a group already gone is a no-op).
struct ProcessGroupGuard(u32);

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0 as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// `{"content": ..., "meta": ...}` is taken apart; anything else is the content itself.
fn parse_answer(text: String) -> AgentAnswer {
    if let Ok(serde_json::Value::Object(mut object)) = serde_json::from_str(text.trim())
        && let Some(serde_json::Value::String(content)) = object.remove("content")
    {
        return AgentAnswer { content, meta: object.remove("meta") };
    }
    AgentAnswer { content: text, meta: None }
}

fn stderr_tail(err: &[u8]) -> String {
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
            AgentAnswer { content: "plain".into(), meta: None }
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
