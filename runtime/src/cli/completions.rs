//! `completions <SHELL>` and `man [COMMAND]`: shell completion that asks this binary (so thread
//! ids and workflow names complete from the store), and the manual page.

use std::ffi::OsStr;

use clap::{CommandFactory, Parser, ValueEnum};
use clap_complete::engine::CompletionCandidate;

use super::{Cli, GlobalOptions};
use crate::error::Error;

/// The environment variable a shell's completion script sets when it asks this binary.
pub const COMPLETE_ENV: &str = "COMPLETE";

/// The most candidates offered for one word: a home of 100,000 threads must not flood a shell.
const MAX_CANDIDATES: usize = 200;

/// The shells completions are written for.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
    Powershell,
    Elvish,
}

/// Print the shell code that completes uncaged-workflow's commands, flags, thread ids and
/// workflow names (asking this binary as you type).
#[derive(Debug, Parser)]
#[command(after_help = "Install it once, for example:
  bash:  echo 'source <(uncaged-workflow completions bash)' >> ~/.bashrc
  zsh:   echo 'source <(uncaged-workflow completions zsh)' >> ~/.zshrc
  fish:  uncaged-workflow completions fish > ~/.config/fish/completions/uncaged-workflow.fish
  powershell:  uncaged-workflow completions powershell | Out-String | Invoke-Expression")]
pub struct CompletionsCommand {
    /// The shell
    #[arg(value_enum)]
    pub shell: Shell,
}

impl CompletionsCommand {
    pub fn execute(self, _global: &GlobalOptions) -> anyhow::Result<i32> {
        let name = self.shell.to_possible_value().expect("every shell has a name");
        let shells = clap_complete::env::Shells::builtins();
        let shell = shells.completer(name.get_name()).expect("a built-in shell");
        // The script calls back the binary found on PATH under its own name, wherever this
        // copy of it was run from.
        let mut out = Vec::new();
        shell
            .write_registration(
                COMPLETE_ENV,
                "uncaged-workflow",
                "uncaged-workflow",
                "uncaged-workflow",
                &mut out,
            )
            .map_err(Error::stdout)?;
        std::io::Write::write_all(&mut std::io::stdout().lock(), &out).map_err(Error::stdout)?;
        Ok(0)
    }
}

/// Print the manual page (roff), of uncaged-workflow or of one of its commands.
#[derive(Debug, Parser)]
#[command(after_help = "Examples:
  uncaged-workflow man | man -l -
  uncaged-workflow man run > uncaged-workflow-run.1")]
pub struct ManCommand {
    /// A command, for its own page (`run`, `schedule`, …)
    pub command: Option<String>,
}

impl ManCommand {
    pub fn execute(self, _global: &GlobalOptions) -> anyhow::Result<i32> {
        let mut command = Cli::command();
        command.build();
        let page = match &self.command {
            None => command,
            Some(name) => {
                let sub = command.find_subcommand(name).cloned().ok_or_else(|| {
                    Error::Usage(format!("no command `{name}` (see `uncaged-workflow --help`)"))
                })?;
                sub.name(format!("uncaged-workflow-{name}"))
            }
        };
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out).map_err(Error::stdout)?;
        std::io::Write::write_all(&mut std::io::stdout().lock(), &out).map_err(Error::stdout)?;
        Ok(0)
    }
}

/// The store a completion reads: the one the environment and config.yaml name (a shell
/// completing a word sees no `--home` typed on the line).
fn store() -> Option<crate::store::Storage> {
    let global = GlobalOptions {
        home: None,
        store: std::env::var(crate::store::STORE_ENV).ok(),
        verbose: 0,
        color: crate::terminal::ColorChoice::Never,
    };
    global.store().ok()
}

/// Thread ids that start with what is typed, newest first, each with its workflow and status.
pub fn thread_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy().to_ascii_uppercase();
    let Some(summaries) = store().and_then(|s| s.threads().summaries().ok()) else {
        return Vec::new();
    };
    summaries
        .iter()
        .rev()
        .filter(|t| t.thread_id.encode(&mut [0; 26]).starts_with(&typed))
        .take(MAX_CANDIDATES)
        .map(|t| {
            let about = format!("{} {}", t.name, t.status.as_str());
            CompletionCandidate::new(t.thread_id.to_string()).help(Some(about.into()))
        })
        .collect()
}

/// Registered workflow names that start with what is typed, with their descriptions' start.
pub fn workflow_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy();
    let Some(store) = store() else { return Vec::new() };
    let Ok(registry) = store.registry().load() else { return Vec::new() };
    registry
        .workflows
        .iter()
        .filter(|(name, _)| name.starts_with(typed.as_ref()))
        .take(MAX_CANDIDATES)
        .map(|(name, entry)| {
            CompletionCandidate::new(name.clone()).help(Some(entry.hash.to_string().into()))
        })
        .collect()
}
