//! Registered workflows as a user sees them: adding a bundle file under a name, finding the
//! bundle a name stands for, removing a name. Where the registry and the bundle store meet
//! the engine.

use std::path::Path;
use std::sync::Arc;

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::BundleHash;
use crate::limits::{Limits, Size};
use crate::sandbox::engine::{HEADER_LEN, LoadedBundle, Runtime, check_header};
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
        Catalog { registry: store.registry().clone(), bundles: store.bundles().clone() }
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
    pub async fn add(
        &self,
        runtime: &Runtime,
        name: &str,
        path: &Path,
        limits: &Limits,
    ) -> Result<Added> {
        validate_name(name)?;
        // A workflow file is validated and assembled before the home is touched: a file that
        // does not validate leaves nothing behind.
        let bytes = bundle_bytes(path, limits)?;
        // Fail on an unwritable home before the work of compiling.
        self.bundles.prepare()?;
        let hash = BundleHash::of(&bytes);
        // Compiling fills the AOT cache, so the first `run` starts at once.
        let (pre, _) = runtime.load(hash, &bytes, path)?;
        let descriptor = runtime.describe(&pre, path, limits).await?;
        let registered = self.registry.update(|registry| {
            self.bundles.put(registry, &bytes, &descriptor)?;
            Ok(registry.register(name, hash, now_ms()))
        })?;
        Ok(Added { name: name.to_string(), hash, registered, descriptor })
    }

    /// The workflow `text` names: a registered name, or the hash of a workflow's current
    /// version (what an API client that pinned a version sends).
    pub fn name_of(&self, text: &str) -> Result<String> {
        let registry = self.registry.load()?;
        if registry.workflows.contains_key(text) {
            return Ok(text.to_string());
        }
        if let Ok(hash) = text.parse::<BundleHash>()
            && let Some((name, _)) = registry.workflows.iter().find(|(_, e)| e.hash == hash)
        {
            return Ok(name.clone());
        }
        Err(registry.unknown(text))
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
        let parts = BundleParts { name, hash, bytes: &bundle.bytes, path: &bundle.path };
        loaded(parts, descriptor, pre, cache)
    }

    /// Loads the bundle file at `path` (a component, or a workflow file built on the spot) as
    /// workflow `name` would run it, without storing or registering anything: what `replay`
    /// checks recorded threads against.
    pub async fn load_file(
        runtime: &Runtime,
        name: &str,
        path: &Path,
        limits: &Limits,
    ) -> Result<LoadedBundle> {
        let bytes = bundle_bytes(path, limits)?;
        Self::compiled(runtime, name, path, &bytes, limits).await
    }

    /// Loads the bundle file at `path` as [`load_file`](Self::load_file) does, and stores it
    /// (not registered: no version of `name` changes) for threads to run on it: what an eval
    /// runs recorded threads on, and runs again after a crash.
    pub async fn store_file(
        &self,
        runtime: &Runtime,
        name: &str,
        path: &Path,
        limits: &Limits,
    ) -> Result<LoadedBundle> {
        let bytes = bundle_bytes(path, limits)?;
        self.bundles.prepare()?;
        let bundle = Self::compiled(runtime, name, path, &bytes, limits).await?;
        self.registry.update(|registry| self.bundles.put(registry, &bytes, &bundle.descriptor))?;
        Ok(bundle)
    }

    /// `bytes` (read from `path`) compiled, or taken from the AOT cache, and described.
    async fn compiled(
        runtime: &Runtime,
        name: &str,
        path: &Path,
        bytes: &[u8],
        limits: &Limits,
    ) -> Result<LoadedBundle> {
        let hash = BundleHash::of(bytes);
        let (pre, cache) = runtime.load(hash, bytes, path)?;
        let descriptor = runtime.describe(&pre, path, limits).await?;
        loaded(BundleParts { name, hash, bytes, path }, descriptor, pre, cache)
    }

    /// Unregisters `name`. Its bundle files stay: threads may still refer to them.
    pub fn remove(&self, name: &str) -> Result<WorkflowEntry> {
        self.registry.update(|registry| {
            let unknown = registry.unknown(name);
            registry.workflows.remove(name).ok_or(unknown)
        })
    }
}

