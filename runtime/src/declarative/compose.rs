//! Assembling a declarative bundle: the interpreter component composed with a tiny component
//! that exports the definition, into one component that imports only what any bundle imports.
//!
//! The YAML source rides along in a custom section, so `show` can print the workflow as its
//! author wrote it. Every input of the assembly is fixed bytes, so the same YAML gives the
//! same bundle, and the same id.

use wac_graph::types::Package;
use wac_graph::{CompositionGraph, EncodeOptions};

/// The custom section holding a declarative bundle's YAML source.
pub const SOURCE_SECTION: &str = "uncaged-workflow:source";

/// The interface every bundle exports.
const WORKFLOW_EXPORT: &str = "uncaged:workflow/workflow@0.3.0";

/// The interpreter composed with `definition` (canonical JSON), `source` appended.
pub fn compose(interpreter: &[u8], definition: &str, source: &str) -> Result<Vec<u8>, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("cannot {what}: {e:#}");
    let mut graph = CompositionGraph::new();
    let interpreter =
        Package::from_bytes("uncaged:interpreter", None, interpreter.to_vec(), graph.types_mut())
            .map_err(|e| fail("read the interpreter component", &e))?;
    let interpreter =
        graph.register_package(interpreter).map_err(|e| fail("register the interpreter", &e))?;
    let provider = definition_component(definition)?;
    let provider = Package::from_bytes("uncaged:definition", None, provider, graph.types_mut())
        .map_err(|e| fail("read the definition component", &e))?;
    let provider =
        graph.register_package(provider).map_err(|e| fail("register the definition", &e))?;
    let provider = graph.instantiate(provider);
    let interpreter = graph.instantiate(interpreter);
    let function = graph
        .alias_instance_export(provider, "definition")
        .map_err(|e| fail("take the definition export", &e))?;
    graph
        .set_instantiation_argument(interpreter, "definition", function)
        .map_err(|e| fail("give the interpreter its definition", &e))?;
    let workflow = graph
        .alias_instance_export(interpreter, WORKFLOW_EXPORT)
        .map_err(|e| fail("take the interpreter's workflow export", &e))?;
    graph.export(workflow, WORKFLOW_EXPORT).map_err(|e| fail("export the workflow", &e))?;
    let mut bytes = graph
        .encode(EncodeOptions { define_components: true, validate: true, processor: None })
        .map_err(|e| fail("encode the bundle", &e))?;
    append_custom_section(&mut bytes, SOURCE_SECTION, source.as_bytes());
    Ok(bytes)
}

/// A component exporting `definition: func() -> string` that returns `json`: one page-aligned
/// memory holding the string and the (pointer, length) pair the canonical ABI reads.
fn definition_component(json: &str) -> Result<Vec<u8>, String> {
    let len = u32::try_from(json.len()).map_err(|_| "the definition is over 4 GiB".to_string())?;
    let pages = (u64::from(len) + 8).div_ceil(65536);
    let mut header = Vec::with_capacity(8);
    header.extend_from_slice(&8u32.to_le_bytes());
    header.extend_from_slice(&len.to_le_bytes());
    let wat = format!(
        r#"(component
  (core module $m
    (memory (export "memory") {pages})
    (data (i32.const 0) "{header}")
    (data (i32.const 8) "{body}")
    (func (export "definition") (result i32) i32.const 0))
  (core instance $i (instantiate $m))
  (func $definition (result string)
    (canon lift (core func $i "definition") (memory (core memory $i "memory"))))
  (export "definition" (func $definition)))"#,
        header = escape(&header),
        body = escape(json.as_bytes()),
    );
    wat::parse_str(&wat).map_err(|e| format!("cannot assemble the definition component: {e}"))
}

/// Bytes as a WAT string literal's contents.
fn escape(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(bytes.len() * 3);
    for byte in bytes {
        let _ = write!(text, "\\{byte:02x}");
    }
    text
}

fn append_custom_section(bytes: &mut Vec<u8>, name: &str, payload: &[u8]) {
    let mut body = Vec::new();
    leb128(&mut body, name.len() as u64);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    bytes.push(0);
    leb128(bytes, body.len() as u64);
    bytes.extend_from_slice(&body);
}

fn leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The YAML source of a declarative bundle, if `bytes` is one.
pub fn source_of(bytes: &[u8]) -> Option<String> {
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) if depth > 0 => depth -= 1,
            wasmparser::Payload::CustomSection(section)
                if depth == 0 && section.name() == SOURCE_SECTION =>
            {
                return String::from_utf8(section.data().to_vec()).ok();
            }
            _ => {}
        }
    }
    None
}
