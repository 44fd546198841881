//! Roles as data: identity, prompts and the JSON Schema of the structured output.

use serde_json::Value;

/// A role of a workflow: pure data, no behaviour. The host binds an agent to it at run time.
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    /// Unique name within the workflow, e.g. `planner`.
    pub name: String,
    /// One line for humans: what this role does.
    pub description: String,
    /// Instructions given to the role's agent.
    pub system_prompt: String,
    /// Guidance given to the extractor that turns the agent's answer into `meta`.
    pub extract_prompt: String,
    /// JSON Schema of the role's `meta`.
    pub schema: Value,
}

impl Role {
    /// A role with a name and a description, an empty prompt and a schema accepting any object.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Role {
            name: name.into(),
            description: description.into(),
            system_prompt: String::new(),
            extract_prompt: String::new(),
            schema: serde_json::json!({ "type": "object" }),
        }
    }

    /// Sets the instructions given to the role's agent.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Sets the guidance given to the extractor.
    pub fn extract_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.extract_prompt = prompt.into();
        self
    }

    /// Sets the JSON Schema of the role's `meta`.
    pub fn schema(mut self, schema: Value) -> Self {
        self.schema = schema;
        self
    }
}
