//! Who asked for a thread from outside — an MCP client's tool call, an API caller — as its
//! start record keeps it and listings show it.

use serde::{Deserialize, Serialize};

/// The request that started a thread from outside: over which door, with which credential, from
/// which client program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartedBy {
    /// `mcp` (a tool call) or `api` (`POST /api/v1/threads`).
    pub via: String,
    /// Whose credential: a token's name (`token:ci`), the server's own token (`server`), or
    /// `stdio` (the local user running `uncaged-workflow mcp`).
    pub caller: String,
    /// The client program, as it named itself (MCP's `clientInfo`), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// How much of a client's name a record keeps: it is the client's own text.
const MAX_CLIENT_NAME: usize = 80;

impl StartedBy {
    pub fn new(via: &str, caller: &str, client: Option<&str>) -> Self {
        let client = client
            .map(|c| crate::terminal::line(c).chars().take(MAX_CLIENT_NAME).collect::<String>())
            .filter(|c| !c.trim().is_empty());
        StartedBy { via: via.into(), caller: caller.into(), client }
    }

    /// One line: `mcp token:ci (claude-code)`.
    pub fn line(&self) -> String {
        match &self.client {
            Some(client) => format!("{} {} ({client})", self.via, self.caller),
            None => format!("{} {}", self.via, self.caller),
        }
    }
}
