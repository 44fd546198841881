//! JSON Schemas: compiling a role's schema into a validator, once per process.
//!
//! Schemas come from bundles (untrusted): the descriptor's role schemas are checked here at
//! `add` time, and every `extract` call validates against one. Compiled validators are cached
//! by their text, because a worker's threads run one bundle whose roles use the same few
//! schemas and compiling one costs more than a whole step.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use serde_json::Value;

/// Compiled schemas by their text, shared by every thread of the process. Bounded, because
/// the schemas come from untrusted guests.
static COMPILED: LazyLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> =
    LazyLock::new(Mutex::default);
const MAX_COMPILED: usize = 256;

/// The validator of `schema` (JSON Schema as JSON text), compiled once per process. The
/// error says why the text is not JSON or not a valid schema.
pub fn compile(schema: &str) -> Result<Arc<jsonschema::Validator>, String> {
    if let Some(validator) = COMPILED.lock().get(schema).cloned() {
        return Ok(validator);
    }
    let value: Value = serde_json::from_str(schema).map_err(|e| e.to_string())?;
    let validator = Arc::new(jsonschema::validator_for(&value).map_err(|e| e.to_string())?);
    let mut compiled = COMPILED.lock();
    if compiled.len() >= MAX_COMPILED {
        compiled.clear();
    }
    compiled.insert(schema.to_string(), validator.clone());
    Ok(validator)
}

/// Compiles the JSON Schema meta-schema, which checking any schema needs first and which
/// costs milliseconds: a worker does it on a spare core while its engine starts.
pub fn precompile_meta_schema() {
    let _ = jsonschema::draft202012::meta::is_valid(&Value::Bool(true));
}
