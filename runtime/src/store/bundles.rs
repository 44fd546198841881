//! The bundle store: `bundles/<HASH>.wasm` byte for byte as added, its descriptor beside it
//! (or both in the database's `bundles` table), and the integrity checks (SHA-256 against the
//! registry, XXH64 against the id) done whenever a bundle is loaded.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::BundleHash;
use crate::store::descriptor::Descriptor;
use crate::store::registry::{BundleRecord, RegistryFile, SUMMARY_CHARS, yaml_reason};
use crate::store::{Backend, postgres};

/// Bundles and their descriptors, under a home or in a database.
#[derive(Debug, Clone)]
pub struct BundleStore {
    backend: Backend,
}

/// A stored bundle's bytes, verified.
#[derive(Debug, Clone)]
pub struct StoredBundle {
    pub hash: BundleHash,
    pub bytes: Vec<u8>,
    pub path: PathBuf,
}

impl BundleStore {
    /// The store of `home`.
    pub fn new(home: &Home) -> Self {
        BundleStore { backend: Backend::Files(home.clone()) }
    }

    /// The bundles of a store.
    pub(crate) fn of(backend: &Backend) -> Self {
        BundleStore { backend: backend.clone() }
    }

    /// Makes sure bundles can be stored (an unwritable home fails here, before the work of
    /// compiling a bundle to add).
    pub fn prepare(&self) -> Result<()> {
        match &self.backend {
            Backend::Files(home) => durable::create_dir(&home.bundles_dir()),
            Backend::Postgres(_) => Ok(()),
        }
    }

    /// Stores `bytes` as `bundles/<HASH>.wasm` with its descriptor, and records its SHA-256.
    /// Must be called with the registry lock held, inside [`Registry::update`](crate::store::registry::Registry::update).
    ///
    /// A bundle already stored under the same XXH64 with different bytes is refused: XXH64
    /// is not collision resistant, and the id must mean one thing.
    pub fn put(
        &self,
        registry: &mut RegistryFile,
        bytes: &[u8],
        descriptor: &Descriptor,
    ) -> Result<BundleHash> {
        let hash = BundleHash::of(bytes);
        let sha256 = sha256_hex(bytes);
        if let Some(record) = registry.bundles.get(&hash)
            && record.sha256 != sha256
        {
            return Err(Error::InvalidBundle {
                path: self.place(hash),
                reason: format!(
                    "XXH64 collision: a different bundle with id `{hash}` is already stored \
                     (SHA-256 {} vs {sha256})",
                    record.sha256
                ),
            });
        }
        let summary = descriptor.description.chars().take(SUMMARY_CHARS).collect();
        let record = BundleRecord { sha256, size: bytes.len() as u64, summary: Some(summary) };
        match &self.backend {
            Backend::Files(home) => {
                // Rewrite the file unless it is already intact, so a damaged copy is repaired
                // by adding the right bytes again.
                let path = home.bundle_file(hash);
                if std::fs::read(&path).map(|b| b != bytes).unwrap_or(true) {
                    durable::write_atomic(&path, bytes)?;
                }
                let yaml = serde_yaml::to_string(descriptor).expect("descriptor serializes");
                durable::write_atomic(&home.descriptor_file(hash), yaml.as_bytes())?;
            }
            Backend::Postgres(pg) => postgres::registry::put(pg, &record, hash, bytes, descriptor)?,
        }
        registry.bundles.insert(hash, record);
        Ok(hash)
    }

    /// Where bundle `hash` is kept, for messages.
    fn place(&self, hash: BundleHash) -> PathBuf {
        match &self.backend {
            Backend::Files(home) => home.bundle_file(hash),
            Backend::Postgres(pg) => postgres::registry::place(pg, hash),
        }
    }

    /// Loads a stored bundle and checks it against its integrity record. `name` is the
    /// workflow it is loaded for, for error messages.
    pub fn load(
        &self,
        registry: &RegistryFile,
        name: &str,
        hash: BundleHash,
    ) -> Result<StoredBundle> {
        let path = self.place(hash);
        let missing = || Error::MissingBundle {
            name: name.to_string(),
            hash: hash.to_string(),
            path: path.clone(),
        };
        let bytes = match &self.backend {
            Backend::Files(_) => match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(Error::io("read bundle", &path)(e)),
            },
            Backend::Postgres(pg) => postgres::registry::bytes(pg, hash)?.ok_or_else(missing)?,
        };
        let Some(record) = registry.bundles.get(&hash) else {
            return Err(Error::InvalidBundle {
                path,
                reason: "no integrity record in workflow.yaml; add the bundle again".into(),
            });
        };
        let actual = sha256_hex(&bytes);
        if let Backend::Postgres(pg) = &self.backend
            && (actual != record.sha256 || BundleHash::of(&bytes) != hash)
        {
            return Err(Error::CorruptBundle {
                hash: hash.to_string(),
                place: pg.target().to_string(),
                reason: format!(
                    "its bytes do not match it (SHA-256 {actual}, expected {}; XXH64 id {}); \
                     refusing to run it — add the bundle again to repair it",
                    record.sha256,
                    BundleHash::of(&bytes)
                ),
            });
        }
        if actual != record.sha256 || BundleHash::of(&bytes) != hash {
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
        let (text, path) = match &self.backend {
            Backend::Files(home) => {
                let path = home.descriptor_file(hash);
                (durable::read_text(&path, "read descriptor")?, path)
            }
            Backend::Postgres(pg) => {
                (postgres::registry::descriptor(pg, hash)?, postgres::registry::place(pg, hash))
            }
        };
        let Some(text) = text else {
            return Err(Error::MissingFile { what: "the descriptor of bundle", path });
        };
        serde_yaml::from_str(&text).map_err(|e| Error::Corrupt { path, reason: yaml_reason(&e) })
    }
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
