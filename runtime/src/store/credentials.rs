//! The OAuth credentials of the MCP servers that ask for them (`oauth:` on a `url:` tool
//! server): what `tools login` gets once from a person's browser, and what every worker then
//! uses and refreshes — so they live in the store, beside its other secrets, not in one
//! machine's keychain: a private file per server in a home
//! (`credentials/<sha256 of the URL>.json`, 0600), a row of `tool_credentials` in a database.
//!
//! They are kept by the server's URL, not by the name a binding gives it: a token goes only to
//! the server it was granted for, and a name pointed at another URL has no credentials until
//! someone logs in to that one. What is kept is the OAuth client's own JSON (client id, token
//! response, scopes), opaque here.

use crate::error::Result;

/// Where the credentials of OAuth tool servers are kept.
pub trait CredentialBackend: Send + Sync + std::fmt::Debug {
    /// The credentials kept for the server at `url`, as JSON text.
    fn read(&self, url: &str) -> Result<Option<String>>;

    /// Keeps `credentials` (JSON text) for the server at `url`, replacing what was there.
    fn write(&self, url: &str, credentials: &str) -> Result<()>;

    /// Forgets the credentials of the server at `url`; whether there were any.
    fn remove(&self, url: &str) -> Result<bool>;
}
