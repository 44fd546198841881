//! `remove <name>`.

use clap::Parser;

use super::GlobalOptions;
use crate::run::catalog::Catalog;

/// Unregister a workflow. Its bundle files and threads stay on disk.
#[derive(Debug, Parser)]
pub struct RemoveCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::completions::workflow_names))]
    pub name: String,
}

impl RemoveCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let entry = Catalog::new(&store).remove(&self.name)?;
        // The schedule its `trigger:` registered goes with it.
        crate::schedule::sync_workflow_trigger(&store, &self.name)?;
        outln!(
            "removed {} (was {}; its bundle files and threads stay on disk)",
            self.name,
            entry.hash
        )?;
        Ok(0)
    }
}
