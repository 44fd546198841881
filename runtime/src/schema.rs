//! JSON Schemas: compiling a role's schema into a validator, once per process, within bounds.
//!
//! Schemas come from bundles (untrusted): the descriptor's role schemas are checked here at
//! `add` time, and every `extract` call validates against one. A schema can cost a validator
//! without end — `{"allOf": [{"$ref": "#"}]}` recurses until the stack overflows and takes the
//! whole worker down — so before it is compiled a schema must be small ([`MAX_SCHEMA_BYTES`],
//! [`MAX_SCHEMA_DEPTH`]), its references must stay inside it, and following its in-place
//! keywords (`$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`,
//! `dependentSchemas`) from any subschema must end: recursion is allowed only through a
//! keyword that steps into the instance (`properties`, `items`, …), which the instance's own
//! bounded depth ends. Patterns are matched by the linear-time `regex` engine.
//!
//! Compiled validators are cached by their text, because a worker's threads run one bundle
//! whose roles use the same few schemas and compiling one costs more than a whole step.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use serde_json::Value;

/// Compiled schemas by their text, shared by every thread of the process. Bounded, because
/// the schemas come from untrusted guests.
static COMPILED: LazyLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> =
    LazyLock::new(Mutex::default);
const MAX_COMPILED: usize = 256;

/// The largest schema accepted, as JSON text.
pub const MAX_SCHEMA_BYTES: usize = 256 << 10;
/// The deepest nesting of a schema's JSON.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// The most subschemas that following in-place keywords from one subschema may reach,
/// counting each path (a DAG of `anyOf`s can otherwise double the work at every level).
pub const MAX_IN_PLACE_EXPANSION: u64 = 10_000;

/// The validator of `schema` (JSON Schema as JSON text), compiled once per process. The
/// error says why the text is not JSON, not bounded (see the module) or not a valid schema.
pub fn compile(schema: &str) -> Result<Arc<jsonschema::Validator>, String> {
    if let Some(validator) = COMPILED.lock().get(schema).cloned() {
        return Ok(validator);
    }
    if schema.len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "the schema is {} bytes, over the {MAX_SCHEMA_BYTES} a schema may take",
            schema.len()
        ));
    }
    let value: Value = serde_json::from_str(schema).map_err(|e| e.to_string())?;
    check_bounded(&value)?;
    let validator = jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(&value)
        .map_err(|e| e.to_string())?;
    let validator = Arc::new(validator);
    let mut compiled = COMPILED.lock();
    if compiled.len() >= MAX_COMPILED {
        compiled.clear();
    }
    compiled.insert(schema.to_string(), validator.clone());
    Ok(validator)
}

/// Why `value` does not match `validator`, on one line naming where (`None` if it matches).
pub fn first_error(validator: &jsonschema::Validator, value: &Value) -> Option<String> {
    let error = validator.validate(value).err()?;
    Some(format!("{error} ({})", location(&error.instance_path().to_string())))
}

/// Where in an instance a JSON Pointer points, as an error says it.
pub fn location(path: &str) -> String {
    match path {
        "" => "at the top level".to_string(),
        path => format!("at `{path}`"),
    }
}

/// Compiles the JSON Schema meta-schema, which checking any schema needs first and which
/// costs milliseconds: a worker does it on a spare core while its engine starts.
pub fn precompile_meta_schema() {
    let _ = jsonschema::draft202012::meta::is_valid(&Value::Bool(true));
}

/// Keywords whose subschemas apply to the same instance.
const IN_PLACE_ONE: &[&str] = &["not", "if", "then", "else"];
const IN_PLACE_MANY: &[&str] = &["allOf", "anyOf", "oneOf"];
const IN_PLACE_MAP: &[&str] = &["dependentSchemas"];
/// Keywords whose subschemas apply to a part of the instance (or hold definitions).
const DESCENDING_ONE: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
];
const DESCENDING_MANY: &[&str] = &["prefixItems", "items"];
const CONTAINERS_MAP: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];

