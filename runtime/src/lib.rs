//! uncaged-workflow: runs multi-role AI agent workflows, each one a sandboxed WebAssembly
//! component, and keeps every thread's steps.
//!
//! The library is layered; each layer uses only the ones before it:
//!
//! 1. base — [`error`], [`ids`], [`clock`], [`cron`], [`home`], [`durable`], [`duration`], [`schema`],
//!    [`limits`], [`http`], [`spending`], [`run_request`], [`procfs`], [`faults`], [`scaffold`],
//!    [`terminal`], [`telemetry`]: no knowledge of workflows beyond names and numbers.
//! 2. [`declarative`] — a YAML workflow validated and composed with the interpreter into a
//!    bundle: bytes in, bytes out.
//! 3. [`store`] — everything kept (records, journals, logs, registry, bundles, config), and
//!    nothing of wasmtime.
//! 4. [`agents`] — who answers a role, and the extractor of its meta.
//! 5. [`sandbox`] — everything wasmtime: engine, bindings, a thread's store, the host imports.
//! 6. [`run`] — the catalog, a thread's lifecycle, the step loop, the worker process and its
//!    socket protocol.
//! 7. [`eval`] — recorded threads run again beside themselves, judged and compared.
//! 8. [`reach`] — waits sent to people through `notify:` channels, and the signed one-time
//!    links that decide them.
//! 9. [`schedule`] — threads that start themselves: cron and poll triggers, fired exactly
//!    once by `schedule tick` or `serve`.
//! 10. [`serve`] — the opt-in long-lived process: the schedule loop, the notifier, the web
//!     view, the API, and the MCP server (also over stdio, for `uncaged-workflow mcp`).
//! 11. [`cli`] — one thin file per subcommand.

pub mod agent_spec;
pub mod agents;
pub mod cli;
pub mod clock;
pub mod cron;
pub mod data_map;
pub mod declarative;
pub mod durable;
pub mod duration;
pub mod env_name;
pub mod error;
pub mod eval;
pub mod faults;
pub mod home;
pub mod http;
pub mod ids;
pub mod limits;
pub mod procfs;
pub mod reach;
pub mod run;
pub mod run_request;
pub mod sandbox;
pub mod scaffold;
pub mod schedule;
pub mod schema;
pub mod serve;
pub mod spending;
pub mod store;
pub mod telemetry;
pub mod terminal;

pub use error::{Error, Result};

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod layering;
