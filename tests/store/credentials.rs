//! `CredentialBackend`: tool servers' OAuth credentials, kept by the server's URL.

use super::*;

contract! {
    /// Credentials are kept per URL, replaced whole, and forgotten; on a home, in a file only
    /// its owner reads.
    fn a_tool_servers_credentials_are_kept_by_its_url(store: &Storage) -> Result<()> {
        let credentials = store.credentials();
        let (one, other) = ("https://mcp.example/mcp", "https://mcp.example/other");
        ensure!(credentials.read(one)?.is_none());
        credentials.write(one, r#"{"client_id": "c1", "token": "a"}"#)?;
        credentials.write(other, r#"{"client_id": "c2"}"#)?;
        credentials.write(one, r#"{"client_id": "c1", "token": "b"}"#)?;
        ensure!(credentials.read(one)?.as_deref() == Some(r#"{"client_id": "c1", "token": "b"}"#));
        ensure!(credentials.read(other)?.as_deref() == Some(r#"{"client_id": "c2"}"#));
        ensure!(credentials.remove(one)?);
        ensure!(!credentials.remove(one)?);
        ensure!(credentials.read(one)?.is_none() && credentials.read(other)?.is_some());
        let dir = store.home().credentials_dir();
        if let Ok(files) = std::fs::read_dir(&dir) {
            use std::os::unix::fs::PermissionsExt;
            for file in files.flatten() {
                let mode = file.metadata()?.permissions().mode() & 0o777;
                ensure!(mode == 0o600, "{}: {mode:o}", file.path().display());
            }
        }
        Ok(())
    }
}
