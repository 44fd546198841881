//! Handing a thread to its bundle's worker and following it: shared by `run`, `resume`,
//! `fork` and `answer`, with the agent and limit flags they take. On a terminal it shows a
//! spinner with the role at work; otherwise plain lines; with `--json` one object per event.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use super::output::truncate;
use crate::agent_spec::AgentSpec;
use crate::agents::AgentFlags;
use crate::agents::binding::{parse_agent_spec, parse_role_binding};
use crate::error::{Error, Result, exit};
use crate::limits::LimitOverrides;
use crate::run::actions::{Hand, Handed};
use crate::run::control;
use crate::run::dispatch::{Accepted, Heard, Question};
use crate::run::events::Event;
use crate::run::lifecycle::RunOptions;
use crate::store::Storage;
use crate::store::records::{Budget, End, StepRecord};
use crate::terminal;

/// The prompt of a new thread: given, read from standard input (`-p -`), or from a file.
#[derive(Debug, Clone, Args)]
pub struct PromptArgs {
    /// The prompt: what the thread is to do (`-` reads it from standard input)
    #[arg(short, long, required_unless_present = "prompt_file", conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from this file
    #[arg(long, value_name = "PATH")]
    pub prompt_file: Option<std::path::PathBuf>,
}

impl PromptArgs {
    /// The most a prompt read from a file or standard input may hold.
    const MAX: u64 = 16 << 20;

    /// The prompt's text.
    pub fn text(&self) -> Result<String> {
        use std::io::Read;
        let (what, reader): (std::path::PathBuf, Box<dyn Read>) =
            match (self.prompt.as_deref(), &self.prompt_file) {
                (Some("-"), _) => ("standard input".into(), Box::new(std::io::stdin())),
                (Some(text), _) => return Ok(text.to_string()),
                (None, Some(path)) => {
                    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
                        std::io::ErrorKind::NotFound => {
                            Error::MissingFile { what: "prompt file", path: path.clone() }
                        }
                        _ => Error::io("read the prompt file", path)(e),
                    })?;
                    (path.clone(), Box::new(file))
                }
                (None, None) => return Err(Error::Usage("give the prompt: -p TEXT".into())),
            };
        let mut bytes = Vec::new();
        reader
            .take(Self::MAX + 1)
            .read_to_end(&mut bytes)
            .map_err(Error::io("read the prompt from", &what))?;
        if bytes.len() as u64 > Self::MAX {
            return Err(Error::Usage(format!(
                "the prompt in {} is over its limit of 16 MiB",
                what.display()
            )));
        }
        String::from_utf8(bytes).map_err(|_| {
            Error::Usage(format!("the prompt in {} is not UTF-8 text", what.display()))
        })
    }
}

/// Data for a thread, as a trigger would pass it.
#[derive(Debug, Clone, Args)]
pub struct TriggerArgs {
    /// JSON handed to the bundle as `run-input.trigger-data` and kept in the start record,
    /// as a schedule or a poll passes its item (at most 1 MiB)
    #[arg(long, value_name = "JSON")]
    pub trigger_data: Option<String>,
}

impl TriggerArgs {
    /// The trigger data, parsed.
    pub fn value(&self) -> crate::Result<Option<serde_json::Value>> {
        const MAX: usize = 1 << 20;
        let Some(text) = &self.trigger_data else { return Ok(None) };
        if text.len() > MAX {
            return Err(crate::Error::Usage(format!(
                "--trigger-data is {} bytes, over its limit of 1 MiB",
                text.len()
            )));
        }
        serde_json::from_str(text)
            .map(Some)
            .map_err(|e| crate::Error::Usage(format!("--trigger-data is not JSON: {e}")))
    }
}

/// Agent choices for a thread.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Agent for every role not bound more specifically (see `run --help`)
    #[arg(long, value_name = "AGENT", value_parser = parse_agent_spec)]
    pub agent: Option<AgentSpec>,
    /// Agent for one role (repeatable)
    #[arg(long, value_name = "ROLE=AGENT", value_parser = parse_role_binding)]
    pub agent_for: Vec<(String, AgentSpec)>,
}

