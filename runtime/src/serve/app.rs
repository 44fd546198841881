//! What every request handler of `serve` shares: the store, the server's token and CSRF
//! token, the hosts it answers to, and the watchers of its live views.

use crate::store::Storage;

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    pub store: Storage,
    /// The server's own token (`--token`): it may do anything.
    pub token: Option<String>,
    /// Whether the page needs no token: a loopback listener without `--token`.
    pub open: bool,
    /// The page's token for actions.
    pub csrf: String,
    /// `Host` values a loopback listener answers to; empty: any.
    pub hosts: Vec<String>,
    /// The page, with its CSRF token in.
    pub index: String,
    /// The schedules' firing logs as read so far.
    pub histories: super::views::SharedHistories,
    /// Set when the server stops: live views end.
    pub stopping: tokio::sync::watch::Sender<bool>,
    /// What live views watch, each watched once.
    pub live: super::live::LiveViews,
    /// The name of the token's cookie (see [`super::http::token_cookie`]).
    pub cookie: String,
    /// The largest request body the API takes.
    pub max_body: usize,
    /// The threads API clients follow, each read once.
    pub feeds: super::feeds::Feeds,
    /// Webhook deliveries answered, for `/metrics`.
    pub deliveries: super::metrics::Deliveries,
    /// Agent-call latencies counted so far, for `/metrics`.
    pub latencies: super::metrics::Latencies,
    /// The server's own address (`http://HOST:PORT`), where links and the A2A agent card
    /// point unless `serve.public_url` says otherwise.
    pub own_url: String,
}
