//! `RequestKeys`: the keys that make a retried request start one thread.

use super::*;

contract! {
    /// Request keys: the first claim wins, a second gets what the first claimed, and scopes
    /// keep clients apart.
    fn a_request_key_is_claimed_once(store: &Storage) -> Result<()> {
        use uncaged_workflow::store::request_keys::{Claim, RequestKey};
        let key = |scope: &str, fingerprint: &str| RequestKey {
            scope: scope.into(),
            key: "retry-me".into(),
            fingerprint: fingerprint.into(),
            thread: ThreadId::new(),
            created: 5,
        };
        let first = key("token:ci", "a");
        ensure!(store.request_keys().claim(&first)? == Claim::New);
        match store.request_keys().claim(&key("token:ci", "b"))? {
            Claim::Taken(taken) => ensure!(taken == first, "{taken:?}"),
            Claim::New => anyhow::bail!("claimed twice"),
        }
        ensure!(store.request_keys().claim(&key("token:other", "a"))? == Claim::New);
        // Forgotten once old enough: the key may then be claimed again.
        ensure!(store.request_keys().forget_before(5)? == 0);
        ensure!(store.request_keys().forget_before(6)? == 2);
        ensure!(store.request_keys().claim(&key("token:ci", "c"))? == Claim::New);
        Ok(())
    }
}
