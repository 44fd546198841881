//! `new <dir> --lang rust|python|js`.

use std::path::PathBuf;

use clap::Parser;

use super::options::GlobalOptions;
use crate::scaffold::{self, Language};

/// Write a minimal, buildable bundle project (its README says how to build it).
#[derive(Debug, Parser)]
pub struct NewCommand {
    /// The project directory to create; its name names the bundle
    pub dir: PathBuf,
    /// The language to write the bundle in
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Language,
    /// For Rust: the path of an uncaged-workflow-sdk crate to use [default: a copy written into
    /// the project, under sdk/]
    #[arg(long, value_name = "PATH")]
    pub sdk: Option<PathBuf>,
}

impl NewCommand {
    pub fn execute(self, _global: &GlobalOptions) -> anyhow::Result<i32> {
        let files = scaffold::create(&self.dir, self.lang, self.sdk.as_deref())?;
        outln!(
            "created {} bundle project {}:",
            format!("{:?}", self.lang).to_lowercase(),
            self.dir.display()
        )?;
        for file in files {
            outln!("  {}", file.display())?;
        }
        outln!("see {} for how to build it", self.dir.join("README.md").display())?;
        Ok(0)
    }
}
