//! JSON documents in a directory of a home, each changed under one `flock` that every process
//! of the home takes for the directory (a process that dies holding it lets go), and replaced
//! durably (temp file, fsync, rename): what links and notices are kept as. Their rate is a
//! person's, so one lock per directory costs nothing.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::durable;
use crate::error::{Error, Result};

/// The lock of `dir`, held until the returned file is dropped.
pub fn lock(dir: &Path) -> Result<std::fs::File> {
    durable::create_dir(dir)?;
    let path = dir.join(".lock");
    let file =
        durable::open_private(OpenOptions::new().create(true).truncate(false).write(true), &path)
            .map_err(Error::io("open lock", &path))?;
    file.lock().map_err(Error::io("lock", &path))?;
    Ok(file)
}

/// The document at `path`, if there is one.
pub fn read<T: DeserializeOwned>(path: &Path, action: &'static str) -> Result<Option<T>> {
    let Some(text) = durable::read_text(path, action)? else { return Ok(None) };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Corrupt { path: path.to_path_buf(), reason: e.to_string() })
}

/// Writes `value` to `path` durably (its directory made if missing).
pub fn write(path: &Path, value: &impl Serialize) -> Result<()> {
    durable::create_dir(durable::parent_dir(path))?;
    let json = serde_json::to_vec(value).expect("a document serializes");
    durable::write_atomic(path, &json)
}

/// The documents of `dir` (files ending `.json`), in the order of their names.
pub fn all<T: DeserializeOwned>(dir: &Path, action: &'static str) -> Result<Vec<(PathBuf, T)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io("list", dir)(e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut docs = Vec::with_capacity(paths.len());
    for path in paths {
        if let Some(doc) = read(&path, action)? {
            docs.push((path, doc));
        }
    }
    Ok(docs)
}
