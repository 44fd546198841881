//! The baseline of a thread of an eval: the recorded thread it re-runs, read from the store
//! when the eval's thread runs (or runs again after a crash), for its calls to be answered
//! from (see [`crate::sandbox::baseline`]).

use std::sync::Arc;

use crate::error::Result;
use crate::sandbox::baseline::Baseline;
use crate::store::Storage;
use crate::store::records::ThreadRecord;

/// The baseline of thread `record`, if it is a thread of an eval.
pub fn of(store: &Storage, record: &ThreadRecord) -> Result<Option<Arc<Baseline>>> {
    let Some(eval) = &record.start.eval else { return Ok(None) };
    let recorded = store.threads().read(eval.baseline)?;
    let mut journal = store.threads().journal(recorded.start.hash, recorded.id())?;
    journal.forget_retried(&recorded.retries);
    // The system prompts its calls were asked with, for calls journaled before each kept the
    // digest of its whole request; a version no longer stored leaves those calls to be asked.
    let system_prompts = match store.bundles().descriptor(recorded.version()) {
        Ok(descriptor) => descriptor.roles.into_iter().map(|r| (r.name, r.system_prompt)).collect(),
        Err(_) => Default::default(),
    };
    Ok(Some(Arc::new(Baseline::new(
        recorded.id(),
        recorded.start.parameters.prompt.clone(),
        recorded.steps.clone(),
        system_prompts,
        journal.calls_before(usize::MAX),
        eval.live.iter().cloned().collect(),
        eval.tools,
    ))))
}
