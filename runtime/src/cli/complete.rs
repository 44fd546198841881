//! What a shell completes as it asks this binary: thread ids and workflow names, read from the
//! store the environment and config.yaml name.

use std::ffi::OsStr;

use clap_complete::engine::CompletionCandidate;

use super::options::GlobalOptions;

/// The most candidates offered for one word: a home of 100,000 threads must not flood a shell.
const MAX_CANDIDATES: usize = 200;

/// The store a completion reads: the one the environment and config.yaml name (a shell
/// completing a word sees no `--home` typed on the line).
fn store() -> Option<crate::store::Storage> {
    let global = GlobalOptions {
        home: None,
        store: std::env::var(crate::store::STORE_ENV).ok(),
        verbose: 0,
        color: crate::terminal::ColorChoice::Never,
    };
    global.store().ok()
}

/// Thread ids that start with what is typed, newest first, each with its workflow and status.
pub fn thread_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy().to_ascii_uppercase();
    let Some(summaries) = store().and_then(|s| s.threads().summaries().ok()) else {
        return Vec::new();
    };
    summaries
        .iter()
        .rev()
        .filter(|t| t.thread_id.encode(&mut [0; 26]).starts_with(&typed))
        .take(MAX_CANDIDATES)
        .map(|t| {
            let about = format!("{} {}", t.name, t.status.as_str());
            CompletionCandidate::new(t.thread_id.to_string()).help(Some(about.into()))
        })
        .collect()
}

/// Registered workflow names that start with what is typed, with their descriptions' start.
pub fn workflow_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy();
    let Some(store) = store() else { return Vec::new() };
    let Ok(registry) = store.registry().load() else { return Vec::new() };
    registry
        .workflows
        .iter()
        .filter(|(name, _)| name.starts_with(typed.as_ref()))
        .take(MAX_CANDIDATES)
        .map(|(name, entry)| {
            CompletionCandidate::new(name.clone()).help(Some(entry.hash.to_string().into()))
        })
        .collect()
}
