//! `serve`.

use clap::Parser;

use super::options::GlobalOptions;
use crate::error::Error;
use crate::serve::connections::ConnectionLimits;
use crate::serve::{self, DEFAULT_ADDR, Options};

const AFTER_HELP: &str = "\
The web view lists workflows, schedules and threads (live), and shows a thread's routing graph,
timeline, steps and debug log, with pause, resume, kill, fork and answer. The same server
answers the HTTP API (/api/v1, with tokens from `token create`), webhooks (POST
/hooks/WORKFLOW) and /metrics. Without a token it listens on a loopback address only; on any
other address every request must carry one (--token, or one `token create` made): open
http://HOST:PORT/?token=TOKEN once (a cookie keeps it).

Examples:
  uncaged-workflow serve
  uncaged-workflow serve --listen 127.0.0.1:0            (any free port; the address is printed)
  UNCAGED_WORKFLOW_TOKEN=$(openssl rand -hex 16) uncaged-workflow serve --listen 0.0.0.0:8420
  uncaged-workflow token create --name ci && uncaged-workflow serve --listen 0.0.0.0:8420";

/// Fire schedules continuously and serve the web view, until interrupted.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct ServeCommand {
    /// Address or host name, and port, to listen on (port 0: any free port) [default:
    /// `serve.listen` in config.yaml, else 127.0.0.1:8420]
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Token every request must carry; required to listen on a non-loopback address [default:
    /// the variable `serve.token_env` in config.yaml names]
    #[arg(long, env = "UNCAGED_WORKFLOW_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve the web view only; do not fire schedules
    #[arg(long)]
    pub no_schedules: bool,
}

impl ServeCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let config = store.config()?.serve;
        let listen = self.listen.or(config.listen).unwrap_or_else(|| DEFAULT_ADDR.to_string());
        let (addr, host) = serve::resolve_listen(&listen).await?;
        let token = match (self.token, &config.token_env) {
            (Some(token), _) => Some(token),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| {
                Error::Usage(format!(
                    "config.yaml: serve.token_env names `{var}`, which is not set (or not UTF-8)"
                ))
            })?),
            (None, None) => None,
        };
        crate::run::worker::raise_open_files_limit();
        let defaults = ConnectionLimits::defaults();
        let limits = ConnectionLimits {
            header_timeout: config.header_timeout.map_or(defaults.header_timeout, |t| t.0),
            idle_timeout: config.idle_timeout.map_or(defaults.idle_timeout, |t| t.0),
            max_connections: config.max_connections.unwrap_or(defaults.max_connections),
        };
        let max_body = config.max_body_bytes.unwrap_or(serve::DEFAULT_MAX_BODY);
        let options =
            Options { addr, host, token, schedules: !self.no_schedules, limits, max_body };
        let firing = options.schedules;
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match &mut term { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        serve::serve(
            store,
            options,
            |addr| {
                let schedules = if firing { "firing schedules" } else { "schedules not fired" };
                println!("serving http://{addr}/ ({schedules}; Ctrl-C stops)");
            },
            shutdown,
        )
        .await?;
        Ok(0)
    }
}
