//! Every method of every store trait is called by the contract: this reads the traits in
//! `runtime/src/store/` and each trait's test file, and names any method that file calls
//! nowhere (`.method(` or `::method(`). A trait added without its file fails here too.

use std::collections::BTreeMap;
use std::path::Path;

/// Each store trait, and the files of the contract that test it (a thread's journal and
/// debug log are reached through `ThreadStore`, and tested with them).
const FILES: &[(&str, &[&str])] = &[
    ("ThreadStore", &["threads.rs", "journal.rs", "debug_log.rs"]),
    ("ThreadWriter", &["threads.rs"]),
    ("CallLog", &["journal.rs"]),
    ("LogSink", &["debug_log.rs"]),
    ("WorkQueue", &["queue.rs", "live.rs"]),
    ("LiveChannel", &["live.rs"]),
    ("RegistryBackend", &["registry.rs"]),
    ("BundleBackend", &["bundles.rs"]),
    ("ScheduleBackend", &["schedules.rs"]),
    ("LockHolder", &["schedules.rs"]),
    ("TokenBackend", &["tokens.rs"]),
    ("EvalBackend", &["evals.rs"]),
    ("RequestKeys", &["request_keys.rs"]),
    ("CredentialBackend", &["credentials.rs"]),
    ("CapacityBackend", &["capacity.rs"]),
    ("LinkBackend", &["links.rs"]),
    ("NoticeBackend", &["notices.rs"]),
    ("PushConfigBackend", &["push_configs.rs"]),
];

/// The methods of each `pub trait` declared in the Rust files under `dir`, by trait.
fn traits(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let mut lines = text.lines();
            while let Some(line) = lines.next() {
                let Some(rest) = line.strip_prefix("pub trait ") else { continue };
                let name: String =
                    rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let mut methods = Vec::new();
                // The trait's body: to the `}` that closes it at the start of a line.
                for line in lines.by_ref() {
                    if line.starts_with('}') {
                        break;
                    }
                    if let Some(rest) = line.strip_prefix("    fn ") {
                        let method: String =
                            rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        methods.push(method);
                    }
                }
                found.insert(name, methods);
            }
        }
    }
    found
}

#[test]
fn every_store_trait_method_is_called_by_the_contract() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let declared = traits(&root.join("runtime/src/store"));
    let here = root.join("tests/store");
    let mut missing = Vec::new();
    for (name, methods) in &declared {
        let Some((_, files)) = FILES.iter().find(|(t, _)| t == name) else {
            missing.push(format!("trait {name}: no contract file (add it to FILES)"));
            continue;
        };
        let text: String =
            files.iter().map(|f| std::fs::read_to_string(here.join(f)).unwrap()).collect();
        for method in methods {
            if !text.contains(&format!(".{method}(")) && !text.contains(&format!("::{method}(")) {
                missing.push(format!("{name}::{method} (in {})", files.join(", ")));
            }
        }
    }
    assert!(declared.len() >= FILES.len(), "found only {declared:?}");
    assert!(missing.is_empty(), "store trait methods no contract test calls: {missing:#?}");
}
