//! The process's HTTP clients: one TLS stack (rustls on ring, the provider PostgreSQL's TLS
//! uses too) installed once, before any client is built.

use std::sync::Once;

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
