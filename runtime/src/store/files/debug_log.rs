//! A thread's debug log in a home directory: `logs/<HASH>/<ULID>.info.jsonl`, written at the
//! log's flush points.

use std::path::PathBuf;

use crate::store::debug_log::LogSink;

/// A thread's debug log file, created at the first write, open between flushes while the
/// thread runs and closed while it waits.
#[derive(Debug)]
pub struct FileLog {
    pub(super) path: PathBuf,
    pub(super) file: Option<std::fs::File>,
}

impl LogSink for FileLog {
    fn write(&mut self, lines: &[u8]) -> std::io::Result<()> {
        let mut file = match self.file.take() {
            Some(file) => file,
            None => crate::durable::open_private(
                std::fs::OpenOptions::new().create(true).append(true),
                &self.path,
            )?,
        };
        std::io::Write::write_all(&mut file, lines)?;
        self.file = Some(file);
        Ok(())
    }

    fn release(&mut self) {
        self.file = None;
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
