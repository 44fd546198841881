//! Everything the product keeps, and nothing of wasmtime: thread records, call journals, debug
//! logs, the registry of workflows, bundle files and their descriptors, and `config.yaml`.
//!
//! A store is a home directory (the embedded default) or a PostgreSQL database shared by many
//! machines (the private `postgres` module). Every concept has one trait and an implementation
//! for each, named alike: threads ([`ThreadStore`]: `FileThreads`, `PgThreads`), their call
//! journals ([`journal::CallLog`]), the registry and bundles ([`registry::RegistryBackend`],
//! [`bundles::BundleBackend`]), schedules ([`schedules::ScheduleBackend`]), the work queue
//! ([`queue::WorkQueue`]: `FileQueue`, `PgQueue`), the HTTP API's tokens
//! ([`tokens::TokenBackend`]), request keys ([`request_keys::RequestKeys`]) and tool servers'
//! OAuth credentials ([`credentials::CredentialBackend`]), and provider limits
//! ([`capacity::CapacityBackend`]). Nothing above this module asks which store
//! it is on. The interface is synchronous: each call is one short read or append, made
//! between guest steps. The home directory stays local either way: the configuration, the
//! AOT cache and the worker sockets of this machine.

pub mod bundles;
pub mod call_loop;
pub mod capacity;
pub mod config;
pub mod credentials;
pub mod debug_log;
pub mod descriptor;
pub mod evals;
pub mod files;
pub mod journal;
pub mod limiter;
pub mod links;
pub mod notices;
pub mod notify_config;
pub mod pauses;
mod postgres;
pub mod push_configs;
pub mod queue;
pub mod records;
pub mod registry;
pub mod request_keys;
pub mod schedules;
pub mod serve_config;
pub mod started_by;
pub mod steps;
pub mod summaries;
pub mod tokens;
pub mod tool_servers;
pub mod upgrades;

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};

use self::bundles::BundleStore;
use self::config::Config;
use self::debug_log::{DebugLine, DebugLog, LogSink};
use self::journal::{CallLog, Journal, JournalLine};
use self::queue::WorkQueue;
use self::records::{EndRecord, Paused, StartRecord, StepRecord, ThreadRecord, ThreadSummary};
use self::registry::Registry;

/// Where threads are kept.
pub trait ThreadStore: Send + Sync + fmt::Debug {
    /// Creates a thread with its start record, its initial steps (a fork's prefix) and the
    /// calls those steps made; the returned writer holds the thread's run lock.
    fn create(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
    ) -> Result<(Box<dyn ThreadWriter>, ThreadRecord)>;

    /// Creates a thread as [`create`](Self::create) does, held by nobody: for a thread handed
    /// to a worker next. A creator that dies before the hand-over leaves a thread at rest
    /// (`interrupted`, which a schedule's next pass or `resume` hands over), never one held by
    /// a dead process until its lease runs out.
    fn create_at_rest(
        &self,
        start: &StartRecord,
        steps: &[StepRecord],
        calls: &[JournalLine],
    ) -> Result<ThreadRecord> {
        let (writer, mut record) = self.create(start, steps, calls)?;
        drop(writer);
        record.running = false;
        Ok(record)
    }

    /// Takes a thread's run lock and reads it back, to continue it. Fails with
    /// [`Error::ThreadBusy`](crate::Error::ThreadBusy) if another process runs it.
    fn open(&self, id: ThreadId) -> Result<(Box<dyn ThreadWriter>, ThreadRecord)>;

    /// Reads a thread as it is now.
    fn read(&self, id: ThreadId) -> Result<ThreadRecord>;

    /// Every thread's id, oldest first.
    fn list(&self) -> Result<Vec<ThreadId>>;

    /// What was stored for thread `id` after its record `after` (0-based; -1 for all), and
    /// whether a process holds it or it waits in the queue: what a follower reads each poll,
    /// without reading the whole thread again. `None` if there is no such thread.
    fn changes(&self, id: ThreadId, after: i64) -> Result<Option<Changes>>;

