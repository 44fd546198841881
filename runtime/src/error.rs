//! Library errors that callers match on, and the process exit codes they map to.

use std::path::PathBuf;

/// Exit codes of the `uncaged-workflow` binary, so scripts can tell failures apart.
///
/// A thread's own return code (0–63 by convention) is passed through by `run`; host-side
/// failures use the `sysexits.h` range above it.
pub mod exit {
    /// Bad command line (unknown flag, missing argument, malformed id).
    pub const USAGE: i32 = 64;
    /// Bad input data: a file that is not a bundle, a corrupt registry or config.
    pub const DATA: i32 = 65;
    /// Something named does not exist: workflow, thread, bundle file.
    pub const NOT_FOUND: i32 = 66;
    /// The host failed running a thread: a trap, an exceeded limit, an internal error.
    pub const SOFTWARE: i32 = 70;
    /// The thread is not in a state that allows the command (running, ended, not running).
    pub const STATE: i32 = 75;
    /// Reading or writing the home directory failed.
    pub const IO: i32 = 74;
    /// The store's database cannot be reached.
    pub const UNAVAILABLE: i32 = 69;
    /// The store's database refused the credentials.
    pub const NO_PERMISSION: i32 = 77;
    /// The store is not one this binary can use: another application's, or a newer schema.
    pub const CONFIG: i32 = 78;
    /// A recorded thread does not replay through a bundle (`replay`), or could not move to
    /// it (`upgrade`).
    pub const DIVERGED: i32 = 79;
    /// `eval`: a thread regressed (its recorded thread passed its judges, the eval's fails).
    pub const REGRESSED: i32 = 80;
    /// Interrupted (Ctrl-C), or the thread was killed (128 + SIGINT).
    pub const INTERRUPTED: i32 = 130;

    /// Every exit code and what it means: the one table that `--help` prints and the
    /// documentation shows (a test holds the documentation to it).
    pub const TABLE: &[(&str, &str)] = &[
        (
            "0",
            "success (for `run`, `resume`, `fork`, `answer`, `step`: the workflow returned 0); \
             also when the reader of stdout went away (`| head`)",
        ),
        (
            "1-63",
            "the workflow's own return code, passed through (the SDK uses 1 for a failed agent \
             or extraction, 2 for max rounds reached); a workflow code outside 0-63 exits 1, so \
             no bundle can exit like the host",
        ),
        (
            "64",
            "usage error: a bad flag or value (a step or role a thread does not have, an agent \
             spec that cannot be used), a malformed id, an empty answer",
        ),
        (
            "65",
            "invalid input data: not a bundle or workflow file, over a limit, a corrupt \
             registry or config.yaml (a bad binding in it), a recorded step too large to \
             continue, an answer that is not what the role asks for",
        ),
        ("66", "not found: workflow, thread, schedule, bundle, a file named on the command line"),
        ("69", "the store's database cannot be reached, or has no such database"),
        ("70", "the host ended the thread (a trap, a limit, a broken contract) or its worker died"),
        ("74", "I/O error reading or writing the home (a full disk, a read-only home)"),
        (
            "75",
            "the thread is not in a state for the command (running, paused, ended); `run` and \
             `resume` also exit 75 when their thread paused or waits for a human",
        ),
        ("77", "the store's database refused the credentials, or its TLS certificate is untrusted"),
        (
            "78",
            "the store's database belongs to another application, or was migrated by a newer \
             uncaged-workflow",
        ),
        (
            "79",
            "`replay`: a recorded thread diverges from the bundle; `upgrade`: a thread was \
             refused, its new version diverging from what it recorded",
        ),
        (
            "80",
            "`eval`: a thread regressed (its recorded thread passed its judges, the eval's thread \
             fails them)",
        ),
        ("130", "interrupted (Ctrl-C), or the thread was killed"),
    ];

    /// [`TABLE`] as `--help` ends: a heading, then one code per line, meanings aligned.
    pub fn help() -> String {
        const INDENT: usize = 8;
        const WIDTH: usize = 96;
        let mut text = String::from("Exit codes:");
        for (code, meaning) in TABLE {
            let mut line = format!("  {code:<5} ");
            for word in meaning.split(' ') {
                if line.len() + word.len() > WIDTH && line.len() > INDENT {
                    text.push('\n');
                    text.push_str(line.trim_end());
                    line = " ".repeat(INDENT);
                }
                line.push_str(word);
                line.push(' ');
            }
            text.push('\n');
            text.push_str(line.trim_end());
        }
        text
    }

    /// [`TABLE`] as a Markdown table, as the documentation shows it.
    pub fn markdown() -> String {
        let mut text = String::from("| code | meaning |\n|---|---|\n");
        for (code, meaning) in TABLE {
            text.push_str(&format!("| {code} | {} |\n", meaning.replace('|', "\\|")));
        }
        text
    }
}

/// Why the store's database cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFailure {
    /// The connection string does not parse.
    Usage,
    /// No server answers, or it has no such database.
    Unreachable,
    /// The server refused the user or password, or we refused its TLS certificate.
    Credentials,
    /// The database belongs to another application.
    Foreign,
    /// The store was migrated by a newer version of this program.
    NewerSchema,
    /// A statement failed.
    Query,
}

