//! Declarative workflows in their canonical form, and how they route.
//!
//! A YAML workflow is validated by the host (`uncaged-workflow add`/`build`) into a
//! [`Definition`], serialized as canonical JSON and composed with the interpreter component
//! into one bundle. Inside the sandbox the interpreter reads it back and asks this crate what
//! to do next: [`graph::route`] for a role graph with JSONata conditions, [`dag::plan`] for a
//! DAG of steps with a failure policy. Both decide from the thread's recorded steps alone, so
//! a resumed or forked thread decides as an uninterrupted one did.

pub mod dag;
pub mod expr;
pub mod graph;
mod model;

pub use model::{
    DagStep, Definition, END, FailurePolicy, FanOut, Node, OnStepFailure, Retry, Role, Routing,
    START, STATUS_ROLE, Transition, USER_ROLE, reference,
};

/// A recorded step as routing sees it.
#[derive(Debug, Clone, Copy)]
pub struct StepView<'a> {
    /// The role that ran.
    pub role: &'a str,
    /// Its structured output.
    pub meta: &'a serde_json::Value,
}

/// Return code of a thread whose DAG finished with steps failed or skipped (under
/// `skip_dependents`, or skipped by the user).
pub const RETURN_PARTIAL: i32 = 3;
/// Return code of a thread that stopped on a failure (or was aborted by the user).
pub const RETURN_FAILED: i32 = 1;
/// Return code of a thread that reached its `max_rounds`.
pub const RETURN_MAX_ROUNDS: i32 = 2;
/// The most agent calls a DAG stage makes at once (the host's batch limit).
pub const MAX_PARALLEL: usize = 64;
