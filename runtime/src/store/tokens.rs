//! API tokens: who may call the HTTP API, and whether they may act or only read. A token is
//! shown once, when it is made; the store keeps only its SHA-256, so a copy of the store (a
//! backup, a database dump) gives nobody access. In a home: `api/tokens.json` (0600); in a
//! database: the `api_tokens` table ([`TokenBackend`]).

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::error::{Error, Result};

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

/// The error for a name already in use.
pub fn taken(name: &str) -> Error {
    Error::Usage(format!(
        "a token named `{name}` exists; revoke it first (`uncaged-workflow token revoke {name}`)"
    ))
}