/// Reads a file to add as a bundle: only a regular file, only after its first bytes say it is
/// a component, and no more than `max` bytes of it — a FIFO, a device or a huge sparse file is
/// refused before it is read.
fn read_bundle_file(path: &Path, max: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let invalid = |reason: String| Error::InvalidBundle { path: path.to_path_buf(), reason };
    let metadata = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile { what: "bundle", path: path.into() },
        _ => Error::io("read bundle", path)(e),
    })?;
    if !metadata.is_file() {
        let kind = if metadata.is_dir() { "a directory" } else { "not a regular file" };
        return Err(invalid(format!("{kind}: a bundle is a `.wasm` file")));
    }
    if metadata.len() > max as u64 {
        return Err(invalid(format!(
            "it is {}, over the bundle size limit ({}; limits.bundle-size)",
            Size(metadata.len() as usize),
            Size(max)
        )));
    }
    let file = std::fs::File::open(path).map_err(Error::io("read bundle", path))?;
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    let mut reader = file.take(max as u64 + 1);
    (&mut reader)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut bytes)
        .map_err(Error::io("read bundle", path))?;
    check_header(&bytes).map_err(|reason| invalid(reason.into()))?;
    reader.read_to_end(&mut bytes).map_err(Error::io("read bundle", path))?;
    if bytes.len() > max {
        return Err(invalid(format!(
            "it grew past the bundle size limit ({}; limits.bundle-size) while being read",
            Size(max)
        )));
    }
    Ok(bytes)
}

/// The bundle at `path`: a component as it is, or a workflow file assembled into one.
fn bundle_bytes(path: &Path, limits: &Limits) -> Result<Vec<u8>> {
    if crate::declarative::is_source(path) {
        Ok(crate::declarative::assemble(path)?.bytes)
    } else {
        read_bundle_file(path, limits.bundle_bytes)
    }
}

/// Workflow names become file-free registry keys and CLI arguments: keep them simple.
fn validate_name(name: &str) -> Result<()> {
    crate::ids::validate_name("workflow name", name)
}

/// What a bundle is loaded from.
struct BundleParts<'a> {
    name: &'a str,
    hash: BundleHash,
    bytes: &'a [u8],
    path: &'a Path,
}

/// A compiled bundle and its descriptor, ready to run threads: its roles' schemas compiled,
/// and what the host reads from a declarative bundle's definition.
fn loaded(
    parts: BundleParts<'_>,
    descriptor: Descriptor,
    pre: crate::sandbox::instance::BundlePre,
    cache: crate::sandbox::engine::CacheOutcome,
) -> Result<LoadedBundle> {
    let mut schemas = std::collections::BTreeMap::new();
    for role in &descriptor.roles {
        let validator = crate::schema::compile(&role.schema.to_string()).map_err(|reason| {
            Error::InvalidBundle {
                path: parts.path.to_path_buf(),
                reason: format!("role `{}` has an invalid JSON Schema: {reason}", role.name),
            }
        })?;
        schemas.insert(role.name.clone(), validator);
    }
    let system_prompts = Arc::new(
        descriptor.roles.iter().map(|r| (r.name.clone(), r.system_prompt.clone())).collect(),
    );
    let role_schemas =
        Arc::new(descriptor.roles.iter().map(|r| (r.name.clone(), r.schema.clone())).collect());
    let step_settings = Arc::new(crate::declarative::step_settings(parts.bytes));
    Ok(LoadedBundle {
        name: parts.name.to_string(),
        hash: parts.hash,
        descriptor,
        schemas,
        system_prompts,
        role_schemas,
        step_settings,
        pre,
        cache,
    })
}
