//! A thread's call journal in a home directory: `logs/<HASH>/<ULID>.calls.jsonl`, appended
//! (and fsynced where a call's answer must survive a crash) by the one process that runs the
//! thread; a damaged line is skipped, its call made again.

use std::path::{Path, PathBuf};

use crate::durable::AppendFile;
use crate::error::{Error, Result};
use crate::store::journal::{CallLog, JournalLine};

/// A thread's call journal file: kept open from one record to the next while the thread runs,
/// and closed before it waits ([`CallLog::release`]).
#[derive(Debug)]
pub struct FileCalls {
    path: PathBuf,
    file: Option<AppendFile>,
}

impl FileCalls {
    /// Opens (creating) the journal at `path`; opening repairs a torn last line before
    /// anything is appended.
    pub fn open(path: &Path) -> Result<Self> {
        AppendFile::open(path, true)?;
        Ok(FileCalls { path: path.to_path_buf(), file: None })
    }
}

impl CallLog for FileCalls {
    fn read(&self) -> Result<Vec<JournalLine>> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("read call journal", &self.path)(e)),
        };
        // Damaged lines (torn, or not even text) are skipped: their calls are made again.
        Ok(bytes
            .split(|&b| b == b'\n')
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect())
    }

    fn append(&mut self, record: &JournalLine, durable: bool) -> Result<()> {
        let line = serde_json::to_vec(record).expect("journal lines serialize");
        let file = match &mut self.file {
            Some(file) => file,
            // `open` repaired a torn tail already.
            None => self.file.insert(AppendFile::reopen(&self.path, false)?),
        };
        file.append_synced(&line, durable).map_err(Error::io("append to call journal", &self.path))
    }

    fn release(&mut self) {
        self.file = None;
    }
}
