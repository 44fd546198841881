//! A bundle's descriptor: its description, roles and input schema, read from the bundle at
//! `add` time and kept beside it as `bundles/<HASH>.yaml`.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::limits::{Limits, Size};

/// What a bundle says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    /// What the workflow does.
    pub description: String,
    /// Rounds a thread may take when `run` is not given `--max-rounds`.
    #[serde(rename = "maxRounds")]
    pub max_rounds: u32,
    /// The roles, in the order the bundle lists them.
    pub roles: Vec<RoleSpec>,
    /// JSON Schema of the data a thread starts with (contract 0.3.0 on); absent, a thread
    /// takes any data. Every start is validated against it (see [`Descriptor::check_input`]).
    #[serde(rename = "inputSchema", default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<serde_json::Value>,
    /// The version of the WIT contract the bundle targets (`0.2.0`); descriptors recorded
    /// before there was more than one are `0.1.0`.
    #[serde(default = "first_contract")]
    pub contract: String,
}

fn first_contract() -> String {
    "0.1.0".into()
}

/// Why a thread's data does not fit its workflow's input schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRefused {
    /// Where in the data (a JSON Pointer, empty for the whole value).
    pub path: String,
    /// What is wrong there.
    pub reason: String,
}

/// One role, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleSpec {
    pub name: String,
    pub description: String,
    #[serde(rename = "systemPrompt")]
    pub system_prompt: String,
    #[serde(rename = "extractPrompt")]
    pub extract_prompt: String,
    /// JSON Schema of the role's meta.
    pub schema: serde_json::Value,
}

/// A role as a bundle states it, its schema still JSON text: what [`Descriptor::check`]
/// takes.
#[derive(Debug, Clone)]
pub struct RoleText {
    pub name: String,
    pub description: String,
    pub system_prompt: String,
    pub extract_prompt: String,
    pub schema: String,
}

/// The longest role name.
pub const MAX_ROLE_NAME: usize = 64;

impl Descriptor {
    /// Checks what a bundle says about itself: within the `roles` and `descriptor` limits,
    /// unique role names of printable characters, schemas (the roles' and the input's) that
    /// are JSON and valid, bounded JSON Schema. The error says which role is wrong and why.
    pub fn check(
        description: String,
        max_rounds: u32,
        raw: Vec<RoleText>,
        input_schema: Option<String>,
        limits: &Limits,
    ) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("its descriptor declares no roles".into());
        }
        if raw.len() > limits.roles {
            return Err(format!(
                "its descriptor declares {} roles, over the limit of {} (limits.roles)",
                raw.len(),
                limits.roles
            ));
        }
        let size = description.len()
            + input_schema.as_ref().map_or(0, String::len)
            + raw
                .iter()
                .map(|r| {
                    r.name.len()
                        + r.description.len()
                        + r.system_prompt.len()
                        + r.extract_prompt.len()
                        + r.schema.len()
                })
                .sum::<usize>();
        if size > limits.descriptor_bytes {
            return Err(format!(
                "its descriptor is {}, over the descriptor limit ({}; limits.descriptor)",
                Size(size),
                Size(limits.descriptor_bytes)
            ));
        }
        let mut names = HashSet::new();
        let mut roles = Vec::with_capacity(raw.len());
        for role in raw {
            let printable = !role.name.is_empty()
                && role.name.len() <= MAX_ROLE_NAME
                && !role.name.chars().any(|c| c.is_control() || c.is_whitespace());
            if !printable {
                return Err(format!(
                    "its descriptor has a role name {:?} that is not 1-{MAX_ROLE_NAME} bytes of \
                     printable characters without spaces",
                    role.name.chars().take(MAX_ROLE_NAME).collect::<String>()
                ));
            }
            if !names.insert(role.name.clone()) {
                return Err(format!("its descriptor declares role `{}` twice", role.name));
            }
            let schema: serde_json::Value = serde_json::from_str(&role.schema)
                .map_err(|e| format!("role `{}` has a schema that is not JSON: {e}", role.name))?;
            // Compiled into the process's cache: the threads' extractions reuse it.
            crate::schema::compile(&role.schema)
                .map_err(|e| format!("role `{}` has an invalid JSON Schema: {e}", role.name))?;
            roles.push(RoleSpec {
                name: role.name,
                description: role.description,
                system_prompt: role.system_prompt,
                extract_prompt: role.extract_prompt,
                schema,
            });
        }
        let input_schema = match input_schema {
            None => None,
            Some(text) => {
                let schema = serde_json::from_str(&text)
                    .map_err(|e| format!("its input schema is not JSON: {e}"))?;
                crate::schema::compile(&text)
                    .map_err(|e| format!("its input schema is not a valid JSON Schema: {e}"))?;
                Some(schema)
            }
        };
        // The caller, which knows the component, sets the contract.
        Ok(Descriptor { description, max_rounds, roles, input_schema, contract: first_contract() })
    }

    /// Checks the data a thread of this workflow is to start with against the workflow's
    /// input schema. No data reads as an empty object, so that a schema requiring nothing
    /// accepts a start without data and one requiring a field refuses it. The error says
    /// where the data is wrong.
    pub fn check_input(&self, data: Option<&serde_json::Value>) -> Result<(), InputRefused> {
        let Some(schema) = &self.input_schema else { return Ok(()) };
        let empty = serde_json::Value::Object(Default::default());
        let data = data.unwrap_or(&empty);
        // Checked and compiled at `add`: this is the process's cached validator.
        let validator = crate::schema::compile(&schema.to_string()).map_err(|reason| {
            InputRefused { path: String::new(), reason: format!("its input schema: {reason}") }
        })?;
        match validator.validate(data) {
            Ok(()) => Ok(()),
            Err(error) => Err(InputRefused {
                path: error.instance_path().to_string(),
                reason: error.to_string(),
            }),
        }
    }

    /// The role named `name`.
    pub fn role(&self, name: &str) -> Option<&RoleSpec> {
        self.roles.iter().find(|r| r.name == name)
    }
}
