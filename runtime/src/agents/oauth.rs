//! Signing in to MCP servers that ask for OAuth 2.1 (`oauth:` on a `url:` tool server), with
//! the official Rust SDK's client: `tools login` does the browser step once — discovery of the
//! server's authorization server (RFC 9728, RFC 8414), dynamic client registration (RFC 7591),
//! the authorization code with PKCE, a redirect to a listener on loopback — and every agent
//! call then connects with the tokens the store keeps, refreshed as they run out. A refresh
//! the authorization server refuses leaves the thread resting until a person signs in again.
//!
//! The tokens are secrets: they live in the store (see [`crate::store::credentials`]), go only
//! to the URL they were granted for, and never reach a log or an error message.

use std::sync::Arc;
use std::time::Duration;

use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession,
    CredentialStore, StoredCredentials,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::AgentFailure;
use crate::store::credentials::CredentialBackend;
use crate::store::tool_servers::OAuthSettings;

/// How long `tools login` waits for the browser to come back.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The SDK's credential store on the store's: one server's credentials, by its URL.
struct StoreCredentials {
    backend: Arc<dyn CredentialBackend>,
    url: String,
}

/// A store failure as the SDK's error (its message names no secret).
fn store_error(e: crate::Error) -> AuthError {
    AuthError::CredentialStoreError(crate::error::chain_line(&e))
}

#[async_trait::async_trait]
impl CredentialStore for StoreCredentials {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let Some(text) = self.backend.read(&self.url).map_err(store_error)? else {
            return Ok(None);
        };
        // Credentials that do not read are none: the person signs in again.
        Ok(serde_json::from_str(&text).ok())
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let text = serde_json::to_string(&credentials)
            .map_err(|e| AuthError::CredentialStoreError(e.to_string()))?;
        self.backend.write(&self.url, &text).map_err(store_error)
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.backend.remove(&self.url).map(|_| ()).map_err(store_error)
    }
}

/// The SDK's manager of `url`'s authorization, on the store's credentials. Discovered
/// metadata may name a private address: the server is one config.yaml trusts.
async fn manager(
    backend: &Arc<dyn CredentialBackend>,
    url: &str,
) -> Result<AuthorizationManager, AuthError> {
    // The SDK builds its own HTTP client, on the process's TLS provider.
    crate::http::install_tls();
    let mut manager = AuthorizationManager::new_allowing_private_addresses(url).await?;
    manager.set_credential_store(StoreCredentials { backend: backend.clone(), url: url.into() });
    Ok(manager)
}

/// What a person is told to do when server `name` needs them to sign in.
pub fn sign_in_needed(name: &str, why: &str) -> String {
    format!(
        "tool server `{name}` needs a person to sign in ({why}): run `uncaged-workflow tools \
         login {name}`, then resume the thread"
    )
}

/// An HTTP client of `url` that sends the access token `tools login` got, refreshing it
/// when it runs out (and keeping the new one in the store for every worker). No credentials,
/// or a refresh the authorization server refuses, is [`AgentFailure::SignIn`].
pub async fn authorized_client(
    backend: &Arc<dyn CredentialBackend>,
    name: &str,
    url: &str,
    http: reqwest::Client,
) -> Result<AuthClient<reqwest::Client>, AgentFailure> {
    let unreachable = |e: AuthError| AgentFailure::Failed {
        message: format!("tool server `{name}`: its authorization: {e}"),
        transient: true,
    };
    let mut manager = manager(backend, url).await.map_err(unreachable)?;
    match manager.initialize_from_store().await {
        Ok(true) => {}
        Ok(false) => return Err(AgentFailure::SignIn(sign_in_needed(name, "nobody has"))),
        Err(AuthError::CredentialStoreError(e)) => {
            return Err(AgentFailure::Failed { message: e, transient: true });
        }
        Err(e) => return Err(unreachable(e)),
    }
    // Refreshed now if it ran out, so that a refused refresh is told before the handshake.
    match manager.get_access_token().await {
        Ok(_) => Ok(AuthClient::new(http, manager)),
        Err(AuthError::TokenRefreshRejected(_) | AuthError::AuthorizationRequired) => Err(
            AgentFailure::SignIn(sign_in_needed(name, "its sign-in ran out and was not renewed")),
        ),
        Err(e) => Err(unreachable(e)),
    }
}

/// Signs in to the server at `url` in a person's browser: `show` is given the address to open,
/// and the sign-in ends when the browser comes back to a listener on loopback (within
/// [`LOGIN_TIMEOUT`]). The credentials are kept in the store.
pub async fn login(
    backend: &Arc<dyn CredentialBackend>,
    url: &str,
    settings: &OAuthSettings,
    show: impl FnOnce(&str),
) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("cannot listen on loopback for the browser: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let auth = |e: AuthError| format!("the authorization server: {e}");
    let mut manager = manager(backend, url).await.map_err(auth)?;
    let metadata = manager.resolve_metadata().await.map_err(auth)?;
    manager.set_metadata(metadata.metadata);
    let mut request = AuthorizationRequest::new(&redirect).with_client_name("uncaged-workflow");
    request = match settings.scopes.is_empty() {
        true => request.with_initial_scope_selection(),
        false => request.with_scopes(settings.scopes.iter().map(String::as_str)),
    };
    if let Some(client_id) = &settings.client_id {
        request = request.with_preregistered_client(client_id);
    }
    let session = AuthorizationSession::new(manager, request).await.map_err(|(_, e)| auth(e))?;
    show(session.get_authorization_url());
    let callback = tokio::time::timeout(LOGIN_TIMEOUT, redirected(&listener, port))
        .await
        .map_err(|_| {
            format!(
                "the browser did not come back within {}",
                humantime::format_duration(LOGIN_TIMEOUT)
            )
        })??;
    session.handle_callback_url(&callback).await.map_err(auth)?;
    Ok(())
}

/// The first request to `/callback` on `listener`, as a full URL; the browser is told it may
/// close the page. Other requests (a favicon) get 404.
async fn redirected(listener: &TcpListener, port: u16) -> Result<String, String> {
    loop {
        let (mut stream, _) =
            listener.accept().await.map_err(|e| format!("the browser's request: {e}"))?;
        let mut reader = BufReader::new(&mut stream);
        let mut line = String::new();
        // A request line, bounded: anything else on this port is not the browser we sent.
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut limited = (&mut reader).take(8192);
            limited.read_line(&mut line).await
        })
        .await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            continue;
        }
        let target = line.split_whitespace().nth(1).unwrap_or_default().to_string();
        let found = target.starts_with("/callback?");
        let (status, body) = if found {
            ("200 OK", "Signed in to the tool server: you may close this page.")
        } else {
            ("404 Not Found", "Not found.")
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: \
             {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
        if found {
            return Ok(format!("http://127.0.0.1:{port}{target}"));
        }
    }
}
