//! Request keys in a home directory: a claim is a file created with no-clobber,
//! `api/requests/<scope>/<sha256 of the key>.json`, so that two processes cannot both win.

use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::store::bundles::sha256_hex;
use crate::store::request_keys::{Claim, RequestKey, RequestKeys};

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
