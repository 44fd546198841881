//! API tokens in a home directory: `api/tokens.json` (0600), replaced atomically under
//! `api/tokens.lock`; only each token's SHA-256 is kept.

use std::path::PathBuf;

use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::store::tokens::{ApiToken, TokenBackend, taken};

/// Tokens in a home: `api/tokens.json`, replaced atomically under `api/tokens.lock`.
#[derive(Debug)]
pub struct FileTokens {
    file: PathBuf,
    lock: PathBuf,
}

impl FileTokens {
    pub fn new(home: &Home) -> Self {
        FileTokens {
            file: home.api_dir().join("tokens.json"),
            lock: home.api_dir().join("tokens.lock"),
        }
    }

    fn read(&self) -> Result<Vec<ApiToken>> {
        let Some(text) = durable::read_text(&self.file, "read the API tokens")? else {
            return Ok(vec![]);
        };
        serde_json::from_str(&text)
            .map_err(|e| Error::Corrupt { path: self.file.clone(), reason: e.to_string() })
    }

    /// Changes the tokens under the lock, one process at a time.
    fn change<T>(&self, change: impl FnOnce(&mut Vec<ApiToken>) -> Result<T>) -> Result<T> {
        durable::create_dir(durable::parent_dir(&self.lock))?;
        let lock = durable::AppendFile::open(&self.lock, false)?;
        lock.lock().map_err(Error::io("lock", &self.lock))?;
        let mut tokens = self.read()?;
        let out = change(&mut tokens)?;
        let json = serde_json::to_vec_pretty(&tokens).expect("tokens serialize");
        durable::write_atomic(&self.file, &json)?;
        Ok(out)
    }
}

impl TokenBackend for FileTokens {
    fn add(&self, token: &ApiToken) -> Result<()> {
        self.change(|tokens| {
            if tokens.iter().any(|t| t.name == token.name) {
                return Err(taken(&token.name));
            }
            tokens.push(token.clone());
            tokens.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(())
        })
    }

    fn list(&self) -> Result<Vec<ApiToken>> {
        self.read()
    }

    fn revoke(&self, name: &str) -> Result<bool> {
        self.change(|tokens| {
            let before = tokens.len();
            tokens.retain(|t| t.name != name);
            Ok(tokens.len() != before)
        })
    }

    fn find(&self, hash: &str) -> Result<Option<ApiToken>> {
        Ok(self.read()?.into_iter().find(|t| t.hash == hash))
    }
}