/// Checks the bounds the module describes: depth, local references only, no in-place cycle,
/// a bounded in-place expansion.
fn check_bounded(root: &Value) -> Result<(), String> {
    // Every subschema by its JSON pointer, with its in-place edges (pointers it applies to
    // the same instance).
    let mut nodes: HashMap<String, Vec<String>> = HashMap::new();
    let mut anchors: HashMap<String, String> = HashMap::new();
    walk(root, String::new(), 0, &mut nodes, &mut anchors)?;
    // Resolve `$ref`s now that every pointer and anchor is known.
    let mut edges: HashMap<String, Vec<String>> = HashMap::new();
    for (pointer, targets) in &nodes {
        let mut resolved = Vec::with_capacity(targets.len());
        for target in targets {
            let Some(reference) = target.strip_prefix("$ref:") else {
                resolved.push(target.clone());
                continue;
            };
            let to = if reference == "#" {
                String::new()
            } else if let Some(path) = reference.strip_prefix("#/") {
                format!("/{path}")
            } else if let Some(anchor) = reference.strip_prefix('#') {
                anchors
                    .get(anchor)
                    .cloned()
                    .ok_or_else(|| format!("`$ref` to an unknown anchor `{reference}`"))?
            } else {
                return Err(format!(
                    "`$ref` to `{reference}`: a role's schema may refer only to itself (`#…`)"
                ));
            };
            if !nodes.contains_key(&to) {
                return Err(format!("`$ref` to `{reference}`, which is not a schema in it"));
            }
            resolved.push(to);
        }
        edges.insert(pointer.clone(), resolved);
    }
    // Depth-first: a node on the current path again is an in-place cycle; otherwise count
    // the expansion (memoised: a DAG is counted by paths, not nodes).
    let mut expansion: HashMap<String, u64> = HashMap::new();
    let mut on_path: Vec<String> = Vec::new();
    fn visit(
        node: &str,
        edges: &HashMap<String, Vec<String>>,
        expansion: &mut HashMap<String, u64>,
        on_path: &mut Vec<String>,
    ) -> Result<u64, String> {
        if let Some(&known) = expansion.get(node) {
            return Ok(known);
        }
        if on_path.iter().any(|p| p == node) {
            let at = if node.is_empty() { "#".to_string() } else { format!("#{node}") };
            return Err(format!(
                "it refers to itself at `{at}` without stepping into the data (e.g. \
                 `allOf: [{{$ref: \"#\"}}]`): validating it would never end"
            ));
        }
        on_path.push(node.to_string());
        let mut total: u64 = 1;
        for next in edges.get(node).into_iter().flatten() {
            total = total.saturating_add(visit(next, edges, expansion, on_path)?);
            if total > MAX_IN_PLACE_EXPANSION {
                return Err(format!(
                    "its in-place keywords (`$ref`, `allOf`, `anyOf`, …) expand to over \
                     {MAX_IN_PLACE_EXPANSION} subschemas"
                ));
            }
        }
        on_path.pop();
        expansion.insert(node.to_string(), total);
        Ok(total)
    }
    let mut pointers: Vec<&String> = edges.keys().collect();
    pointers.sort();
    for pointer in pointers {
        visit(pointer, &edges, &mut expansion, &mut on_path)?;
    }
    Ok(())
}

