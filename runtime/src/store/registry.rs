//! The registry (`workflow.yaml`, or a database's tables behind [`RegistryBackend`]): workflow
//! names, their current bundle and version history, and the SHA-256 of every stored bundle.
//!
//! Reads take no lock (the file is only ever replaced atomically); changes hold an exclusive
//! lock on `workflow.lock` across read-modify-write, so concurrent CLI processes never lose
//! each other's updates. A file that does not parse is reported with its line and is never
//! overwritten.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::BundleHash;

/// The registry as a value: every workflow name with its current version and history, and
/// every stored bundle's integrity record (a home keeps it as `workflow.yaml`, a database in
/// its tables).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryTable {
    /// Registered workflows by name.
    #[serde(default)]
    pub workflows: BTreeMap<String, WorkflowEntry>,
    /// Every bundle ever stored, by hash: its integrity record.
    #[serde(default)]
    pub bundles: BTreeMap<BundleHash, BundleRecord>,
}

impl RegistryTable {
    /// The entry registered as `name`, or the error naming the closest registered name.
    pub fn entry(&self, name: &str) -> Result<&WorkflowEntry> {
        self.workflows.get(name).ok_or_else(|| self.unknown(name))
    }

    /// The error for `name`, which is not registered.
    pub fn unknown(&self, name: &str) -> Error {
        let names: Vec<&str> = self.workflows.keys().map(String::as_str).collect();
        Error::UnknownWorkflow {
            name: name.to_string(),
            closest: crate::error::closest(name, &names).map(str::to_string),
        }
    }
}

/// A registered workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowEntry {
    /// The current version.
    pub hash: BundleHash,
    /// When the current version became current (ms since the Unix epoch).
    pub timestamp: u64,
    /// Earlier versions, most recent first.
    #[serde(default)]
    pub history: Vec<Version>,
}

/// A version a workflow once had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Version {
    pub hash: BundleHash,
    /// When it became current.
    pub timestamp: u64,
}

/// Integrity record of a stored bundle: XXH64 names it, SHA-256 vouches for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleRecord {
    pub sha256: String,
    pub size: u64,
    /// The start of the bundle's description, for listings that must not read every
    /// descriptor (absent in registries written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// How much of a description [`BundleRecord::summary`] keeps.
pub const SUMMARY_CHARS: usize = 200;

/// What [`Registry::register`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// The name is new.
    New,
    /// The name now points at the new hash; the previous one went to history.
    Updated { previous: BundleHash },
    /// The name already pointed at this hash.
    Unchanged,
}

/// Where a registry is kept: `workflow.yaml` under a home, or a database's tables.
pub trait RegistryBackend: Send + Sync + fmt::Debug {
    /// Reads the whole registry.
    fn load(&self) -> Result<RegistryTable>;
    /// Reads, applies `change`, writes back, all under a lock that serialises changes; nothing
    /// is written if `change` fails.
    fn update(&self, change: &mut dyn FnMut(&mut RegistryTable) -> Result<()>) -> Result<()>;
}

/// Access to the registry.
#[derive(Debug, Clone)]
pub struct Registry {
    backend: Arc<dyn RegistryBackend>,
}

impl Registry {
    /// The registry kept by `backend`.
    pub fn with(backend: Arc<dyn RegistryBackend>) -> Self {
        Registry { backend }
    }

    /// Where it is kept (what the store contract tests, method by method).
    pub fn backend(&self) -> &dyn RegistryBackend {
        &*self.backend
    }

    /// Reads the registry; a missing one is empty.
    pub fn load(&self) -> Result<RegistryTable> {
        self.backend.load()
    }

    /// The entry for `name`.
    pub fn get(&self, name: &str) -> Result<WorkflowEntry> {
        let mut registry = self.load()?;
        registry.workflows.remove(name).ok_or_else(|| registry.unknown(name))
    }

    /// Changes the registry under its lock: read, apply `change`, write atomically. Nothing is
    /// written if `change` fails or the registry does not read.
    pub fn update<T>(&self, change: impl FnOnce(&mut RegistryTable) -> Result<T>) -> Result<T> {
        let mut change = Some(change);
        let mut out = None;
        self.backend.update(&mut |file| {
            let change = change.take().expect("a registry change is applied once");
            out = Some(change(file)?);
            Ok(())
        })?;
        Ok(out.expect("the change ran"))
    }
}

