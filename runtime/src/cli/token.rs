//! `token create|list|revoke`: the HTTP API's tokens.

use std::io::Write as _;

use clap::{Parser, Subcommand};
use serde_json::json;

use super::options::GlobalOptions;
use super::output::{Age, print_json, print_table};
use crate::clock::now_ms;
use crate::store::tokens;

/// Manage the tokens that let other systems call the HTTP API (`serve`).
#[derive(Debug, Parser)]
#[command(after_help = "Examples:\n  uncaged-workflow token create --name ci\n  \
    uncaged-workflow token create --name dashboard --read-only\n  \
    uncaged-workflow token list\n  uncaged-workflow token revoke ci")]
pub struct TokenCommand {
    #[command(subcommand)]
    pub action: TokenAction,
}

/// What to do with tokens.
#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Make a token and print it, once: only its hash is kept
    Create {
        /// What the token is for (shown in listings; 1-64 of A-Z a-z 0-9 - _ .)
        #[arg(long)]
        name: String,
        /// The token may read threads, workflows and schedules, but not start or change them
        #[arg(long)]
        read_only: bool,
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// List the tokens (their names, never the tokens)
    List {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: requests carrying it are refused from now on
    Revoke {
        /// The token's name
        name: String,
    },
}

impl TokenCommand {
    pub fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        match self.action {
            TokenAction::Create { name, read_only, json } => {
                let issued = tokens::issue(store.tokens(), &name, read_only)?;
                if json {
                    print_json(&json!({
                        "name": issued.token.name, "token": issued.secret,
                        "readOnly": issued.token.read_only,
                    }))?;
                } else {
                    outln!("{}", issued.secret)?;
                    let access = if read_only { "read-only" } else { "read and act" };
                    // On stderr: `token create > file` keeps the token alone.
                    let _ = writeln!(
                        std::io::stderr().lock(),
                        "token `{name}` ({access}): shown this once; send it as \
                         `Authorization: Bearer <token>`"
                    );
                }
            }
            TokenAction::List { json } => {
                let list = store.tokens().list()?;
                if json {
                    let list: Vec<_> = list
                        .iter()
                        .map(|t| json!({"name": t.name, "readOnly": t.read_only, "created": t.created}))
                        .collect();
                    print_json(&list)?;
                } else if list.is_empty() {
                    outln!(
                        "no tokens (make one with `uncaged-workflow token create --name NAME`)"
                    )?;
                } else {
                    let now_ms = now_ms();
                    let rows: Vec<Vec<String>> = list
                        .iter()
                        .map(|t| {
                            let access = if t.read_only { "read-only" } else { "read, act" };
                            let age = Age { at_ms: t.created, now_ms }.to_string();
                            vec![t.name.clone(), access.to_string(), age]
                        })
                        .collect();
                    print_table(&["NAME", "ACCESS", "AGE"], &rows)?;
                }
            }
            TokenAction::Revoke { name } => {
                if !store.tokens().revoke(&name)? {
                    return Err(crate::Error::UnknownToken(
                        crate::terminal::line(&name).into_owned(),
                    )
                    .into());
                }
                outln!("revoked token `{name}`")?;
            }
        }
        Ok(0)
    }
}
