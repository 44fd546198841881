//! Following a thread handed to a worker, shared by `run`, `resume`, `fork`, `answer` and
//! `retry`: on a terminal a spinner with the role at work; otherwise plain lines; with
//! `--json` one object per event. A `human` agent's question is put to the person at this
//! terminal ([`super::ask`]).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{BufReader, Lines, Stdin};

use super::ask::ask_person;
use super::options::Follow;
use super::output::truncate;
use crate::error::{Error, Result, exit};
use crate::run::actions::Handed;
use crate::run::control;
use crate::run::dispatch::{Accepted, Heard};
use crate::run::events::Event;
use crate::store::Storage;
use crate::store::queue::LiveText;
use crate::store::records::{End, StepRecord};
use crate::terminal;

/// Prints how the thread stopped: the event with `--json`, else `text` (its first word, the
/// status, painted on a terminal).
fn report(how: Follow, event: &Event, text: String) -> Result<()> {
    if how.quiet {
        return Ok(());
    }
    if how.json {
        return print_event(event);
    }
    let text = terminal::block(&text);
    let (first, rest) = text.split_once(' ').unwrap_or((&text, ""));
    match terminal::Color::of_status(first) {
        Some(color) => outln!("{} {rest}", terminal::paint(first, color, terminal::Stream::Stdout)),
        None => outln!("{text}"),
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

/// Progress output: a spinner on a terminal, and a model's text as it grows; nothing extra
/// elsewhere.
struct Progress {
    how: Follow,
    spinner: Option<ProgressBar>,
    /// The role and turn whose model's text is being written out, mid-line (the spinner is
    /// off).
    live: Option<(String, u32)>,
}

impl Progress {
    fn new(how: Follow) -> Self {
        Progress { how, spinner: Self::spinner(how), live: None }
    }

    /// Writes out, at a terminal, a piece of the text a model is writing, each turn on lines
    /// of its own (piped output keeps to its lines: the step's line tells its answer).
    fn delta(&mut self, live: &LiveText) -> Result<()> {
        use std::io::Write as _;
        if self.how.json || self.how.quiet || !std::io::stdout().is_terminal() {
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        let whose = (live.role.clone(), live.turn);
        if self.live.as_ref() != Some(&whose) {
            if self.live.is_some() {
                writeln!(out).map_err(Error::stdout)?;
            }
            self.stop();
            write!(out, "    {} ▸ ", terminal::line(&live.role)).map_err(Error::stdout)?;
            self.live = Some(whose);
        }
        write!(out, "{}", terminal::block(&live.text)).map_err(Error::stdout)?;
        out.flush().map_err(Error::stdout)
    }

    /// Ends the line of live text, if one is being written, and brings the spinner back.
    fn end_live(&mut self) -> Result<()> {
        if self.live.take().is_some() {
            outln!()?;
            self.restart();
        }
        Ok(())
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

    fn working(&mut self, roles: &[String], agents: &[String]) {
        let _ = self.end_live();
        if let Some(bar) = &self.spinner {
            bar.reset_elapsed();
            bar.set_message(terminal::line(&Event::working_phrase(roles, agents)).into_owned());
        }
    }

    /// Prints a line above the spinner.
    fn println(&mut self, line: &str) -> Result<()> {
        self.end_live()?;
        match &self.spinner {
            Some(bar) => bar.suspend(|| outln!("{}", terminal::line(line))),
            None => outln!("{}", terminal::line(line)),
        }
    }

    fn finish(&mut self) {
        let _ = self.end_live();
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
            Event::Delta { text, .. } => {
                if how.json {
                    print_event(&event)?;
                }
                progress.delta(text)?;
                continue;
            }
            Event::Waiting { role, .. } => {
                let record = store.threads().read(id)?;
                let tool = record.paused.as_ref().and_then(|p| p.call.as_ref()?.tool.as_ref());
                let text = match tool {
                    Some(tool) => crate::run::answer::asked_of(id, tool),
                    None => format!(
                        "waiting for a human answer for role `{role}`; `uncaged-workflow answer {id} TEXT` continues it"
                    ),
                };
                (text, exit::STATE)
            }
            Event::Ended { end, .. } => {
                let End { return_code, summary, status, .. } = end;
                (format!("{} ({return_code}): {summary}", status.as_str()), end.exit_code())
            }
            Event::Paused { steps, .. } => {
                // Why, when the thread says (its budget, a tool server to sign in to).
                let record = store.threads().read(id)?;
                let why = match record.paused.as_ref().and_then(|p| p.reason.as_deref()) {
                    Some(reason) => format!(": {}", crate::terminal::line(reason)),
                    None => String::new(),
                };
                (
                    format!(
                        "paused after step {steps}{why}; `uncaged-workflow resume {id}` continues it"
                    ),
                    exit::STATE,
                )
            }
            Event::Started { .. } => continue,
        };
        progress.finish();
        report(how, &event, text)?;
        return Ok(code);
    }
}
