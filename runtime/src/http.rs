//! The process's HTTP clients: one TLS stack (rustls on ring, the provider PostgreSQL's TLS
//! uses too) installed once, before any client is built; and the clients agents share.

use std::collections::HashMap;
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;

/// Installs ring as the process's TLS provider, once. reqwest, the OTLP exporter and the MCP
/// client all ask for the process default; without one they cannot make a client at all.
pub fn install_tls() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        // Another part of the process may have installed the same provider first.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A client builder, the TLS provider in place.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_tls();
    reqwest::Client::builder()
}

/// The process's client whose requests time out after `timeout`, made once and shared (a
/// client is a handle to one pool of connections): building one reads the machine's root
/// certificates, ~2.5 ms, which every thread of a worker or an eval binding a model paid at
/// its start; and threads calling one provider now reuse its connections.
pub fn shared_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    static CLIENTS: OnceLock<Mutex<HashMap<Duration, reqwest::Client>>> = OnceLock::new();
    let clients = CLIENTS.get_or_init(Default::default);
    if let Some(client) = clients.lock().unwrap_or_else(|e| e.into_inner()).get(&timeout) {
        return Ok(client.clone());
    }
    // Built outside the lock: another thread may build one too, and one of them is kept.
    let client = client_builder().timeout(timeout).build()?;
    let mut clients = clients.lock().unwrap_or_else(|e| e.into_inner());
    Ok(clients.entry(timeout).or_insert(client).clone())
}

/// Standard Webhooks' signing, one place for both sides: the webhook triggers verify with it,
/// `notify:` webhook channels sign with it. The key of a `whsec_` secret is its base64 after
/// the prefix; a secret without the prefix is its own bytes. `None`: malformed base64.
pub fn standard_webhooks_key(secret: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    match std::str::from_utf8(secret).ok().and_then(|s| s.strip_prefix("whsec_")) {
        Some(encoded) => base64::engine::general_purpose::STANDARD.decode(encoded).ok(),
        None => Some(secret.to_vec()),
    }
}

/// The MAC of a Standard Webhooks message: HMAC-SHA256 of `id.timestamp.body` under `key`.
pub fn standard_webhooks_mac(
    key: &[u8],
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    mac
}
