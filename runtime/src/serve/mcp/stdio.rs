//! `uncaged-workflow mcp`'s transport: JSON-RPC messages, one a line, on standard input and
//! output — the SDK's own stdio transport, but for what a client on 2025-11-25 says of tasks,
//! which the SDK cannot read: its task messages are routed to this server's methods before the
//! SDK reads them, and its handshake's answer tells of tasks ([`super::core_tasks`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Sink, Stream};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::core_tasks;

/// The longest line a client may send.
const MAX_LINE: usize = 256 << 20;

/// Standard input and output as the server's transport.
pub fn transport() -> (
    impl Sink<TxJsonRpcMessage<RoleServer>, Error = std::io::Error> + Send + Unpin + 'static,
    impl Stream<Item = RxJsonRpcMessage<RoleServer>> + Send + Unpin + 'static,
) {
    // Whether the handshake negotiated 2025-11-25: told by the server's answer to it, which
    // comes before any other request of the client's.
    let on_2025_11_25 = Arc::new(AtomicBool::new(false));
    let negotiated = on_2025_11_25.clone();
    let sink = futures::sink::unfold(tokio::io::stdout(), move |mut out, message| {
        let negotiated = negotiated.clone();
        async move {
            let mut message = serde_json::to_value(&message).map_err(std::io::Error::other)?;
            if core_tasks::advertise(&mut message) {
                negotiated.store(true, Ordering::SeqCst);
            }
            let mut line = serde_json::to_vec(&message).map_err(std::io::Error::other)?;
            line.push(b'\n');
            out.write_all(&line).await?;
            out.flush().await?;
            Ok::<_, std::io::Error>(out)
        }
    });
    let lines = BufReader::new(tokio::io::stdin());
    let stream = futures::stream::unfold(lines, move |mut lines| {
        let on_2025_11_25 = on_2025_11_25.clone();
        async move {
            let mut line = String::new();
            loop {
                line.clear();
                match AsyncReadExt::take(&mut lines, MAX_LINE as u64 + 1).read_line(&mut line).await
                {
                    Ok(0) | Err(_) => return None,
                    Ok(n) if n > MAX_LINE => {
                        tracing::warn!("mcp over stdio: a message over {MAX_LINE} bytes; closing");
                        return None;
                    }
                    Ok(_) => {}
                }
                if line.trim().is_empty() {
                    continue;
                }
                let Ok(mut message) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!("mcp over stdio: a line that is not JSON was dropped");
                    continue;
                };
                if on_2025_11_25.load(Ordering::SeqCst) {
                    core_tasks::route(&mut message);
                }
                match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(message) {
                    Ok(message) => return Some((message, lines)),
                    Err(e) => tracing::warn!("mcp over stdio: a message that does not read: {e}"),
                }
            }
        }
    });
    (Box::pin(sink), Box::pin(stream))
}
