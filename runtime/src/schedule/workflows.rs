//! Registering workflows with their triggers: adding, removing and rolling back a workflow
//! keeps the schedule its current version's `trigger:` asks for in step (see
//! [`sync_workflow_trigger`](super::sync_workflow_trigger)). The CLI and every other way in
//! register workflows here, so a trigger never drifts from its version.

use std::path::Path;

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::ids::BundleHash;
use crate::limits::Limits;
use crate::run::catalog::{Added, Catalog};
use crate::sandbox::engine::Runtime;
use crate::store::Storage;
use crate::store::registry::WorkflowEntry;
use crate::store::schedules::Schedule;

/// A workflow added, and the schedule its `trigger:` registered.
#[derive(Debug, Clone)]
pub struct AddedWorkflow {
    pub added: Added,
    pub schedule: Option<Schedule>,
}

/// Adds the bundle or YAML workflow at `path` as `name` (see [`Catalog::add`]) and registers
/// its `trigger:`. A trigger that cannot be registered is an error that says the workflow was
/// added all the same.
pub async fn add(
    store: &Storage,
    runtime: &Runtime,
    name: &str,
    path: &Path,
    limits: &Limits,
) -> Result<AddedWorkflow> {
    let added = Catalog::new(store).add(runtime, name, path, limits).await?;
    let schedule = super::sync_workflow_trigger(store, &added.name).map_err(|e| {
        Error::Usage(format!(
            "workflow `{}` was added ({}), but its `trigger:` was not registered: {}",
            added.name,
            added.hash,
            crate::error::chain_line(&e)
        ))
    })?;
    Ok(AddedWorkflow { added, schedule })
}

/// Unregisters workflow `name`, and the schedule its `trigger:` registered with it. Its bundle
/// files and threads stay.
pub fn remove(store: &Storage, name: &str) -> Result<WorkflowEntry> {
    let entry = Catalog::new(store).remove(name)?;
    super::sync_workflow_trigger(store, name)?;
    Ok(entry)
}

/// Makes an earlier version of workflow `name` current again (`target`, or the one before),
/// its `trigger:` with it. Returns the versions it went from and to.
pub fn rollback(
    store: &Storage,
    name: &str,
    target: Option<BundleHash>,
) -> Result<(BundleHash, BundleHash)> {
    let moved = Catalog::new(store).registry().update(|r| r.rollback(name, target, now_ms()))?;
    super::sync_workflow_trigger(store, name)?;
    Ok(moved)
}