impl AgentArgs {
    /// The flags, with relative paths made absolute against the current directory.
    pub fn flags(&self) -> Result<AgentFlags> {
        let flags = AgentFlags {
            default: self.agent.clone(),
            for_roles: self.agent_for.clone(),
            ..Default::default()
        };
        Ok(flags.absolutize(&crate::run::lifecycle::current_dir()?))
    }

    /// The flags if any were given (they then override the thread's recorded ones).
    pub fn overrides(&self) -> Result<AgentFlags> {
        if self.agent.is_none() && self.agent_for.is_empty() {
            Ok(AgentFlags::default())
        } else {
            self.flags()
        }
    }
}

/// Sandbox limits for a new thread, recorded with it.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Override a sandbox limit for this thread (repeatable): cpu-per-step=5s, memory=256MiB,
    /// table-elements=N, string=4MiB, output=1MiB, max-rounds=N
    #[arg(long = "limit", value_name = "KEY=VALUE", value_parser = crate::limits::parse_limit_flag)]
    pub limits: Vec<(String, String)>,
}

impl LimitArgs {
    /// The overrides, later ones winning.
    pub fn overrides(&self) -> Result<LimitOverrides> {
        LimitOverrides::from_pairs(self.limits.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|reason| Error::Usage(format!("--limit: {reason}")))
    }
}

/// How a new thread is to run: its rounds, agents, limits and trigger data.
#[derive(Debug, Clone, Args)]
pub struct RunOptionArgs {
    /// Most role executions the thread may take [default: the bundle's own]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rounds: Option<u32>,
    #[command(flatten)]
    pub agents: AgentArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub trigger: TriggerArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

impl RunOptionArgs {
    /// The run options these flags ask for, parsed once here.
    pub fn options(&self) -> Result<RunOptions> {
        Ok(RunOptions {
            max_rounds: self.max_rounds,
            agents: self.agents.flags()?,
            limits: self.limits.overrides()?,
            trigger_data: self.trigger.value()?,
            budget: self.budget.budget(),
        })
    }
}

/// What a new thread may spend on its agents: over it, the thread pauses (reason `budget`)
/// before its next agent call, and `resume --raise-budget` continues it.
#[derive(Debug, Clone, Args)]
pub struct BudgetArgs {
    /// Most tokens (in and out) the thread's agent calls may use
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Most US dollars its agent calls may cost (as `prices:` in config.yaml price them)
    #[arg(long, value_name = "USD", value_parser = parse_dollars)]
    pub max_cost: Option<f64>,
    /// Most agent calls it may make
    #[arg(long, value_name = "N")]
    pub max_agent_calls: Option<u64>,
    /// Longest it may run, from its start, e.g. 30m, 2h
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_duration: Option<Duration>,
}

impl BudgetArgs {
    pub fn budget(&self) -> Budget {
        Budget {
            max_tokens: self.max_tokens,
            max_cost_usd: self.max_cost,
            max_agent_calls: self.max_agent_calls,
            max_duration_ms: self.max_duration.map(|d| d.as_millis() as u64),
        }
    }
}

/// An amount of dollars: a finite number, not negative.
fn parse_dollars(text: &str) -> std::result::Result<f64, String> {
    text.trim_start_matches('$')
        .parse::<f64>()
        .ok()
        .filter(|d| d.is_finite() && *d >= 0.0)
        .ok_or_else(|| format!("`{text}` is not an amount of dollars (e.g. 2.50)"))
}

/// `--raise-budget KEY=VALUE`: `tokens=N`, `cost=USD`, `agent-calls=N` or `duration=D`.
pub fn parse_budget_raise(text: &str) -> std::result::Result<Budget, String> {
    let (key, value) = text.split_once('=').ok_or_else(|| {
        format!("`{text}`: expected KEY=VALUE (tokens, cost, agent-calls, duration)")
    })?;
    let count = || value.parse::<u64>().map_err(|_| format!("`{value}` is not a whole number"));
    let mut budget = Budget::default();
    match key {
        "tokens" => budget.max_tokens = Some(count()?),
        "cost" => budget.max_cost_usd = Some(parse_dollars(value)?),
        "agent-calls" => budget.max_agent_calls = Some(count()?),
        "duration" => {
            let d = humantime::parse_duration(value).map_err(|e| format!("`{value}`: {e}"))?;
            budget.max_duration_ms = Some(d.as_millis() as u64);
        }
        other => {
            return Err(format!("no budget `{other}` (tokens, cost, agent-calls or duration)"));
        }
    }
    Ok(budget)
}

/// How to follow a thread handed to a worker.
#[derive(Debug, Clone, Args)]
pub struct FollowArgs {
    /// Print the thread id and return at once; the thread runs on in the background
    #[arg(long)]
    pub detach: bool,
    /// Print each event (work started, each step, the end) as a JSON object, one per line
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Print nothing but errors (and a human agent's questions): the exit code says how the
    /// thread ended
    #[arg(short, long)]
    pub quiet: bool,
}

impl FollowArgs {
    /// The following these flags ask for.
    pub fn how(&self) -> Follow {
        Follow { detach: self.detach, json: self.json, quiet: self.quiet }
    }
}

/// How to follow.
#[derive(Debug, Clone, Copy)]
pub struct Follow {
    /// Print the thread id and return at once.
    pub detach: bool,
    /// One JSON object per event instead of lines for humans.
    pub json: bool,
    /// Nothing on stdout.
    pub quiet: bool,
}

impl Follow {
    /// How the thread is to be handed over for this following.
    pub fn hand(self) -> Hand {
        if self.detach { Hand::Detach } else { Hand::Follow }
    }