/// Errors from the uncaged-workflow library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line asks for something that cannot be done as asked.
    #[error("{0}")]
    Usage(String),

    /// An id given by the user does not parse.
    #[error("invalid {kind} `{id}`: expected {expected}")]
    InvalidId { kind: &'static str, id: String, expected: &'static str },

    /// No workflow is registered under this name; `closest` is the registered name nearest
    /// to it, if one is near enough to be what was meant.
    #[error("no workflow named `{name}` ({})", match closest {
        Some(near) => format!("did you mean `{near}`?"),
        None => "see `uncaged-workflow list`".into(),
    })]
    UnknownWorkflow { name: String, closest: Option<String> },

    /// No schedule has this name.
    #[error("no schedule named `{0}` (see `uncaged-workflow schedule list`)")]
    UnknownSchedule(String),

    /// A request key (`Idempotency-Key`) came back with another request.
    #[error("idempotency key `{0}` was used for another request; use a new key for a new request")]
    KeyReused(String),

    /// No API token has this name.
    #[error("no token named `{0}` (see `uncaged-workflow token list`)")]
    UnknownToken(String),

    /// No thread with this id exists.
    #[error("no thread `{0}` (see `uncaged-workflow threads`)")]
    UnknownThread(String),

    /// The thread is being run by another process.
    #[error("thread `{0}` is running (see `uncaged-workflow ps`)")]
    ThreadBusy(String),

    /// The thread cannot do what was asked in its current state.
    #[error("thread `{id}` is {status}: {reason}")]
    ThreadState { id: String, status: &'static str, reason: String },

    /// A file that should be a bundle is not one.
    #[error("{}: {reason}", path.display())]
    InvalidBundle { path: PathBuf, reason: String },

    /// A YAML or JSON file the host reads does not parse.
    /// A declarative workflow file that does not validate, at the place it goes wrong.
    #[error("{}:{line}:{column}: {message}", path.display())]
    InvalidWorkflow { path: PathBuf, line: usize, column: usize, message: String },

    #[error("{}: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },

    /// A file named on the command line, or one the home should hold, does not exist.
    #[error("{what} {} does not exist", path.display())]
    MissingFile { what: &'static str, path: PathBuf },

    /// A recorded step is too large to hand back to the bundle.
    #[error(
        "thread `{id}`: step {step} (line {line} of its data file) is {}, over the string \
         limit ({}; limits.string); fork the thread before that step to continue it",
        bytesize::ByteSize(*size as u64).display().iec(),
        bytesize::ByteSize(*limit as u64).display().iec()
    )]
    RecordTooLarge { id: String, step: usize, line: usize, size: usize, limit: usize },

    /// A registered bundle's file is gone.
    #[error("bundle `{hash}` of workflow `{name}` is missing: {} does not exist", path.display())]
    MissingBundle { name: String, hash: String, path: PathBuf },

    /// `rollback` has nothing to roll back to.
    #[error("workflow `{name}` has no earlier version to roll back to")]
    NoHistory { name: String },

    /// `rollback <hash>` names a version not in the workflow's history.
    #[error(
        "workflow `{name}` has no version `{hash}` in its history (see `uncaged-workflow history {name}`)"
    )]
    UnknownVersion { name: String, hash: String },

    /// A limit in config.yaml cannot be used as written.
    #[error("limit `{key}`: {reason}")]
    InvalidLimit { key: String, reason: String },

    /// The data a thread is to start with does not fit its workflow's input schema; no
    /// thread was created.
    #[error(
        "workflow `{workflow}` does not take this data: {reason} ({}); `uncaged-workflow show {workflow}` shows its input schema",
        crate::schema::location(path)
    )]
    InvalidInput {
        workflow: String,
        /// Where in the data (a JSON Pointer, empty for the whole value).
        path: String,
        reason: String,
    },

    /// `--max-rounds` asks for more than the host allows.
    #[error("max rounds {asked} is over the host's hard cap of {cap} (limits.max-rounds)")]
    RoundsOverCap { asked: u32, cap: u32 },

    /// An agent binding cannot be used as written: one given on the command line (a usage
    /// error), or one config.yaml defines (bad data).
    #[error("agent binding `{binding}`{}: {reason}", if *in_config { " in config.yaml" } else { "" })]
    InvalidAgent { binding: String, reason: String, in_config: bool },

    /// A person's answer is not what the role asks for; nothing was recorded.
    #[error(
        "thread `{id}`: the answer for role `{role}` does not fit: {reason}; answer with JSON like {expected}"
    )]
    InvalidAnswer { id: String, role: String, reason: String, expected: String },

    /// The planner gave no plan that validates within its attempts.
    #[error(
        "the planner gave no plan that validates in {attempts} attempt(s); the last one: {reason}"
    )]
    PlanInvalid { attempts: u32, reason: String },

    /// The planner agent gave no answer at all.
    #[error("planner agent `{agent}`: {reason}")]
    PlannerFailed { agent: String, reason: String },

    /// A worker process reported a failure; `code` is the exit code it maps to.
    #[error("{message}")]
    Remote { message: String, code: i32 },

    /// The connection to a bundle's worker broke (the worker died) while it was handed
    /// thread `thread`, or ran it; the thread is left at rest, as a crash leaves it.
    #[error("lost the worker of bundle {hash} (thread {thread}): {cause}")]
    WorkerLost { thread: String, hash: String, cause: String },

    /// The host itself failed (wasmtime setup, an internal invariant).
    #[error("{0}")]
    Host(String),

    /// The store's database cannot be used, or a statement on it failed.
    #[error("store {target}: {reason}")]
    Database { target: String, failure: DatabaseFailure, reason: String },

    /// This process's lease on a thread expired and another worker took the thread over:
    /// nothing more of it may be written from here.
    #[error(
        "thread `{0}` was taken over by another worker (this process's lease on it expired); \
         it writes nothing more to it"
    )]
    LeaseLost(String),

    /// A bundle's bytes in the database do not match their id or their SHA-256.
    #[error("bundle `{hash}` in {place}: {reason}")]
    CorruptBundle { hash: String, place: String, reason: String },

    /// Filesystem trouble, with what was being done.
    // The cause is part of the message, not a `source`, so an error chain prints it once.
    #[error("{action} {}: {cause}", path.display())]
    Io { action: &'static str, path: PathBuf, cause: std::io::Error },
}

