//! The wasmtime embedding: one engine configuration, the linker every thread uses, the AOT
//! cache of compiled bundles, and the check that a component fits the `bundle` world.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::function_cache::FunctionCache;
use wasmtime::component::{Component, HasSelf, Linker, types::ComponentItem};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::{self, Bundle, Contract, v0_1, v0_2};
use super::instance::BundlePre;
use super::state::{EPOCH_TICK, HostContext, ThreadState, new_store, within_budget};
use crate::durable;
use crate::error::{Error, Result, chain_line};
use crate::home::Home;
use crate::ids::{BundleHash, Digest};
use crate::limits::Limits;
use crate::store::descriptor::Descriptor;

/// The WIT name a bundle exports its workflow under, before `@version`.
const WORKFLOW_EXPORT: &str = "uncaged:workflow/workflow";

/// The engine, the linker and the home's AOT cache. One per process, shared by all threads.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<ThreadState>>,
    home: Home,
    engine_key: String,
    allocator: Allocator,
    /// A worker's: the instances it may keep live at once (`limits.live-instances`), and how
    /// long a thread waits on its agents before it gives its instance up (`evict-after`).
    /// `None` where a process runs one thread.
    instances: Option<InstanceCache>,
}

/// Live instances as a bounded cache: a slot per instance, handed out in the order asked.
#[derive(Clone)]
struct InstanceCache {
    slots: Arc<tokio::sync::Semaphore>,
    evict_after: std::time::Duration,
}

/// A thread's hold on one of a worker's live instances, given back when dropped.
pub struct InstanceSlot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// How a runtime allocates instances (reported by workers and benchmarks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocator {
    /// Each instance maps its own memory, tables and fiber stack.
    OnDemand,
    /// Instances come from pools reserved up front for this many threads.
    Pooling { threads: u32 },
    /// Pooling was asked for but the pool could not be reserved (why), so on demand.
    OnDemandFallback(String),
}

impl std::fmt::Display for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Allocator::OnDemand => f.write_str("on demand"),
            Allocator::Pooling { threads } => write!(f, "pooling ({threads} threads)"),
            Allocator::OnDemandFallback(why) => write!(f, "on demand (pool refused: {why})"),
        }
    }
}

/// A bundle ready to run threads: compiled, checked against the world, pre-instantiated.
pub struct LoadedBundle {
    /// The workflow name it was loaded for.
    pub name: String,
    pub hash: BundleHash,
    pub descriptor: Descriptor,
    /// Each role's schema, compiled: every step the bundle yields is checked against its
    /// role's.
    pub schemas: std::collections::BTreeMap<String, std::sync::Arc<jsonschema::Validator>>,
    /// Each role's system prompt, shared by every thread's agent contexts.
    pub system_prompts: Arc<std::collections::HashMap<String, String>>,
    /// Each role's schema as JSON, for what a person's answer must hold.
    pub role_schemas: Arc<std::collections::HashMap<String, serde_json::Value>>,
    /// What the host does for a declarative DAG's steps besides asking agents: timeouts,
    /// child workflows.
    pub step_settings: Arc<crate::declarative::StepSettings>,
    pub pre: BundlePre,
    pub cache: CacheOutcome,
}

/// Where a compiled bundle came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded precompiled code from `cache/`.
    Hit,
    /// Compiled now (and written to `cache/`).
    Miss,
}

impl Runtime {
    /// Builds an engine that allocates instances on demand (for commands that run at most one
    /// thread), its linker, and the epoch ticker that bounds guest CPU time.
    pub fn new(home: &Home) -> Result<Self> {
        Self::with_config(home, base_config(), Allocator::OnDemand)
    }

    /// Builds an engine for a worker: instances come from a pooling allocator sized for
    /// `limits.live_instances` instances of at most `limits.memory_bytes` each. Pooling makes
    /// instantiation cheaper and keeps thousands of live instances within the kernel's
    /// memory-map limit; the pool's own bounds back the limits up. A worker runs more threads
    /// than it has instances: one waiting on its agents gives its instance up.
    pub fn for_worker(home: &Home, limits: &Limits) -> Result<Self> {
        let threads = u32::try_from(limits.live_instances).unwrap_or(u32::MAX / 64).max(1);
        let instances = Some(InstanceCache {
            slots: Arc::new(tokio::sync::Semaphore::new(threads as usize)),
            evict_after: limits.evict_after,
        });
        let mut runtime = Self::pooled(home, limits, threads)?;
        runtime.instances = instances;
        Ok(runtime)
    }

