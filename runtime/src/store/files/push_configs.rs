//! A2A push configs in a home: `reach/push/<thread>/<id>.json` (ids are checked: no input
//! reaches a path unchecked).

use std::path::PathBuf;

use super::docs;
use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::store::push_configs::{PushConfig, PushConfigBackend, check_id};

#[derive(Debug)]
pub struct FilePushConfigs {
    dir: PathBuf,
}

impl FilePushConfigs {
    pub fn new(home: &Home) -> Self {
        FilePushConfigs { dir: home.reach_dir().join("push") }
    }

    fn file(&self, thread: ThreadId, id: &str) -> Result<PathBuf> {
        check_id(id).map_err(Error::Usage)?;
        Ok(self.dir.join(thread.to_string()).join(format!("{id}.json")))
    }
}

impl PushConfigBackend for FilePushConfigs {
    fn put(&self, config: &PushConfig) -> Result<()> {
        docs::write(&self.file(config.thread, &config.id)?, config)
    }

    fn of_thread(&self, thread: ThreadId) -> Result<Vec<PushConfig>> {
        let mut found: Vec<PushConfig> =
            docs::all::<PushConfig>(&self.dir.join(thread.to_string()), "read a push config")?
                .into_iter()
                .map(|(_, c)| c)
                .collect();
        found.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok(found)
    }

    fn delete(&self, thread: ThreadId, id: &str) -> Result<bool> {
        let path = self.file(thread, id)?;
        match std::fs::remove_file(&path) {
            Ok(()) => {
                durable::sync_dir(durable::parent_dir(&path))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("remove", &path)(e)),
        }
    }

    fn all(&self) -> Result<Vec<PushConfig>> {
        let threads = match std::fs::read_dir(&self.dir) {
            Ok(threads) => threads,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list", &self.dir)(e)),
        };
        let mut found = vec![];
        for thread in threads.flatten() {
            let Some(id) = thread.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            found.extend(self.of_thread(id)?);
        }
        Ok(found)
    }
}
