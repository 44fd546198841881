//! OAuth credentials in a home directory: `credentials/<sha256 of the server's URL>.json`,
//! private to the home's owner (0600), replaced atomically so a refresh that crashes leaves
//! the old tokens or the new, never half of each.

use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::store::bundles::sha256_hex;
use crate::store::credentials::CredentialBackend;

/// The credentials in a home.
#[derive(Debug)]
pub struct FileCredentials {
    dir: PathBuf,
}

impl FileCredentials {
    pub fn new(home: &Home) -> Self {
        FileCredentials { dir: home.credentials_dir() }
    }

    /// The file of the server at `url`: named by a hash, so no URL reaches a path.
    fn file(&self, url: &str) -> PathBuf {
        self.dir.join(format!("{}.json", sha256_hex(url.as_bytes())))
    }
}

impl CredentialBackend for FileCredentials {
    fn read(&self, url: &str) -> Result<Option<String>> {
        durable::read_text(&self.file(url), "read the credentials of a tool server")
    }

    fn write(&self, url: &str, credentials: &str) -> Result<()> {
        durable::write_atomic(&self.file(url), credentials.as_bytes())
    }

    fn remove(&self, url: &str) -> Result<bool> {
        let path = self.file(url);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("remove", &path)(e)),
        }
    }
}
