//! The parts of config.yaml that say how the long-lived parts serve: `serve:` (where it listens,
//! its token, its bounds, the address it is reached at), `mcp:` (what the MCP server offers and
//! how long its calls wait) and `telemetry:` (where traces go).

use serde::Deserialize;

use crate::duration::Seconds;

/// `telemetry:` in config.yaml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP collector's base URL (`http://localhost:4318`): traces are exported there
    /// unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or its `_TRACES_` form) names another.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

/// `serve:` in config.yaml. The token itself is not in the file (which is often shared, or
/// kept in a repository): the file names the environment variable that holds it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// `HOST:PORT`, when `--listen` does not say.
    #[serde(default)]
    pub listen: Option<String>,
    /// The environment variable holding the token, when neither `--token` nor
    /// `UNCAGED_WORKFLOW_TOKEN` gives one.
    #[serde(default)]
    pub token_env: Option<String>,
    /// The most connections served at once [default: what the process's descriptors allow,
    /// 4,096 at most].
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// How long a client may take to send a request's headers [default: 10s].
    #[serde(default)]
    pub header_timeout: Option<Seconds>,
    /// How long a connection may be quiet before it is closed [default: 60s].
    #[serde(default)]
    pub idle_timeout: Option<Seconds>,
    /// The largest request body the HTTP API takes, in bytes [default: 1 MiB]; larger ones
    /// are refused with 413.
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// The address people and other agents reach this server at (`https://flows.example.com`),
    /// where links in messages and the A2A agent card point [default: the address it listens
    /// on].
    #[serde(default)]
    pub public_url: Option<String>,
}

impl ServeConfig {
    /// What is wrong with `public_url`, if anything.
    pub(super) fn check(&self) -> std::result::Result<(), String> {
        let Some(url) = &self.public_url else { return Ok(()) };
        let parsed =
            reqwest::Url::parse(url).map_err(|e| format!("serve.public_url `{url}`: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(format!("serve.public_url `{url}`: expected an http(s):// address"));
        }
        Ok(())
    }
}

/// `mcp:` in config.yaml.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The workflows offered as tools, by name [default: every registered workflow].
    #[serde(default)]
    pub workflows: Option<Vec<String>>,
    /// How long a tool call from a client without tasks waits for its thread to end before it
    /// answers with the thread's id and how to follow it [default: 60s].
    #[serde(default)]
    pub wait: Option<Seconds>,
    /// How long a tool call from a client of the tasks extension waits for its thread to end
    /// before it answers with a task to poll [default: 5s]; a thread that waits for a person
    /// is a task at once.
    #[serde(default)]
    pub task_after: Option<Seconds>,
    /// How often a call's thread is read besides when its worker says it stored something
    /// [default: 2s]; where no word comes (behind a transaction-pooling PgBouncer) it is read
    /// every 20 ms after a change, then every 250 ms.
    #[serde(default)]
    pub poll: Option<Seconds>,
}
