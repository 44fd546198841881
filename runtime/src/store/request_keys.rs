//! Request keys: what makes a retried request start one thread, not two. An API client's
//! `Idempotency-Key` (and, later, a webhook's delivery id) is claimed for a thread id before
//! the thread is created; a second request with the key gets the thread the first claimed.
//!
//! A claim is one atomic insert-if-absent — a file created with no-clobber in a home
//! (`api/requests/<scope>/<sha256 of the key>.json`), a row with a primary key in a database
//! (`request_keys`) — so two processes, on two machines sharing a database, cannot both win.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::ThreadId;
use crate::store::bundles::sha256_hex;

/// A key and what it was claimed for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestKey {
    /// Whose keys these are (a token's name): two clients' keys never meet.
    pub scope: String,
    pub key: String,
    /// A digest of what the request asked: the same key with another request is refused.
    pub fingerprint: String,
    /// The thread the key stands for.
    pub thread: ThreadId,
    /// When it was claimed (ms since the epoch).
    pub created: u64,
}

/// How a claim went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is now this request's.
    New,
    /// Another request had it: what it claimed.
    Taken(RequestKey),
}

/// Where request keys are kept.
pub trait RequestKeys: Send + Sync + std::fmt::Debug {
    /// Claims `key` unless it is taken.
    fn claim(&self, key: &RequestKey) -> Result<Claim>;

    /// Forgets the keys claimed before `cutoff` (ms since the epoch): a request retried with
    /// one of them later starts a thread of its own. Returns how many were forgotten.
    fn forget_before(&self, cutoff: u64) -> Result<usize>;
}

/// The request keys of a store.
pub type SharedRequestKeys = Arc<dyn RequestKeys>;

/// The longest key taken: keys are ids a client makes (a UUID is 36 characters).
pub const MAX_KEY_LEN: usize = 255;

/// Request keys in a home.
#[derive(Debug)]
pub struct FileRequestKeys {
    dir: PathBuf,
}

impl FileRequestKeys {
    pub fn new(home: &Home) -> Self {
        FileRequestKeys { dir: home.api_dir().join("requests") }
    }

    /// The file of `scope`'s key `key`: named by hashes, so no key reaches a path.
    fn file(&self, scope: &str, key: &str) -> PathBuf {
        let scope = &sha256_hex(scope.as_bytes())[..16];
        self.dir.join(scope).join(format!("{}.json", sha256_hex(key.as_bytes())))
    }
}

impl RequestKeys for FileRequestKeys {
    fn claim(&self, key: &RequestKey) -> Result<Claim> {
        let path = self.file(&key.scope, &key.key);
        let bytes = serde_json::to_vec(key).expect("a key serializes");
        match durable::create_atomic(&path, &bytes, |_| Ok(())) {
            Ok(_) => Ok(Claim::New),
            Err(Error::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = durable::read_text(&path, "read a request key")?.unwrap_or_default();
                let taken = serde_json::from_str(&text)
                    .map_err(|e| Error::Corrupt { path, reason: e.to_string() })?;
                Ok(Claim::Taken(taken))
            }
            Err(e) => Err(e),
        }
    }

    fn forget_before(&self, cutoff: u64) -> Result<usize> {
        let mut forgotten = 0;
        let Ok(scopes) = std::fs::read_dir(&self.dir) else { return Ok(0) };
        for scope in scopes.flatten() {
            let Ok(keys) = std::fs::read_dir(scope.path()) else { continue };
            for key in keys.flatten() {
                let path = key.path();
                let claimed = durable::read_text(&path, "read a request key")?
                    .and_then(|text| serde_json::from_str::<RequestKey>(&text).ok());
                // A file that does not read (a torn temporary file) is left to its writer.
                if claimed.is_some_and(|k| k.created < cutoff) {
                    std::fs::remove_file(&path).map_err(Error::io("remove", &path))?;
                    forgotten += 1;
                }
            }
        }
        Ok(forgotten)
    }
}
