//! `new`: writes a minimal, buildable bundle project in Rust, Python or JavaScript. Templates
//! and the helpers they need (the WIT, the Python and JavaScript helpers) are compiled into
//! the binary from the repository's own files, so a scaffold always matches this host.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The languages a bundle can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Language {
    Rust,
    Python,
    Js,
}

const WIT: &str = include_str!("../../wit/workflow.wit");
const PY_HELPER: &str = include_str!("../../guest-sdk/python/uncaged_workflow.py");
const PY_RESOURCES: &str = include_str!("../../guest-sdk/python/workflow.py");
const JS_HELPER: &str = include_str!("../../guest-sdk/js/uncaged-workflow.js");

/// Where the Rust SDK was when this binary was built; used when it is still there.
const SDK_AT_BUILD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");
/// Otherwise the SDK comes from the repository.
const SDK_GIT: &str = "https://github.com/uncaged/uncaged-workflow";

/// Writes a new bundle project into `dir` (which must not exist or be empty); returns the
/// files written, relative to `dir`.
pub fn create(dir: &Path, language: Language, sdk: Option<&Path>) -> Result<Vec<PathBuf>> {
    if dir.exists() && std::fs::read_dir(dir).map_err(Error::io("read", dir))?.next().is_some() {
        return Err(Error::InvalidId {
            kind: "project directory",
            id: dir.display().to_string(),
            expected: "a directory that does not exist yet, or is empty",
        });
    }
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| {
            !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
        .ok_or_else(|| Error::InvalidId {
            kind: "project name",
            id: dir.display().to_string(),
            expected: "a directory name of letters, digits, - and _",
        })?
        .to_string();
    let crate_name = name.replace('-', "_");
    let fill =
        |template: &str| template.replace("{{name}}", &name).replace("{{crate}}", &crate_name);
    let files: Vec<(&str, String)> = match language {
        Language::Rust => {
            let sdk = match sdk
                .map(Path::to_path_buf)
                .or_else(|| Path::new(SDK_AT_BUILD).canonicalize().ok())
            {
                Some(path) => {
                    format!("uncaged-workflow-sdk = {{ path = {:?} }}", path.display().to_string())
                }
                None => format!("uncaged-workflow-sdk = {{ git = {SDK_GIT:?} }}"),
            };
            vec![
                (
                    "Cargo.toml",
                    fill(include_str!("../templates/rust/Cargo.toml"))
                        .replace("{{sdk_dependency}}", &sdk),
                ),
                ("src/lib.rs", fill(include_str!("../templates/rust/lib.rs"))),
                ("README.md", fill(include_str!("../templates/rust/README.md"))),
                (".gitignore", "/target\n".into()),
            ]
        }
        Language::Python => vec![
            ("app.py", fill(include_str!("../templates/python/app.py"))),
            ("uncaged_workflow.py", PY_HELPER.into()),
            ("workflow.py", PY_RESOURCES.into()),
            ("wit/workflow.wit", WIT.into()),
            ("build.sh", fill(include_str!("../templates/python/build.sh"))),
            ("README.md", fill(include_str!("../templates/python/README.md"))),
            (".gitignore", "*.wasm\n__pycache__/\n".into()),
        ],
        Language::Js => vec![
            ("app.js", fill(include_str!("../templates/js/app.js"))),
            (
                "uncaged-workflow.js",
                JS_HELPER.replace("from \"uncaged-workflow\"", "from \"./uncaged-workflow.js\""),
            ),
            ("wit/workflow.wit", WIT.into()),
            ("package.json", fill(include_str!("../templates/js/package.json"))),
            ("build.sh", fill(include_str!("../templates/js/build.sh"))),
            ("README.md", fill(include_str!("../templates/js/README.md"))),
            (".gitignore", "*.wasm\nbuild/\nnode_modules/\n".into()),
        ],
    };
    let mut written = Vec::new();
    for (relative, content) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(Error::io("create directory", parent))?;
        }
        std::fs::write(&path, content).map_err(Error::io("write", &path))?;
        if relative.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(Error::io("make executable", &path))?;
        }
        written.push(PathBuf::from(relative));
    }
    Ok(written)
}
