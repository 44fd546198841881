//! Declarative workflows: a YAML file (a role graph with JSONata conditions, or a DAG of steps
//! with a failure policy) validated and assembled into one self-contained bundle.
//!
//! The bundle is the interpreter component — built from `declarative/interpreter` and shipped
//! inside this binary, so no toolchain is needed — composed with the definition. It runs
//! sandboxed like any bundle; the routing runs inside it.

mod compose;
pub mod mermaid;
pub mod outline;
pub mod source;

use std::path::Path;

use uncaged_workflow_declarative::Definition;

use crate::error::{Error, Result};

pub use compose::SOURCE_SECTION;

/// The JSON Schema of a workflow file (`docs/workflow.schema.json`): the published contract,
/// and what the planner is asked to answer to.
pub const SCHEMA: &str = include_str!("../../../docs/workflow.schema.json");

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

/// What the host does for a declarative DAG's steps besides asking their agents, by step (its
/// role): empty for a code bundle, or a workflow whose steps set none of it.
#[derive(Debug, Clone, Default)]
pub struct StepSettings {
    /// The longest an agent call of the step may take (`timeout:`): the host cancels it then.
    pub timeouts: std::collections::HashMap<String, std::time::Duration>,
    /// The workflow the step runs as a child thread (`workflow:`).
    pub children: std::collections::HashMap<String, ChildStep>,
}

/// A step that runs another workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildStep {
    /// The registered workflow's name.
    pub workflow: String,
    /// The child thread's prompt: the step's description.
    pub prompt: String,
}

/// The [`StepSettings`] of the declarative bundle `bytes` is, if it is one.
pub fn step_settings(bytes: &[u8]) -> StepSettings {
    let Some(text) = source_of(bytes) else { return StepSettings::default() };
    // The host validated this source when it built the bundle; a failure here sets nothing.
    let Ok(definition) = source::parse(Path::new("bundle.yaml"), &text) else {
        return StepSettings::default();
    };
    let uncaged_workflow_declarative::Routing::Steps { steps, .. } = definition.routing else {
        return StepSettings::default();
    };
    let mut settings = StepSettings::default();
    for step in steps {
        if let Some(ms) = step.timeout_ms {
            let timeout = std::time::Duration::from_millis(u64::from(ms));
            settings.timeouts.insert(step.id.clone(), timeout);
        }
        if let Some(workflow) = step.workflow {
            let role = definition.roles.iter().find(|r| r.name == step.id);
            let prompt = role.map(|r| r.description.clone()).unwrap_or_default();
            settings.children.insert(step.id, ChildStep { workflow, prompt });
        }
    }
    settings
}
