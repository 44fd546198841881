//! Provider limits in a home directory: `limits/<name>.json`, changed under an `flock` of
//! `limits/<name>.lock` that every process of the home takes (and a process that dies holding
//! it lets go of), replaced by a rename so that a reader without the lock sees a whole state.
//!
//! Not synced to disk: a limit's state is the last minute of calls, and a machine that loses
//! it in a crash has lost only a minute's count, which its restarted threads' calls rebuild.

use std::fs::OpenOptions;
use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::store::capacity::{CapacityBackend, LimitState};

/// The limits of a home.
#[derive(Debug)]
pub struct FileCapacity {
    dir: PathBuf,
}

impl FileCapacity {
    pub fn new(home: &Home) -> Self {
        FileCapacity { dir: home.limits_dir() }
    }

    /// Limit `name`'s file (names are checked when config.yaml is read: no path reaches here).
    fn file(&self, name: &str, ext: &str) -> PathBuf {
        debug_assert!(crate::store::capacity::check_name(name).is_ok());
        self.dir.join(format!("{name}.{ext}"))
    }
}

impl CapacityBackend for FileCapacity {
    fn update(&self, name: &str, change: &mut dyn FnMut(&mut LimitState)) -> Result<()> {
        durable::create_dir(&self.dir)?;
        let lock = self.file(name, "lock");
        let file = durable::open_private(
            OpenOptions::new().create(true).truncate(false).write(true),
            &lock,
        )
        .map_err(Error::io("open lock", &lock))?;
        file.lock().map_err(Error::io("lock", &lock))?;
        let mut state = self.read(name)?;
        let before = state.clone();
        change(&mut state);
        if state != before {
            let path = self.file(name, "json");
            let temp = self.file(name, "json.tmp");
            let json = serde_json::to_vec(&state).expect("a limit's state serializes");
            durable::open_private(
                OpenOptions::new().create(true).truncate(true).write(true),
                &temp,
            )
            .and_then(|mut f| std::io::Write::write_all(&mut f, &json))
            .map_err(Error::io("write", &temp))?;
            std::fs::rename(&temp, &path).map_err(Error::io("rename", &temp))?;
        }
        Ok(())
    }

    fn read(&self, name: &str) -> Result<LimitState> {
        let path = self.file(name, "json");
        match durable::read_text(&path, "read a limit's state")? {
            None => Ok(LimitState::default()),
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| Error::Corrupt { path, reason: e.to_string() }),
        }
    }
}
