//! Property tests of every parser of bytes the product did not write itself: thread records,
//! call journals, the registry, descriptors, `config.yaml`, scripted-answer files, agent
//! output, ids, JSON Schemas, the extractor's search for JSON in an agent's text, declarative
//! workflow files and their JSONata conditions.
//!
//! Each property says what must hold for *any* input: no panic, no stack overflow, and either
//! a value or the error a user is meant to see (never an I/O error for bad bytes). Runs are
//! reproducible: a fixed seed, `UNCAGED_FUZZ_CASES` cases a property (256 by default; `make
//! fuzz` runs many more), `UNCAGED_FUZZ_SEED` to explore another part of the input space.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use crate::error::Error;
use crate::home::Home;
use crate::ids::{BundleHash, ThreadId};
use crate::store::ThreadStore;
use crate::store::files::journal::FileCalls;
use crate::store::files::threads::{FileThreads, read_thread};

/// The configuration of every property here.
fn config() -> Config {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    Config {
        cases: env("UNCAGED_FUZZ_CASES").map_or(256, |n| n as u32),
        rng_seed: RngSeed::Fixed(env("UNCAGED_FUZZ_SEED").unwrap_or(0x005e_ed0f_0dd5)),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Bytes that look like what the parsers read: JSON and YAML fragments, control characters,
/// invalid UTF-8, long lines, the start of a real record.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    let pieces = prop_oneof![
        any::<Vec<u8>>(),
        "[{}\\[\\]\":,0-9a-zA-Z\\-_ \n\t\\\\]{0,200}".prop_map(String::into_bytes),
        Just(b"{\"name\":\"w\",\"hash\":\"0000000000000\",\"threadId\":\"01KQXKW18CT8G75T53R8F4G7YG\",\"parameters\":{\"prompt\":\"p\",\"options\":{\"maxRounds\":3}},\"timestamp\":1}\n".to_vec()),
        Just(b"{\"role\":\"r\",\"content\":\"c\",\"meta\":{},\"timestamp\":2}\n".to_vec()),
        Just(b"{\"paused\":{\"by\":\"waiting\"},\"timestamp\":3}\n".to_vec()),
        Just(b"{\"end\":{\"returnCode\":0,\"summary\":\"s\",\"status\":\"completed\"},\"timestamp\":4}\n".to_vec()),
        Just(vec![0xff, 0xfe, 0x00, b'\n']),
        Just("[".repeat(300).into_bytes()),
        Just(b"workflows:\n  w:\n    hash: 0000000000000\n    timestamp: 1\n".to_vec()),
        Just(b"agents:\n  a:\n    kind: command\n    command: x\nlimits:\n  memory: 1\n".to_vec()),
    ];
    prop::collection::vec(pieces, 0..8).prop_map(|parts| parts.concat())
}