/// Records `schema` (at `pointer`) and its subschemas: in-place edges as pointers, `$ref`s as
/// `$ref:<reference>` until they are resolved.
fn walk(
    schema: &Value,
    pointer: String,
    depth: usize,
    nodes: &mut HashMap<String, Vec<String>>,
    anchors: &mut HashMap<String, String>,
) -> Result<(), String> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!("it nests deeper than {MAX_SCHEMA_DEPTH} levels"));
    }
    let Value::Object(object) = schema else {
        // `true`, `false`: schemas without subschemas. Anything else is the compiler's to judge.
        nodes.entry(pointer).or_default();
        return Ok(());
    };
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    let mut in_place = Vec::new();
    // A nested `$id` would move what `#` means inside it; the analysis above reads `#` as the
    // root, so such schemas are refused rather than analysed wrongly.
    if depth > 0 && object.contains_key("$id") {
        return Err("`$id` below the top of a role's schema is not supported".into());
    }
    for keyword in ["$dynamicRef", "$recursiveRef"] {
        if object.contains_key(keyword) {
            return Err(format!("`{keyword}` is not supported in a role's schema; use `$ref`"));
        }
    }
    if let Some(reference) = object.get("$ref") {
        let reference = reference.as_str().ok_or("`$ref` is not a string")?;
        in_place.push(format!("$ref:{reference}"));
    }
    if let Some(anchor) = object.get("$anchor").and_then(Value::as_str) {
        anchors.insert(anchor.to_string(), pointer.clone());
    }
    let mut children: Vec<(String, &Value, bool)> = Vec::new();
    for (key, value) in object {
        let here = format!("{pointer}/{}", escape(key));
        if IN_PLACE_ONE.contains(&key.as_str()) {
            children.push((here, value, true));
        } else if IN_PLACE_MANY.contains(&key.as_str()) || DESCENDING_MANY.contains(&key.as_str()) {
            let in_place_key = IN_PLACE_MANY.contains(&key.as_str());
            match value {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        children.push((format!("{here}/{i}"), item, in_place_key));
                    }
                }
                other if DESCENDING_ONE.contains(&key.as_str()) => {
                    children.push((here, other, false));
                }
                _ => {}
            }
        } else if IN_PLACE_MAP.contains(&key.as_str()) || CONTAINERS_MAP.contains(&key.as_str()) {
            if let Value::Object(map) = value {
                let in_place_key = IN_PLACE_MAP.contains(&key.as_str());
                for (name, item) in map {
                    children.push((format!("{here}/{}", escape(name)), item, in_place_key));
                }
            }
        } else if DESCENDING_ONE.contains(&key.as_str()) {
            children.push((here, value, false));
        } else if key == "dependencies" {
            // Draft 7: a schema value applies in place; an array of names is no schema.
            if let Value::Object(map) = value {
                for (name, item) in map.iter().filter(|(_, v)| v.is_object() || v.is_boolean()) {
                    children.push((format!("{here}/{}", escape(name)), item, true));
                }
            }
        }
    }
    in_place.extend(children.iter().filter(|(_, _, same)| *same).map(|(c, _, _)| c.clone()));
    nodes.insert(pointer, in_place);
    for (child, value, _) in children {
        walk(value, child, depth + 1, nodes, anchors)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(schema: Value) -> Result<(), String> {
        compile(&schema.to_string()).map(|_| ())
    }

    #[test]
    fn schemas_that_recurse_in_place_are_refused() {
        for schema in [
            serde_json::json!({"allOf": [{"$ref": "#"}]}),
            serde_json::json!({"$ref": "#"}),
            serde_json::json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]},
                                         "b": {"not": {"$ref": "#/$defs/a"}}},
                               "$ref": "#/$defs/a"}),
            serde_json::json!({"$defs": {"a": {"$anchor": "x", "oneOf": [{"$ref": "#x"}]}}}),
        ] {
            let error = bounded(schema.clone()).unwrap_err();
            assert!(error.contains("refers to itself"), "{schema}: {error}");
        }
    }

    #[test]
    fn recursion_through_the_data_is_allowed() {
        let tree = serde_json::json!({
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}
        });
        bounded(tree.clone()).unwrap();
        let validator = compile(&tree.to_string()).unwrap();
        let deep = (0..100)
            .fold(serde_json::json!({}), |inner, _| serde_json::json!({"children": [inner]}));
        assert!(validator.is_valid(&deep));
    }

    #[test]
    fn references_stay_inside_and_expansion_is_bounded() {
        let remote = bounded(serde_json::json!({"$ref": "https://example.com/s.json"}));
        assert!(remote.unwrap_err().contains("may refer only to itself"));
        assert!(bounded(serde_json::json!({"$ref": "#/nowhere"})).is_err());
        let nested_id = serde_json::json!({"$defs": {"x": {"$id": "x", "allOf": [{"$ref": "#"}]}}});
        assert!(bounded(nested_id).unwrap_err().contains("`$id`"));
        // 20 levels of two-way anyOf over the next level: 2^20 paths.
        let mut defs = serde_json::Map::new();
        for i in 0..20 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                serde_json::json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d20".into(), serde_json::json!({"type": "string"}));
        let wide = serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(bounded(wide).unwrap_err().contains("expand to over"));
        let deep =
            (0..100).fold(serde_json::json!({}), |inner, _| serde_json::json!({"not": inner}));
        assert!(bounded(deep).unwrap_err().contains("nests deeper"));
    }

    #[test]
    fn patterns_match_in_linear_time() {
        let validator = compile(r#"{"type": "string", "pattern": "^(a+)+$"}"#).unwrap();
        let evil = format!("{}!", "a".repeat(10_000));
        assert!(!validator.is_valid(&Value::String(evil)));
    }
}
