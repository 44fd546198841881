//! `rollback <name> [hash]`.

use clap::Parser;

use super::options::GlobalOptions;
use crate::ids::BundleHash;
use crate::schedule::workflows;

/// Switch a workflow to an earlier version (default: the one before the current).
///
/// The version left becomes the most recent history entry, so rolling back twice returns to
/// where you started.
#[derive(Debug, Parser)]
pub struct RollbackCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub name: String,
    /// A hash from `history <name>`
    pub hash: Option<String>,
}

impl RollbackCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let target = self.hash.as_deref().map(str::parse::<BundleHash>).transpose()?;
        let store = global.store()?;
        // The schedule of a `trigger:` follows the version now current.
        let (from, to) = workflows::rollback(&store, &self.name, target)?;
        outln!("rolled {} back from {from} to {to}", self.name)?;
        Ok(0)
    }
}
