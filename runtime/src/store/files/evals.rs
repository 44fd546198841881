//! Evals in a home directory: `evals/<ID>.json`, one file per experiment, replaced atomically.

use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::store::evals::{EvalBackend, Experiment};

/// The experiments under `evals/`.
#[derive(Debug)]
pub struct FileEvals {
    dir: PathBuf,
}

impl FileEvals {
    pub fn new(home: &Home) -> Self {
        FileEvals { dir: home.evals_dir() }
    }

    fn file(&self, id: ThreadId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn read(&self, path: PathBuf) -> Result<Option<Experiment>> {
        let Some(text) = durable::read_text(&path, "read an eval")? else { return Ok(None) };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Corrupt { path, reason: e.to_string() })
    }
}

impl EvalBackend for FileEvals {
    fn put(&self, experiment: &Experiment) -> Result<()> {
        durable::create_dir(&self.dir)?;
        let json = serde_json::to_vec_pretty(experiment).expect("an experiment serializes");
        durable::write_atomic(&self.file(experiment.id), &json)
    }

    fn get(&self, id: ThreadId) -> Result<Option<Experiment>> {
        self.read(self.file(id))
    }

    fn list(&self) -> Result<Vec<Experiment>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list the evals", &self.dir)(e)),
        };
        let mut ids: Vec<ThreadId> = entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                name.to_str()?.strip_suffix(".json")?.parse().ok()
            })
            .collect();
        ids.sort();
        let mut all = Vec::with_capacity(ids.len());
        for id in ids {
            all.extend(self.get(id)?);
        }
        Ok(all)
    }
}
