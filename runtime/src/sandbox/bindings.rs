//! The one host-side `bindgen!` of the `bundle` world in `wit/`.
//!
//! Imports are async (agents do I/O) and trappable (an exceeded limit or a host fault ends the
//! guest with a trap instead of an error it could ignore).

wasmtime::component::bindgen!({
    world: "bundle",
    path: "../wit",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use exports::uncaged::workflow::workflow::Step;
pub use uncaged::workflow::types::{
    AgentError, AgentRequest, BundleDescriptor, ExtractError, ExtractRequest, LogLevel, RoleOutput,
    RunInput, RunOptions, ThreadContext, WorkflowResult,
};
