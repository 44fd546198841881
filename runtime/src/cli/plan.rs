//! `plan "<what the workflow should do>"`.

use std::path::PathBuf;

use clap::Parser;

use super::options::GlobalOptions;
use crate::agent_spec::AgentSpec;
use crate::agents::binding::parse_agent_spec;
use crate::agents::planner::{DEFAULT_ATTEMPTS, Plan, Planner};
use crate::declarative::{mermaid, outline};
use crate::error::Error;
use crate::limits::Limits;
use crate::sandbox::engine::Runtime;
use crate::schedule::workflows::{self, AddedWorkflow};
use crate::terminal;

const AFTER_HELP: &str = "\
Examples:
  uncaged-workflow plan \"Every weekday at 9, summarise yesterday's failed CI runs\" --agent gpt
  uncaged-workflow plan \"Review each changed file, then sum up\" --out review.yaml --mermaid
  uncaged-workflow plan \"Triage new issues\" --agent scripted:plans.yaml --yes";

/// Draft a workflow from a sentence with the planner agent, show it, and add it once you
/// confirm it.
///
/// The planner (a model by structured output, with the workflow schema as the contract, or any
/// agent) answers with a plan; `add`'s validator checks it, and its errors go back to the
/// planner until it validates (up to --attempts). The plan is shown as a tree (and as Mermaid
/// with --mermaid); you confirm it, ask for a change in your own words, or quit. On confirm
/// the YAML is written, added as a bundle, and its trigger registered.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct PlanCommand {
    /// What the workflow should do, in a sentence or a paragraph
    #[arg(value_parser = non_empty)]
    pub sentence: String,
    /// The planner: a binding in config.yaml (an `openai` model), `command:PROGRAM`,
    /// `scripted:FILE` (answers under `$planner:`) [default: `roles: {$planner: …}` in
    /// config.yaml, then its `agent:`, then the built-in offline example]
    #[arg(long, value_name = "AGENT", value_parser = parse_agent_spec)]
    pub agent: Option<AgentSpec>,
    /// Name to add the workflow under [default: the plan's `name`]
    #[arg(long)]
    pub name: Option<String>,
    /// Where to write the workflow's YAML [default: NAME.yaml]
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replace the file --out names if it exists
    #[arg(long)]
    pub force: bool,
    /// Add the plan without asking
    #[arg(long, short)]
    pub yes: bool,
    /// Also print the plan as a Mermaid flowchart
    #[arg(long)]
    pub mermaid: bool,
    /// Plans that do not validate the planner may give before this gives up
    #[arg(long, default_value_t = DEFAULT_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub attempts: u32,
}

impl PlanCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        let config = store.config()?;
        let cwd = std::env::current_dir().map_err(Error::io("read", "the current directory"))?;
        let mut planner =
            Planner::bind(&config, self.agent.clone(), &cwd, &self.sentence, self.attempts)?;
        if planner.is_offline_example() {
            eprintln!(
                "note: the planner is the built-in offline agent, which answers an example plan \
                 without reading your sentence; bind a model with --agent (see docs/agents.md)"
            );
        }
        eprintln!("asking the planner (agent `{}`)…", terminal::line(planner.agent()));
        let mut drafted = planner.draft().await;
        let (plan, name, out) = loop {
            report_repairs(&mut planner);
            let plan = drafted?;
            let name = self.name_of(&plan)?;
            let out = self.out.clone().unwrap_or_else(|| PathBuf::from(format!("{name}.yaml")));
            if out.exists() && !self.force {
                return Err(Error::Usage(format!(
                    "{} exists; give another file with --out, or --force to replace it",
                    out.display()
                ))
                .into());
            }
            outln!("{}", outline::outline(Some(&name), &plan.definition, plan.trigger.as_ref()))?;
            if self.mermaid {
                outln!("{}", mermaid::flowchart(&plan.definition))?;
            }
            if self.yes {
                break (plan, name, out);
            }
            match ask(&format!("Add it as `{name}`? [y]es, [m]odify, [q]uit: "))?.as_str() {
                "y" | "yes" => break (plan, name, out),
                "q" | "quit" => {
                    outln!("nothing written or added")?;
                    return Ok(0);
                }
                "m" | "modify" => {
                    let change = ask("What should change? ")?;
                    if change.is_empty() {
                        drafted = Ok(plan);
                        continue;
                    }
                    eprintln!("asking the planner for the change…");
                    let revised = planner.revise(&change).await;
                    // A revision that never validates leaves the plan shown before.
                    drafted = match revised {
                        Err(Error::PlanInvalid { attempts, reason }) => {
                            eprintln!(
                                "the planner gave no valid change in {attempts} attempt(s) \
                                 ({}); the plan is as it was",
                                terminal::line(&reason)
                            );
                            Ok(plan)
                        }
                        other => other,
                    };
                }
                other => {
                    eprintln!("`{}`: answer y, m or q", terminal::line(other));
                    drafted = Ok(plan);
                }
            }
        };
        crate::durable::write_shared(&out, plan.text.as_bytes())?;
        outln!("wrote {}", out.display())?;
        let runtime = Runtime::new(store.home())?;
        let limits = Limits::resolve(&config.limits, &Default::default())?;
        let AddedWorkflow { added, schedule } =
            workflows::add(&store, &runtime, &name, &out, &limits).await?;
        outln!("added {} {}", added.name, added.hash)?;
        match &schedule {
            Some(schedule) => outln!(
                "its trigger is schedule {} ({}); `schedule tick` or `serve` fires it",
                schedule.name,
                super::output::describe_trigger(&schedule.trigger)
            )?,
            None => outln!("start a thread with `uncaged-workflow run {} -p \"…\"`", added.name)?,
        }
        if planner.usage.calls > 0 {
            eprintln!(
                "the planner used {} tokens in, {} out, in {} call(s)",
                planner.usage.input_tokens, planner.usage.output_tokens, planner.usage.calls
            );
        }
        Ok(0)
    }

    /// The name to add `plan` under: --name, else the plan's own.
    fn name_of(&self, plan: &Plan) -> crate::Result<String> {
        let name =
            self.name.clone().or_else(|| plan.name.clone()).ok_or_else(|| {
                Error::Usage("the plan has no `name`; give one with --name".into())
            })?;
        crate::ids::validate_name("workflow name", &name)?;
        Ok(name)
    }
}

/// Prints (on stderr) the validation errors the planner was sent back since the last call.
fn report_repairs(planner: &mut Planner) {
    for reason in planner.repairs.drain(..) {
        eprintln!("the plan did not validate: {}", terminal::line(&reason));
    }
}

/// Asks `question` on stderr and reads one line of stdin, trimmed; the end of stdin is an
/// error that says how to go without a question.
fn ask(question: &str) -> crate::Result<String> {
    eprint!("{question}");
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line).map_err(Error::io("read", "standard input"))? {
        0 => Err(Error::Usage(
            "no answer on standard input; --yes adds the plan without asking".into(),
        )),
        _ => Ok(line.trim().to_string()),
    }
}

fn non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("say what the workflow should do".into())
    } else {
        Ok(text.to_string())
    }
}
