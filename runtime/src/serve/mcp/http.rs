//! `/mcp`: MCP over Streamable HTTP, for `serve`. `serve`'s guard has checked the request
//! (its host, its origin, its token: see [`crate::serve::http`]); here its body is bounded and
//! read as JSON before the SDK's service gets it, so that a request over the limit or not JSON
//! is answered with a JSON-RPC error, as a client can read, and changes nothing; and the task
//! messages of a client on 2025-11-25 (which names its version in each request's
//! `MCP-Protocol-Version`) are routed to this server's own methods, its handshake's answer
//! telling of tasks ([`super::core_tasks`]).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tower_service::Service;

use super::{McpServer, Shared, core_tasks};
use crate::store::Storage;

/// The SDK's service behind `/mcp`, and the largest body it takes.
#[derive(Clone)]
pub struct McpService {
    sdk: StreamableHttpService<McpServer, LocalSessionManager>,
    max_body: usize,
}

impl std::fmt::Debug for McpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McpService")
    }
}

/// The service for `store`, taking bodies up to `max_body` bytes; it ends its streams when
/// `stopping` is set.
pub fn service(
    store: Storage,
    max_body: usize,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> McpService {
    let shared = Shared::new(store);
    // Host and Origin are `serve`'s guard's to check (with the API's rules), not the SDK's.
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(Vec::<String>::new())
        .with_max_request_body_bytes(max_body);
    let cancel = config.cancellation_token.clone();
    tokio::spawn(async move {
        while !*stopping.borrow() {
            if stopping.changed().await.is_err() {
                break;
            }
        }
        cancel.cancel();
    });
    let sdk = StreamableHttpService::new(
        move || Ok(McpServer::http(shared.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    McpService { sdk, max_body }
}

/// A JSON-RPC error with no request id, as the HTTP answer `status`.
fn rpc_error(status: StatusCode, code: i32, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}
    });
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The most of a body over the limit that is read (and dropped) before the refusal: past it the
/// connection is cut.
const DRAIN_AT_MOST: usize = 256 << 20;

/// JSON-RPC's codes for a body that is not JSON, and for one that is not a request.
const PARSE_ERROR: i32 = -32700;
const INVALID_REQUEST: i32 = -32600;

/// Serves one request to `/mcp`.
pub async fn endpoint(State(mcp): State<McpService>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // Whether the request is a handshake, whose answer may have to tell of 2025-11-25's tasks.
    let mut initialize = false;
    let body = if parts.method == axum::http::Method::POST {
        let mut stream = body.into_data_stream();
        let mut bytes = Vec::new();
        let (mut over, mut read) = (false, 0usize);
        while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
            let Ok(chunk) = chunk else { break };
            read += chunk.len();
            over |= read > mcp.max_body;
            if !over {
                bytes.extend_from_slice(&chunk);
            } else if read > DRAIN_AT_MOST {
                break;
            }
        }
        let mut bytes = Bytes::from(bytes);
        match over {
            false => {}
            // What was sent is read to its end (and dropped, up to DRAIN_AT_MOST), so that the
            // client, still sending, reads the refusal rather than a reset connection.
            true => {
                return rpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    INVALID_REQUEST,
                    &format!(
                        "the request is over the limit of {} bytes (serve.max_body_bytes)",
                        mcp.max_body
                    ),
                );
            }
        }
        match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(mut message) if is_json_rpc(&message) => {
                initialize = message.get("method").and_then(|m| m.as_str()) == Some("initialize");
                // A client on 2025-11-25 says so in every request after its handshake.
                let version = parts.headers.get("mcp-protocol-version");
                if version.is_some_and(|v| v == core_tasks::VERSION) {
                    core_tasks::route(&mut message);
                    bytes = Bytes::from(serde_json::to_vec(&message).expect("JSON serializes"));
                }
            }
            Ok(_) => {
                return rpc_error(
                    StatusCode::BAD_REQUEST,
                    INVALID_REQUEST,
                    "the body is not a JSON-RPC 2.0 message: an object with \"jsonrpc\": \"2.0\" \
                     and a string `method` (a request or notification) or an `id` with a `result` \
                     or an `error` (a response)",
                );
            }
            Err(e) => {
                return rpc_error(
                    StatusCode::BAD_REQUEST,
                    PARSE_ERROR,
                    &format!("the body is not JSON: {e}"),
                );
            }
        }
        Body::from(bytes)
    } else {
        body
    };
    let mut service = mcp.sdk.clone();
    let response = match service.call(Request::from_parts(parts, body)).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    };
    let response = as_json_rpc(response).await;
    if initialize { advertised(response).await } else { response }
}

/// The most of a handshake's answer read to put the tasks capability into it.
const HANDSHAKE_AT_MOST: usize = 1 << 20;

/// The SDK's answer to an `initialize`, telling of tasks where it negotiated 2025-11-25 (see
/// [`core_tasks::advertise`]); it is one message, as JSON or as one server-sent event.
async fn advertised(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, HANDSHAKE_AT_MOST).await else {
        return rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            -32603,
            "the handshake's answer is too long",
        );
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut told = false;
    let mut tell = |json: &str| -> Option<String> {
        let mut message: serde_json::Value = serde_json::from_str(json).ok()?;
        core_tasks::advertise(&mut message).then(|| {
            told = true;
            message.to_string()
        })
    };
    let rewritten: String = if text.trim_start().starts_with('{') {
        tell(&text).unwrap_or_default()
    } else {
        // Server-sent events: the message is a `data:` line.
        text.split_inclusive('\n')
            .map(|line| match line.strip_prefix("data:").and_then(|data| tell(data.trim())) {
                Some(told) => format!("data: {told}\n"),
                None => line.to_string(),
            })
            .collect()
    };
    if !told {
        return Response::from_parts(parts, Body::from(bytes));
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(rewritten))
}

/// Whether `message` has the shape of a JSON-RPC 2.0 message.
fn is_json_rpc(message: &serde_json::Value) -> bool {
    let Some(object) = message.as_object() else { return false };
    let version = object.get("jsonrpc").and_then(|v| v.as_str()) == Some("2.0");
    let request = object.get("method").is_some_and(|m| m.is_string());
    let response = object.contains_key("id")
        && (object.contains_key("result") || object.contains_key("error"));
    version && (request || response)
}

/// A refusal the SDK answers in plain text (a session it does not know, say), as the JSON-RPC
/// error a client reads; every other answer as it is.
async fn as_json_rpc(response: Response) -> Response {
    let plain = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .is_none_or(|t| t.starts_with("text/plain"));
    let status = response.status();
    if !(status.is_client_error() && plain) {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    rpc_error(status, INVALID_REQUEST, text.trim())
}
