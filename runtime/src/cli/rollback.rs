//! `rollback <name> [hash]`.

use clap::Parser;

use super::GlobalOptions;
use crate::clock::now_ms;
use crate::ids::BundleHash;
use crate::run::catalog::Catalog;

/// Switch a workflow to an earlier version (default: the one before the current).
///
/// The version left becomes the most recent history entry, so rolling back twice returns to
/// where you started.
#[derive(Debug, Parser)]
pub struct RollbackCommand {
    /// The workflow
    #[arg(add = clap_complete::ArgValueCompleter::new(super::completions::workflow_names))]
    pub name: String,
    /// A hash from `history <name>`
    pub hash: Option<String>,
}

impl RollbackCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let target = self.hash.as_deref().map(str::parse::<BundleHash>).transpose()?;
        let store = global.store()?;
        let catalog = Catalog::new(&store);
        let (from, to) = catalog.registry().update(|r| r.rollback(&self.name, target, now_ms()))?;
        outln!("rolled {} back from {from} to {to}", self.name)?;
        // The schedule of a `trigger:` follows the version now current.
        crate::schedule::sync_workflow_trigger(&store, &self.name)?;
        Ok(0)
    }
}
