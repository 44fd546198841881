//! The rule the folders follow, checked: dependencies run one way, from the CLI down to the
//! base, and no two modules of one folder depend on each other in a circle. The test reads
//! the source (`crate::…` and `super::…` paths) rather than trusting a list kept by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level modules by layer; a module may use only modules of its own layer or below.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "error",
            "ids",
            "clock",
            "cron",
            "home",
            "durable",
            "duration",
            "schema",
            "limits",
            "http",
            "spending",
            "run_request",
            "procfs",
            "faults",
            "agent_spec",
            "scaffold",
            "terminal",
            "env_name",
            "data_map",
            "telemetry",
        ],
    ),
    // Declarative workflows: YAML validated and assembled into a bundle; bytes in, bytes out.
    ("declarative", &["declarative"]),
    ("store", &["store"]),
    ("agents", &["agents"]),
    ("sandbox", &["sandbox"]),
    ("run", &["run"]),
    // Evals: recorded threads run again beside themselves, judged and compared.
    ("eval", &["eval"]),
    // Reach: waits sent to people (notify: channels) and the signed links that decide them.
    ("reach", &["reach"]),
    ("schedule", &["schedule"]),
    ("serve", &["serve"]),
    ("cli", &["cli"]),
    // Test-only modules that exercise the whole library.
    ("tests", &["fuzz", "layering"]),
];

/// Module path of each source file (`store/journal.rs` → `store::journal`), and its text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> =
                relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            found.insert(parts.join("::"), std::fs::read_to_string(&path).unwrap());
        }
    }
    found
}

/// The modules `text` (the file of module `me`) refers to, resolved to known modules: every
/// `crate::…` and `super::…` path, grouped imports (`use crate::store::{files, queue}`)
/// counted path by path.
fn references(me: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    // A file's own code (tests included) counts, its comments do not.
    let code: String =
        text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let parent = me.rsplit_once("::").map_or("", |(p, _)| p);
    for (prefix, base) in [("crate::", String::new()), ("super::", parent.to_string())] {
        for (at, _) in code.match_indices(prefix) {
            if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            // `super::*` (an inline test module's glob of its own file) names no module.
            for named in
                tree_paths(&code[at + prefix.len()..]).into_iter().filter(|n| !n.is_empty())
            {
                let mut path: Vec<&str> = base.split("::").filter(|p| !p.is_empty()).collect();
                path.extend(named.split("::").filter(|p| !p.is_empty() && *p != "self"));
                // The longest prefix that is a module.
                while !path.is_empty() && !known.contains(&path.join("::")) {
                    path.pop();
                }
                if !path.is_empty() {
                    out.insert(path.join("::"));
                }
            }
        }
    }
    out.remove(me);
    out
}

/// The paths of the use tree (or plain path) that `text` starts with: `a::b` is one path,
/// `a::{b, c::{d, e}}` three (`a::b`, `a::c::d`, `a::c::e`).
fn tree_paths(text: &str) -> Vec<String> {
    let end =
        text.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(text.len());
    let stem = text[..end].trim_end_matches("::");
    if !text[end..].starts_with('{') || !text[..end].ends_with("::") && !text[..end].is_empty() {
        return vec![stem.to_string()];
    }
    // The group, to its matching brace, split at its top-level commas.
    let group = &text[end + 1..];
    let (mut depth, mut close) = (1, group.len());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            close = i;
            break;
        }
    }
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    let inner = &group[..close];
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .flat_map(tree_paths)
        .map(|path| if stem.is_empty() { path } else { format!("{stem}::{path}") })
        .collect()
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap()
}

fn layer(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|(_, members)| members.contains(&top(module)))
        .unwrap_or_else(|| panic!("module `{module}` is in no layer: add it to LAYERS"))
}

/// A circle in `edges`, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn dependencies_run_one_way_and_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let known: BTreeSet<String> = files.keys().cloned().collect();
    let mut upward = Vec::new();
    // Edges between siblings: files of one folder, or the top-level modules.
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (me, text) in &files {
        if me.is_empty() {
            continue;
        }
        for target in references(me, text, &known) {
            if layer(&target) > layer(me) {
                upward.push(format!("{me} -> {target}"));
            }
            // Reduce both ends to the children of their deepest common folder.
            let (a, b): (Vec<&str>, Vec<&str>) =
                (me.split("::").collect(), target.split("::").collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            if common < a.len() && common < b.len() {
                let from = a[..=common].join("::");
                let to = b[..=common].join("::");
                siblings.entry(from).or_default().insert(to);
            }
        }
    }
    assert!(upward.is_empty(), "modules that use a layer above their own: {upward:#?}");
    assert_eq!(find_cycle(&siblings), None, "a circle of dependencies");
}

