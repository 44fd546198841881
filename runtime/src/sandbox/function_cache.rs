//! Cranelift's incremental compilation cache, on disk: compiled functions keyed by the hash
//! of their code, so that compiling a bundle recompiles only the functions never compiled
//! before. Every declarative bundle is the same interpreter composed with another definition,
//! so after the first, adding one compiles almost nothing.
//!
//! One file per function under `cache/functions/`, written by rename; never fsynced, since an
//! entry lost or torn by a crash is only a miss (Cranelift recompiles a function whose entry
//! does not decode). Like the AOT cache beside it, the directory is trusted as the home is.

use std::borrow::Cow;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use wasmtime::CacheStore;

#[derive(Debug)]
pub struct FunctionCache {
    dir: PathBuf,
}

impl FunctionCache {
    pub fn new(dir: PathBuf) -> Self {
        FunctionCache { dir }
    }

    /// `functions/ab/cdef…`: the SHA-256 of the key in hex, fanned out by its first byte.
    fn path(&self, key: &[u8]) -> PathBuf {
        let hex: String = Sha256::digest(key).iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }
}

impl CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        std::fs::read(self.path(key)).ok().map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let path = self.path(key);
        let Some(dir) = path.parent() else { return false };
        if crate::durable::create_dir(dir).is_err() {
            return false;
        }
        // Unique per writer: two processes compiling the same function both succeed.
        let temp = dir.join(format!(".{}.{}", std::process::id(), ulid::Ulid::new()));
        let written =
            std::fs::write(&temp, &value).is_ok() && std::fs::rename(&temp, &path).is_ok();
        if !written {
            let _ = std::fs::remove_file(&temp);
        }
        written
    }
}
