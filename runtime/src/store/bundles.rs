//! The bundle store: `bundles/<HASH>.wasm` byte for byte as added, its descriptor beside it
//! (or both in the database's `bundles` table), and the integrity checks (SHA-256 against the
//! registry, XXH64 against the id) done whenever a bundle is loaded.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::ids::BundleHash;
use crate::store::descriptor::Descriptor;
use crate::store::registry::{BundleRecord, RegistryTable, SUMMARY_CHARS, yaml_reason};

/// Where bundle bytes and descriptors are kept: files under a home, or a database table.
pub trait BundleBackend: Send + Sync + fmt::Debug {
    /// Makes sure bundles can be stored.
    fn prepare(&self) -> Result<()>;
    /// Stores a bundle's bytes and descriptor, repairing a damaged copy.
    fn write(
        &self,
        hash: BundleHash,
        bytes: &[u8],
        descriptor: &Descriptor,
        record: &BundleRecord,
    ) -> Result<()>;
    /// A bundle's bytes, `None` if it is not stored.
    fn read(&self, hash: BundleHash) -> Result<Option<Vec<u8>>>;
    /// What changes whenever a bundle's stored bytes change (a file's size and modification
    /// time, a row's version), `None` if it is not stored: bytes verified under one stamp need
    /// not be read and hashed again while it holds.
    fn stamp(&self, hash: BundleHash) -> Result<Option<String>>;
    /// A bundle's descriptor as stored (YAML), `None` if it is not stored.
    fn read_descriptor(&self, hash: BundleHash) -> Result<Option<String>>;
    /// Where a bundle is, for messages.
    fn place(&self, hash: BundleHash) -> PathBuf;
    /// Where its descriptor is, for messages.
    fn descriptor_place(&self, hash: BundleHash) -> PathBuf {
        self.place(hash)
    }
    /// The database that holds the bundles, if it is one (for the message that its bytes
    /// were changed).
    fn database(&self) -> Option<String>;
}

/// Bundles and their descriptors.
#[derive(Debug, Clone)]
pub struct BundleStore {
    backend: Arc<dyn BundleBackend>,
    /// The bundles this process verified: each one's stamp then, and the SHA-256 it matched.
    verified: Arc<Mutex<HashMap<BundleHash, (String, String)>>>,
}

/// A stored bundle's bytes, verified.
#[derive(Debug, Clone)]
pub struct StoredBundle {
    pub hash: BundleHash,
    pub bytes: Vec<u8>,
    pub path: PathBuf,
}

impl BundleStore {
    /// The bundles `backend` keeps.
    pub fn with(backend: Arc<dyn BundleBackend>) -> Self {
        BundleStore { backend, verified: Arc::default() }
    }

    /// Where they are kept (what the store contract tests, method by method).
    pub fn backend(&self) -> &dyn BundleBackend {
        &*self.backend
    }

    /// Makes sure bundles can be stored (an unwritable home fails here, before the work of
    /// compiling a bundle to add).
    pub fn prepare(&self) -> Result<()> {
        self.backend.prepare()
    }

    /// Stores `bytes` with its descriptor, and records its SHA-256. Must be called inside
    /// [`Registry::update`](crate::store::registry::Registry::update).
    ///
    /// A bundle already stored under the same XXH64 with different bytes is refused: XXH64
    /// is not collision resistant, and the id must mean one thing.
    pub fn put(
        &self,
        registry: &mut RegistryTable,
        bytes: &[u8],
        descriptor: &Descriptor,
    ) -> Result<BundleHash> {
        let hash = BundleHash::of(bytes);
        let sha256 = sha256_hex(bytes);
        if let Some(record) = registry.bundles.get(&hash)
            && record.sha256 != sha256
        {
            return Err(Error::InvalidBundle {
                path: self.backend.place(hash),
                reason: format!(
                    "XXH64 collision: a different bundle with id `{hash}` is already stored \
                     (SHA-256 {} vs {sha256})",
                    record.sha256
                ),
            });
        }
        let summary = descriptor.description.chars().take(SUMMARY_CHARS).collect();
        let record = BundleRecord { sha256, size: bytes.len() as u64, summary: Some(summary) };
        self.backend.write(hash, bytes, descriptor, &record)?;
        registry.bundles.insert(hash, record);
        Ok(hash)
    }

    /// Checks a stored bundle against its integrity record as [`load`](Self::load) does,
    /// without reading its bytes again where this process verified them under the stamp they
    /// still have (a start checks its bundle; reading and hashing it for every start of a
    /// busy server is most of what a start costs the store).
    pub fn verify(&self, registry: &RegistryTable, name: &str, hash: BundleHash) -> Result<()> {
        let stamp = self.backend.stamp(hash)?;
        let expected = registry.bundles.get(&hash).map(|r| r.sha256.as_str());
        if let (Some(stamp), Some(expected)) = (&stamp, expected)
            && self.verified.lock().get(&hash).is_some_and(|(s, sha)| s == stamp && sha == expected)
        {
            return Ok(());
        }
        self.load(registry, name, hash)?;
        // Stamped before the bytes were read: a change since then has another stamp.
        if let (Some(stamp), Some(expected)) = (stamp, expected) {
            self.verified.lock().insert(hash, (stamp, expected.to_string()));
        }
        Ok(())
    }

    /// Loads a stored bundle and checks it against its integrity record. `name` is the
    /// workflow it is loaded for, for error messages.
    pub fn load(
        &self,
        registry: &RegistryTable,
        name: &str,
        hash: BundleHash,
    ) -> Result<StoredBundle> {
        let path = self.backend.place(hash);
        let Some(bytes) = self.backend.read(hash)? else {
            return Err(Error::MissingBundle {
                name: name.to_string(),
                hash: hash.to_string(),
                path,
            });
        };
        let Some(record) = registry.bundles.get(&hash) else {
            return Err(Error::InvalidBundle {
                path,
                reason: "no integrity record in the registry; add the bundle again".into(),
            });
        };
        let actual = sha256_hex(&bytes);
        if actual != record.sha256 || BundleHash::of(&bytes) != hash {
            if let Some(database) = self.backend.database() {
                return Err(Error::CorruptBundle {
                    hash: hash.to_string(),
                    place: database,
                    reason: format!(
                        "its bytes do not match it (SHA-256 {actual}, expected {}; XXH64 id {}); \
                         refusing to run it — add the bundle again to repair it",
                        record.sha256,
                        BundleHash::of(&bytes)
                    ),
                });
            }
            return Err(Error::InvalidBundle {
                path,
                reason: format!(
                    "bundle file was modified after it was added (SHA-256 {actual}, expected {}); \
                     refusing to run it",
                    record.sha256
                ),
            });
        }
        Ok(StoredBundle { hash, bytes, path })
    }

    /// Reads the descriptor stored beside a bundle.
    pub fn descriptor(&self, hash: BundleHash) -> Result<Descriptor> {
        let path = self.backend.descriptor_place(hash);
        let Some(text) = self.backend.read_descriptor(hash)? else {
            return Err(Error::MissingFile { what: "the descriptor of bundle", path });
        };
        serde_yaml::from_str(&text).map_err(|e| Error::Corrupt { path, reason: yaml_reason(&e) })
    }
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
