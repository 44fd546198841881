//! The MCP servers of an `openai` binding (`tools:` in config.yaml): how each is reached — a
//! program over stdio, or a Streamable HTTP URL — which of its tools the model may see, which
//! need a person's yes, which may be called again after a crash, and the bounds of a call.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::duration::Seconds;

/// An MCP server a binding's model may call tools of, and which of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolServer {
    /// A program spoken to over its stdin and stdout (run without a shell).
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// The environment variables it is given (names: their values come from the process that
    /// asked for the run, never the file); besides `PATH`, the only ones it gets.
    #[serde(default)]
    pub env: Vec<String>,
    /// A Streamable HTTP endpoint, in place of a command.
    #[serde(default)]
    pub url: Option<String>,
    /// Headers sent to the endpoint; `${NAME}` in a value is that variable's value.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The endpoint asks for OAuth 2.1: a person signs in once with `tools login NAME`, and
    /// the tokens, kept in the store, are sent and refreshed from then on.
    #[serde(default)]
    pub oauth: Option<OAuthSettings>,
    /// The tools the model may see [default: every tool the server lists when the call
    /// starts].
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// Tools a person must say yes to before each call.
    #[serde(default)]
    pub approve: Vec<String>,
    /// Tools that may be called again when a crash cut a call of theirs short (beside the
    /// tools that say so themselves: `readOnlyHint`, `idempotentHint`).
    #[serde(default)]
    pub safe_to_repeat: Vec<String>,
    /// The longest one call may take [default: 60s].
    #[serde(default)]
    pub timeout: Option<Seconds>,
    /// The most bytes of a result the model is given; more is cut, with a marker
    /// [default: 65536].
    #[serde(default)]
    pub max_result_bytes: Option<usize>,
}

/// How a tool server's OAuth client signs in.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthSettings {
    /// The scopes asked for [default: those the server says it supports].
    #[serde(default)]
    pub scopes: Vec<String>,
    /// A client registered with the authorization server beforehand [default: one
    /// registered dynamically at login].
    #[serde(default)]
    pub client_id: Option<String>,
}

/// A tool call's longest time unless its server says.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// A tool result's largest size unless its server says.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 << 10;

impl ToolServer {
    /// What is wrong with it, if anything: it is a command or a URL (not both), and the
    /// variables it names are names.
    pub fn check(&self) -> std::result::Result<(), String> {
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => return Err("has both `command` and `url`: choose one".into()),
            (None, None) => return Err("needs a `command` (stdio) or a `url` (HTTP)".into()),
            (None, Some(url)) if !url.starts_with("http://") && !url.starts_with("https://") => {
                return Err(format!("`url: {url}` is not an http:// or https:// URL"));
            }
            (Some(_), None) if !self.headers.is_empty() => {
                return Err("`headers` are for a `url`, not a `command`".into());
            }
            (None, Some(_)) if !self.env.is_empty() || !self.args.is_empty() => {
                return Err("`env` and `args` are for a `command`, not a `url`".into());
            }
            _ => {}
        }
        for name in self.variables() {
            if !crate::env_name::is_name(name) {
                return Err(format!(
                    "`{}` is not the name of an environment variable (A-Z, 0-9, _)",
                    crate::terminal::line(name)
                ));
            }
        }
        if self.oauth.is_some() {
            if self.url.is_none() {
                return Err("`oauth` is for a `url`, not a `command`".into());
            }
            if self.headers.keys().any(|h| h.eq_ignore_ascii_case("authorization")) {
                return Err("has `oauth` and an `Authorization` header: choose one".into());
            }
        }
        if self.max_result_bytes == Some(0) {
            return Err("`max_result_bytes` must be above 0".into());
        }
        Ok(())
    }

    /// The environment variables it names: those its process is given, and those its
    /// headers read (`${NAME}`).
    pub fn variables(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.env.iter().map(String::as_str).collect();
        for value in self.headers.values() {
            let mut rest = value.as_str();
            while let Some(at) = rest.find("${") {
                let Some(end) = rest[at..].find('}') else { break };
                names.push(&rest[at + 2..at + end]);
                rest = &rest[at + end + 1..];
            }
        }
        names
    }
}

/// The keys a tool server may have (a misspelt one is refused with the closest).
pub(super) const KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "url",
    "headers",
    "oauth",
    "allow",
    "approve",
    "safe_to_repeat",
    "timeout",
    "max_result_bytes",
];
