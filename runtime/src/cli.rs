//! The command line: the top-level parser, one subcommand per file under `cli/`, and the
//! small output helpers they share. Commands are thin; the work is in the library.

/// `println!` that returns the failure instead of panicking: when the reader of stdout has gone
/// (`uncaged-workflow threads | head -1`), the command stops with an error the binary turns
/// into a quiet exit, as ripgrep and cargo do.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::error::Error::stdout)
    }};
}

mod add;
mod answer;
mod ask;
mod build;
mod complete;
pub mod completions;
mod control;
mod eval;
mod follow;
mod fork;
mod history;
mod list;
mod mcp;
mod new;
pub mod options;
mod output;
mod plan;
mod ps;
mod remove;
mod replay;
mod resume;
mod retry;
mod rollback;
mod run;
mod schedule;
mod serve;
mod show;
mod step;
mod thread;
mod threads;
mod token;
mod tools;
mod upgrade;
mod worker;

use clap::{Parser, Subcommand};

use options::GlobalOptions;

const AFTER_HELP: &str = "\
Examples:
  uncaged-workflow add solve-issue solve_issue.wasm
  uncaged-workflow run solve-issue -p \"Fix the crash on empty input\"
  uncaged-workflow run solve-issue -p \"...\" --agent-for reviewer=command:./review.sh
  uncaged-workflow threads solve-issue
  uncaged-workflow thread 01KQXKW18CT8G75T53R8F4G7YG
  uncaged-workflow fork 01KQXKW18CT8G75T53R8F4G7YG --from-role reviewer";

/// The examples, then every exit code (from the one table of them, [`crate::error::exit`]).
fn after_help() -> String {
    format!("{AFTER_HELP}\n\n{}", crate::error::exit::help())
}

/// Run multi-role AI agent workflows, each a sandboxed WebAssembly component.
#[derive(Debug, Parser)]
#[command(name = "uncaged-workflow", version, after_help = after_help(), max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOptions,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a bundle (or a YAML workflow), store it by hash, precompile it, and register
    /// it under a name
    Add(add::AddCommand),
    /// Build a YAML workflow into a bundle file
    Build(build::BuildCommand),
    /// Draft a workflow from a sentence with a planner agent, and add it once confirmed
    Plan(plan::PlanCommand),
    /// List registered workflows
    List(list::ListCommand),
    /// Show a workflow: description, current hash, roles and their schemas (or its YAML)
    Show(show::ShowCommand),
    /// Unregister a workflow (its bundles and threads stay on disk)
    Remove(remove::RemoveCommand),
    /// Show a workflow's version history
    History(history::HistoryCommand),
    /// Switch a workflow back to an earlier version
    Rollback(rollback::RollbackCommand),
    /// Replay recorded threads through a bundle not registered yet, offline: does it do what
    /// they did?
    Replay(replay::ReplayCommand),
    /// Run recorded threads again on a changed workflow, prompt or agent, and compare: what
    /// got better, what got worse, what it cost
    Eval(Box<eval::EvalCommand>),
    /// Start a thread of a workflow and print its steps as they happen
    Run(run::RunCommand),
    /// List threads, newest last
    Threads(threads::ThreadsCommand),
    /// Show a thread (`thread <ID>`), create one without running it (`thread start`), or
    /// delete one (`thread rm <ID>`)
    Thread(thread::ThreadCommand),
    /// List threads running in live worker processes
    Ps(ps::PsCommand),
    /// End a thread that has not ended: a running one now, a paused, waiting or interrupted
    /// one where it is
    Kill(control::KillCommand),
    /// Stop a running thread after its current step
    Pause(control::PauseCommand),
    /// Continue a paused or interrupted thread
    Resume(resume::ResumeCommand),
    /// Start a new thread from a prefix of another's steps
    Fork(fork::ForkCommand),
    /// Continue a failed thread from the step that failed (on a new version, with --latest)
    Retry(retry::RetryCommand),
    /// Run exactly one role of a thread and exit
    Step(step::StepCommand),
    /// Move a thread to another version of its workflow, if the version does what it did
    Upgrade(upgrade::UpgradeCommand),
    /// Answer for a `human` agent a thread waits on, and continue it
    Answer(answer::AnswerCommand),
    /// Start threads by themselves: cron and poll schedules, fired by `schedule tick` or
    /// `serve`
    Schedule(schedule::ScheduleCommand),
    /// Fire schedules continuously and serve the web view (opt-in; nothing else needs it)
    Serve(serve::ServeCommand),
    /// Serve MCP over stdio: workflows as tools for AI assistants
    Mcp(mcp::McpCommand),
    /// Manage the tokens that let other systems call the HTTP API
    Token(token::TokenCommand),
    /// Sign in to the MCP tool servers of durable agents that ask for OAuth
    Tools(tools::ToolsCommand),
    /// Scaffold a buildable bundle project in Rust, Python or JavaScript
    New(new::NewCommand),
    /// Print shell completions (commands, flags, thread ids, workflow names)
    Completions(completions::CompletionsCommand),
    /// Print the manual page, of uncaged-workflow or of one command
    Man(completions::ManCommand),
    #[command(hide = true)]
    Worker(worker::WorkerCommand),
}

