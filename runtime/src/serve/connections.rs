//! The connections of `serve`, each bounded: a client that never finishes its headers is cut
//! off after the header timeout, one that goes quiet after the idle timeout, and past the
//! connection cap new connections get a `503` at once, so that no number of stalled sockets
//! (which arrive before any token is checked) can starve the requests that matter.
//!
//! axum's own `serve` has none of these; hyper's connection builder has the header timeout,
//! and the idle watch and the cap are here.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

/// The bounds every connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// How long a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// How long a connection may send and receive nothing (a live view's keep-alives count).
    pub idle_timeout: Duration,
    /// The most connections served at once.
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// The defaults: 10 s for headers, 60 s idle, and as many connections as the process's
    /// descriptors allow, keeping some for the store and the worker sockets (4,096 at most).
    pub fn defaults() -> Self {
        let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1024) as usize;
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: descriptors.saturating_sub(128).clamp(16, 4096),
        }
    }
}

/// Serves `router` on `listener` until `stopping` turns true, then lets the connections at
/// work finish (live views are told to end by the same signal).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    mut stopping: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.changed() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // Out of descriptors, say: the listener is not given up on, but not spun on.
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let (router, stopping) = (router.clone(), stopping.clone());
                tokio::spawn(async move {
                    serve_one(stream, router, limits, stopping).await;
                    drop(permit);
                });
            }
            Err(_) => {
                tokio::spawn(refuse(stream, limits.max_connections));
            }
        }
    }
    // Connections at work finish (their tasks hold the permits), for a few seconds at most.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(5), permits.acquire_many(all)).await;
}

/// Tells a client over the cap so, in one response, and closes.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = serde_json::json!({"error": {
        "code": "too_many_connections",
        "message": format!(
            "the server is at its limit of {max} connections (serve.max_connections); try \
             again shortly"
        ),
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    if !matches!(tokio::time::timeout(Duration::from_secs(5), write).await, Ok(Ok(()))) {
        return;
    }
    // The answer went before the request was read. Closed now, the socket would answer the
    // request arriving after it with a reset: the client's next write fails ("broken pipe"),
    // and it may never read why it was refused. What it sends is read and dropped until it
    // closes its side, for a moment and a few kilobytes at most.
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// How long a refused connection is read from after its answer, and how much of it.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 * 1024;

/// Serves one connection's requests until it closes, goes quiet for the idle timeout, or the
/// server stops.
async fn serve_one(
    stream: TcpStream,
    router: axum::Router,
    limits: ConnectionLimits,
    mut stopping: watch::Receiver<bool>,
) {
    let started = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Watched { inner: stream, activity: activity.clone(), started });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(io, TowerToHyperService::new(router));
    tokio::pin!(connection);
    let check = limits.idle_timeout.min(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            _ = tokio::time::sleep(check) => {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                if started.elapsed().saturating_sub(last) >= limits.idle_timeout {
                    // Dropped: the socket closes, whatever the client was doing.
                    return;
                }
            }
            _ = stopping.changed() => connection.as_mut().graceful_shutdown(),
        }
    }
}

/// A connection's socket, noting when it last moved a byte either way.
struct Watched {
    inner: TcpStream,
    /// Milliseconds since `started`.
    activity: Arc<AtomicU64>,
    started: Instant,
}

impl Watched {
    fn moved(&self) {
        self.activity.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved();
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        poll
    }

    /// Vectored, as the socket is: hyper then queues a response's chunks (the event feeds'
    /// shared frames) and writes them as they are, where it would copy each into a buffer of
    /// the connection's own (a thousand followers of a large step, a thousand copies).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
