//! Deliveries of waits in a home: `reach/notices/<thread>/<sha256 of the key>.json`, claimed
//! and settled under the directory's lock.

use std::path::PathBuf;

use super::docs;
use crate::error::Result;
use crate::home::Home;
use crate::ids::ThreadId;
use crate::store::bundles::sha256_hex;
use crate::store::notices::{self, Attempt, Notice, NoticeBackend};

#[derive(Debug)]
pub struct FileNotices {
    dir: PathBuf,
}

impl FileNotices {
    pub fn new(home: &Home) -> Self {
        FileNotices { dir: home.reach_dir().join("notices") }
    }

    fn file(&self, thread: ThreadId, key: &str) -> PathBuf {
        self.dir.join(thread.to_string()).join(format!("{}.json", sha256_hex(key.as_bytes())))
    }
}

impl NoticeBackend for FileNotices {
    fn claim(
        &self,
        fresh: &Notice,
        owner: &str,
        now: u64,
        lease_ms: u64,
    ) -> Result<Option<Notice>> {
        let _lock = docs::lock(&self.dir)?;
        let path = self.file(fresh.thread, &fresh.key);
        let kept = docs::read::<Notice>(&path, "read a notice")?;
        let Some(claimed) = notices::claim(kept, fresh, owner, now, lease_ms) else {
            return Ok(None);
        };
        docs::write(&path, &claimed)?;
        Ok(Some(claimed))
    }

    fn settle(&self, claimed: &Notice, attempt: &Attempt) -> Result<()> {
        let _lock = docs::lock(&self.dir)?;
        let path = self.file(claimed.thread, &claimed.key);
        if let Some(kept) = docs::read::<Notice>(&path, "read a notice")?
            && let Some(settled) = notices::settle(&kept, claimed, attempt)
        {
            docs::write(&path, &settled)?;
        }
        Ok(())
    }

    fn of_thread(&self, thread: ThreadId) -> Result<Vec<Notice>> {
        let mut all: Vec<Notice> =
            docs::all::<Notice>(&self.dir.join(thread.to_string()), "read a notice")?
                .into_iter()
                .map(|(_, n)| n)
                .collect();
        all.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
        Ok(all)
    }
}
