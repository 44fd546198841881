//! Registered workflows as a user sees them: adding a bundle file under a name, finding the
//! bundle a name stands for, removing a name. Where the registry and the bundle store meet
//! the engine.

use std::path::Path;

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::BundleHash;
use crate::sandbox::engine::{LoadedBundle, Runtime};
use crate::store::Storage;
use crate::store::bundles::BundleStore;
use crate::store::descriptor::Descriptor;
use crate::store::registry::{Registered, Registry, WorkflowEntry};

/// What `add` did.
#[derive(Debug, Clone)]
pub struct Added {
    pub name: String,
    pub hash: BundleHash,
    pub registered: Registered,
    pub descriptor: Descriptor,
}

/// The registered workflows of a home.
#[derive(Debug, Clone)]
pub struct Catalog {
    registry: Registry,
    bundles: BundleStore,
}

impl Catalog {
    /// The catalog kept in `store`.
    pub fn new(store: &Storage) -> Self {
        Catalog { registry: store.registry(), bundles: store.bundles() }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The stored bundles.
    pub fn bundles(&self) -> &BundleStore {
        &self.bundles
    }

    /// Validates the component at `path`, stores it, precompiles it into the AOT cache and
    /// registers it under `name` (the previous version goes to history).
    pub async fn add(&self, runtime: &Runtime, name: &str, path: &Path) -> Result<Added> {
        validate_name(name)?;
        // Fail on an unwritable home before the work of compiling.
        self.bundles.prepare()?;
        let bytes = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::InvalidBundle { path: path.to_path_buf(), reason: "no such file".into() }
            }
            _ => Error::io("read bundle", path)(e),
        })?;
        let hash = BundleHash::of(&bytes);
        // Compiling fills the AOT cache, so the first `run` starts at once.
        let (pre, _) = runtime.load(hash, &bytes, path)?;
        let descriptor = runtime.describe(&pre, path).await?;
        let registered = self.registry.update(|registry| {
            self.bundles.put(registry, &bytes, &descriptor)?;
            Ok(registry.register(name, hash, now_ms()))
        })?;
        Ok(Added { name: name.to_string(), hash, registered, descriptor })
    }

    /// The entry of `name`.
    pub fn entry(&self, name: &str) -> Result<WorkflowEntry> {
        self.registry.get(name)
    }

    /// Loads the bundle `hash` (verified against its SHA-256) for workflow `name`, from the
    /// AOT cache when possible.
    pub fn load(&self, runtime: &Runtime, name: &str, hash: BundleHash) -> Result<LoadedBundle> {
        let registry = self.registry.load()?;
        let bundle = self.bundles.load(&registry, name, hash)?;
        let (pre, cache) = runtime.load(hash, &bundle.bytes, &bundle.path)?;
        let descriptor = self.bundles.descriptor(hash)?;
        Ok(LoadedBundle { name: name.to_string(), hash, descriptor, pre, cache })
    }

    /// Unregisters `name`. Its bundle files stay: threads may still refer to them.
    pub fn remove(&self, name: &str) -> Result<WorkflowEntry> {
        self.registry.update(|registry| {
            registry.workflows.remove(name).ok_or_else(|| Error::UnknownWorkflow(name.to_string()))
        })
    }
}

/// Workflow names become file-free registry keys and CLI arguments: keep them simple.
fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidId {
            kind: "workflow name",
            id: name.to_string(),
            expected: "1-64 characters from A-Z a-z 0-9 - _ . not starting with - or .",
        })
    }
}
