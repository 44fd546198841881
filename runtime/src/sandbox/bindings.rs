//! The host-side `bindgen!` of each version of the contract in `wit/`: 0.3.0, the current one
//! (`wit/workflow.wit`), and 0.2.0 and 0.1.0 (`wit/<version>/workflow.wit`), which bundles
//! built before it still target. All are linked into every runtime; a bundle is run through
//! the one it exports (see [`Contract`]).
//!
//! Imports are async (agents do I/O) and trappable (an exceeded limit or a host fault ends the
//! guest with a trap instead of an error it could ignore).

wasmtime::component::bindgen!({
    world: "bundle",
    path: "../wit/workflow.wit",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use exports::uncaged::workflow::workflow::Step;
pub use uncaged::workflow::types::{
    AgentCall, AgentError, BundleDescriptor, ExtractError, ExtractRequest, LogLevel, RoleOutput,
    RunInput, RunOptions, WorkflowResult,
};

/// The 0.2.0 contract: as 0.3.0's, without the descriptor's input schema.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        world: "bundle",
        path: "../wit/0.2.0/workflow.wit",
        imports: { default: async | trappable },
        exports: { default: async },
    });

    pub use exports::uncaged::workflow::workflow::Step;
    pub use uncaged::workflow::types::{RoleOutput, RunInput, RunOptions};
}

/// The 0.1.0 contract: one agent at a time, each request carrying the thread.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        world: "bundle",
        path: "../wit/0.1.0/workflow.wit",
        imports: { default: async | trappable },
        exports: { default: async },
    });

    pub use exports::uncaged::workflow::workflow::Step;
    pub use uncaged::workflow::types::{AgentRequest, RoleOutput, RunInput, RunOptions};
}

/// A version of the contract the host runs bundles of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Contract {
    V0_1,
    V0_2,
    V0_3,
}

impl Contract {
    /// Every version the host runs, oldest first.
    pub const ALL: [Contract; 3] = [Contract::V0_1, Contract::V0_2, Contract::V0_3];

    /// The version as WIT writes it (`0.3.0`).
    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
            Contract::V0_3 => "0.3.0",
        }
    }

    /// The version named `version`, if the host runs it.
    pub fn from_version(version: &str) -> Option<Contract> {
        Contract::ALL.into_iter().find(|c| c.version() == version)
    }
}

impl std::fmt::Display for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uncaged:workflow@{}", self.version())
    }
}
