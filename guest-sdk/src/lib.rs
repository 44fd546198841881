//! The Rust SDK for uncaged-workflow bundles: roles as data, a pure moderator, one macro.
//!
//! A bundle is a `cdylib` crate that depends on this crate alone. It describes its roles,
//! writes a moderator that picks the next role from the thread so far, and exports itself:
//!
//! ```ignore
//! use uncaged_workflow_sdk::{export_workflow, json, Next, Role, ThreadContext, Workflow};
//!
//! struct Echo;
//!
//! impl Workflow for Echo {
//!     const DESCRIPTION: &'static str = "Says the prompt back, once.";
//!
//!     fn roles() -> Vec<Role> {
//!         vec![Role::new("echo", "Repeats the prompt")
//!             .system_prompt("Repeat the user's prompt.")
//!             .extract_prompt("Put the repeated text in `text`.")
//!             .schema(json!({
//!                 "type": "object",
//!                 "required": ["text"],
//!                 "properties": { "text": { "type": "string" } }
//!             }))]
//!     }
//!
//!     fn moderator(thread: &ThreadContext) -> Next {
//!         if thread.steps.is_empty() { Next::role("echo") } else { Next::done("echoed") }
//!     }
//! }
//!
//! export_workflow!(Echo);
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2 --release` and hand the `.wasm` file to
//! `uncaged-workflow add`.
//!
//! # The engine loop
//!
//! Each call of the host's `next()` runs one step in three phases:
//!
//! 1. the **moderator** looks at the thread (prompt and steps so far) and names the next role
//!    ([`Next::role`]), several roles to run at once ([`Next::parallel`]), or ends the thread;
//! 2. the **agents** bound to those roles by the host answer with text (several at once: the
//!    host runs them concurrently);
//! 3. the **extractor** turns each answer into its role's `meta`, validated against its schema;
//!
//! and the steps `{role, content, meta, timestamp}` are yielded together for the host to
//! persist. The engine keeps the thread's steps itself: the host hands them over once, when
//! the thread starts or resumes.
//!
//! The loop honours the *continuation contract*: a thread started with recorded steps
//! continues after them, which is how the host resumes, pauses and forks threads. It also
//! enforces `max_rounds`: once the thread holds that many steps, it ends with
//! [`RETURN_MAX_ROUNDS`].
#![deny(missing_docs)]

mod engine;
mod role;
mod thread;

pub use engine::{Engine, RoleError, Workflow};
pub use role::Role;
pub use serde_json::{self, Value, json};
pub use thread::{Next, Outcome, Step, ThreadContext};

/// Return code of a thread that finished normally.
pub const RETURN_OK: i32 = 0;
/// Return code of a thread that ended because an agent or the extractor failed.
pub const RETURN_FAILED: i32 = 1;
/// Return code of a thread that reached `max_rounds` before its moderator ended it.
pub const RETURN_MAX_ROUNDS: i32 = 2;

/// Writes to the thread's debug log (`.info.jsonl`) through the host.
pub mod log {
    use crate::bindings::uncaged::workflow::host;
    use crate::bindings::uncaged::workflow::types::LogLevel;

    /// Log at `info` level. `tag` is an 8-character code naming the call site.
    pub fn info(tag: &str, message: &str) {
        host::log(LogLevel::Info, tag, message);
    }

    /// Log at `warn` level.
    pub fn warn(tag: &str, message: &str) {
        host::log(LogLevel::Warn, tag, message);
    }

    /// Log at `debug` level.
    pub fn debug(tag: &str, message: &str) {
        host::log(LogLevel::Debug, tag, message);
    }

    /// Log at `error` level.
    pub fn error(tag: &str, message: &str) {
        host::log(LogLevel::Error, tag, message);
    }
}

/// Raw bindings generated from `wit/`. Bundle authors use the types above instead.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "bundle",
        path: "../wit/workflow.wit",
        pub_export_macro: true,
        export_macro_name: "__export_bundle",
        default_bindings_module: "uncaged_workflow_sdk::bindings",
    });
}

#[doc(hidden)]
pub use wit_bindgen;

/// Exports a [`Workflow`] as the bundle's `workflow` interface. Use it once per bundle.
#[macro_export]
macro_rules! export_workflow {
    ($workflow:ty) => {
        #[doc(hidden)]
        type __UncagedWorkflowEngine = $crate::Engine<$workflow>;
        $crate::bindings::__export_bundle!(__UncagedWorkflowEngine with_types_in $crate::bindings);
    };
}