    fn pooled(home: &Home, limits: &Limits, threads: u32) -> Result<Self> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(threads + POOL_SLACK)
            .total_core_instances((threads + POOL_SLACK).saturating_mul(CORE_INSTANCES_PER_THREAD))
            .total_memories(
                (threads + POOL_SLACK).saturating_mul(MEMORIES_PER_THREAD).min(MAX_MEMORY_SLOTS),
            )
            .total_tables((threads + POOL_SLACK).saturating_mul(TABLES_PER_THREAD))
            .total_stacks(threads + POOL_SLACK)
            .max_core_instances_per_component(64)
            .max_memories_per_component(MEMORIES_PER_THREAD)
            .max_tables_per_component(TABLES_PER_THREAD)
            .max_memory_size(limits.memory_bytes)
            .table_elements(limits.table_elements);
        let mut config = base_config();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        match Self::with_config(home, config, Allocator::Pooling { threads }) {
            Ok(runtime) => Ok(runtime),
            Err(e) => {
                // A machine that cannot reserve the pool still runs threads, one allocation
                // at a time.
                tracing::warn!("pooling allocator unavailable ({e}); allocating on demand");
                Self::with_config(home, base_config(), Allocator::OnDemandFallback(e.to_string()))
            }
        }
    }

    fn with_config(home: &Home, mut config: Config, allocator: Allocator) -> Result<Self> {
        // Functions compiled once are reused by every later compile: above all, every
        // declarative bundle is the same interpreter with another definition.
        config
            .enable_incremental_compilation(Arc::new(FunctionCache::new(home.function_cache_dir())))
            .map_err(|e| internal("enable the function cache", e))?;
        let engine = Engine::new(&config).map_err(|e| internal("create the wasmtime engine", e))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| internal("link WASI", e))?;
        Bundle::add_to_linker::<ThreadState, HasSelf<ThreadState>>(&mut linker, |state| state)
            .map_err(|e| internal("link the host interface", e))?;
        v0_2::Bundle::add_to_linker::<ThreadState, HasSelf<ThreadState>>(&mut linker, |state| {
            state
        })
        .map_err(|e| internal("link the 0.2.0 host interface", e))?;
        v0_1::Bundle::add_to_linker::<ThreadState, HasSelf<ThreadState>>(&mut linker, |state| {
            state
        })
        .map_err(|e| internal("link the 0.1.0 host interface", e))?;

        let weak = engine.weak();
        std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .map_err(Error::io("start the epoch thread", "epoch-ticker"))?;

        let mut hasher = twox_hash::XxHash64::with_seed(0);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = Digest::from_value(hasher.finish()).to_string();
        Ok(Runtime {
            engine,
            linker: Arc::new(linker),
            home: home.clone(),
            engine_key,
            allocator,
            instances: None,
        })
    }

    /// A slot for one live instance: at once where the runtime keeps no cache of them, else
    /// once one is free (threads are served in the order they asked).
    pub async fn instance_slot(&self) -> InstanceSlot {
        let Some(cache) = &self.instances else { return InstanceSlot { _permit: None } };
        // The semaphore is never closed.
        InstanceSlot { _permit: cache.slots.clone().acquire_owned().await.ok() }
    }

    /// How long a thread waits on its agents before it gives its instance up; `None` where
    /// a thread keeps its instance to the end (a process running one thread).
    pub fn evict_after(&self) -> Option<std::time::Duration> {
        self.instances.as_ref().map(|cache| cache.evict_after)
    }

    /// How this runtime allocates instances.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `cache/<HASH>-<engine>.cwasm`: keyed by bundle and by engine version + configuration,
    /// so code compiled by another build is never loaded.
    pub fn cache_file(&self, hash: BundleHash) -> PathBuf {
        self.home.cache_dir().join(format!("{hash}-{}.cwasm", self.engine_key))
    }

    /// Compiles `bytes` (or loads them precompiled from the cache) and checks the component
    /// against the `bundle` world. `path` names the file in errors.
    pub fn load(
        &self,
        hash: BundleHash,
        bytes: &[u8],
        path: &Path,
    ) -> Result<(BundlePre, CacheOutcome)> {
        let (component, outcome) = match self.load_cached(hash) {
            Some(component) => (component, CacheOutcome::Hit),
            None => {
                let component = compile(&self.engine, bytes, path)?;
                self.store_cached(hash, &component);
                (component, CacheOutcome::Miss)
            }
        };
        let pre = self.check_world(&component, path)?;
        Ok((pre, outcome))
    }

    fn load_cached(&self, hash: BundleHash) -> Option<Component> {
        let path = self.cache_file(hash);
        if !path.exists() {
            return None;
        }
        // SAFETY: the file was written by `store_cached` from `Component::serialize` under
        // this home, and its name carries the engine's compatibility hash. wasmtime checks
        // the header and refuses code from another engine version or configuration; a file
        // it refuses is treated as a miss and rewritten. The home directory is trusted like
        // the binary itself (see SECURITY notes in the README).
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize_file(&self.engine, &path) };
        match loaded {
            Ok(component) => {
                tracing::info!(target: "uncaged_workflow::cache", "AOT cache hit: loaded {}", path.display());
                Some(component)
            }
            Err(e) => {
                tracing::warn!("ignoring unusable AOT cache file {}: {e:#}", path.display());
                None
            }
        }
    }

    fn store_cached(&self, hash: BundleHash, component: &Component) {
        let path = self.cache_file(hash);
        let bytes = match component.serialize() {
            Ok(bytes) => bytes,
            Err(e) => return tracing::warn!("cannot serialize compiled bundle {hash}: {e}"),
        };
        match durable::write_atomic(&path, &bytes) {
            Ok(()) => {
                tracing::info!(target: "uncaged_workflow::cache", "AOT cache miss: compiled and wrote {}", path.display())
            }
            // The cache only saves time; failing to fill it must not fail the command. A home
            // that cannot be written to is used as it is, quietly: the command says so itself
            // if it must write (in one line), and a read is no reason to warn.
            Err(crate::Error::Io { cause, .. })
                if matches!(
                    cause.kind(),
                    std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                tracing::debug!("cannot write AOT cache file {}: {cause}", path.display())
            }
            Err(e) => tracing::warn!("cannot write AOT cache file {}: {e}", path.display()),
        }
    }

    /// Instantiates the bundle once, in a sandbox with no agents, to read its descriptor.
    /// `path` names the bundle in errors.
    pub async fn describe(
        &self,
        pre: &BundlePre,
        path: &Path,
        limits: &Limits,
    ) -> Result<Descriptor> {
        let invalid = |reason: String| Error::InvalidBundle { path: path.to_path_buf(), reason };
        let state = ThreadState::new(HostContext::detached(), &Limits::default());
        let mut store = new_store(&self.engine, state);
        let clock = store.data().clock().clone();
        let bundle = within_budget(&clock, pre.instantiate(&mut store))
            .await
            .map_err(|e| invalid(format!("it fails to start: {}", chain_line(&e))))?;
        clock.start_step();
        let raw = within_budget(&clock, bundle.descriptor(&mut store))
            .await
            .map_err(|e| invalid(format!("its `descriptor()` failed: {}", chain_line(&e))))?;
        let mut descriptor =
            Descriptor::check(raw.description, raw.max_rounds, raw.roles, raw.input_schema, limits)
                .map_err(invalid)?;
        descriptor.contract = pre.contract().version().to_string();
        Ok(descriptor)
    }

    /// Checks imports and exports against the world of the contract version the component
    /// exports, and pre-instantiates.
    fn check_world(&self, component: &Component, path: &Path) -> Result<BundlePre> {
        let invalid = |reason: String| Error::InvalidBundle { path: path.to_path_buf(), reason };
        let ty = component.component_type();
        let exported = ty.exports(&self.engine).find_map(|(name, item)| {
            let version = name.strip_prefix(WORKFLOW_EXPORT)?.strip_prefix('@')?;
            matches!(item.ty, ComponentItem::ComponentInstance(_)).then(|| version.to_string())
        });
        // Imports first: what a component wants from the host is refused before anything else.
        // Its contract imports must be of the version it exports.
        let contract_import = |name: &str| {
            ["uncaged:workflow/host@", "uncaged:workflow/types@"].iter().any(|prefix| {
                name.strip_prefix(prefix).is_some_and(|v| match &exported {
                    Some(version) => v == version,
                    None => Contract::from_version(v).is_some(),
                })
            })
        };
        for (name, _) in ty.imports(&self.engine) {
            if !(contract_import(name) || name.starts_with("wasi:")) {
                return Err(invalid(format!(
                    "it imports `{name}`, which the host does not provide (a bundle may import \
                     only uncaged:workflow/host of the contract it exports, and WASI p2)"
                )));
            }
        }
        let Some(version) = exported else {
            return Err(invalid(format!(
                "it does not export `{WORKFLOW_EXPORT}`: not an uncaged-workflow bundle (build \
                 it against wit/ with the SDK)"
            )));
        };
        let Some(contract) = Contract::from_version(&version) else {
            // The bundle's text: kept to what a version can hold.
            let shown: String = version.chars().filter(char::is_ascii_graphic).take(32).collect();
            let (last, earlier) = Contract::ALL.split_last().expect("a contract");
            let earlier: Vec<_> = earlier.iter().map(|c| c.version()).collect();
            return Err(invalid(format!(
                "it targets contract uncaged:workflow@{shown}, which this host does not run (it \
                 runs {} and {})",
                earlier.join(", "),
                last.version()
            )));
        };
        let pre = self
            .linker
            .instantiate_pre(component)
            .map_err(|e| invalid(format!("it does not fit the host: {}", chain_line(&e))))?;
        let mismatch = |e: wasmtime::Error| {
            invalid(format!("it does not match the {contract} `bundle` world: {}", chain_line(&e)))
        };
        Ok(match contract {
            Contract::V0_1 => BundlePre::V0_1(v0_1::BundlePre::new(pre).map_err(mismatch)?),
            Contract::V0_2 => BundlePre::V0_2(v0_2::BundlePre::new(pre).map_err(mismatch)?),
            Contract::V0_3 => BundlePre::V0_3(bindings::BundlePre::new(pre).map_err(mismatch)?),
        })
    }
}

