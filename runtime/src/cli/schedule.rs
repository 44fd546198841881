//! `schedule add|list|rm|pause|resume|tick`.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use super::options::{AgentArgs, GlobalOptions, LimitArgs};
use super::output::{Age, Table, print_json};
use crate::clock::now_ms;
use crate::error::{Error, exit};
use crate::run_request::RunRequest;
use crate::schedule::{self, Firer, NewSchedule};
use crate::store::schedules::{DiffMode, Trigger};
use crate::terminal;

const AFTER_HELP: &str = "\
A schedule starts threads of a workflow by itself: at the instants of a cron expression, or
when a poll command's output shows a new item (one thread per item, the item as the thread's
trigger data) or any change. `schedule tick` fires what is due once and exits (for cron or a
systemd timer); `serve` fires continuously. Each cron instant and each poll item starts one
thread, exactly once, even if the firing process is killed; instants missed while nothing
fired (the machine was off) fire once, not once each.

Examples:
  uncaged-workflow schedule add solve-issue --cron '0 9 * * MON-FRI' --tz Europe/Paris -p \"Triage new issues\"
  uncaged-workflow schedule add triage --poll './open-issues.sh --json' --every 5m --diff new-items
  uncaged-workflow schedule add solve-issue --webhook --secret-env GITHUB_HOOK_SECRET
  uncaged-workflow schedule list
  uncaged-workflow schedule tick
  * * * * * uncaged-workflow schedule tick      (a crontab line: fire every minute)";

/// Start threads by themselves: cron and poll schedules.
#[derive(Debug, Parser)]
#[command(after_help = AFTER_HELP)]
pub struct ScheduleCommand {
    #[command(subcommand)]
    pub action: ScheduleAction,
}

/// What to do with schedules.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Add a schedule: `--cron EXPR`, `--poll CMD --every DURATION --diff MODE`, or
    /// `--webhook --secret-env NAME`
    Add(Box<AddArgs>),
    /// List schedules with their next firing
    List {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule (the threads it started stay)
    Rm {
        /// The schedule
        name: String,
    },
    /// Stop a schedule (or every trigger of a workflow) from firing until `resume`
    Pause {
        /// The schedule
        #[arg(required_unless_present = "workflow")]
        name: Option<String>,
        /// Every schedule of this workflow instead: the workflow's phase becomes `paused`
        #[arg(long, value_name = "NAME", conflicts_with = "name")]
        workflow: Option<String>,
    },
    /// Let a paused schedule (or a workflow's triggers) fire again, from now on (what it
    /// missed is not caught up)
    Resume {
        /// The schedule
        #[arg(required_unless_present = "workflow")]
        name: Option<String>,
        /// Every schedule of this workflow instead: the workflow is `active` again
        #[arg(long, value_name = "NAME", conflicts_with = "name")]
        workflow: Option<String>,
    },
    /// Fire everything due now, once, and exit: for a crontab entry or a systemd timer
    Tick {
        /// Print what fired as JSON
        #[arg(long)]
        json: bool,
    },
}

/// `schedule add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The workflow to start (its current version at each firing)
    #[arg(add = clap_complete::ArgValueCompleter::new(super::complete::workflow_names))]
    pub workflow: String,
    /// Fire at the instants of this cron expression: 5 fields (minute hour day month
    /// weekday) or 6 (a leading seconds field)
    #[arg(long, value_name = "EXPR", conflicts_with_all = ["poll", "every", "diff", "include_existing", "webhook"], required_unless_present_any = ["poll", "webhook"])]
    pub cron: Option<String>,
    /// The time zone of the cron expression, an IANA name [default: UTC]
    #[arg(long, value_name = "ZONE", requires = "cron")]
    pub tz: Option<String>,
    /// Fire on what this command prints: a program and its arguments, quoted as for a shell
    /// (never run by one), run in the current directory
    #[arg(long, value_name = "CMD", requires_all = ["every", "diff"], conflicts_with = "webhook")]
    pub poll: Option<String>,
    /// Fire on each signed request to `serve`'s POST /hooks/WORKFLOW (GitHub's
    /// X-Hub-Signature-256 or Standard Webhooks), the request's body as `$trigger_data`
    #[arg(long, requires = "secret_env")]
    pub webhook: bool,
    /// The environment variable of `serve` holding the webhook's signing secret
    #[arg(long, value_name = "NAME", requires = "webhook")]
    pub secret_env: Option<String>,
    /// A field of the threads' data, taken from each delivery's body by a JSON Pointer
    /// (`--map issue=/issue/number`; repeat it); without any, the body is the data
    #[arg(long, value_name = "FIELD=POINTER", requires = "webhook", value_parser = map_field)]
    pub map: Vec<(String, String)>,
    /// How often the poll command runs, e.g. 30s, 5m, 1h
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub every: Option<Duration>,
    /// new-items: the output is a JSON array, each new item (by its `id`, else its content)
    /// starts a thread; any-change: any new output starts one
    #[arg(long, value_name = "MODE", value_enum)]
    pub diff: Option<Diff>,
    /// Fire for what the first check finds too (by default it is taken as already seen)
    #[arg(long)]
    pub include_existing: bool,
    /// The prompt of the threads it starts [default: the workflow's description]
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// The schedule's name [default: the workflow's, numbered if taken]
    #[arg(long)]
    pub name: Option<String>,
    /// Most role executions each thread may take [default: the bundle's own]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: Option<u32>,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Print the schedule as JSON
    #[arg(long)]
    pub json: bool,
}

/// One `--map FIELD=POINTER`.
fn map_field(text: &str) -> Result<(String, String), String> {
    let (field, pointer) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not FIELD=POINTER (issue=/issue/number)"))?;
    Ok((field.to_string(), pointer.to_string()))
}

