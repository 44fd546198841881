//! `remove <name>`.

use clap::Parser;

use super::options::GlobalOptions;
use crate::schedule::workflows;

/// Unregister a workflow. Its bundle files and threads stay on disk.
#[derive(Debug, Parser)]
pub struct RemoveCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub name: String,
}

impl RemoveCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        // The schedule its `trigger:` registered goes with it.
        let entry = workflows::remove(&store, &self.name)?;
        outln!(
            "removed {} (was {}; its bundle files and threads stay on disk)",
            self.name,
            entry.hash
        )?;
        Ok(0)
    }
}
