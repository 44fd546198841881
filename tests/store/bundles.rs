//! `BundleBackend`: bundle bytes and descriptors, stored once by hash and read back.

use super::*;
use uncaged_workflow::store::descriptor::Descriptor;
use uncaged_workflow::store::registry::BundleRecord;

contract! {
    /// Bytes and descriptor are kept as written, a damaged copy repaired by writing them
    /// again; a bundle not stored reads as none; where a bundle is kept is named for messages.
    fn a_bundle_is_stored_by_its_hash(store: &Storage) -> Result<()> {
        let backend = store.bundles().backend();
        backend.prepare()?;
        let bytes = b"\0asm pretend".to_vec();
        let hash = BundleHash::of(&bytes);
        let descriptor = Descriptor {
            description: "a bundle".into(),
            max_rounds: 3,
            roles: vec![],
            contract: "0.2.0".into(),
        };
        let record = BundleRecord {
            sha256: uncaged_workflow::store::bundles::sha256_hex(&bytes),
            size: bytes.len() as u64,
            summary: Some("a bundle".into()),
        };
        ensure!(backend.read(hash)?.is_none() && backend.read_descriptor(hash)?.is_none());
        backend.write(hash, &bytes, &descriptor, &record)?;
        ensure!(backend.read(hash)? == Some(bytes.clone()));
        let yaml = backend.read_descriptor(hash)?.context("a descriptor")?;
        ensure!(serde_yaml::from_str::<Descriptor>(&yaml)? == descriptor, "{yaml}");
        backend.write(hash, &bytes, &descriptor, &record)?;
        ensure!(backend.read(hash)? == Some(bytes));
        ensure!(backend.place(hash).to_string_lossy().contains(&hash.to_string()));
        ensure!(!backend.descriptor_place(hash).as_os_str().is_empty());
        ensure!(backend.database().is_some() == store.url().is_some());
        Ok(())
    }
}
