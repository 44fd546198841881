//! Registered workflows as a user sees them: adding a bundle file under a name, finding the
//! bundle a name stands for, removing a name. Ties the registry, the bundle store and the
//! engine together.

use std::path::Path;

use wasmtime::Store;

use crate::bindings::BundlePre;
use crate::descriptor::Descriptor;
use crate::engine::{CacheOutcome, Runtime, one_line};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::BundleHash;
use crate::limits::Limits;
use crate::registry::{Registered, Registry, WorkflowEntry};
use crate::sandbox::{HostContext, ThreadState};
use crate::store::BundleStore;
use crate::thread_log::now_ms;

/// What `add` did.
#[derive(Debug, Clone)]
pub struct Added {
    pub name: String,
    pub hash: BundleHash,
    pub registered: Registered,
    pub descriptor: Descriptor,
}

/// A bundle ready to run threads: compiled, checked, pre-instantiated.
pub struct LoadedBundle {
    pub name: String,
    pub hash: BundleHash,
    pub descriptor: Descriptor,
    pub pre: BundlePre<ThreadState>,
    pub cache: CacheOutcome,
}

/// The registered workflows of a home.
#[derive(Debug, Clone)]
pub struct Catalog {
    home: Home,
    registry: Registry,
    store: BundleStore,
}

impl Catalog {
    /// The catalog of `home`.
    pub fn new(home: &Home) -> Self {
        Catalog { home: home.clone(), registry: Registry::new(home), store: BundleStore::new(home) }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The bundle store.
    pub fn store(&self) -> &BundleStore {
        &self.store
    }

    /// Validates the component at `path`, stores it, precompiles it into the AOT cache and
    /// registers it under `name` (the previous version goes to history).
    pub async fn add(&self, runtime: &Runtime, name: &str, path: &Path) -> Result<Added> {
        validate_name(name)?;
        // Fail on an unwritable home before the work of compiling.
        crate::durable::create_dir(&self.home.bundles_dir())?;
        let bytes = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::InvalidBundle { path: path.to_path_buf(), reason: "no such file".into() }
            }
            _ => Error::io("read bundle", path)(e),
        })?;
        let hash = BundleHash::of(&bytes);
        // Compiling fills the AOT cache, so the first `run` starts at once.
        let (pre, _) = runtime.load(hash, &bytes, path)?;
        let descriptor = describe(runtime, &pre, path).await?;
        let registered = self.registry.update(|registry| {
            self.store.put(registry, &bytes, &descriptor)?;
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
        let bundle = self.store.load(&registry, name, hash)?;
        let (pre, cache) = runtime.load(hash, &bundle.bytes, &bundle.path)?;
        let descriptor = self.store.descriptor(hash)?;
        Ok(LoadedBundle { name: name.to_string(), hash, descriptor, pre, cache })
    }

    /// Unregisters `name`. Its bundle files stay: threads may still refer to them.
    pub fn remove(&self, name: &str) -> Result<WorkflowEntry> {
        self.registry.update(|registry| {
            registry.workflows.remove(name).ok_or_else(|| Error::UnknownWorkflow(name.to_string()))
        })
    }

    /// The home.
    pub fn home(&self) -> &Home {
        &self.home
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

/// Instantiates the bundle once, in a sandbox with no agents, to read its descriptor.
async fn describe(
    runtime: &Runtime,
    pre: &BundlePre<ThreadState>,
    path: &Path,
) -> Result<Descriptor> {
    let invalid = |reason: String| Error::InvalidBundle { path: path.to_path_buf(), reason };
    let host = HostContext::detached();
    let mut store = Store::new(runtime.engine(), ThreadState::new(host, &Limits::default()));
    store.limiter(|state| &mut state.limiter);
    crate::runner::install_cpu_deadline(&mut store);
    let bundle = pre
        .instantiate_async(&mut store)
        .await
        .map_err(|e| invalid(format!("it fails to start: {}", one_line(&e))))?;
    let raw = bundle
        .uncaged_workflow_workflow()
        .call_descriptor(&mut store)
        .await
        .map_err(|e| invalid(format!("its `descriptor()` failed: {}", one_line(&e))))?;
    Descriptor::from_guest(raw).map_err(invalid)
}
