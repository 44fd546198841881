//! `remove <name>`.

use clap::Parser;

use super::GlobalOptions;
use crate::run::catalog::Catalog;

/// Unregister a workflow. Its bundle files and threads stay on disk.
#[derive(Debug, Parser)]
pub struct RemoveCommand {
    /// The workflow
    pub name: String,
}

impl RemoveCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let entry = Catalog::new(&global.store()?).remove(&self.name)?;
        outln!(
            "removed {} (was {}; its bundle files and threads stay on disk)",
            self.name,
            entry.hash
        )?;
        Ok(0)
    }
}
