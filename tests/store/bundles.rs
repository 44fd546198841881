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
        let (hash, descriptor, record) = described(&bytes);
        ensure!(backend.read(hash)?.is_none() && backend.read_descriptor(hash)?.is_none());
        ensure!(backend.stamp(hash)?.is_none());
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

    /// A bundle verified once is not read again while its stamp holds, and bytes changed
    /// after that (a damaged or tampered copy) change its stamp and are refused.
    fn a_verified_bundle_changed_since_is_refused(store: &Storage) -> Result<()> {
        let backend = store.bundles().backend();
        backend.prepare()?;
        let bytes = b"\0asm verified".to_vec();
        let (hash, descriptor, record) = described(&bytes);
        backend.write(hash, &bytes, &descriptor, &record)?;
        let mut registry = uncaged_workflow::store::registry::RegistryTable::default();
        registry.bundles.insert(hash, record.clone());
        let stamp = backend.stamp(hash)?.context("a stamp")?;
        store.bundles().verify(&registry, "w", hash)?;
        store.bundles().verify(&registry, "w", hash)?;
        ensure!(backend.stamp(hash)? == Some(stamp.clone()), "reading changed the stamp");
        let tampered = b"\0asm tampered".to_vec();
        backend.write(hash, &tampered, &descriptor, &record)?;
        ensure!(backend.stamp(hash)?.is_some_and(|now| now != stamp), "the stamp held");
        let refused = store.bundles().verify(&registry, "w", hash);
        ensure!(refused.is_err(), "changed bytes were not refused");
        backend.write(hash, &bytes, &descriptor, &record)?;
        store.bundles().verify(&registry, "w", hash)?;
        Ok(())
    }
}

/// A bundle of `bytes`: its id, a descriptor and its integrity record.
fn described(bytes: &[u8]) -> (BundleHash, Descriptor, BundleRecord) {
    let descriptor = Descriptor {
        description: "a bundle".into(),
        max_rounds: 3,
        roles: vec![],
        // Kept as it was given: a store holds the input schema every start is checked against.
        input_schema: Some(serde_json::json!({
            "type": "object", "required": ["issue"],
            "properties": {"issue": {"type": "integer", "minimum": 1}}
        })),
        contract: "0.3.0".into(),
    };
    let record = BundleRecord {
        sha256: uncaged_workflow::store::bundles::sha256_hex(bytes),
        size: bytes.len() as u64,
        summary: Some("a bundle".into()),
    };
    (BundleHash::of(bytes), descriptor, record)
}
