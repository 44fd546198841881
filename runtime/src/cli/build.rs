//! `build <flow.yaml> [-o FILE]`.

use std::path::PathBuf;

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::print_json;
use crate::declarative;
use crate::error::Error;
use crate::ids::BundleHash;

/// Build a declarative workflow (YAML) into a bundle file, to ship or to `add` elsewhere.
///
/// The file is validated as `add` validates it, and composed with the interpreter built into
/// this program: no toolchain is needed, and the same YAML gives the same bytes, so the same
/// id, on every machine running the same version of uncaged-workflow.
#[derive(Debug, Parser)]
pub struct BuildCommand {
    /// The workflow file (`.yaml` or `.yml`, or a DAG-protocol plan as `.json`)
    pub file: PathBuf,
    /// Where to write the bundle [default: the workflow file with the extension `.wasm`]
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

impl BuildCommand {
    pub fn execute(self, _global: &GlobalOptions) -> anyhow::Result<i32> {
        if !declarative::is_source(&self.file) {
            return Err(Error::Usage(format!(
                "{}: `build` takes a declarative workflow (a `.yaml`, `.yml` or `.json` file); a code \
                 bundle is built with its own toolchain (see `uncaged-workflow new`)",
                self.file.display()
            ))
            .into());
        }
        let assembled = declarative::assemble(&self.file)?;
        let output = self.output.unwrap_or_else(|| self.file.with_extension("wasm"));
        crate::durable::write_shared(&output, &assembled.bytes)?;
        let hash = BundleHash::of(&assembled.bytes);
        let roles: Vec<&str> = assembled.definition.roles.iter().map(|r| r.name.as_str()).collect();
        if self.json {
            print_json(&json!({
                "file": output, "hash": hash.to_string(), "bytes": assembled.bytes.len(),
                "roles": roles,
            }))?;
        } else {
            outln!(
                "built {} {hash} ({}; roles: {})",
                output.display(),
                bytesize::ByteSize(assembled.bytes.len() as u64).display().iec(),
                roles.join(", ")
            )?;
        }
        Ok(0)
    }
}
