//! The agent processes a thread has running, written down so that the next run of the thread
//! can stop any that outlived their worker.
//!
//! A command agent runs in a process group of its own. Its first process dies with the worker
//! (`PR_SET_PDEATHSIG`), but what it started — a coding agent's shell, compiler or test run —
//! is not its child in the kernel's eyes and keeps running. So each running group is listed in
//! `run/agents/<ULID>.json` (the home's machine-local directory: processes belong to a
//! machine) while its call lasts, and before a thread is continued (`resume`, `answer`, `step`)
//! or removed, every group still listed there is killed: two agents never work on one call.
//!
//! A group id is only trusted for the boot it was recorded in, and only while its first
//! process, if still there, is the one recorded (same start time): Linux does not give a
//! process-group id to a new process while any member of the group lives, so a group whose
//! first process is gone but whose members remain is still the agent's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

use crate::durable;
use crate::error::{Error, Result};
use crate::procfs::{boot_id, group_runs, start_time};

/// How long a killed group may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// One agent process group as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Group {
    /// The group id: the pid of its first process.
    pgid: i32,
    /// That process's start time, in clock ticks after boot (`/proc/<pid>/stat`, field 22).
    started: u64,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`).
    boot: String,
}

/// Starts `command` as an agent's process (a command agent, a tool server), its stdio piped:
/// in a process group of its own, so that stopping it stops whatever it started too; dying
/// with the worker; killed when its handle is dropped. Its group is listed in `processes`
/// while the returned guard lives, so that a later run of the thread can stop what a dead
/// worker left behind.
pub fn spawn_group(
    command: &mut tokio::process::Command,
    processes: Option<&Arc<AgentProcesses>>,
) -> std::io::Result<(tokio::process::Child, Option<GroupGuard>)> {
    die_with_worker(command);
    let child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let group = child.id().map(|pid| match processes {
        Some(processes) => processes.track(pid),
        None => GroupGuard::untracked(pid),
    });
    Ok((child, group))
}

/// A long-lived agent process (a tool server) that nobody waits on while it serves: reaped
/// the moment it exits, so that one that died leaves no zombie for the rest of its call, and
/// killed (and reaped) once this is dropped.
#[derive(Debug)]
pub struct Reaped {
    /// Dropped, it tells the reaping task to kill the process.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Reaped {
    /// Reaps `child` (`what` names it in the log) in a task of its own.
    pub fn watch(mut child: tokio::process::Child, what: String) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::select! {
                status = child.wait() => match status {
                    Ok(status) => tracing::debug!("{what} exited ({status})"),
                    Err(e) => tracing::warn!("{what}: waiting for it: {e}"),
                },
                // Dropped or told: kill it, and wait for it.
                _ = stopped => {
                    let _ = child.kill().await;
                }
            }
        });
        Reaped { _stop: stop }
    }
}

/// Makes `command`'s process die with the worker (`PR_SET_PDEATHSIG`): a program started for
/// a call must not outlive the worker that waits for it.
fn die_with_worker(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the child between fork and exec, and calls only prctl,
    // which is async-signal-safe; it touches no memory of the parent. The signal is tied
    // to the thread that spawned the child: a tokio worker thread, which lives as long as
    // the worker process's runtime.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

/// The ledger of one thread's running agent process groups.
#[derive(Debug)]
pub struct AgentProcesses {
    path: PathBuf,
    groups: Mutex<Vec<Group>>,
}

impl AgentProcesses {
    /// The ledger at `path` (nothing is read or written yet).
    pub fn new(path: PathBuf) -> Self {
        AgentProcesses { path, groups: Mutex::new(Vec::new()) }
    }

    /// Records the group led by `pid`, just started; it stays listed until the returned guard
    /// is dropped, which kills the group (whatever the agent left running) and unlists it.
    ///
    /// A list that cannot be written (a full disk) only loses that safety net, with a warning:
    /// the agent's first process still dies with the worker, and the thread's next record will
    /// meet the same disk and interrupt the thread.
    pub fn track(self: &Arc<Self>, pid: u32) -> GroupGuard {
        let pgid = pid as i32;
        let group = Group {
            pgid,
            // A process that has already exited has no start time left to read: it cannot
            // outlive anything, but its group might, so it is listed all the same.
            started: start_time(pgid).unwrap_or(0),
            boot: boot_id(),
        };
        let mut groups = self.groups.lock();
        groups.push(group);
        if let Err(e) = self.write(&groups) {
            tracing::warn!("an agent process group runs unlisted: {e}");
        }
        GroupGuard { ledger: Some(self.clone()), pgid }
    }

    fn untrack(&self, pgid: i32) {
        let mut groups = self.groups.lock();
        groups.retain(|g| g.pgid != pgid);
        if let Err(e) = self.write(&groups) {
            tracing::warn!("cannot update the agent process list: {e}");
        }
    }

    /// Rewrites the list. It is removed only when the thread's run is over (on drop), not as
    /// each call ends: freeing its block mid-run would let a full disk look less full to the
    /// thread's next records than it is.
    fn write(&self, groups: &[Group]) -> Result<()> {
        let text = serde_json::to_vec(groups).expect("process groups serialize");
        durable::write_atomic(&self.path, &text)
    }
}

impl Drop for AgentProcesses {
    fn drop(&mut self) {
        if self.groups.lock().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Kills every agent process group listed at `path` by a run of the thread that is over (its
/// worker died), waits until they are gone, and clears the list. Returns how many groups were
/// still running.
pub fn stop_leftovers(path: &Path) -> Result<usize> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io("read", path)(e)),
    };
    // A damaged list names no process that can be trusted: nothing is killed.
    let groups: Vec<Group> = serde_json::from_slice(&text).unwrap_or_default();
    let boot = boot_id();
    let mut stopped = 0;
    for group in groups.iter().filter(|g| g.boot == boot) {
        let Some(pgid) = Pid::from_raw(group.pgid) else { continue };
        if start_time(group.pgid).is_some_and(|started| started != group.started) {
            continue; // The id now leads another group.
        }
        if rustix::process::kill_process_group(pgid, Signal::KILL).is_err() {
            continue; // No such group left.
        }
        stopped += 1;
        let deadline = Instant::now() + KILL_WAIT;
        while group_runs(group.pgid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", path)(e)),
        _ => Ok(stopped),
    }
}

/// Kills its process group when dropped (SIGKILL to a group already gone is a no-op), and
/// takes it off its thread's ledger.
#[derive(Debug)]
pub struct GroupGuard {
    ledger: Option<Arc<AgentProcesses>>,
    pgid: i32,
}

impl GroupGuard {
    /// A guard that kills the group led by `pid` on drop, with no ledger.
    pub fn untracked(pid: u32) -> Self {
        GroupGuard { ledger: None, pgid: pid as i32 }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = Pid::from_raw(self.pgid) {
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
        if let Some(ledger) = &self.ledger {
            ledger.untrack(self.pgid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_groups_are_killed_and_foreign_ones_spared() -> Result<()> {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agents.json");
        let spawn =
            || std::process::Command::new("sleep").arg("300").process_group(0).spawn().unwrap();
        let (mut ours, mut other) = (spawn(), spawn());
        let ledger = Arc::new(AgentProcesses::new(path.clone()));
        let guard = ledger.track(ours.id());
        // The other group is listed with a start time that is not its own: an id reused.
        let mut groups = ledger.groups.lock().clone();
        groups.push(Group { pgid: other.id() as i32, started: 1, boot: boot_id() });
        std::fs::write(&path, serde_json::to_vec(&groups).unwrap()).unwrap();
        std::mem::forget(guard); // as when the worker dies: nobody unlists the group

        assert_eq!(stop_leftovers(&path)?, 1);
        assert!(ours.wait().unwrap().code().is_none(), "killed by a signal");
        assert!(other.try_wait().unwrap().is_none(), "the foreign group runs on");
        assert!(!path.exists(), "the list is cleared");
        assert_eq!(stop_leftovers(&path)?, 0);

        // A run that ends with no agent running takes its list away.
        let ledger = Arc::new(AgentProcesses::new(path.clone()));
        let mut third = spawn();
        drop(ledger.track(third.id()));
        assert!(third.wait().unwrap().code().is_none(), "the guard kills its group");
        assert!(path.exists());
        drop(ledger);
        assert!(!path.exists());
        other.kill().unwrap();
        other.wait().unwrap();
        Ok(())
    }
}
