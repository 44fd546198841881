//! Poll triggers: running the operator's check command, and reading what it printed as items
//! (`new-items`) or as one output (`any-change`).
//!
//! The command is the operator's code, like a command agent: started directly (never through
//! a shell) in the directory the schedule was added from, killed with its process group after
//! its timeout, its stdout bounded, the tail of its stderr in the error when it fails. What it
//! prints is untrusted data: it is parsed, bounded and keyed, never executed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::agents::command::{find_program, stderr_tail};
use crate::ids::Digest;

/// The most a check may print: what one thread's `trigger-data` may hold.
pub const MAX_OUTPUT: usize = 1 << 20;

/// How long a check may run unless the schedule says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest `id` kept as an item's key as it is; a longer one is keyed by its digest.
const MAX_ID_CHARS: usize = 200;

/// Runs `command` (program and arguments) in `cwd` and returns its stdout; the error is one
/// line naming the program and why.
pub async fn check(
    command: &[String],
    cwd: Option<&Path>,
    timeout: Duration,
) -> Result<String, String> {
    let (program, args) = command.split_first().ok_or("the poll command is empty")?;
    find_program(program, cwd)?;
    let mut child = tokio::process::Command::new(program);
    if let Some(cwd) = cwd {
        child.current_dir(cwd);
    }
    let mut child = child
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start `{program}`: {e}"))?;
    let pid = child.id();
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut over = false;
    let run = async {
        // One byte over the limit tells "too much" from "exactly the limit".
        let mut out_reader = (&mut stdout).take(MAX_OUTPUT as u64 + 1);
        let mut err_reader = (&mut stderr).take(64 * 1024);
        // Stderr is read while stdout is, so that neither pipe fills and blocks the command;
        // but a command over the output limit is not waited for.
        let read_err = async {
            let _ = err_reader.read_to_end(&mut err).await;
        };
        let read_out = async {
            out_reader.read_to_end(&mut out).await?;
            if out.len() > MAX_OUTPUT {
                over = true;
                return Ok(None);
            }
            child.wait().await.map(Some)
        };
        tokio::pin!(read_err, read_out);
        let mut err_done = false;
        let result = loop {
            tokio::select! {
                result = &mut read_out => break result,
                _ = &mut read_err, if !err_done => err_done = true,
            }
        };
        if !err_done && matches!(result, Ok(Some(_))) {
            // The command exited: what it wrote to stderr is there to read.
            let _ = tokio::time::timeout(Duration::from_secs(1), read_err).await;
        }
        result
    };
    let outcome = tokio::time::timeout(timeout, run).await;
    // Whatever the command started goes with it.
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process_group(
            rustix::process::Pid::from_raw(pid as i32).expect("a child's pid is positive"),
            rustix::process::Signal::KILL,
        );
    }
    let tail = stderr_tail(&err);
    let with_tail = |m: String| if tail.is_empty() { m } else { format!("{m}: {tail}") };
    let status = match outcome {
        Err(_) => {
            let limit = humantime::format_duration(timeout);
            return Err(with_tail(format!("`{program}` did not finish within {limit}")));
        }
        Ok(Err(e)) => return Err(format!("`{program}`: {e}")),
        Ok(Ok(None)) | Ok(Ok(Some(_))) if over => {
            return Err(format!("`{program}` printed more than 1 MiB"));
        }
        Ok(Ok(None)) => unreachable!("no status only when over the limit"),
        Ok(Ok(Some(status))) => status,
    };
    if !status.success() {
        let how = status.code().map_or("a signal".to_string(), |c| format!("exit status {c}"));
        return Err(with_tail(format!("`{program}` failed with {how}")));
    }
    String::from_utf8(out).map_err(|_| format!("`{program}` printed invalid UTF-8"))
}

