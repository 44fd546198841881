//! `serve`: the one long-lived process, and an opt-in one. It fires schedules continuously
//! (the loop `schedule tick` runs once) and serves the web view on a local address, with the
//! HTTP API, webhooks and MCP ([`mcp`], which `uncaged-workflow mcp` also serves over stdio).
//!
//! Nothing else needs it: threads run in their bundles' worker processes whether or not it
//! runs, and the web view reads the same store the CLI does, through the library.

pub mod a2a;
pub mod api;
pub mod app;
mod assets;
pub mod connections;
pub mod feeds;
pub mod hooks;
pub mod http;
pub mod links;
pub mod live;
pub mod mcp;
pub mod metrics;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::schedule::Firer;
use crate::store::Storage;

/// The address `serve` listens on unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8420";

/// The longest the schedule loop sleeps: a schedule added meanwhile is seen this soon.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// How often `serve` looks for starts answered by a `serve` of the same home that died before
/// handing them to a worker (and once as it starts).
const ORPHAN_SWEEP: Duration = Duration::from_secs(10);

/// The longest `serve` waits, as it stops, for the starts it answered to be handed to their
/// workers; one still under way then is handed over by the next `serve`.
const HAND_OVER_GRACE: Duration = Duration::from_secs(30);

/// How `serve` runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub addr: SocketAddr,
    /// The host name `addr` was resolved from (`localhost`), if it was given by name: requests
    /// may name it in `Host`.
    pub host: Option<String>,
    /// Required of every request; required to listen on a non-loopback address.
    pub token: Option<String>,
    /// Fire schedules (off: only the web view).
    pub schedules: bool,
    /// The bounds of every connection.
    pub limits: connections::ConnectionLimits,
    /// The largest request body the API takes.
    pub max_body: usize,
}