/// Settings every engine shares. Nothing here may differ between engines that share the AOT
/// cache except the allocation strategy, which does not change generated code.
fn base_config() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // CPU deadlines and `kill` interrupt guest code at epoch checks.
    config.epoch_interruption(true);
    config
}

/// Pool slots beyond `max-threads`, for instances that are not threads (descriptors).
const POOL_SLACK: u32 = 8;
/// Pool budget per thread: generous for Rust guests (1 memory, ~4 core instances), enough for
/// the Python and JavaScript runtimes' components.
const CORE_INSTANCES_PER_THREAD: u32 = 16;
const MEMORIES_PER_THREAD: u32 = 4;
const TABLES_PER_THREAD: u32 = 8;
/// Each linear-memory slot reserves 4 GiB of address space plus a 32 MiB guard (what lets
/// compiled code skip bounds checks), and x86-64 gives a process 128 TiB: the pool takes at
/// most half of that. Sized at four memories a thread for every thread, a worker allowed
/// 10,000 threads would ask for 160 TiB, fail to reserve its pool and fall back to allocating
/// on demand, which costs more kernel mappings per thread than the pool. Capped, a
/// one-memory bundle (Rust) gets its 10,000 threads and a bundle with several memories runs
/// out of slots (a clear "pool exhausted" error) before it runs out of address space.
const MAX_MEMORY_SLOTS: u32 = 16_384;

