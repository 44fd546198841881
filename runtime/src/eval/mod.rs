//! Evals: recorded threads of a workflow run again on a changed version, prompt or binding,
//! each in a thread of its own beside the recorded one (never on it). The roles asked live
//! are chosen; the recorded thread's journal answers every other call that asks what it
//! asked. Each finished thread is judged (its outcome, the eval's checks) and compared with
//! its recorded thread: what got better, what got worse, and what it cost.
//!
//! [`plan`] makes an experiment, [`runs`] runs (or finishes) its threads, [`judge`] and
//! [`compare`] read what they did, [`junit`] writes it for CI. The CLI's `eval` is a thin
//! layer over these.

pub mod compare;
pub mod html;
pub mod judge;
pub mod junit;
pub mod llm_judge;
pub mod plan;
pub mod runs;

use crate::error::{Error, Result};
use crate::ids::ThreadId;

/// The eval id `text` names (its full id: experiments are few, and named in scripts).
pub fn experiment_id(text: &str) -> Result<ThreadId> {
    text.trim().parse().map_err(|_| {
        Error::Usage(format!("eval `{}`: not an eval id", crate::terminal::line(text)))
    })
}
