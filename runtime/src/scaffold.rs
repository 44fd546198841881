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

/// The Rust SDK, copied into a Rust project (`sdk/`) so that it builds offline, wherever it
/// is moved, and always against the contract of the host that made it.
const SDK_FILES: &[(&str, &str)] = &[
    ("sdk/src/lib.rs", include_str!("../../guest-sdk/src/lib.rs")),
    ("sdk/src/engine.rs", include_str!("../../guest-sdk/src/engine.rs")),
    ("sdk/src/role.rs", include_str!("../../guest-sdk/src/role.rs")),
    ("sdk/src/thread.rs", include_str!("../../guest-sdk/src/thread.rs")),
];
const SDK_MANIFEST: &str = include_str!("../templates/rust/sdk-Cargo.toml");

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
            // The SDK the user names, or the copy written beside the bundle: no path of
            // this machine ends up in the project.
            let sdk_path = sdk.map_or_else(|| "sdk".to_string(), |p| p.display().to_string());
            let sdk_dependency = format!("uncaged-workflow-sdk = {{ path = {sdk_path:?} }}");
            let mut files = vec![
                (
                    "Cargo.toml",
                    fill(include_str!("../templates/rust/Cargo.toml"))
                        .replace("{{sdk_dependency}}", &sdk_dependency),
                ),
                ("src/lib.rs", fill(include_str!("../templates/rust/lib.rs"))),
                ("README.md", fill(include_str!("../templates/rust/README.md"))),
                (".gitignore", "/target\n".into()),
            ];
            if sdk.is_none() {
                files.push(("sdk/Cargo.toml", SDK_MANIFEST.into()));
                files.extend(SDK_FILES.iter().map(|(path, text)| (*path, text.to_string())));
                // The SDK's bindings read the WIT from `../wit`, as in the repository.
                files.push(("wit/workflow.wit", WIT.into()));
            }
            files
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
            // Every version of the toolchain's tree, pinned: `npm ci` installs what was tested.
            ("package-lock.json", fill(include_str!("../templates/js/package-lock.json"))),
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
