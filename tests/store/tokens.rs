//! `TokenBackend`: the HTTP API's tokens, kept as hashes.

use super::*;

contract! {
    /// API tokens: kept as hashes, found by the token, refused twice under one name, gone
    /// once revoked.
    fn tokens_are_kept_as_hashes_and_revoked(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::tokens;
        let ci = tokens::issue(store.tokens(), "ci", false)?;
        let viewer = tokens::issue(store.tokens(), "viewer", true)?;
        ensure!(ci.token.hash != ci.secret && !ci.token.hash.contains(&ci.secret[4..]));
        let found = tokens::authenticate(store.tokens(), &viewer.secret)?;
        ensure!(found.as_ref().is_some_and(|t| t.name == "viewer" && t.read_only), "{found:?}");
        ensure!(tokens::authenticate(store.tokens(), "uwt_nothing")?.is_none());
        ensure!(matches!(tokens::issue(store.tokens(), "ci", true), Err(Error::Usage(_))));
        let names: Vec<String> = store.tokens().list()?.into_iter().map(|t| t.name).collect();
        ensure!(names == ["ci", "viewer"], "{names:?}");
        ensure!(store.tokens().revoke("ci")? && !store.tokens().revoke("ci")?);
        ensure!(tokens::authenticate(store.tokens(), &ci.secret)?.is_none());
        Ok(())
    }

    /// The backend adds a token once per name and finds it by its hash alone.
    fn a_token_is_found_by_its_hash(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::tokens::ApiToken;
        let token = ApiToken { name: "bot".into(), hash: "ab".repeat(32), read_only: true, created: 7 };
        store.tokens().add(&token)?;
        ensure!(matches!(store.tokens().add(&token), Err(Error::Usage(_))), "a name once");
        ensure!(store.tokens().find(&"ab".repeat(32))? == Some(token));
        ensure!(store.tokens().find(&"cd".repeat(32))?.is_none());
        Ok(())
    }
}
