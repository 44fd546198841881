//! Schedules in a home directory: `schedules/<NAME>/schedule.json` (replaced atomically),
//! `firings.jsonl` (the firing log: append-only, fsynced, read from where it was last read),
//! `poll.json`, and `schedules/fire.lock` (an `flock`, released with its process).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::durable::{self, AppendFile};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::store::schedules::{
    FireLock, FiringEvent, FiringHistory, PollState, Schedule, ScheduleBackend,
};

/// Schedules in a home: `schedules/<NAME>/{schedule.json, firings.jsonl, poll.json}`.
#[derive(Debug)]
pub struct FileSchedules {
    dir: PathBuf,
}

impl FileSchedules {
    /// The schedules of `home`.
    pub fn new(home: &Home) -> Self {
        FileSchedules { dir: home.schedules_dir() }
    }

    fn schedule_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn definition_file(&self, name: &str) -> PathBuf {
        self.schedule_dir(name).join("schedule.json")
    }

    fn firings_file(&self, name: &str) -> PathBuf {
        self.schedule_dir(name).join("firings.jsonl")
    }

    fn poll_file(&self, name: &str) -> PathBuf {
        self.schedule_dir(name).join("poll.json")
    }
}

impl ScheduleBackend for FileSchedules {
    /// An `flock`: a process that dies holding it releases it.
    fn lock(&self) -> Result<FireLock> {
        durable::create_dir(&self.dir)?;
        let path = self.dir.join("fire.lock");
        let file = durable::open_private(
            std::fs::OpenOptions::new().create(true).truncate(false).write(true),
            &path,
        )
        .map_err(Error::io("open", &path))?;
        file.lock().map_err(Error::io("lock", &path))?;
        Ok(FireLock::File(file))
    }

    fn list(&self) -> Result<Vec<Schedule>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list", &self.dir)(e)),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut schedules = Vec::new();
        for name in names {
            match self.get(&name) {
                Ok(Some(schedule)) => schedules.push(schedule),
                Ok(None) => {}
                Err(e) => tracing::warn!("schedule `{name}` left out: {e}"),
            }
        }
        Ok(schedules)
    }

    fn get(&self, name: &str) -> Result<Option<Schedule>> {
        let path = self.definition_file(name);
        let Some(text) = durable::read_text(&path, "read")? else { return Ok(None) };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Corrupt { path, reason: e.to_string() })
    }

    fn put(&self, schedule: &Schedule, _lock: &FireLock) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(schedule).expect("schedules serialize");
        durable::write_atomic(&self.definition_file(&schedule.name), &bytes)
    }

    fn remove(&self, name: &str, _lock: &FireLock) -> Result<bool> {
        let dir = self.schedule_dir(name);
        if !self.definition_file(name).exists() {
            return Ok(false);
        }
        // The definition goes first: a crash after it leaves a folder no listing shows, and
        // adding the name again starts a new log.
        std::fs::remove_file(self.definition_file(name))
            .map_err(Error::io("remove", self.definition_file(name)))?;
        std::fs::remove_dir_all(&dir).map_err(Error::io("remove", &dir))?;
        Ok(true)
    }

    fn record(&self, name: &str, event: &FiringEvent, _lock: &FireLock) -> Result<()> {
        let path = self.firings_file(name);
        let mut file = AppendFile::open(&path, true)?;
        let line = serde_json::to_vec(event).expect("firing events serialize");
        file.append(&line).map_err(Error::io("append to", &path))
    }

    fn catch_up(&self, name: &str, history: &mut FiringHistory) -> Result<()> {
        catch_up_file(history, &self.firings_file(name))
    }

    fn poll_state(&self, name: &str) -> Result<PollState> {
        let path = self.poll_file(name);
        match durable::read_text(&path, "read")? {
            None => Ok(PollState::default()),
            // Damaged: as if never checked (the firing log, not this, says what was seen).
            Some(text) => Ok(serde_json::from_str(&text).unwrap_or_default()),
        }
    }

    fn set_poll_state(&self, name: &str, state: &PollState) -> Result<()> {
        let bytes = serde_json::to_vec(state).expect("poll states serialize");
        durable::write_atomic(&self.poll_file(name), &bytes)
    }
}

/// Reads what was appended to the log file at `path` since the last read (all of it the
/// first time). A torn last line (a crash mid-append) is left for the next read, which
/// finds it terminated by the next append and skips it.
fn catch_up_file(history: &mut FiringHistory, path: &Path) -> Result<()> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("open the firing log", path)(e)),
    };
    let len = file.metadata().map_err(Error::io("read the firing log", path))?.len();
    if len < history.position() {
        // The log was replaced (the schedule removed and added again): start over.
        *history = FiringHistory::default();
    }
    if len == history.position() {
        return Ok(());
    }
    file.seek(SeekFrom::Start(history.position()))
        .map_err(Error::io("read the firing log", path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(Error::io("read the firing log", path))?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut at = history.position();
    for line in bytes[..complete].split_inclusive(|&b| b == b'\n') {
        at += line.len() as u64;
        match serde_json::from_slice::<FiringEvent>(line) {
            Ok(event) => history.apply_at(event, at),
            // An empty line, or a torn one terminated by a later append: nothing was
            // promised for it.
            Err(e) if line.trim_ascii().is_empty() => {
                let _ = e;
            }
            Err(e) => tracing::warn!("{}: skipped a damaged line: {e}", path.display()),
        }
    }
    history.skip_to(history.position().max(at));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ThreadId;
    use crate::store::schedules::FiringState;

    #[test]
    fn the_log_is_read_incrementally_and_a_torn_line_waits() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let schedules = FileSchedules::new(&Home::new(dir.path()));
        let lock = schedules.lock()?;
        std::fs::create_dir(dir.path().join("schedules/s")).unwrap();
        let id = ThreadId::new();
        let fired = FiringEvent::Fired {
            key: "cron:1000".into(),
            thread_id: id,
            at: 5,
            trigger_data: None,
            instant: Some(1000),
            output: None,
        };
        schedules.record("s", &fired, &lock)?;
        let mut history = FiringHistory::default();
        schedules.catch_up("s", &mut history)?;
        assert_eq!(history.pending().count(), 1);
        assert_eq!(history.last_instant, Some(1000));
        // A torn append: not read, and the next append terminates it.
        let path = dir.path().join("schedules/s/firings.jsonl");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"started\":{\"thr"))
            .unwrap();
        schedules.catch_up("s", &mut history)?;
        assert_eq!(history.pending().count(), 1);
        schedules.record("s", &FiringEvent::Started { thread_id: id, at: 6 }, &lock)?;
        schedules.catch_up("s", &mut history)?;
        assert_eq!(history.pending().count(), 0);
        assert_eq!(history.firings[0].state, FiringState::Started);
        // The same as reading it whole.
        let whole = schedules.history("s")?;
        assert_eq!(whole.firings, history.firings);
        Ok(())
    }
}
