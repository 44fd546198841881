//! Evals in a home directory: `evals/<ID>.json`, one file per experiment, and
//! `evals/sets/<NAME>.json`, one per set of threads, each replaced atomically.

use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::store::evals::{EvalBackend, EvalSet, Experiment};

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

    fn sets(&self) -> PathBuf {
        self.dir.join("sets")
    }

    /// The names of the files in `dir` ending in `.json`, without it, sorted.
    fn names(dir: &std::path::Path) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io("list the evals", dir)(e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                Some(name.to_str()?.strip_suffix(".json")?.to_string())
            })
            .collect();
        names.sort();
        Ok(names)
    }
}

/// The value JSON file `path` holds, if there is one.
fn read<T: serde::de::DeserializeOwned>(path: PathBuf) -> Result<Option<T>> {
    let Some(text) = durable::read_text(&path, "read an eval")? else { return Ok(None) };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Corrupt { path, reason: e.to_string() })
}

/// `value` as JSON in file `path` of `dir`, replaced whole.
fn write(
    dir: &std::path::Path,
    path: &std::path::Path,
    value: &impl serde::Serialize,
) -> Result<()> {
    durable::create_dir(dir)?;
    let json = serde_json::to_vec_pretty(value).expect("an eval serializes");
    durable::write_atomic(path, &json)
}

impl EvalBackend for FileEvals {
    fn put(&self, experiment: &Experiment) -> Result<()> {
        write(&self.dir, &self.file(experiment.id), experiment)
    }

    fn get(&self, id: ThreadId) -> Result<Option<Experiment>> {
        read(self.file(id))
    }

    fn list(&self) -> Result<Vec<Experiment>> {
        let mut ids: Vec<ThreadId> =
            Self::names(&self.dir)?.iter().filter_map(|n| n.parse().ok()).collect();
        ids.sort();
        let mut all = Vec::with_capacity(ids.len());
        for id in ids {
            all.extend(self.get(id)?);
        }
        Ok(all)
    }

    fn put_set(&self, set: &EvalSet) -> Result<()> {
        let sets = self.sets();
        write(&sets, &sets.join(format!("{}.json", set.name)), set)
    }

    fn get_set(&self, name: &str) -> Result<Option<EvalSet>> {
        // A set's name is checked where it is saved; one that could leave the folder is none.
        if crate::ids::validate_name("eval set name", name).is_err() {
            return Ok(None);
        }
        read(self.sets().join(format!("{name}.json")))
    }

    fn list_sets(&self) -> Result<Vec<EvalSet>> {
        let mut all = Vec::new();
        for name in Self::names(&self.sets())? {
            all.extend(self.get_set(&name)?);
        }
        Ok(all)
    }
}
