//! `run <name> -p <prompt>`.

use clap::Parser;
use serde_json::json;

use super::GlobalOptions;
use super::output::one_line;
use crate::agent::{AgentFlags, AgentSet, parse_role_binding};
use crate::catalog::Catalog;
use crate::config::Config;
use crate::engine::{CacheOutcome, Runtime};
use crate::ids::ThreadId;
use crate::runner::{ThreadEvent, ThreadSpec, run_thread};
use crate::sandbox::Limits;

const AFTER_HELP: &str = "\
Agents (--agent, --agent-for ROLE=AGENT, or config.yaml):
  scripted                 built-in, offline: answers from each role's schema examples
  scripted:FILE            built-in, offline: answers per role from a YAML file
  command:PROGRAM [ARGS]   an external program (context as JSON on stdin, answer on stdout)
  NAME                     a binding defined under `agents:` in config.yaml

Examples:
  uncaged-workflow run solve-issue -p \"Fix the crash on empty input\"
  uncaged-workflow run solve-issue -p \"...\" --agent scripted:answers.yaml --max-rounds 6";

/// Start a thread of a workflow and print its steps as they happen.
///
/// Exits with the workflow's return code (0 when it succeeded).
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct RunCommand {
    /// The workflow
    pub name: String,
    /// The prompt: what the thread is to do
    #[arg(short, long)]
    pub prompt: String,
    /// Most role executions the thread may take [default: the bundle's own]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: Option<u32>,
    /// Agent for every role not bound more specifically
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,
    /// Agent for one role (repeatable)
    #[arg(long, value_name = "ROLE=AGENT", value_parser = parse_role_binding)]
    pub agent_for: Vec<(String, String)>,
    /// Print each step as a JSON object, one per line
    #[arg(long)]
    pub json: bool,
}

impl RunCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let home = global.home()?;
        let catalog = Catalog::new(&home);
        let entry = catalog.entry(&self.name)?;
        let runtime = Runtime::new(&home)?;
        let bundle = catalog.load(&runtime, &self.name, entry.hash)?;
        let config = Config::load(&home.config_file())?;
        let flags = AgentFlags { default: self.agent.clone(), for_roles: self.agent_for.clone() };
        let agents = AgentSet::resolve(&config, &flags, &bundle.descriptor)?;
        let spec = ThreadSpec {
            id: ThreadId::new(),
            prompt: self.prompt.clone(),
            max_rounds: self.max_rounds.unwrap_or(bundle.descriptor.max_rounds),
            steps: vec![],
            forked_from: None,
        };
        let id = spec.id;
        if !self.json {
            let cache = match bundle.cache {
                CacheOutcome::Hit => "precompiled",
                CacheOutcome::Miss => "compiled now",
            };
            println!("thread {id}: {} {} ({cache})", self.name, bundle.hash);
        }
        let json = self.json;
        let end = run_thread(
            &runtime,
            &home,
            &bundle,
            spec,
            agents.clone(),
            &Limits::default(),
            |event| {
                let ThreadEvent::Step { index, step, elapsed } = event;
                if json {
                    let line = json!({"thread": id.to_string(), "index": index, "role": step.role,
                    "content": step.content, "meta": step.meta, "timestamp": step.timestamp,
                    "durationMs": elapsed.as_millis() as u64});
                    println!("{line}");
                } else {
                    let agent = &agents.for_role(&step.role).label;
                    println!(
                        "[{index}] {:<10} {agent}, {} ms  {}",
                        step.role,
                        elapsed.as_millis(),
                        one_line(&step.meta.to_string(), 100)
                    );
                }
            },
        )
        .await?;
        if json {
            println!("{}", json!({"thread": id.to_string(), "end": end.end}));
        } else {
            println!("{} ({}): {}", end.end.status.as_str(), end.end.return_code, end.end.summary);
        }
        Ok(end.end.return_code)
    }
}