/// The command line's modules that every command may use: its option groups, following and
/// asking, output, completion. The rest are commands.
const CLI_SHARED: &[&str] =
    &["cli::options", "cli::follow", "cli::ask", "cli::output", "cli::complete"];

/// Commands import downward: a command uses only the command line's shared modules (never
/// `cli.rs`, the dispatcher that imports every command, nor another command), and those use
/// only each other.
#[test]
fn commands_import_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let known: BTreeSet<String> = files.keys().cloned().collect();
    let mut wrong = Vec::new();
    for (me, text) in files.iter().filter(|(m, _)| m.starts_with("cli::")) {
        for target in references(me, text, &known).into_iter().filter(|t| top(t) == "cli") {
            if !CLI_SHARED.contains(&target.as_str()) {
                wrong.push(format!("{me} -> {target}"));
            }
        }
    }
    assert!(wrong.is_empty(), "command-line modules that import upward or sideways: {wrong:#?}");
}

/// The reader of imports sees through groups: a circle written with grouped imports is still
/// a circle.
#[test]
fn grouped_imports_are_read_path_by_path() {
    let known: BTreeSet<String> =
        ["store", "store::files", "store::files::queue", "store::queue", "store::records"]
            .into_iter()
            .map(String::from)
            .collect();
    let text = "use crate::store::{records::{ThreadRecord, X}, files::queue, queue::{self, Y}};";
    let found = references("store::journal", text, &known);
    let expected: BTreeSet<String> = ["store::records", "store::files::queue", "store::queue"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, expected);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("a".into());
    assert!(find_cycle(&edges).is_some());
}

/// `cargo build --release` (and `cargo install --path runtime`) on a machine without the
/// wasm32-wasip2 target builds the host: no default member of the workspace has a build
/// script that builds anything (the guest fixtures' one needs the target; the runtime's only
/// passes a link argument), and the fixtures are only a dev-dependency.
#[test]
fn a_plain_build_needs_no_guest_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = manifest.lines().find(|l| l.starts_with("default-members")).unwrap();
    let members: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
    assert!(!members.is_empty(), "{line}");
    for member in members {
        let script =
            std::fs::read_to_string(root.join(member).join("build.rs")).unwrap_or_default();
        assert!(
            !script.contains("wasm32") && !script.contains("Command"),
            "{member}'s build script builds something"
        );
    }
    let runtime = std::fs::read_to_string(root.join("runtime/Cargo.toml")).unwrap();
    let (normal, dev) = runtime.split_once("[dev-dependencies]").unwrap();
    assert!(!normal.contains("uncaged-test-artifacts") && dev.contains("uncaged-test-artifacts"));
}

/// Every crate a plain build of the runtime compiles (`make demo`, `cargo install`) resolves
/// to the features `cargo test` compiles it with, so that the two share one build of wasmtime
/// and its tree (see the feature unification in runtime/Cargo.toml). A test-only dependency
/// that turns on a feature of a shared crate fails here, naming the crate.
#[test]
fn a_build_and_the_tests_share_one_dependency_build() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Each package's feature sets as `cargo tree` resolves them for `edges` (a package built
    // for the host and for the target may show two sets).
    let features = |args: &[&str]| -> BTreeMap<String, BTreeSet<String>> {
        let out = std::process::Command::new(&cargo)
            .current_dir(&root)
            .args(["tree", "--offline", "--prefix", "none", "--format", "{p}|{f}"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        let mut packages = BTreeMap::<String, BTreeSet<String>>::new();
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let Some((package, rest)) = line.split_once('|') else { continue };
            let features = rest.trim_end_matches(" (*)").to_string();
            packages.entry(package.to_string()).or_default().insert(features);
        }
        packages
    };
    let build = features(&["-p", "uncaged-workflow", "--edges", "normal,build"]);
    let test = features(&["--edges", "normal,build,dev"]);
    assert!(build.len() > 100, "cargo tree listed {} packages", build.len());
    let split: Vec<String> = build
        .iter()
        .filter(|(package, features)| test.get(*package) != Some(features))
        .map(|(package, features)| format!("{package}: {features:?} vs {:?}", test.get(package)))
        .collect();
    assert!(split.is_empty(), "built twice, with other features for the tests: {split:#?}");
}
