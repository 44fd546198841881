//! What `/proc` says of a process on this machine: whether it runs (a zombie does not), when it
//! started, and which boot this is. The agents' ledger uses it to recognise its own process
//! groups, and the queue to tell at once that a worker of this machine has died.

use std::path::Path;

/// The fields of a `/proc/<pid>/stat` file that follow the command name, from field 3
/// (`state`) on: the name may hold spaces and parentheses, so they are counted from the last
/// `)`. `None` if there is no such process.
pub fn stat_fields(stat_file: &Path) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(stat_file).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// When process `pid` started, in clock ticks after boot (field 22); `None` if there is no
/// such process.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_fields(Path::new(&format!("/proc/{pid}/stat")))?.get(19)?.parse().ok()
}

/// Whether process `pid` runs: it exists and is not a zombie (field 3 `Z`: dead, waiting for
/// its parent to collect it) nor dying (`X`).
pub fn runs(pid: i32) -> bool {
    stat_fields(Path::new(&format!("/proc/{pid}/stat")))
        .is_some_and(|fields| !matches!(fields.first().map(String::as_str), Some("Z" | "X")))
}

/// Whether a process of group `pgid` (field 5) still runs.
pub fn group_runs(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|entry| {
        let Some(fields) = stat_fields(&entry.path().join("stat")) else { return false };
        let state = fields.first().map(String::as_str);
        fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
            && !matches!(state, Some("Z" | "X"))
    })
}

/// This boot's id (empty where the kernel does not say).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_are_read_from_proc() {
        let me = std::process::id() as i32;
        let started = start_time(me).expect("this process has a start time");
        assert_eq!(start_time(me), Some(started), "stable");
        assert!(start_time(i32::MAX).is_none());
    }

    #[test]
    fn a_zombie_does_not_run() {
        assert!(runs(std::process::id() as i32));
        assert!(!runs(i32::MAX), "no such process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Not reaped yet: a zombie once it has exited.
        while runs(pid) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "still listed");
        child.wait().unwrap();
    }
}
