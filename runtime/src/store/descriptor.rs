//! A bundle's descriptor: its description and roles, read from the bundle at `add` time and
//! kept beside it as `bundles/<HASH>.yaml`.

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
    /// The version of the WIT contract the bundle targets (`0.2.0`); descriptors recorded
    /// before there was more than one are `0.1.0`.
    #[serde(default = "first_contract")]
    pub contract: String,
}

fn first_contract() -> String {
    "0.1.0".into()
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
    /// unique role names of printable characters, schemas that are JSON and valid, bounded
    /// JSON Schema. The error says which role is wrong and why.
    pub fn check(
        description: String,
        max_rounds: u32,
        raw: Vec<RoleText>,
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
        // The caller, which knows the component, sets the contract.
        Ok(Descriptor { description, max_rounds, roles, contract: first_contract() })
    }

    /// The role named `name`.
    pub fn role(&self, name: &str) -> Option<&RoleSpec> {
        self.roles.iter().find(|r| r.name == name)
    }
}
