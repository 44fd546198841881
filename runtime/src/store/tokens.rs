//! API tokens: who may call the HTTP API, and whether they may act or only read. A token is
//! shown once, when it is made; the store keeps only its SHA-256, so a copy of the store (a
//! backup, a database dump) gives nobody access. In a home: `api/tokens.json` (0600); in a
//! database: the `api_tokens` table ([`TokenBackend`]).

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::durable;
use crate::error::{Error, Result};
use crate::home::Home;

/// What every token starts with: a secret scanner (GitHub's, say) can tell it from noise.
pub const PREFIX: &str = "uwt_";

/// A token as the store keeps it: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiToken {
    pub name: String,
    /// The SHA-256 of the token, as hex.
    pub hash: String,
    /// May read, never act (start, kill, answer …).
    pub read_only: bool,
    /// When it was made (ms since the epoch).
    pub created: u64,
}

/// Where tokens are kept.
pub trait TokenBackend: Send + Sync + std::fmt::Debug {
    /// Adds `token`; fails with a usage error if its name is taken.
    fn add(&self, token: &ApiToken) -> Result<()>;
    /// Every token, by name.
    fn list(&self) -> Result<Vec<ApiToken>>;
    /// Removes the token named `name`; false if there was none.
    fn revoke(&self, name: &str) -> Result<bool>;
    /// The token whose hash is `hash`.
    fn find(&self, hash: &str) -> Result<Option<ApiToken>>;
}

/// The tokens of a store.
pub type Tokens = Arc<dyn TokenBackend>;

/// A token just made: the secret, to be shown once, and what is kept of it.
#[derive(Debug)]
pub struct Issued {
    pub secret: String,
    pub token: ApiToken,
}

/// Makes a token named `name` and keeps its hash.
pub fn issue(tokens: &dyn TokenBackend, name: &str, read_only: bool) -> Result<Issued> {
    check_name(name)?;
    let secret = format!("{PREFIX}{}", crate::ids::random_hex(32));
    let token =
        ApiToken { name: name.to_string(), hash: hash(&secret), read_only, created: now_ms() };
    tokens.add(&token)?;
    Ok(Issued { secret, token })
}

/// The token `presented` is, if the store knows it. It is looked up by its hash: the
/// comparison an attacker could time is of hashes they cannot choose.
pub fn authenticate(tokens: &dyn TokenBackend, presented: &str) -> Result<Option<ApiToken>> {
    if !presented.starts_with(PREFIX) || presented.len() > 200 {
        return Ok(None);
    }
    tokens.find(&hash(presented))
}

/// The SHA-256 of a token, as hex.
pub fn hash(secret: &str) -> String {
    super::bundles::sha256_hex(secret.as_bytes())
}

/// A token's name: 1–64 of `A-Z a-z 0-9 - _ .`, as shown in listings and logs.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "token name `{}`: use 1 to 64 of A-Z a-z 0-9 - _ .",
            crate::terminal::line(name)
        )))
    }
}

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

/// The error for a name already in use.
pub fn taken(name: &str) -> Error {
    Error::Usage(format!(
        "a token named `{name}` exists; revoke it first (`uncaged-workflow token revoke {name}`)"
    ))
}