/// Errors a bad file may give: its damage named, or a missing file; never a crash.
fn acceptable(result: Result<impl Sized, Error>) -> bool {
    matches!(result, Ok(_) | Err(Error::Corrupt { .. } | Error::MissingFile { .. }))
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn thread_files_of_any_bytes_read_or_are_refused(bytes in hostile_bytes()) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "t.data.jsonl", &bytes);
        prop_assert!(acceptable(read_thread(&path)));
    }

    #[test]
    fn call_journals_of_any_bytes_read(bytes in hostile_bytes()) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "t.calls.jsonl", &bytes);
        let calls = crate::store::journal::CallLog::read(&FileCalls::open(&path).unwrap());
        prop_assert!(calls.is_ok());
    }

    #[test]
    fn registries_descriptors_and_configs_of_any_bytes_read_or_are_refused(
        bytes in hostile_bytes()
    ) {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path());
        let storage = crate::store::Storage::open(&home);
        write(dir.path(), "workflow.yaml", &bytes);
        write(dir.path(), "config.yaml", &bytes);
        std::fs::create_dir_all(home.bundles_dir()).unwrap();
        let hash = BundleHash::of(b"x");
        std::fs::write(home.descriptor_file(hash), &bytes).unwrap();
        prop_assert!(acceptable(storage.registry().load()));
        prop_assert!(acceptable(storage.config()));
        prop_assert!(acceptable(storage.bundles().descriptor(hash)));
    }

    #[test]
    fn scripted_answer_files_of_any_bytes_load_or_say_why(bytes in hostile_bytes()) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "answers.yaml", &bytes);
        let descriptor = crate::store::descriptor::Descriptor {
            description: String::new(),
            max_rounds: 1,
            roles: vec![],
            input_schema: None,
            contract: "0.3.0".into(),
        };
        // Ok or a message: either way no panic.
        let _ = crate::agents::ScriptedAgent::new(Some(&path), &descriptor);
    }

    #[test]
    fn agent_output_of_any_text_is_an_answer(text in any::<String>()) {
        let answer = crate::agents::command::parse_answer(text.clone());
        prop_assert!(answer.meta.is_none() || !answer.content.is_empty() || text.contains("content"));
    }

    #[test]
    fn agent_output_as_content_and_meta_round_trips(content in any::<String>(), n in any::<i64>()) {
        let text = serde_json::json!({"content": content, "meta": {"n": n}}).to_string();
        let answer = crate::agents::command::parse_answer(text);
        prop_assert_eq!(answer.content, content);
        prop_assert_eq!(answer.meta, Some(serde_json::json!({"n": n})));
    }

    #[test]
    fn ids_parse_only_their_own_text(text in "[0-9A-Za-z]{0,30}", value in any::<u128>()) {
        if let Ok(id) = text.parse::<ThreadId>() {
            prop_assert_eq!(id.to_string(), text.to_ascii_uppercase());
        }
        if let Ok(hash) = text.parse::<BundleHash>() {
            prop_assert_eq!(hash.to_string(), text.to_ascii_uppercase());
        }
        let id = ulid::Ulid(value).to_string();
        prop_assert_eq!(id.parse::<ThreadId>().unwrap().to_string(), id);
    }

    #[test]
    fn schemas_of_any_shape_compile_or_are_refused_without_overflow(schema in json_value()) {
        if let Ok(validator) = crate::schema::compile(&schema.to_string()) {
            // Validating anything against an accepted schema ends.
            let _ = validator.is_valid(&schema);
        }
    }

    #[test]
    fn the_extractor_reads_any_agent_text(text in "\\PC{0,400}|[{}\\[\\]\":,0-9a-z` \n]{0,400}") {
        let schema = r#"{"type":"object","required":["ok"]}"#;
        let _ = crate::agents::extract::Extractor.extract(schema, &text, None);
    }

    #[test]
    fn workflow_files_of_any_text_validate_or_say_where(text in workflow_text()) {
        // A declarative workflow is a user's file: either a definition, or one error at a
        // place in it — never a panic, an I/O error or a position past the end.
        match crate::declarative::source::parse(Path::new("flow.yaml"), &text) {
            Ok(_) => {}
            Err(Error::InvalidWorkflow { line, column, .. }) => {
                prop_assert!(line >= 1 && column >= 1);
                prop_assert!(line <= text.lines().count().max(1) + 1, "line {} of {:?}", line, text);
            }
            Err(other) => prop_assert!(false, "{other}"),
        }
    }

    #[test]
    fn conditions_of_any_text_are_checked_without_a_panic(
        expr in "\\PC{0,60}|[$a-z().=<>!&|\\[\\]{}'\" 0-9:;,*/+-]{0,60}",
        meta in json_value(),
    ) {
        // The check never panics, whatever the text (`add` runs it on a user's file).
        if uncaged_workflow_declarative::expr::check(&expr).is_ok() {
            let input = serde_json::json!({"role": "r", "meta": meta, "depth": 1, "history": []});
            let _ = uncaged_workflow_declarative::expr::evaluate(&expr, &input);
        }
    }

    #[test]
    fn steps_written_are_read_back_whole(
        steps in prop::collection::vec(("\\PC{0,20}", any::<String>(), any::<u32>()), 0..5)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let threads = FileThreads::new(&Home::new(dir.path()));
        let start: crate::store::records::StartRecord = serde_json::from_slice(
            br#"{"name":"w","hash":"0000000000000","threadId":"01KQXKW18CT8G75T53R8F4G7YG",
                "parameters":{"prompt":"p","options":{"maxRounds":3}},"timestamp":1}"#,
        ).unwrap();
        let records: Vec<_> = steps
            .into_iter()
            .map(|(role, content, n)| crate::store::records::StepRecord {
                role,
                content,
                meta: serde_json::json!({"n": n}),
                timestamp: n as u64,
                group: None,
                agent: None,
                duration_ms: None,
                usage: None,
            })
            .collect();
        let (writer, _) = threads.create(&start, &records, &[]).unwrap();
        drop(writer);
        prop_assert_eq!(threads.read(start.thread_id).unwrap().steps, records);
    }
}

/// Text shaped like a workflow file: its keys, references, conditions and YAML punctuation.
fn workflow_text() -> impl Strategy<Value = String> {
    let pieces = prop_oneof![
        any::<String>(),
        "[a-z_$: \n\\-\\[\\]{},.'\"]{0,80}",
        Just("description: d\n".to_string()),
        Just("roles:\n  a:\n    schema: {type: object}\n".to_string()),
        Just("graph:\n  - from: $START\n    transitions:\n      - to: a\n".to_string()),
        Just(
            "  - from: a\n    transitions:\n      - to: $END\n        condition: meta.x = 1\n"
                .to_string()
        ),
        Just("steps:\n  - id: a\n    description: A\n    depends_on: [b]\n".to_string()),
        Just("    inputs:\n      x: $steps.a.output.y\n".to_string()),
        Just("failure_policy: {on_step_failure: ask_user, max_retries: 2}\n".to_string()),
        Just("&anchor *alias !!tag\n".to_string()),
    ];
    prop::collection::vec(pieces, 0..8).prop_map(|parts| parts.concat())
}

/// JSON values shaped like schemas: keywords, references and nesting.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        Just(json!({})),
        Just(json!(true)),
        Just(json!({"type": "string", "pattern": "^(a+)+$"})),
        Just(json!({"$ref": "#"})),
        Just(json!({"$ref": "#/$defs/a"})),
        Just(json!({"$ref": "#/properties/x"})),
        Just(json!({"$anchor": "a"})),
        Just(json!({"$ref": "#a"})),
        any::<i64>().prop_map(Value::from),
        "[a-z$#/]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 4, |inner| {
        let keyword = prop_oneof![
            Just("allOf"),
            Just("anyOf"),
            Just("oneOf"),
            Just("not"),
            Just("if"),
            Just("then"),
            Just("items"),
            Just("properties"),
            Just("$defs"),
            Just("additionalProperties"),
            Just("dependentSchemas"),
            Just("$ref"),
            Just("a"),
            Just("x"),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keyword, inner), 0..4).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}
