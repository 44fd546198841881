//! A2A push-notification configs: where an A2A client asked to be told when its task (a
//! thread) comes to rest or ends — a URL, and the token or credentials sent with each push.
//! Kept with the thread's id; the `serve` notifier sends each change once (as a delivery in
//! [`super::notices`]). In a home: `reach/push/<thread>/<id>.json`; in a database: the
//! `push_configs` table.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ids::ThreadId;

/// One push config of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfig {
    pub thread: ThreadId,
    /// Its id within the task (the client's, or made here).
    pub id: String,
    /// The A2A config as the client gave it (URL, token, authentication), as JSON.
    pub config: serde_json::Value,
    /// Who made it (a token's name).
    pub owner: String,
    pub created: u64,
}

/// Where push configs are kept.
pub trait PushConfigBackend: Send + Sync + std::fmt::Debug {
    /// Keeps `config`, replacing one of the same thread and id.
    fn put(&self, config: &PushConfig) -> Result<()>;
    /// The configs of thread `thread`, oldest first.
    fn of_thread(&self, thread: ThreadId) -> Result<Vec<PushConfig>>;
    /// Forgets config `id` of thread `thread`; whether there was one.
    fn delete(&self, thread: ThreadId, id: &str) -> Result<bool>;
    /// Every config, of every thread (the notifier's round).
    fn all(&self) -> Result<Vec<PushConfig>>;
}

/// Whether `id` may name a config: it becomes a file name in a home.
pub fn check_id(id: &str) -> std::result::Result<(), String> {
    let fits = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    fits.then_some(())
        .ok_or_else(|| "a push config's id is 1 to 64 characters from A-Z a-z 0-9 - _".to_string())
}