    /// Prints how the thread stopped: the event with `--json`, else `text` (its first word,
    /// the status, painted on a terminal).
    fn report(self, event: &Event, text: String) -> Result<()> {
        if self.quiet {
            return Ok(());
        }
        if self.json {
            return print_event(event);
        }
        let text = terminal::block(&text);
        let (first, rest) = text.split_once(' ').unwrap_or((&text, ""));
        match terminal::Color::of_status(first) {
            Some(color) => {
                outln!("{} {rest}", terminal::paint(first, color, terminal::Stream::Stdout))
            }
            None => outln!("{text}"),
        }
    }
}

/// Prints an event as one line of JSON (`--json`).
pub fn print_event(event: &Event) -> Result<()> {
    outln!("{}", serde_json::to_string(event).expect("events serialize"))
}

/// A step as a line for people: `[3] reviewer   scripted, 2 ms  {"approved":true}` (a step no
/// agent answered, a `$status` record say, shows its duration alone).
pub fn step_line(index: usize, step: &StepRecord) -> String {
    let meta = truncate(&step.meta.to_string(), 100);
    let took = step.duration_ms.map(|ms| format!("{ms} ms"));
    let about: Vec<&str> = step.agent.as_deref().into_iter().chain(took.as_deref()).collect();
    format!(
        "{} {:<10} {}  {meta}",
        super::output::step_label(index, step),
        step.role,
        about.join(", ")
    )
}

/// Progress output: a spinner on a terminal, nothing extra elsewhere.
struct Progress {
    how: Follow,
    spinner: Option<ProgressBar>,
}

impl Progress {
    fn new(how: Follow) -> Self {
        Progress { how, spinner: Self::spinner(how) }
    }

    /// Stops the spinner while a person reads and types, so it neither claims a role is at
    /// work nor draws over what they type; [`Progress::restart`] brings it back.
    fn stop(&mut self) {
        if let Some(bar) = self.spinner.take() {
            bar.finish_and_clear();
        }
    }

    fn restart(&mut self) {
        self.spinner = Self::spinner(self.how);
    }

    fn spinner(how: Follow) -> Option<ProgressBar> {
        (!how.json && !how.quiet && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar.set_message("starting");
            bar
        })
    }

    fn working(&self, roles: &[String], agents: &[String]) {
        if let Some(bar) = &self.spinner {
            bar.reset_elapsed();
            bar.set_message(terminal::line(&Event::working_phrase(roles, agents)).into_owned());
        }
    }

