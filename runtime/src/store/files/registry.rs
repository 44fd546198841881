//! The registry and the bundles of a home directory: `workflow.yaml` (replaced atomically,
//! changed under the exclusive lock of `workflow.lock`), and `bundles/<HASH>.wasm` with its
//! descriptor `bundles/<HASH>.yaml`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::ids::BundleHash;
use crate::store::bundles::BundleBackend;
use crate::store::descriptor::Descriptor;
use crate::store::registry::{BundleRecord, RegistryBackend, RegistryTable, yaml_reason};

/// `workflow.yaml` under a home.
#[derive(Debug)]
pub struct FileRegistry {
    home: Home,
}

impl FileRegistry {
    pub fn new(home: &Home) -> Self {
        FileRegistry { home: home.clone() }
    }
}

impl RegistryBackend for FileRegistry {
    fn load(&self) -> Result<RegistryTable> {
        let path = self.home.registry_file();
        let Some(text) = durable::read_text(&path, "read registry")? else {
            return Ok(RegistryTable::default());
        };
        if text.trim().is_empty() {
            return Ok(RegistryTable::default());
        }
        serde_yaml::from_str(&text).map_err(|e| Error::Corrupt { path, reason: yaml_reason(&e) })
    }

    fn update(&self, change: &mut dyn FnMut(&mut RegistryTable) -> Result<()>) -> Result<()> {
        let _lock = lock(&self.home)?;
        let mut file = self.load()?;
        let before = file.clone();
        change(&mut file)?;
        if file != before {
            let yaml = serde_yaml::to_string(&file).expect("registry serializes");
            durable::write_atomic(&self.home.registry_file(), yaml.as_bytes())?;
        }
        Ok(())
    }
}

/// Takes the exclusive lock on a home's registry, released when the returned file is dropped.
fn lock(home: &Home) -> Result<File> {
    durable::create_dir(home.root())?;
    let path = home.registry_lock();
    let file =
        durable::open_private(OpenOptions::new().create(true).truncate(false).write(true), &path)
            .map_err(Error::io("open lock", &path))?;
    file.lock().map_err(Error::io("lock", &path))?;
    Ok(file)
}

/// `bundles/<HASH>.wasm` and `bundles/<HASH>.yaml` under a home.
#[derive(Debug)]
pub struct FileBundles {
    home: Home,
}

impl FileBundles {
    pub fn new(home: &Home) -> Self {
        FileBundles { home: home.clone() }
    }
}

impl BundleBackend for FileBundles {
    fn prepare(&self) -> Result<()> {
        durable::create_dir(&self.home.bundles_dir())
    }

    fn write(
        &self,
        hash: BundleHash,
        bytes: &[u8],
        descriptor: &Descriptor,
        _: &BundleRecord,
    ) -> Result<()> {
        // Rewrite the file unless it is already intact, so a damaged copy is repaired by
        // adding the right bytes again.
        let path = self.home.bundle_file(hash);
        if std::fs::read(&path).map(|b| b != bytes).unwrap_or(true) {
            durable::write_atomic(&path, bytes)?;
        }
        let yaml = serde_yaml::to_string(descriptor).expect("descriptor serializes");
        durable::write_atomic(&self.home.descriptor_file(hash), yaml.as_bytes())
    }

    fn read(&self, hash: BundleHash) -> Result<Option<Vec<u8>>> {
        let path = self.home.bundle_file(hash);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("read bundle", &path)(e)),
        }
    }

    fn stamp(&self, hash: BundleHash) -> Result<Option<String>> {
        let path = self.home.bundle_file(hash);
        match std::fs::metadata(&path) {
            // The change time too: setting the modification time back cannot hide a change.
            Ok(meta) => Ok(Some(format!(
                "{} {} {}.{} {}.{}",
                meta.ino(),
                meta.len(),
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ctime(),
                meta.ctime_nsec()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("read bundle", &path)(e)),
        }
    }

    fn read_descriptor(&self, hash: BundleHash) -> Result<Option<String>> {
        durable::read_text(&self.home.descriptor_file(hash), "read descriptor")
    }

    fn place(&self, hash: BundleHash) -> PathBuf {
        self.home.bundle_file(hash)
    }

    fn descriptor_place(&self, hash: BundleHash) -> PathBuf {
        self.home.descriptor_file(hash)
    }

    fn database(&self) -> Option<String> {
        None
    }
}