/// Compiles a component, turning wasmtime's errors into what a user can act on.
fn compile(engine: &Engine, bytes: &[u8], path: &Path) -> Result<Component> {
    let invalid = |reason: String| Error::InvalidBundle { path: path.to_path_buf(), reason };
    check_header(bytes).map_err(|reason| invalid(reason.into()))?;
    Component::new(engine, bytes)
        .map_err(|e| invalid(format!("not a valid WebAssembly component: {}", chain_line(&e))))
}

/// Bytes a component starts with that say what it is: magic, version, layer.
pub const HEADER_LEN: usize = 8;

/// Checks the first [`HEADER_LEN`] bytes of a file that should be a component, so that
/// anything else is refused before it is read whole.
pub fn check_header(bytes: &[u8]) -> std::result::Result<(), &'static str> {
    if bytes.len() < HEADER_LEN || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly file (it does not start with the `\\0asm` magic bytes)");
    }
    // Bytes 4..8: version and layer. Core modules are layer 0, components layer 1.
    if bytes[6..8] == [0, 0] {
        return Err("a core WebAssembly module, not a component: build the bundle for \
                    `wasm32-wasip2` (or wrap it with `wasm-tools component new`)");
    }
    Ok(())
}

fn internal(action: &str, e: wasmtime::Error) -> Error {
    Error::Host(format!("cannot {action}: {}", chain_line(&e)))
}
