//! The bundle store: `bundles/<HASH>.wasm` byte for byte as added, its descriptor beside it,
//! and the integrity checks (SHA-256 against the registry) done whenever a bundle is loaded.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::BundleHash;
use crate::store::descriptor::Descriptor;
use crate::store::registry::{BundleRecord, RegistryFile, SUMMARY_CHARS, yaml_reason};

/// Bundles and their descriptors under a home.
#[derive(Debug, Clone)]
pub struct BundleStore {
    home: Home,
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
        BundleStore { home: home.clone() }
    }

    /// Makes sure bundles can be stored (an unwritable home fails here, before the work of
    /// compiling a bundle to add).
    pub fn prepare(&self) -> Result<()> {
        durable::create_dir(&self.home.bundles_dir())
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
        let path = self.home.bundle_file(hash);
        if let Some(record) = registry.bundles.get(&hash)
            && record.sha256 != sha256
        {
            return Err(Error::InvalidBundle {
                path,
                reason: format!(
                    "XXH64 collision: a different bundle with id `{hash}` is already stored \
                     (SHA-256 {} vs {sha256})",
                    record.sha256
                ),
            });
        }
        // Rewrite the file unless it is already intact, so a damaged copy is repaired by
        // adding the right bytes again.
        if std::fs::read(&path).map(|b| b != bytes).unwrap_or(true) {
            durable::write_atomic(&path, bytes)?;
        }
        let yaml = serde_yaml::to_string(descriptor).expect("descriptor serializes");
        durable::write_atomic(&self.home.descriptor_file(hash), yaml.as_bytes())?;
        let summary = descriptor.description.chars().take(SUMMARY_CHARS).collect();
        registry.bundles.insert(
            hash,
            BundleRecord { sha256, size: bytes.len() as u64, summary: Some(summary) },
        );
        Ok(hash)
    }

    /// Loads a stored bundle and checks it against its integrity record. `name` is the
    /// workflow it is loaded for, for error messages.
    pub fn load(
        &self,
        registry: &RegistryFile,
        name: &str,
        hash: BundleHash,
    ) -> Result<StoredBundle> {
        let path = self.home.bundle_file(hash);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::MissingBundle {
                    name: name.to_string(),
                    hash: hash.to_string(),
                    path,
                });
            }
            Err(e) => return Err(Error::io("read bundle", &path)(e)),
        };
        let Some(record) = registry.bundles.get(&hash) else {
            return Err(Error::InvalidBundle {
                path,
                reason: "no integrity record in workflow.yaml; add the bundle again".into(),
            });
        };
        let actual = sha256_hex(&bytes);
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
        let path = self.home.descriptor_file(hash);
        let Some(text) = durable::read_text(&path, "read descriptor")? else {
            return Err(Error::MissingFile { what: "the descriptor of bundle", path });
        };
        serde_yaml::from_str(&text).map_err(|e| Error::Corrupt { path, reason: yaml_reason(&e) })
    }
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
