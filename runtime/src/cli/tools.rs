//! `tools login|logout`: signing in to the MCP servers of `openai` bindings that ask for OAuth.

use std::io::Write as _;

use clap::{Parser, Subcommand};

use super::options::GlobalOptions;
use crate::agents::oauth;
use crate::error::Error;

/// Sign in to (or out of) the MCP tool servers durable agents call, when a server asks for
/// OAuth 2.1 (`oauth:` on its `url:` in config.yaml).
#[derive(Debug, Parser)]
#[command(after_help = "Examples:\n  uncaged-workflow tools login tracker\n  \
    uncaged-workflow tools login coder.tracker\n  uncaged-workflow tools logout tracker")]
pub struct ToolsCommand {
    #[command(subcommand)]
    pub action: ToolsAction,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum ToolsAction {
    /// Sign in in a browser once: the tokens are kept in the store, for every worker, and
    /// refreshed as they run out
    Login {
        /// The tool server, as config.yaml names it (`BINDING.SERVER` when bindings differ)
        server: String,
        /// Open the sign-in page with this program (given the address) rather than only
        /// printing it, e.g. `xdg-open`
        #[arg(long, value_name = "PROGRAM")]
        open_with: Option<String>,
    },
    /// Forget the tokens kept for a server: its calls wait for a sign-in again
    Logout {
        /// The tool server, as config.yaml names it
        server: String,
    },
}

impl ToolsCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let config = store.config()?;
        match self.action {
            ToolsAction::Login { server, open_with } => {
                let (url, settings) = config.oauth_server(&server).map_err(Error::Usage)?;
                let credentials = store.credentials();
                // Said on standard error, which may have gone (a closed pipe): the sign-in
                // goes on whether or not anyone reads.
                let say = |text: String| {
                    let _ = writeln!(std::io::stderr(), "{text}");
                };
                let show = |address: &str| {
                    say(format!("Sign in to `{server}` at:\n\n  {address}\n"));
                    if let Some(program) = &open_with {
                        // The address as one argument, never through a shell.
                        if let Err(e) = std::process::Command::new(program).arg(address).spawn() {
                            say(format!("cannot start `{program}`: {e}; open the address by hand"));
                        }
                    }
                    say("Waiting for the browser to come back…".into());
                };
                oauth::login(&credentials, &url, &settings, show)
                    .await
                    .map_err(|e| Error::Usage(format!("tool server `{server}`: {e}")))?;
                println!("signed in to `{server}` ({url})");
                Ok(0)
            }
            ToolsAction::Logout { server } => {
                let (url, _) = config.oauth_server(&server).map_err(Error::Usage)?;
                match store.credentials().remove(&url)? {
                    true => println!("signed out of `{server}` ({url})"),
                    false => println!("`{server}` had no sign-in kept"),
                }
                Ok(0)
            }
        }
    }
}
