//! `worker <HASH>` (internal): the process `run` starts to host a bundle's threads.

use clap::Parser;

use super::GlobalOptions;
use crate::ids::BundleHash;

/// Serve a bundle's threads until the last one ends (started by `run`; not for direct use).
///
/// Once its socket is bound the worker prints `ready <pid>` on stdout, the one line it ever
/// writes there: the process that started it waits for that line instead of polling.
#[derive(Debug, Parser)]
pub struct WorkerCommand {
    /// The bundle
    pub hash: String,
}

impl WorkerCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let hash: BundleHash = self.hash.parse()?;
        crate::run::worker::serve(global.store()?, hash).await?;
        Ok(0)
    }
}
