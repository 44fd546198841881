//! The home directory (`$UNCAGED_WORKFLOW_HOME`, default `~/.uncaged/workflow`) and where
//! everything lives in it: docs/storage.md describes each path.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ids::{BundleHash, ThreadId};

/// Environment variable overriding the home directory.
pub const HOME_ENV: &str = "UNCAGED_WORKFLOW_HOME";

/// The root of all state: `$UNCAGED_WORKFLOW_HOME`, default `~/.uncaged/workflow`.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// A home rooted at `root`; nothing is created until something is written.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Home { root: root.into() }
    }

    /// The home from `$UNCAGED_WORKFLOW_HOME`, or `~/.uncaged/workflow`.
    pub fn from_env() -> Result<Self> {
        if let Some(root) = std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
            return Ok(Home::new(root));
        }
        let user_home =
            std::env::var_os("HOME").filter(|v| !v.is_empty()).ok_or_else(|| Error::Io {
                action: "locate the home directory",
                path: PathBuf::from("~"),
                cause: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("neither {HOME_ENV} nor HOME is set"),
                ),
            })?;
        Ok(Home::new(PathBuf::from(user_home).join(".uncaged").join("workflow")))
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `workflow.yaml`: the registry.
    pub fn registry_file(&self) -> PathBuf {
        self.root.join("workflow.yaml")
    }

    /// The lock taken while the registry or the bundle store is changed.
    pub fn registry_lock(&self) -> PathBuf {
        self.root.join("workflow.lock")
    }

    /// `evals/`: evals, one file per experiment (their threads are threads).
    pub fn evals_dir(&self) -> PathBuf {
        self.root.join("evals")
    }

    /// `api/`: the HTTP API's tokens (their hashes) and request keys.
    pub fn api_dir(&self) -> PathBuf {
        self.root.join("api")
    }

    /// `credentials/`: tool servers' OAuth credentials, a private file each.
    pub fn credentials_dir(&self) -> PathBuf {
        self.root.join("credentials")
    }

    /// `reach/`: what reaching people keeps: `links/` (signed one-time links, by their
    /// token's hash) and `notices/` (deliveries of waits to `notify:` channels, by thread).
    pub fn reach_dir(&self) -> PathBuf {
        self.root.join("reach")
    }

    /// `limits/`: the provider limits' last minute of calls, a file each (`<name>.json`) and
    /// the lock its changes take (`<name>.lock`).
    pub fn limits_dir(&self) -> PathBuf {
        self.root.join("limits")
    }

    /// `config.yaml`: agent bindings and limits.
    pub fn config_file(&self) -> PathBuf {
        self.root.join("config.yaml")
    }

    /// `bundles/`.
    pub fn bundles_dir(&self) -> PathBuf {
        self.root.join("bundles")
    }

    /// `bundles/<HASH>.wasm`.
    pub fn bundle_file(&self, hash: BundleHash) -> PathBuf {
        self.bundles_dir().join(format!("{hash}.wasm"))
    }

    /// `bundles/<HASH>.yaml`: the descriptor read at `add` time.
    pub fn descriptor_file(&self, hash: BundleHash) -> PathBuf {
        self.bundles_dir().join(format!("{hash}.yaml"))
    }

    /// `cache/`: precompiled code, safe to delete.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// `cache/functions/`: compiled functions by the hash of their code, reused across
    /// bundles (see `sandbox::function_cache`); safe to delete.
    pub fn function_cache_dir(&self) -> PathBuf {
        self.cache_dir().join("functions")
    }

    /// `logs/`.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// `run/queue/<ULID>.json`: thread `id` waiting in the home's work queue.
    pub fn queue_entry(&self, id: crate::ids::ThreadId) -> PathBuf {
        self.run_dir().join("queue").join(format!("{id}.json"))
    }

    /// `logs/threads.index`: the listing cache of threads (see `store::thread_index`).
    pub fn thread_index_file(&self) -> PathBuf {
        self.logs_dir().join("threads.index")
    }

    /// `logs/threads.reopened`: the ended threads that were reopened (retried, moved to
    /// another version), for the listing cache (see `store::thread_index`).
    pub fn thread_reopen_log(&self) -> PathBuf {
        self.logs_dir().join("threads.reopened")
    }

    /// `logs/<HASH>/`: the threads of one bundle version.
    pub fn thread_dir(&self, hash: BundleHash) -> PathBuf {
        self.logs_dir().join(hash.to_string())
    }

    /// `logs/<HASH>/<ULID>.data.jsonl`: the thread's durable state.
    pub fn thread_data_file(&self, hash: BundleHash, id: ThreadId) -> PathBuf {
        self.thread_dir(hash).join(format!("{id}.data.jsonl"))
    }

    /// `logs/<HASH>/<ULID>.info.jsonl`: the thread's debug log.
    pub fn thread_info_file(&self, hash: BundleHash, id: ThreadId) -> PathBuf {
        self.thread_dir(hash).join(format!("{id}.info.jsonl"))
    }

    /// `logs/<HASH>/<ULID>.calls.jsonl`: the thread's call journal.
    pub fn thread_calls_file(&self, hash: BundleHash, id: ThreadId) -> PathBuf {
        self.thread_dir(hash).join(format!("{id}.calls.jsonl"))
    }

    /// `schedules/`: each schedule's definition and firing log, and the lock of firing.
    pub fn schedules_dir(&self) -> PathBuf {
        self.root.join("schedules")
    }

    /// `run/`: sockets and locks of live worker processes.
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// `run/<HASH>.lock`: held by the live worker of a bundle for its whole life.
    pub fn worker_lock(&self, hash: BundleHash) -> PathBuf {
        self.run_dir().join(format!("{hash}.lock"))
    }

    /// `run/agents/<ULID>.json`: the agent process groups a thread has running.
    pub fn agent_processes_file(&self, id: ThreadId) -> PathBuf {
        self.run_dir().join("agents").join(format!("{id}.json"))
    }
}