impl Cli {
    /// The exporter of traces, when this command runs threads in its own process (a worker,
    /// `step`) and the environment or config.yaml names a collector; an exporter that cannot
    /// be set up is reported (once, as a warning) and leaves traces off.
    pub fn telemetry(&self) -> Option<crate::telemetry::Telemetry> {
        if !matches!(self.command, Command::Worker(_) | Command::Step(_)) {
            return None;
        }
        let endpoint = self
            .global
            .home()
            .ok()
            .and_then(|home| crate::store::config::otlp_endpoint(&home.config_file()));
        crate::telemetry::Telemetry::configured(endpoint.as_deref()).unwrap_or_else(|e| {
            eprintln!("uncaged-workflow: warning: traces are off: {e}");
            None
        })
    }

    /// Runs the command; returns the process exit code.
    pub async fn execute(self) -> anyhow::Result<i32> {
        let global = &self.global;
        match self.command {
            Command::Add(c) => c.execute(global).await,
            Command::Build(c) => c.execute(global),
            Command::Plan(c) => c.execute(global).await,
            Command::List(c) => c.execute(global),
            Command::Show(c) => c.execute(global),
            Command::Remove(c) => c.execute(global),
            Command::History(c) => c.execute(global),
            Command::Rollback(c) => c.execute(global),
            Command::Replay(c) => c.execute(global).await,
            Command::Eval(c) => c.execute(global).await,
            Command::Run(c) => c.execute(global).await,
            Command::Threads(c) => c.execute(global).await,
            Command::Thread(c) => c.execute(global).await,
            Command::Ps(c) => c.execute(global).await,
            Command::Kill(c) => c.execute(global).await,
            Command::Pause(c) => c.execute(global).await,
            Command::Resume(c) => c.execute(global).await,
            Command::Fork(c) => c.execute(global).await,
            Command::Retry(c) => c.execute(global).await,
            Command::Step(c) => c.execute(global).await,
            Command::Upgrade(c) => c.execute(global).await,
            Command::Answer(c) => c.execute(global).await,
            Command::Schedule(c) => c.execute(global).await,
            Command::Serve(c) => c.execute(global).await,
            Command::Mcp(c) => c.execute(global).await,
            Command::Token(c) => c.execute(global),
            Command::Tools(c) => c.execute(global).await,
            Command::New(c) => c.execute(global),
            Command::Completions(c) => c.execute(global),
            Command::Man(c) => c.execute(global, <Cli as clap::CommandFactory>::command()),
            Command::Worker(c) => c.execute(global).await,
        }
    }
}

#[cfg(test)]
mod tests {
    /// The documentation's table of exit codes is the one the code keeps.
    #[test]
    fn the_documented_exit_codes_are_the_table() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let table = crate::error::exit::markdown();
        let documented = std::fs::read_to_string(root.join("docs/commands.md"))
            .is_ok_and(|text| text.contains(&table));
        assert!(documented, "docs/commands.md does not hold this table:\n{table}");
    }

    /// Every command the documentation shows (in its code blocks) still parses: a flag renamed
    /// or a command removed fails here, not in a reader's shell.
    #[test]
    fn every_command_in_the_documentation_parses() {
        use clap::Parser;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut pages = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
        let mut checked = 0;
        for page in pages {
            let text = std::fs::read_to_string(&page).unwrap();
            let mut in_code = false;
            for (number, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("```") {
                    in_code = !in_code;
                    continue;
                }
                let Some(command) = in_code.then(|| documented_command(line)).flatten() else {
                    continue;
                };
                let words = shlex::split(&command)
                    .unwrap_or_else(|| panic!("{}:{}: {command}", page.display(), number + 1));
                if let Err(e) = super::Cli::try_parse_from(&words) {
                    // An agent program shown (`command:./agent.sh`) need not be on this machine.
                    let elsewhere = e.kind() == clap::error::ErrorKind::ValueValidation
                        && e.to_string().contains("does not exist");
                    let shown = e.kind() == clap::error::ErrorKind::DisplayHelp || elsewhere;
                    assert!(
                        shown,
                        "{}:{}: `{command}` does not parse: {e}",
                        page.display(),
                        number + 1
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 40, "only {checked} commands found in the documentation");
    }

    /// The `uncaged-workflow …` command on a line of a code block, without a prompt, a shell
    /// variable, a comment or what a pipe or a redirection adds.
    fn documented_command(line: &str) -> Option<String> {
        let at = line.find("uncaged-workflow ")?;
        let before = line[..at].trim_end();
        let starts =
            before.is_empty() || before == "$" || before.ends_with("$(") || before.ends_with('=');
        if !starts {
            return None;
        }
        let mut command = line[at..].to_string();
        for end in [" #", " |", " >", " &&", " ;", ")"] {
            if let Some(cut) = command.find(end) {
                command.truncate(cut);
            }
        }
        // A shell variable stands for a thread id.
        Some(command.replace("$T", "01KQXKW18CT8G75T53R8F4G7YG"))
    }

    #[test]
    fn verify_cli() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
