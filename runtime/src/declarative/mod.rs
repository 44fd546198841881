//! Declarative workflows: a YAML file (a role graph with JSONata conditions, or a DAG of steps
//! with a failure policy) validated and assembled into one self-contained bundle.
//!
//! The bundle is the interpreter component — built from `declarative/interpreter` and shipped
//! inside this binary, so no toolchain is needed — composed with the definition. It runs
//! sandboxed like any bundle; the routing runs inside it.

mod compose;
pub mod mermaid;
pub mod source;

use std::path::Path;

use uncaged_workflow_declarative::Definition;

use crate::error::{Error, Result};

pub use compose::SOURCE_SECTION;

/// The interpreter component (`make interpreter` rebuilds it; a test checks it is current).
pub const INTERPRETER: &[u8] = include_bytes!("interpreter.wasm");

/// A YAML workflow, validated and assembled.
#[derive(Debug)]
pub struct Assembled {
    /// The bundle: one component.
    pub bytes: Vec<u8>,
    pub definition: Definition,
    /// What starts its threads by itself, if the file says.
    pub trigger: Option<source::TriggerSpec>,
}

/// Is `path` a workflow file (as opposed to a component)? A DAG-protocol plan in JSON is one:
/// JSON is YAML.
pub fn is_source(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

/// Reads, validates and assembles the workflow file at `path`.
pub fn assemble(path: &Path) -> Result<Assembled> {
    let (text, definition, trigger) = source::read(path)?;
    let json = serde_json::to_string(&definition).expect("a definition serializes");
    let bytes = compose::compose(INTERPRETER, &json, &text)
        .map_err(|reason| Error::InvalidBundle { path: path.to_path_buf(), reason })?;
    Ok(Assembled { bytes, definition, trigger })
}

/// The YAML source a declarative bundle carries, if `bytes` is one.
pub fn source_of(bytes: &[u8]) -> Option<String> {
    compose::source_of(bytes)
}