impl Error {
    /// Whether this is the store's database being out of reach (down, restarting, cut off):
    /// something to wait out and retry, not a fault of what was being done.
    pub fn is_database_unavailable(&self) -> bool {
        matches!(self, Error::Database { failure: DatabaseFailure::Unreachable, .. })
    }

    /// Whether this says a thread is held by another process (here, or as a worker's reply):
    /// someone else is moving it on.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::ThreadBusy(_) => true,
            Error::Remote { code, .. } => *code == exit::STATE,
            _ => false,
        }
    }

    /// The process exit code this error maps to.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::InvalidId { .. } | Error::Usage(_) | Error::KeyReused(_) => exit::USAGE,
            Error::UnknownWorkflow { .. }
            | Error::UnknownThread(_)
            | Error::UnknownSchedule(_)
            | Error::UnknownToken(_)
            | Error::MissingBundle { .. }
            | Error::MissingFile { .. }
            | Error::UnknownVersion { .. } => exit::NOT_FOUND,
            Error::InvalidBundle { .. }
            | Error::InvalidWorkflow { .. }
            | Error::Corrupt { .. }
            | Error::InvalidAgent { in_config: true, .. }
            | Error::InvalidAnswer { .. }
            | Error::InvalidInput { .. }
            | Error::InvalidLimit { .. }
            | Error::RecordTooLarge { .. }
            | Error::PlanInvalid { .. } => exit::DATA,
            Error::PlannerFailed { .. } => exit::UNAVAILABLE,
            Error::RoundsOverCap { .. } | Error::InvalidAgent { in_config: false, .. } => {
                exit::USAGE
            }
            Error::NoHistory { .. } => exit::USAGE,
            Error::ThreadBusy(_) | Error::ThreadState { .. } => exit::STATE,
            Error::Io { .. } => exit::IO,
            Error::Database { failure, .. } => match failure {
                DatabaseFailure::Usage => exit::USAGE,
                DatabaseFailure::Unreachable => exit::UNAVAILABLE,
                DatabaseFailure::Credentials => exit::NO_PERMISSION,
                DatabaseFailure::Foreign | DatabaseFailure::NewerSchema => exit::CONFIG,
                DatabaseFailure::Query => exit::IO,
            },
            Error::LeaseLost(_) => exit::STATE,
            Error::CorruptBundle { .. } => exit::DATA,
            Error::Host(_) | Error::WorkerLost { .. } => exit::SOFTWARE,
            Error::Remote { code, .. } => *code,
        }
    }

    /// A failure to write to standard output.
    pub fn stdout(cause: std::io::Error) -> Error {
        Error::Io { action: "write to", path: PathBuf::from("standard output"), cause }
    }

    /// Is this a write to a reader that has gone (a closed pipe)? Such a command ends quietly.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Io { cause, .. } if cause.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// A thread that has ended was asked to continue.
    pub fn ended(id: impl std::fmt::Display, status: &'static str) -> Error {
        Error::ThreadState {
            id: id.to_string(),
            status,
            reason: "it has ended; `fork` it to continue from one of its steps".into(),
        }
    }

    /// Wraps an I/O error with the action and path.
    pub fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |cause| Error::Io { action, path, cause }
    }
}

/// An error and its causes on one line (`{e:#}` with newlines folded): how every error chain
/// is printed, by the binary and in messages that quote another error.
pub fn chain_line(e: &dyn std::fmt::Display) -> String {
    format!("{e:#}").replace('\n', " ")
}

/// The one of `options` closest to `word`, if one is close enough to be what was meant (a
/// typo): every "did you mean" of the product.
pub fn closest<'a>(word: &str, options: &[&'a str]) -> Option<&'a str> {
    options
        .iter()
        .map(|o| (strsim::jaro_winkler(word, o), *o))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, o)| o)
}

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