    /// The thread `text` names: a whole id, or a prefix of one that only one thread has
    /// ([`ThreadId::MIN_PREFIX`] characters at least, as `git` and `docker` take them). An
    /// ambiguous prefix is refused with the threads it could mean.
    fn resolve(&self, text: &str) -> Result<ThreadId> {
        let prefix = match ThreadId::named(text)? {
            crate::ids::IdText::Whole(id) => return Ok(id),
            crate::ids::IdText::Prefix(prefix) => prefix,
        };
        let mut matches: Vec<ThreadId> = Vec::new();
        for id in self.list()? {
            if id.encode(&mut [0; 26]).starts_with(&prefix) {
                matches.push(id);
            }
        }
        match matches.as_slice() {
            [] => Err(crate::Error::UnknownThread(text.to_string())),
            [one] => Ok(*one),
            many => {
                const SHOWN: usize = 5;
                let mut listed: Vec<String> =
                    many.iter().take(SHOWN).map(|id| id.to_string()).collect();
                if many.len() > SHOWN {
                    listed.push(format!("and {} more", many.len() - SHOWN));
                }
                Err(crate::Error::Usage(format!(
                    "thread id prefix `{text}` is ambiguous: it could be {}",
                    listed.join(", ")
                )))
            }
        }
    }

    /// Every thread as listings show it, oldest first. Threads that cannot be read are left
    /// out (with a warning): one damaged thread must not hide the others.
    fn summaries(&self) -> Result<Vec<ThreadSummary>>;

    /// Deletes a thread with its journal and debug log (under its run lock), in a way a crash
    /// cannot leave half-done: once a removal starts the thread is gone, and what a crash
    /// leaves of it is finished by the next removal.
    fn remove(&self, id: ThreadId) -> Result<()>;