    /// Prints a line above the spinner.
    fn println(&self, line: &str) -> Result<()> {
        match &self.spinner {
            Some(bar) => bar.suspend(|| outln!("{}", terminal::line(line))),
            None => outln!("{}", terminal::line(line)),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.spinner {
            bar.finish_and_clear();
        }
    }
}

/// Follows a thread handed to a worker: unless detached, prints its steps until it comes to
/// rest, and puts its `human` agents' questions to the person at this terminal. Returns the
/// exit code: the thread's return code, 75 if it paused or waits for a human answer, 130 if
/// this command was interrupted (the thread then pauses).
pub async fn follow(store: &Storage, handed: Handed, how: Follow) -> Result<i32> {
    let Handed { id, hash, mut follower, accepted } = handed;
    let Accepted { pid, cache_hit, steps } = accepted;
    if how.detach {
        outln!("{id}")?;
        return Ok(0);
    }
    if how.json {
        print_event(&Event::Started {
            thread: id,
            hash,
            worker: pid,
            precompiled: pid.map(|_| cache_hit),
            resumed_after: steps,
        })?;
    } else if !how.quiet {
        let resumed =
            if steps > 0 { format!(", continuing after step {steps}") } else { String::new() };
        match pid {
            Some(pid) => {
                let cache = if cache_hit { "precompiled" } else { "compiled now" };
                outln!("thread {id}: bundle {hash} in worker {pid} ({cache}{resumed})")?;
            }
            None => outln!("thread {id}: bundle {hash} queued for a worker{resumed}")?,
        }
    }
    let mut progress = Progress::new(how);
    // Steps reported so far (the thread had `steps` when it was handed over).
    let mut reported = steps;
    let mut stdin: Option<Lines<BufReader<Stdin>>> = None;
    loop {
        let heard = tokio::select! {
            heard = follower.next() => heard?,
            _ = tokio::signal::ctrl_c() => {
                progress.finish();
                // Interrupting the command must not lose the thread: it pauses after the step
                // in progress and can be resumed.
                let _ = control::pause(store, id).await;
                eprintln!("uncaged-workflow: interrupted; thread {id} pauses after its current step (`uncaged-workflow resume {id}` continues it)");
                return Ok(exit::INTERRUPTED);
            }
        };
        let event = match heard {
            Some(Heard::Event(event)) => event,
            Some(Heard::Question(question)) => {
                progress.stop();
                let answer = ask_person(question, &mut stdin).await;
                follower.answer(answer).await?;
                progress.restart();
                continue;
            }
            Some(Heard::Failed { message, code }) => {
                progress.finish();
                return Err(Error::Remote { message, code });
            }
            None => {
                progress.finish();
                return Err(Error::Host(format!(
                    "the worker running thread {id} exited before the thread ended; `uncaged-workflow resume {id}` continues it"
                )));
            }
        };
        // A parent waiting on a child workflow goes on by itself when the child ends: followed
        // on through the store, as the child's worker hands it back.
        if let Event::Waiting { .. } = &event {
            let record = store.threads().read(id)?;
            let child = record.waited_child().map(|(child, role, _)| (child, role.to_string()));
            // Moved on already (its child ended at once, and it runs again): followed on too.
            if child.is_some() || record.status() != crate::store::records::ThreadStatus::Waiting {
                if let Some((child, role)) = child
                    && !how.json
                    && !how.quiet
                {
                    let role = crate::terminal::line(&role);
                    progress.println(&format!("    step `{role}` runs child thread {child}"))?;
                }
                follower = crate::run::dispatch::shared::follow_stored(store, &record, reported);
                continue;
            }
        }
        let (text, code) = match &event {
            Event::Working { roles, agents, .. } => {
                if how.json {
                    print_event(&event)?;
                }
                progress.working(roles, agents);
                continue;
            }
            Event::Step { index, step, .. } => {
                reported = reported.max(*index);
                if how.json {
                    print_event(&event)?;
                } else if !how.quiet {
                    progress.println(&step_line(*index, step))?;
                }
                continue;
            }
            Event::Waiting { role, .. } => (
                format!(
                    "waiting for a human answer for role `{role}`; `uncaged-workflow answer {id} TEXT` continues it"
                ),
                exit::STATE,
            ),
            Event::Ended { end, .. } => {
                let End { return_code, summary, status, .. } = end;
                (format!("{} ({return_code}): {summary}", status.as_str()), end.exit_code())
            }
            Event::Paused { steps, .. } => (
                format!("paused after step {steps}; `uncaged-workflow resume {id}` continues it"),
                exit::STATE,
            ),
            Event::Started { .. } => continue,
        };
        progress.finish();
        how.report(&event, text)?;
        return Ok(code);
    }
}

/// Puts a `human` agent's question to the person running the command, on stderr, and reads
/// the answer: with a line editor at a terminal, else from standard input. `None` declines.
async fn ask_person(
    question: Question,
    stdin: &mut Option<Lines<BufReader<Stdin>>>,
) -> Option<String> {
    let Question { role, system_prompt, context, expected, error } = question;
    match &error {
        // Asked again: the thread so far was shown already.
        Some(error) => eprintln!(
            "── that answer does not fit role `{}`: {} ──",
            terminal::line(&role),
            terminal::line(error)
        ),
        None => {
            eprintln!("── a human answer is needed for role `{}` ──", terminal::line(&role));
            eprintln!("{}", terminal::block(system_prompt.trim()));
            eprintln!();
            eprintln!("{}", terminal::block(context.trim()));
        }
    }
    if let Some(expected) = &expected {
        eprintln!("── answer with JSON like {} ──", terminal::line(expected));
    }
    if std::io::stdin().is_terminal() {
        eprintln!(
            "── type your answer (pasting is fine); a line holding only `.` ends it, Ctrl-C \
             declines ──"
        );
        tokio::task::spawn_blocking(edit_answer).await.unwrap_or(None)
    } else {
        eprintln!("── end your answer with a line holding only `.`, or with end of input ──");
        let lines = stdin.get_or_insert_with(|| BufReader::new(tokio::io::stdin()).lines());
        read_answer(lines).await
    }
}

/// Reads an answer from a person at a terminal with a line editor, up to a line holding only
/// `.`; Ctrl-C (or Ctrl-D on nothing typed) declines, and the thread waits for `answer`.
///
/// The whole answer is one edit: the editor reads every line as it arrives, so a paste, or
/// lines typed ahead of the prompt, arrive whole (an editor started per line would drop what
/// the previous one had read ahead).
fn edit_answer() -> Option<String> {
    let mut editor =
        rustyline::Editor::<AnswerEnd, rustyline::history::DefaultHistory>::new().ok()?;
    editor.set_helper(Some(AnswerEnd));
    let text = editor.readline("> ").ok()?;
    let text = match text.trim_end().rsplit_once('\n') {
        Some((answer, last)) if last.trim() == "." => answer.to_string(),
        _ if text.trim() == "." => String::new(),
        _ => text,
    };
    (!text.trim().is_empty()).then_some(text)
}

/// The editor's rule for an answer: Enter starts a new line, until a line holding only `.`.
struct AnswerEnd;

impl rustyline::validate::Validator for AnswerEnd {
    fn validate(
        &self,
        ctx: &mut rustyline::validate::ValidationContext,
    ) -> rustyline::Result<rustyline::validate::ValidationResult> {
        let ended = ctx.input().lines().last().is_some_and(|line| line.trim() == ".");
        Ok(if ended {
            rustyline::validate::ValidationResult::Valid(None)
        } else {
            rustyline::validate::ValidationResult::Incomplete
        })
    }
}

impl rustyline::completion::Completer for AnswerEnd {
    type Candidate = String;
}
impl rustyline::hint::Hinter for AnswerEnd {
    type Hint = String;
}
impl rustyline::highlight::Highlighter for AnswerEnd {}
impl rustyline::Helper for AnswerEnd {}

/// Reads an answer from stdin: lines up to one holding only `.`, or to the end of input.
/// Nothing at all (end of input at once) is no answer.
async fn read_answer(lines: &mut Lines<BufReader<Stdin>>) -> Option<String> {
    let mut text = Vec::new();
    let mut read_any = false;
    while let Ok(Some(line)) = lines.next_line().await {
        read_any = true;
        if line.trim() == "." {
            break;
        }
        text.push(line);
    }
    let text = text.join("\n");
    (read_any && !text.trim().is_empty()).then_some(text)
}