/// The items of a `new-items` check: its output must be a JSON array. Each item is keyed by
/// its `id` (a string or a number), or else by the digest of its content; an item repeated in
/// one output counts once.
pub fn items(output: &str) -> Result<Vec<(String, serde_json::Value)>, String> {
    let value: serde_json::Value = serde_json::from_str(output.trim()).map_err(|e| {
        format!("its output is not JSON ({e}); `--diff new-items` expects a JSON array")
    })?;
    let serde_json::Value::Array(list) = value else {
        return Err("its output is not a JSON array, which `--diff new-items` expects".into());
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut items = Vec::new();
    for item in list {
        let key = item_key(&item);
        if seen.insert(key.clone()) {
            items.push((key, item));
        }
    }
    Ok(items)
}

/// `item:<id>`, or `item:#<digest>` for an item without a usable id.
fn item_key(item: &serde_json::Value) -> String {
    let id = match item.get("id") {
        Some(serde_json::Value::String(s)) if s.chars().count() <= MAX_ID_CHARS => Some(s.clone()),
        Some(n @ serde_json::Value::Number(_)) => Some(n.to_string()),
        _ => None,
    };
    match id {
        // Kept apart from digest keys, which start with `#`.
        Some(id) if !id.starts_with('#') => format!("item:{id}"),
        _ => format!("item:#{}", digest(&canonical(item))),
    }
}

/// The digest of an output, to tell a change.
pub fn digest(text: &str) -> String {
    Digest::of(text.as_bytes()).to_string()
}

/// JSON with object keys sorted: the same item always has the same digest, however the
/// command ordered its keys.
fn canonical(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", serde_json::Value::from(k.as_str()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        serde_json::Value::Array(list) => {
            format!("[{}]", list.iter().map(canonical).collect::<Vec<_>>().join(","))
        }
        other => other.to_string(),
    }
}

/// What an `any-change` check hands the thread: the output as JSON if it is JSON, else as
/// text.
pub fn change_data(output: &str) -> serde_json::Value {
    serde_json::from_str(output.trim()).unwrap_or_else(|_| serde_json::Value::from(output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_are_keyed_by_id_or_content() {
        let found =
            items(r#"[{"id": 7, "t": 1}, {"id": "a"}, {"b": 1, "a": 2}, {"id": "a"}]"#).unwrap();
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys.len(), 3, "the repeated item counts once: {keys:?}");
        assert_eq!(keys[0], "item:7");
        assert_eq!(keys[1], "item:a");
        // Content keys do not depend on the order of fields.
        assert_eq!(keys[2], item_key(&json!({"a": 2, "b": 1})));
        assert!(keys[2].starts_with("item:#"));
        // An id cannot pass for a digest key.
        assert!(
            item_key(&json!({"id": "#x"})).starts_with("item:#")
                && item_key(&json!({"id": "#x"})) != "item:#x"
        );
        assert!(items("{}").unwrap_err().contains("not a JSON array"));
        assert!(items("nope").unwrap_err().contains("not JSON"));
    }

    #[tokio::test]
    async fn a_check_is_bounded_and_its_failures_named() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("check.sh");
        std::fs::write(&script, "#!/bin/sh\necho \"$1\"\necho oops >&2\nexit \"$2\"\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let run = |args: &[&str]| {
            let mut command = vec![script.display().to_string()];
            command.extend(args.iter().map(|a| a.to_string()));
            command
        };
        let out = check(&run(&["[1]", "0"]), None, DEFAULT_TIMEOUT).await.unwrap();
        assert_eq!(out.trim(), "[1]");
        let e = check(&run(&["x", "3"]), None, DEFAULT_TIMEOUT).await.unwrap_err();
        assert!(e.ends_with("failed with exit status 3: oops"), "{e}");
        let e = check(&["sleep".into(), "5".into()], None, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(e.contains("did not finish within 200ms"), "{e}");
        let e = check(&["no-such-program-here".into()], None, DEFAULT_TIMEOUT).await.unwrap_err();
        assert!(e.contains("is not on PATH"), "{e}");
    }
}