    /// Removes the ended threads `ids` (what `threads prune` selected), as [`ThreadStore::remove`]
    /// does, skipping any that a process took up meanwhile: the ones removed. A database
    /// removes many at once.
    fn remove_ended(&self, ids: &[ThreadId]) -> Result<Vec<ThreadId>> {
        let mut removed = Vec::with_capacity(ids.len());
        for &id in ids {
            match self.remove(id) {
                Ok(()) => removed.push(id),
                Err(Error::ThreadBusy(_) | Error::UnknownThread(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// Finishes removals a crash interrupted.
    fn finish_removals(&self) -> Result<()>;

    /// Where the call journal of a thread is kept (read from, appended to).
    fn call_log(&self, hash: BundleHash, id: ThreadId) -> Result<Box<dyn CallLog>>;

    /// The call journal of a thread, with the calls recorded so far.
    fn journal(&self, hash: BundleHash, id: ThreadId) -> Result<Journal> {
        Journal::new(self.call_log(hash, id)?)
    }

    /// Where the debug log of a thread is written.
    fn debug_sink(&self, hash: BundleHash, id: ThreadId) -> Result<Box<dyn LogSink>>;

    /// The debug log of a thread.
    fn debug_log(&self, hash: BundleHash, id: ThreadId) -> Result<DebugLog> {
        Ok(DebugLog::new(self.debug_sink(hash, id)?))
    }

    /// The last `max` lines of a thread's debug log (damaged lines left out).
    fn debug_tail(&self, hash: BundleHash, id: ThreadId, max: usize) -> Result<Vec<DebugLine>>;
}

/// Records of a thread stored after some point, and whether it is at work.
#[derive(Debug)]
pub struct Changes {
    /// Whether a process holds the thread (its run lock, its lease).
    pub held: bool,
    /// Whether it waits in the queue (nobody holds it).
    pub queued: bool,
    /// The records, with their positions (0-based).
    pub lines: Vec<(i64, String)>,
}

impl Changes {
    /// Adds these records to `parsed`; returns the last one's position, if any.
    pub fn add_to(self, parsed: &mut records::ThreadLines) -> Option<i64> {
        let mut last = None;
        for (position, line) in self.lines {
            parsed.push(position as usize + 1, line.as_bytes());
            last = Some(position);
        }
        last
    }
}

/// A thread held open by the one process that runs it: its records, appended durably (each
/// is stored when the call returns). Dropping it releases the run lock.
pub trait ThreadWriter: Send + fmt::Debug {
    /// Appends role outputs: one step, or the steps of a parallel group, stored together
    /// (a group cut short by a crash is dropped by readers, and undone when the thread is
    /// opened to continue). Resolves once they are durable; meanwhile the caller's thread is
    /// free (a database commits the steps of many threads together).
    fn append_steps<'a>(
        &'a mut self,
        steps: &'a [StepRecord],
    ) -> futures::future::BoxFuture<'a, Result<()>>;
    /// Appends a pause marker.
    fn append_pause(&mut self, paused: Paused) -> Result<()>;
    /// Appends a continuation marker: the thread, at rest by its records, is taken up again
    /// by `by` (see [`records::ContinueRecord`]).
    fn append_continued(&mut self, by: &str) -> Result<()>;
    /// Appends the end record.
    fn append_end(&mut self, end: &EndRecord) -> Result<()>;
    /// Appends a move to another version of the workflow.
    fn append_upgrade(&mut self, upgrade: &upgrades::UpgradeRecord) -> Result<()>;
    /// Appends a retry of the failed thread (in one record, with the steps it carries).
    fn append_retry(&mut self, retry: &upgrades::RetryRecord) -> Result<()>;
}

/// Where everything is kept: threads, registry and bundles (in the home directory or a
/// database), and this machine's configuration. (Named apart from `wasmtime::Store`, a guest
/// instance's state.)
#[derive(Debug, Clone)]
pub struct Storage {
    home: Home,
    registry: Registry,
    bundles: BundleStore,
    schedules: Arc<dyn schedules::ScheduleBackend>,
    threads: Arc<dyn ThreadStore>,
    queue: Arc<dyn WorkQueue>,
    tokens: Arc<dyn tokens::TokenBackend>,
    evals: Arc<dyn evals::EvalBackend>,
    request_keys: Arc<dyn request_keys::RequestKeys>,
    links: Arc<dyn links::LinkBackend>,
    notices: Arc<dyn notices::NoticeBackend>,
    push_configs: Arc<dyn push_configs::PushConfigBackend>,
    credentials: Arc<dyn credentials::CredentialBackend>,
    capacity: Arc<dyn capacity::CapacityBackend>,
    /// This process's calls in line for the provider limits (one line per limit, shared by
    /// every thread the process runs).
    limiter: Arc<limiter::Limiter>,
    /// The connection string of a database store, handed to the worker processes this one
    /// starts (in their environment, never on their command line).
    url: Option<String>,
    /// Hand-overs of starts answered once queued, still under way in this process (a home
    /// directory's `serve`): waited for before it exits. None: a start is handed over before
    /// it is answered.
    hand_overs: Option<tokio_util::task::TaskTracker>,
}

/// The environment variable that names the store (`postgres://…`).
pub const STORE_ENV: &str = "UNCAGED_WORKFLOW_STORE";

impl Storage {
    /// The store kept in the home directory `home`.
    pub fn open(home: &Home) -> Self {
        let capacity: Arc<dyn capacity::CapacityBackend> =
            Arc::new(files::capacity::FileCapacity::new(home));
        Storage {
            home: home.clone(),
            registry: Registry::with(Arc::new(files::registry::FileRegistry::new(home))),
            bundles: BundleStore::with(Arc::new(files::registry::FileBundles::new(home))),
            schedules: Arc::new(files::schedules::FileSchedules::new(home)),
            threads: Arc::new(files::threads::FileThreads::new(home)),
            queue: Arc::new(files::queue::FileQueue::new(home)),
            tokens: Arc::new(files::tokens::FileTokens::new(home)),
            evals: Arc::new(files::evals::FileEvals::new(home)),
            request_keys: Arc::new(files::request_keys::FileRequestKeys::new(home)),
            links: Arc::new(files::links::FileLinks::new(home)),
            notices: Arc::new(files::notices::FileNotices::new(home)),
            push_configs: Arc::new(files::push_configs::FilePushConfigs::new(home)),
            credentials: Arc::new(files::credentials::FileCredentials::new(home)),
            capacity: capacity.clone(),
            limiter: Arc::new(limiter::Limiter::new(capacity)),
            url: None,
            hand_overs: None,
        }
    }

    /// The store `url` names (`postgres://…`), or the home directory when there is none; `home`
    /// keeps this machine's configuration and caches either way.
    pub fn connect(home: &Home, url: Option<&str>) -> Result<Self> {
        let Some(url) = url else { return Ok(Storage::open(home)) };
        if !postgres::is_url(url) {
            return Err(crate::Error::Usage(format!(
                "store `{}`: expected a postgres:// or postgresql:// connection string \
                 (without one, the home directory is the store)",
                postgres::redact(url)
            )));
        }
        let pg = postgres::Postgres::connect(url)?;
        let capacity: Arc<dyn capacity::CapacityBackend> =
            Arc::new(postgres::capacity::PgCapacity::new(&pg));
        Ok(Storage {
            home: home.clone(),
            registry: Registry::with(Arc::new(postgres::registry::PgRegistry::new(&pg))),
            bundles: BundleStore::with(Arc::new(postgres::registry::PgBundles::new(&pg))),
            schedules: Arc::new(postgres::schedules::PgSchedules::new(&pg)),
            threads: Arc::new(postgres::threads::PgThreads::new(&pg)),
            queue: Arc::new(postgres::queue::PgQueue::new(&pg)),
            tokens: Arc::new(postgres::tokens::PgTokens::new(&pg)),
            evals: Arc::new(postgres::evals::PgEvals::new(&pg)),
            request_keys: Arc::new(postgres::request_keys::PgRequestKeys::new(&pg)),
            links: Arc::new(postgres::links::PgLinks::new(&pg)),
            notices: Arc::new(postgres::notices::PgNotices::new(&pg)),
            push_configs: Arc::new(postgres::push_configs::PgPushConfigs::new(&pg)),
            credentials: Arc::new(postgres::credentials::PgCredentials::new(&pg)),
            capacity: capacity.clone(),
            limiter: Arc::new(limiter::Limiter::new(capacity)),
            url: Some(url.to_string()),
            hand_overs: None,
        })
    }

    /// The work queue: where threads wait for a worker, and how workers take them.
    pub fn queue(&self) -> &dyn WorkQueue {
        &*self.queue
    }

    /// This store, with starts answered once their thread is queued, and handed to a worker
    /// after the answer (by this process, with its secrets): for a process that stays, and
    /// waits for [`hand_overs`](Self::hand_overs) before it exits (`serve`). A database's
    /// starts are answered once queued anyway (its workers claim them).
    pub fn handing_over_after_answer(mut self) -> Self {
        self.hand_overs = Some(tokio_util::task::TaskTracker::new());
        self
    }

    /// The hand-overs still under way of starts answered once queued, if this store answers
    /// them so ([`handing_over_after_answer`](Self::handing_over_after_answer)).
    pub fn hand_overs(&self) -> Option<&tokio_util::task::TaskTracker> {
        self.hand_overs.as_ref()
    }

    /// The connection string of a database store.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The home directory (local state: configuration, AOT cache, worker sockets).
    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The threads.
    pub fn threads(&self) -> &dyn ThreadStore {
        &*self.threads
    }

    /// The registry of workflows.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The stored bundles and their descriptors.
    pub fn bundles(&self) -> &BundleStore {
        &self.bundles
    }

    /// The schedules that start threads by themselves.
    pub fn schedules(&self) -> &dyn schedules::ScheduleBackend {
        &*self.schedules
    }

    /// The evals (experiments) kept beside the threads.
    pub fn evals(&self) -> &dyn evals::EvalBackend {
        &*self.evals
    }

    /// The HTTP API's tokens.
    pub fn tokens(&self) -> &dyn tokens::TokenBackend {
        &*self.tokens
    }

    /// The keys that make a retried request start one thread.
    pub fn request_keys(&self) -> &dyn request_keys::RequestKeys {
        &*self.request_keys
    }

    /// The signed one-time links sent to people about waits.
    pub fn links(&self) -> &dyn links::LinkBackend {
        &*self.links
    }

    /// The deliveries of waits to `notify:` channels.
    pub fn notices(&self) -> &dyn notices::NoticeBackend {
        &*self.notices
    }

    /// Where A2A clients asked to be told of their tasks' changes.
    pub fn push_configs(&self) -> &dyn push_configs::PushConfigBackend {
        &*self.push_configs
    }

    /// The OAuth credentials of tool servers (`tools login`), shared with the agent calls
    /// that sign in with them.
    pub fn credentials(&self) -> Arc<dyn credentials::CredentialBackend> {
        self.credentials.clone()
    }

    /// The provider limits' shared state (`limits:` in config.yaml), which every thread of
    /// every worker on this store draws from.
    pub fn capacity(&self) -> Arc<dyn capacity::CapacityBackend> {
        self.capacity.clone()
    }

    /// This process's side of the provider limits: where its threads' calls wait their turn.
    pub fn limiter(&self) -> &Arc<limiter::Limiter> {
        &self.limiter
    }

    /// `config.yaml`: agent bindings and limits.
    pub fn config(&self) -> Result<Config> {
        Config::load(&self.home.config_file())
    }
}