/// `--diff`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Diff {
    NewItems,
    AnyChange,
}

impl ScheduleCommand {
    pub async fn execute(self, global: &GlobalOptions) -> anyhow::Result<i32> {
        let store = global.store()?;
        match self.action {
            ScheduleAction::Add(args) => {
                let trigger = match (&args.cron, &args.poll) {
                    _ if args.webhook => Trigger::Webhook {
                        secret_env: args.secret_env.clone().expect("required by --webhook"),
                        map: args.map.iter().cloned().collect(),
                    },
                    (Some(expression), _) => {
                        Trigger::Cron { expression: expression.clone(), timezone: args.tz.clone() }
                    }
                    (None, Some(command)) => Trigger::Poll {
                        command: shlex::split(command).filter(|c| !c.is_empty()).ok_or_else(
                            || {
                                Error::Usage(format!(
                                    "--poll `{command}` is not a program and its arguments"
                                ))
                            },
                        )?,
                        every_ms: args.every.expect("required by --poll").as_millis() as u64,
                        diff: match args.diff.expect("required by --poll") {
                            Diff::NewItems => DiffMode::NewItems,
                            Diff::AnyChange => DiffMode::AnyChange,
                        },
                        include_existing: args.include_existing,
                    },
                    (None, None) => unreachable!("clap requires --cron or --poll"),
                };
                let prompt = match args.prompt {
                    Some(prompt) => prompt,
                    None => {
                        let entry = store.registry().get(&args.workflow)?;
                        store.bundles().descriptor(entry.hash)?.description
                    }
                };
                let added = schedule::add(
                    &store,
                    NewSchedule {
                        name: args.name,
                        workflow: args.workflow,
                        trigger,
                        prompt,
                        request: RunRequest {
                            max_rounds: args.max_rounds,
                            limits: args.limits.overrides()?,
                            ..args.agents.request()?
                        },
                    },
                )?;
                if args.json {
                    print_json(&added)?;
                } else {
                    outln!(
                        "added schedule {} ({})",
                        added.name,
                        super::output::describe_trigger(&added.trigger)
                    )?;
                }
                Ok(0)
            }
            ScheduleAction::List { json } => {
                let statuses = schedule::statuses(&store, now_ms())?;
                if json {
                    print_json(&statuses)?;
                    return Ok(0);
                }
                if statuses.is_empty() {
                    outln!("no schedules")?;
                    return Ok(0);
                }
                let now_ms = now_ms();
                let mut table = Table::new(&[
                    "SCHEDULE", "WORKFLOW", "TRIGGER", "NEXT", "FIRED", "LAST", "STATE",
                ]);
                for status in &statuses {
                    let s = &status.schedule;
                    let next = match status.next {
                        Some(at) if at > now_ms => {
                            format!("in {}", Age { at_ms: now_ms, now_ms: at })
                        }
                        Some(_) => "now".to_string(),
                        None => "-".to_string(),
                    };
                    let last = status
                        .last_fired
                        .map_or("-".to_string(), |at| format!("{} ago", Age { at_ms: at, now_ms }));
                    let state = match (&status.last_error, s.paused) {
                        (_, true) => "paused".to_string(),
                        (Some(error), false) => format!("failing: {error}"),
                        (None, false) => "active".to_string(),
                    };
                    table
                        .cell(&s.name)
                        .cell(&s.workflow)
                        .cell_truncated(&super::output::describe_trigger(&s.trigger), 50)
                        .cell_shown(&next)
                        .cell_fmt(format_args!("{}", status.fired))
                        .cell_shown(&last)
                        .cell_truncated(&state, 60);
                }
                table.print()?;
                Ok(0)
            }
            ScheduleAction::Rm { name } => {
                schedule::remove(&store, &name)?;
                outln!("removed schedule {name} (the threads it started stay)")?;
                Ok(0)
            }
            ScheduleAction::Pause { name, workflow } => {
                for name in paused(&store, name, workflow, true)? {
                    outln!("paused schedule {name}")?;
                }
                Ok(0)
            }
            ScheduleAction::Resume { name, workflow } => {
                for name in paused(&store, name, workflow, false)? {
                    outln!("resumed schedule {name}; it fires from now on")?;
                }
                Ok(0)
            }
            ScheduleAction::Tick { json } => {
                let pass = Firer::new(store).pass_to_end().await?;
                if json {
                    // One document on one line, failures in it: the exit code says whether
                    // there were any.
                    outln!("{}", serde_json::to_string(&pass).expect("a pass serializes"))?;
                } else {
                    for started in &pass.started {
                        outln!(
                            "started {} (schedule {}, {})",
                            started.thread_id,
                            started.schedule,
                            terminal::line(&started.firing)
                        )?;
                    }
                    for failed in &pass.errors {
                        eprintln!(
                            "uncaged-workflow: schedule {}: {}",
                            failed.schedule,
                            terminal::line(&failed.error)
                        );
                    }
                }
                Ok(if pass.errors.is_empty() { 0 } else { exit::SOFTWARE })
            }
        }
    }
}

/// Pauses or resumes schedule `name`, or every schedule of `workflow`; the names changed.
fn paused(
    store: &crate::store::Storage,
    name: Option<String>,
    workflow: Option<String>,
    paused: bool,
) -> crate::Result<Vec<String>> {
    Ok(match (name, workflow) {
        (_, Some(workflow)) => schedule::phase::set_workflow_paused(store, &workflow, paused)?
            .into_iter()
            .map(|s| s.name)
            .collect(),
        (Some(name), None) => vec![schedule::set_paused(store, &name, paused)?.name],
        (None, None) => unreachable!("clap requires a schedule or a workflow"),
    })
}