impl RegistryTable {
    /// Points `name` at `hash`, moving its previous version to history.
    pub fn register(&mut self, name: &str, hash: BundleHash, now: u64) -> Registered {
        match self.workflows.get_mut(name) {
            None => {
                self.workflows.insert(
                    name.to_string(),
                    WorkflowEntry { hash, timestamp: now, history: vec![] },
                );
                Registered::New
            }
            Some(entry) if entry.hash == hash => Registered::Unchanged,
            Some(entry) => {
                let previous = entry.hash;
                entry.history.insert(0, Version { hash: previous, timestamp: entry.timestamp });
                entry.hash = hash;
                entry.timestamp = now;
                Registered::Updated { previous }
            }
        }
    }

    /// Switches `name` to `target` (default: the version before the current one). The
    /// version it leaves becomes the most recent history entry, so a second `rollback`
    /// returns to it. Returns `(from, to)`.
    pub fn rollback(
        &mut self,
        name: &str,
        target: Option<BundleHash>,
        now: u64,
    ) -> Result<(BundleHash, BundleHash)> {
        let unknown = self.unknown(name);
        let entry = self.workflows.get_mut(name).ok_or(unknown)?;
        let index = match target {
            None if entry.history.is_empty() => {
                return Err(Error::NoHistory { name: name.to_string() });
            }
            None => 0,
            Some(hash) => entry.history.iter().position(|v| v.hash == hash).ok_or_else(|| {
                Error::UnknownVersion { name: name.to_string(), hash: hash.to_string() }
            })?,
        };
        let to = entry.history.remove(index).hash;
        let from = entry.hash;
        entry.history.insert(0, Version { hash: from, timestamp: entry.timestamp });
        entry.hash = to;
        entry.timestamp = now;
        Ok((from, to))
    }

    /// Is `hash` the current or a past version of any workflow?
    pub fn references(&self, hash: BundleHash) -> bool {
        self.workflows.values().any(|e| e.hash == hash || e.history.iter().any(|v| v.hash == hash))
    }
}

/// serde_yaml's message already names line and column; keep it on one line.
pub(crate) fn yaml_reason(e: &serde_yaml::Error) -> String {
    e.to_string().replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u8) -> BundleHash {
        BundleHash::of(&[n])
    }

    #[test]
    fn register_and_rollback_keep_every_version() {
        let mut reg = RegistryTable::default();
        assert_eq!(reg.register("w", h(1), 1), Registered::New);
        assert_eq!(reg.register("w", h(1), 2), Registered::Unchanged);
        assert_eq!(reg.register("w", h(2), 3), Registered::Updated { previous: h(1) });
        assert_eq!(reg.register("w", h(3), 4), Registered::Updated { previous: h(2) });
        let history: Vec<_> = reg.workflows["w"].history.iter().map(|v| v.hash).collect();
        assert_eq!(history, vec![h(2), h(1)]);

        assert_eq!(reg.rollback("w", None, 5).unwrap(), (h(3), h(2)));
        assert_eq!(reg.workflows["w"].hash, h(2));
        // A second rollback returns to where the first one left.
        assert_eq!(reg.rollback("w", None, 6).unwrap(), (h(2), h(3)));
        assert_eq!(reg.rollback("w", Some(h(1)), 7).unwrap(), (h(3), h(1)));
        let all: Vec<_> = reg.workflows["w"].history.iter().map(|v| v.hash).collect();
        assert_eq!(all, vec![h(3), h(2)]);
        assert!(matches!(reg.rollback("w", Some(h(9)), 8), Err(Error::UnknownVersion { .. })));
        assert!(matches!(reg.rollback("x", None, 8), Err(Error::UnknownWorkflow { .. })));
        reg.register("fresh", h(4), 9);
        assert!(matches!(reg.rollback("fresh", None, 9), Err(Error::NoHistory { .. })));
    }
}
