//! Signed one-time links in a home: `reach/links/<token hash>.json` (the hash is hex: no input
//! reaches the path), a use taken under the directory's lock; `reach/links/unapplied/<hash>`
//! marks a use whose decision is not yet applied.

use std::path::PathBuf;

use super::docs;
use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::store::links::{Consumed, Link, LinkBackend, LinkUse};

#[derive(Debug)]
pub struct FileLinks {
    dir: PathBuf,
}

impl FileLinks {
    pub fn new(home: &Home) -> Self {
        FileLinks { dir: home.reach_dir().join("links") }
    }

    /// The file of hash `hash`, or none for a string that is no SHA-256 in hex (a link
    /// someone tampered with names no file).
    fn file(&self, hash: &str) -> Option<PathBuf> {
        let hex = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| self.dir.join(format!("{hash}.json")))
    }

    fn marker(&self, hash: &str) -> PathBuf {
        self.dir.join("unapplied").join(hash)
    }
}

impl LinkBackend for FileLinks {
    fn create(&self, link: &Link) -> Result<()> {
        let path = self.file(&link.hash).ok_or_else(|| bad_hash(&link.hash))?;
        durable::create_dir(&self.dir)?;
        let json = serde_json::to_vec(link).expect("a link serializes");
        durable::create_atomic(&path, &json, |_| Ok(())).map(drop)
    }

    fn get(&self, hash: &str) -> Result<Option<Link>> {
        match self.file(hash) {
            Some(path) => docs::read(&path, "read a link"),
            None => Ok(None),
        }
    }

    fn consume(&self, hash: &str, used: &LinkUse) -> Result<Consumed> {
        let Some(path) = self.file(hash) else { return Ok(Consumed::Unknown) };
        let _lock = docs::lock(&self.dir)?;
        let Some(mut link) = docs::read::<Link>(&path, "read a link")? else {
            return Ok(Consumed::Unknown);
        };
        if link.used.is_some() {
            return Ok(Consumed::UsedBefore(link));
        }
        link.used = Some(used.clone());
        // The marker first: a crash between the two leaves a marker of an unused link, which
        // `unapplied` skips; the other order could leave a use no one applies.
        durable::create_dir(&self.dir.join("unapplied"))?;
        durable::write_atomic(&self.marker(hash), b"")?;
        docs::write(&path, &link)?;
        Ok(Consumed::Taken(link))
    }

    fn applied(&self, hash: &str, outcome: &str) -> Result<()> {
        let Some(path) = self.file(hash) else { return Err(bad_hash(hash)) };
        let _lock = docs::lock(&self.dir)?;
        if let Some(mut link) = docs::read::<Link>(&path, "read a link")?
            && let Some(used) = &mut link.used
        {
            used.applied = true;
            used.outcome = Some(outcome.to_string());
            docs::write(&path, &link)?;
        }
        let marker = self.marker(hash);
        match std::fs::remove_file(&marker) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io("remove", &marker)(e))
            }
            _ => Ok(()),
        }
    }

    fn unapplied(&self) -> Result<Vec<Link>> {
        let markers = match std::fs::read_dir(self.dir.join("unapplied")) {
            Ok(markers) => markers,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list", self.dir.join("unapplied"))(e)),
        };
        let mut links = vec![];
        for marker in markers.flatten() {
            let hash = marker.file_name().to_string_lossy().into_owned();
            if let Some(link) = self.get(&hash)?
                && link.used.as_ref().is_some_and(|u| !u.applied)
            {
                links.push(link);
            }
        }
        links.sort_by_key(|l| l.used.as_ref().map(|u| u.at));
        Ok(links)
    }

    fn of_thread(&self, thread: ThreadId) -> Result<Vec<Link>> {
        let mut links: Vec<Link> = docs::all::<Link>(&self.dir, "read a link")?
            .into_iter()
            .map(|(_, link)| link)
            .filter(|link| link.thread == thread)
            .collect();
        links.sort_by_key(|l| l.created);
        Ok(links)
    }

    fn forget_expired(&self, cutoff: u64) -> Result<usize> {
        let _lock = docs::lock(&self.dir)?;
        let mut forgotten = 0;
        for (path, link) in docs::all::<Link>(&self.dir, "read a link")? {
            if link.expires < cutoff && link.used.as_ref().is_none_or(|u| u.applied) {
                std::fs::remove_file(&path).map_err(Error::io("remove", &path))?;
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }
}

fn bad_hash(hash: &str) -> Error {
    Error::Usage(format!("`{}` is not a link's hash", crate::terminal::line(hash)))
}
