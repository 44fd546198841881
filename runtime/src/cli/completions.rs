//! `completions <SHELL>` and `man [COMMAND]`: shell completion that asks this binary (so thread
//! ids and workflow names complete from the store, see [`super::complete`]), and the manual
//! page.

use clap::{Parser, ValueEnum};

use super::options::GlobalOptions;
use crate::error::Error;

/// The environment variable a shell's completion script sets when it asks this binary.
pub const COMPLETE_ENV: &str = "COMPLETE";

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
    /// Prints the page of `command` (the whole command line's), or of the subcommand asked.
    pub fn execute(
        self,
        _global: &GlobalOptions,
        mut command: clap::Command,
    ) -> anyhow::Result<i32> {
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