/// The largest request body the API takes unless `serve.max_body_bytes` says.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Listens on `options.addr` and serves until `shutdown` completes; `ready` is told the
/// address bound (the port, when 0 was asked for).
pub async fn serve(
    store: Storage,
    options: Options,
    ready: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let addr = options.addr;
    // A start is answered once its thread is queued; on a home directory it is handed to its
    // bundle's worker just after (a database's workers claim it), not while the client waits.
    let store = store.handing_over_after_answer();
    // Each connection holds a descriptor: the soft limit (often 1,024) would cap them low.
    crate::run::worker::raise_open_files_limit();
    if !addr.ip().is_loopback() && options.token.is_none() && store.tokens().list()?.is_empty() {
        return Err(Error::Usage(format!(
            "refusing to listen on {addr} without a token: anyone who can reach it could read \
             every thread and start, kill or answer them; create one with `uncaged-workflow \
             token create --name NAME`, or listen on 127.0.0.1"
        )));
    }
    if let Some(token) = &options.token
        && (token.len() < 16
            || !token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b)))
    {
        return Err(Error::Usage(
            "the token must be at least 16 characters from A-Z a-z 0-9 - _ . ~".into(),
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| Error::Io {
        action: "listen on",
        path: addr.to_string().into(),
        cause: e,
    })?;
    let bound = listener.local_addr().map_err(Error::io("listen on", addr.to_string()))?;
    // A loopback listener answers to its own address, to the names of the loopback, and to
    // the name it was asked to listen on.
    let hosts = if bound.ip().is_loopback() {
        let port = bound.port();
        let mut hosts = vec![
            bound.to_string(),
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        hosts.extend(options.host.as_ref().map(|name| format!("{name}:{port}")));
        hosts
    } else {
        vec![]
    };
    let csrf = crate::ids::random_hex(16);
    let stopping = tokio::sync::watch::channel(false).0;
    let mcp = mcp::http::service(store.clone(), options.max_body, stopping.subscribe());
    let app = Arc::new(app::App {
        store: store.clone(),
        token: options.token.clone(),
        open: bound.ip().is_loopback() && options.token.is_none(),
        max_body: options.max_body,
        index: assets::INDEX_HTML.replace("{{CSRF}}", &csrf),
        csrf,
        hosts,
        histories: Default::default(),
        cookie: http::token_cookie(bound.port()),
        stopping,
        live: Default::default(),
        deliveries: Default::default(),
        latencies: Default::default(),
        feeds: Default::default(),
        own_url: format!("http://{bound}"),
    });
    let notifier = crate::reach::notifier::Notifier::new(store.clone(), format!("http://{bound}"));
    let notifying = tokio::spawn(notify_forever(notifier, store.clone(), app.stopping.subscribe()));
    let sweeping = tokio::spawn(hand_over_orphans_forever(store.clone(), app.stopping.subscribe()));
    let firing =
        options.schedules.then(|| tokio::spawn(fire_forever(store, app.stopping.subscribe())));
    ready(bound);
    hooks::warn_of_missing_secrets(&app.store);
    // Live views hold their connections open: they are told to end when the server stops,
    // or a graceful shutdown would wait for them forever.
    let stopping = app.stopping.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.send_replace(true);
    };
    tokio::spawn(shutdown);
    connections::serve(
        listener,
        http::router(app.clone(), mcp),
        options.limits,
        app.stopping.subscribe(),
    )
    .await;
    // A pass under way is finished, not cut short: its firings are all started, its messages
    // sent and settled.
    if let Some(firing) = firing {
        let _ = firing.await;
    }
    let _ = notifying.await;
    let _ = sweeping.await;
    if let Some(hand_overs) = app.store.hand_overs() {
        hand_overs.close();
        if tokio::time::timeout(HAND_OVER_GRACE, hand_overs.wait()).await.is_err() {
            say(format_args!(
                "{} answered start(s) not yet handed to a worker: the next `serve` hands them over",
                hand_overs.len()
            ));
        }
    }
    Ok(())
}

/// Hands over the starts a `serve` of this home answered and died before handing to a worker
/// ([`Dispatch::hand_over_orphaned_starts`](crate::run::dispatch::Dispatch::hand_over_orphaned_starts)):
/// as it starts, then every [`ORPHAN_SWEEP`], until `stopping`.
async fn hand_over_orphans_forever(
    store: Storage,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let dispatch = crate::run::dispatch::of(&store);
    while !*stopping.borrow() {
        match dispatch.hand_over_orphaned_starts().await {
            Ok(0) => {}
            Ok(handed) => say(format_args!(
                "handed {handed} start(s) answered by a `serve` that died to their workers"
            )),
            Err(e) => say(format_args!("orphaned starts: {}", crate::error::chain_line(&e))),
        }
        tokio::select! {
            _ = crate::clock::sleep_until(now_ms() + ORPHAN_SWEEP.as_millis() as u64, ORPHAN_SWEEP) => {}
            _ = stopping.changed() => {}
        }
    }
}

/// The notifier's loop (see [`crate::reach::notifier`]): a pass every `notify.poll`, until
/// `stopping`. A config that does not read is said once per change, not every pass.
async fn notify_forever(
    mut notifier: crate::reach::notifier::Notifier,
    store: Storage,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut said = String::new();
    while !*stopping.borrow() {
        let poll = store.config().map(|c| c.notify.poll()).unwrap_or(MAX_SLEEP);
        match notifier.pass().await {
            Ok(pass) => {
                said.clear();
                for (thread, channel, recipient) in &pass.sent {
                    let to = recipient.as_deref().map(|r| format!(" to {r}")).unwrap_or_default();
                    say(format_args!("notify: thread {thread}: sent through {channel}{to}"));
                }
                for (thread, channel, why) in &pass.failed {
                    say(format_args!(
                        "notify: thread {thread}: {channel} failed: {}",
                        crate::terminal::line(why)
                    ));
                }
                if pass.recovered > 0 {
                    say(format_args!(
                        "notify: applied {} decision(s) made through links before a crash",
                        pass.recovered
                    ));
                }
            }
            Err(e) => {
                let line = crate::error::chain_line(&e);
                if line != said {
                    say(format_args!("notify: {line}"));
                    said = line;
                }
            }
        }
        tokio::select! {
            _ = crate::clock::sleep_until(now_ms() + poll.as_millis() as u64, poll) => {}
            _ = stopping.changed() => {}
        }
    }
}

/// The address `listen` (`HOST:PORT`, the host an address or a name) stands for, and the host
/// name if it was one. A name that resolves to several addresses (`localhost`: 127.0.0.1 and
/// ::1) is listened on at its first IPv4 one, as most clients try it first.
pub async fn resolve_listen(listen: &str) -> Result<(SocketAddr, Option<String>)> {
    if let Ok(addr) = listen.parse::<SocketAddr>() {
        return Ok((addr, None));
    }
    let usage = |why: String| Error::Usage(format!("--listen `{listen}`: {why}"));
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Err(usage("expected HOST:PORT, e.g. 127.0.0.1:8420 or localhost:8420".into()));
    };
    port.parse::<u16>().map_err(|_| usage(format!("`{port}` is not a port number")))?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| usage(format!("cannot resolve `{host}`: {e}")))?
        .collect();
    let addr = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| usage(format!("`{host}` resolves to no address")))?;
    Ok((addr, Some(host.to_string())))
}

/// The schedule loop: a pass, then a sleep until the next firing is due (at most a second),
/// until `stopping`.
async fn fire_forever(store: Storage, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let mut firer = Firer::new(store);
    while !*stopping.borrow() {
        let next = match firer.pass().await {
            Ok(pass) => {
                for started in &pass.started {
                    say(format_args!(
                        "schedule {}: started thread {} ({})",
                        started.schedule,
                        started.thread_id,
                        crate::terminal::line(&started.firing)
                    ));
                }
                for failed in &pass.errors {
                    say(format_args!(
                        "schedule {}: {}",
                        failed.schedule,
                        crate::terminal::line(&failed.error)
                    ));
                }
                pass.next
            }
            Err(e) => {
                say(format_args!("firing schedules: {}", crate::error::chain_line(&e)));
                None
            }
        };
        let next = next.unwrap_or_else(|| now_ms() + MAX_SLEEP.as_millis() as u64);
        tokio::select! {
            _ = crate::clock::sleep_until(next, MAX_SLEEP) => {}
            // What a poll printed is recorded (and fired on) at once, not at the next tick.
            _ = firer.check_finished() => {}
            _ = stopping.changed() => {}
        }
    }
}

/// A line on stderr about what the schedule loop did. A stderr that cannot be written (a log
/// file on a full disk) loses the line; it does not stop the server, as `eprintln!` would.
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "uncaged-workflow: {line}");
}
