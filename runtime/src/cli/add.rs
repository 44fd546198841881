//! `add <name> <file.wasm>`.

use std::path::PathBuf;

use clap::Parser;
use serde_json::json;

use super::options::GlobalOptions;
use super::output::print_json;
use crate::limits::Limits;
use crate::sandbox::engine::Runtime;
use crate::schedule::workflows::{self, AddedWorkflow};
use crate::store::registry::Registered;
use crate::terminal;

/// Validate a bundle, store it by hash, precompile it, and register it under a name.
///
/// The bundle must be a WebAssembly component built for the `bundle` world in wit/: it may
/// import only uncaged:workflow/host and WASI, and must export uncaged:workflow/workflow.
/// A declarative workflow (`.yaml`/`.yml`, or a DAG-protocol plan as `.json`) is validated and
/// built into such a bundle first, as `build` does; nothing is stored if it does not validate.
/// Adding new bytes under an existing name makes them current and keeps the old version in
/// the workflow's history.
#[derive(Debug, Parser)]
pub struct AddCommand {
    /// Name to register the workflow under
    pub name: String,
    /// The bundle: a `.wasm` component, or a declarative workflow (`.yaml`, `.yml`, `.json`)
    pub file: PathBuf,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

impl AddCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let runtime = Runtime::new(store.home())?;
        let limits = Limits::resolve(&store.config()?.limits, &Default::default())?;
        let AddedWorkflow { added, schedule } =
            workflows::add(&store, &runtime, &self.name, &self.file, &limits).await?;
        let (status, previous) = match added.registered {
            Registered::New => ("new", None),
            Registered::Updated { previous } => ("updated", Some(previous.to_string())),
            Registered::Unchanged => ("unchanged", None),
        };
        if self.json {
            let roles: Vec<_> = added.descriptor.roles.iter().map(|r| &r.name).collect();
            print_json(&json!({
                "name": added.name, "hash": added.hash.to_string(), "status": status,
                "previous": previous, "roles": roles,
                "schedule": schedule.as_ref().map(|s| &s.name),
            }))?;
        } else {
            let roles: Vec<_> = added.descriptor.roles.iter().map(|r| r.name.as_str()).collect();
            let note = match previous {
                Some(previous) => format!("updated from {previous}"),
                None => status.to_string(),
            };
            let roles = terminal::line(&roles.join(", ")).into_owned();
            outln!("added {} {} ({note}; roles: {roles})", added.name, added.hash)?;
            if let Some(schedule) = &schedule {
                outln!(
                    "its trigger is schedule {} ({}); `schedule tick` or `serve` fires it",
                    schedule.name,
                    super::output::describe_trigger(&schedule.trigger)
                )?;
            }
        }
        Ok(0)
    }
}
