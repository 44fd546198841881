//! Fixture: a bundle whose descriptor is whatever a test writes into it. The component holds a
//! fixed-size slot of JSON after a marker; a test finds the marker in the `.wasm` file and
//! overwrites the slot (same length, padded with spaces), which makes a new bundle with the
//! descriptor it wants — hostile ones included — without a build per case.
//!
//! The slot's JSON: `{"description": TEXT, "repeat": N, "roles": [{"name", "description",
//! "schema"}], "extra_roles": N, "input_schema": SCHEMA}` — the description is TEXT repeated N times, and N extra roles
//! `r0`, `r1`, … with an empty schema follow the listed ones. A thread yields one step of the
//! first role whose content is the description, then ends with the description as summary.

use std::cell::Cell;

use uncaged_workflow_sdk::bindings::exports::uncaged::workflow::workflow::{Guest, GuestThread};
use uncaged_workflow_sdk::bindings::uncaged::workflow::host;
use uncaged_workflow_sdk::bindings::uncaged::workflow::types::{
    BundleDescriptor, RoleDescriptor, RoleOutput, RunInput, RunOptions, Step, WorkflowResult,
};
use uncaged_workflow_sdk::{Value, json};

/// Bytes of the slot, marker included.
const SLOT_LEN: usize = 4096;
const MARKER: &[u8] = b"UNCAGED-DESCRIPTOR-SLOT:";
const DEFAULT: &[u8] =
    br#"{"description": "a descriptor fixture", "roles": [{"name": "probe", "schema": {}}]}"#;

const fn slot() -> [u8; SLOT_LEN] {
    let mut bytes = [b' '; SLOT_LEN];
    let mut i = 0;
    while i < MARKER.len() {
        bytes[i] = MARKER[i];
        i += 1;
    }
    let mut j = 0;
    while j < DEFAULT.len() {
        bytes[MARKER.len() + j] = DEFAULT[j];
        j += 1;
    }
    bytes
}

/// Kept verbatim in the data segment: read through `black_box`, never folded away.
static SLOT: [u8; SLOT_LEN] = slot();

fn spec() -> Value {
    let bytes = std::hint::black_box(&SLOT);
    let text = std::str::from_utf8(&bytes[MARKER.len()..]).unwrap_or("{}");
    uncaged_workflow_sdk::serde_json::from_str(text.trim()).unwrap_or_else(|_| json!({}))
}

fn description(spec: &Value) -> String {
    let text = spec["description"].as_str().unwrap_or_default();
    text.repeat(spec["repeat"].as_u64().unwrap_or(1) as usize)
}

struct Fixture;

impl Guest for Fixture {
    type Thread = Run;

    fn descriptor() -> BundleDescriptor {
        let spec = spec();
        let mut roles: Vec<RoleDescriptor> = spec["roles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|role| RoleDescriptor {
                name: role["name"].as_str().unwrap_or_default().into(),
                description: role["description"].as_str().unwrap_or_default().into(),
                system_prompt: String::new(),
                extract_prompt: String::new(),
                schema: role["schema"].to_string(),
            })
            .collect();
        for i in 0..spec["extra_roles"].as_u64().unwrap_or(0) {
            roles.push(RoleDescriptor {
                name: format!("r{i}"),
                description: String::new(),
                system_prompt: String::new(),
                extract_prompt: String::new(),
                schema: "{}".into(),
            });
        }
        // Text as written (a test may give one that is not JSON), or JSON as JSON text.
        let input_schema = match &spec["input_schema"] {
            Value::Null => None,
            Value::String(text) => Some(text.clone()),
            schema => Some(schema.to_string()),
        };
        BundleDescriptor {
            description: description(&spec),
            roles,
            default_max_rounds: 3,
            input_schema,
        }
    }
}

struct Run {
    yielded: Cell<bool>,
}

impl GuestThread for Run {
    fn new(input: RunInput, _options: RunOptions) -> Self {
        Run { yielded: Cell::new(!input.steps.is_empty()) }
    }

    fn next(&self) -> Step {
        let spec = spec();
        if self.yielded.replace(true) {
            return Step::Done(WorkflowResult { return_code: 0, summary: description(&spec) });
        }
        let role = spec["roles"][0]["name"].as_str().unwrap_or_default();
        Step::Outputs(vec![RoleOutput {
            role: role.into(),
            content: description(&spec),
            meta: "{}".into(),
            timestamp: host::now(),
        }])
    }
}

uncaged_workflow_sdk::bindings::__export_bundle!(Fixture with_types_in uncaged_workflow_sdk::bindings);
