//! A bundle's descriptor: its description and roles, read from the bundle at `add` time and
//! kept beside it as `bundles/<HASH>.yaml`.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

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

impl Descriptor {
    /// Checks what a bundle says about itself: unique non-empty role names, schemas that are
    /// JSON and valid JSON Schema. The error says which role is wrong and why.
    pub fn check(description: String, max_rounds: u32, raw: Vec<RoleText>) -> Result<Self, String> {
        let mut names = HashSet::new();
        let mut roles = Vec::with_capacity(raw.len());
        if raw.is_empty() {
            return Err("its descriptor declares no roles".into());
        }
        for role in raw {
            if role.name.trim().is_empty() {
                return Err("its descriptor has a role with an empty name".into());
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
        Ok(Descriptor { description, max_rounds, roles })
    }

    /// The role named `name`.
    pub fn role(&self, name: &str) -> Option<&RoleSpec> {
        self.roles.iter().find(|r| r.name == name)
    }
}
