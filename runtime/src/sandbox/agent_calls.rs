//! A bundle's agent calls on the host's side, one implementation for both contract
//! versions: a batch answered from the call journal where it holds the answer, the others
//! asked of their agents concurrently, each journaled as it answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tracing::Instrument;

use super::calls_out::{Done, Fresh};
use super::children::{ChildCall, ChildState};
use super::control::Activity;
use super::state::{AnsweredCall, ThreadState};
use super::turns::{Spending, ThreadTurns};
use crate::agents::human::AnswerShape;
use crate::agents::{Agent, AgentAnswer, AgentContext, AgentFailure, Bound, CallTurns, RoleRef};
use crate::faults::crash_point;
use crate::ids::ThreadId;
use crate::limits::Size;
use crate::store::debug_log::LogLevel;
use crate::store::journal::{CallErrorKind, CallKind, CallOrigin, CallResponse, Replay};
use crate::store::pauses::{PauseReason, ToolWait};
use crate::store::records::PendingCall;
use crate::telemetry;

/// Log tag of this module's call sites.
pub(super) const TAG_AGENT: &str = "AGM7Q2XW";

/// The most calls one `agents` batch may hold (the WIT says so): each may start a process or
/// hold a connection, and a bundle is untrusted.
pub const MAX_BATCH: usize = 64;

/// One agent call, as either version of the contract asks it.
pub(super) struct Call {
    pub role: String,
    pub input: Option<String>,
    /// 0.1 bundles send a system prompt with each request; 0.2 bundles use the descriptor's.
    pub system_prompt: Option<String>,
    /// What the call journal knows the request by.
    pub digest: String,
}

/// What became of a fresh call.
enum Settled {
    /// Its response, for the bundle and the journal.
    Response(CallResponse),
    /// A person must answer it (or decide about one of its tool calls), and nobody is there.
    Wait(Option<ToolWait>),
    /// It stopped between its turns: the thread pauses (over its budget, or asked to).
    /// The thread must rest, and why: a budget, a sign-in.
    Rest(PauseReason, String),
    Paused,
}

/// An agent's answer within the step's `timeout`, if it has one: past it the call is dropped
/// — a command agent's process group with it — and fails as timed out. Either way `answer` is
/// held once (an `async fn` would hold it twice: as its argument, and moved into the timer).
fn within(
    timeout: Option<Duration>,
    answer: impl std::future::Future<Output = Result<AgentAnswer, AgentFailure>>,
) -> impl std::future::Future<Output = Result<AgentAnswer, AgentFailure>> {
    let Some(limit) = timeout else { return futures::future::Either::Left(answer) };
    let timed = tokio::time::timeout(limit, answer);
    futures::future::Either::Right(futures::FutureExt::map(timed, move |answer| {
        answer.unwrap_or_else(|_| {
            Err(AgentFailure::Timeout(format!(
                "the step's timeout of {} passed",
                humantime::format_duration(limit)
            )))
        })
    }))
}

/// Why a batch's calls stopped the thread, if any did (the first of each kind).
#[derive(Default)]
struct Stops {
    waiting: Option<(String, PendingCall)>,
    rest: Option<(PauseReason, String)>,
    paused: bool,
}

/// What an agent call came to, on its span: its tokens, or why it failed.
fn trace_answer(span: &tracing::Span, answer: &Result<AgentAnswer, AgentFailure>) {
    match answer {
        Ok(AgentAnswer { usage: Some(usage), .. }) => usage.trace(span),
        Ok(_) => {}
        Err(stop) if stop.is_stop() => {}
        Err(failure) => telemetry::record_failure(span, failure.kind(), &failure.to_string()),
    }
}

impl ThreadState {
    /// Makes a batch of agent calls: each answered from the call journal if it holds the
    /// answer, the others asked of their agents concurrently, each journaled as it answers.
    /// One response per call, in order.
    pub(super) async fn ask_agents(
        &mut self,
        calls: Vec<Call>,
    ) -> wasmtime::Result<Vec<CallResponse>> {
        // Until this returns, the time is the host's, not the guest's.
        let _in_host = self.clock.host_call();
        if calls.len() > MAX_BATCH {
            return Err(self.exceed(format!(
                "limit exceeded: the bundle asked {} agents at once, over the limit of {MAX_BATCH} \
                 calls per batch",
                calls.len()
            )));
        }
        for call in &calls {
            self.check_string("the role of an agent call", &call.role)?;
            if let Some(input) = &call.input {
                self.check_string("the input of an agent call", input)?;
            }
        }
        let (Some(agents), Some(thread_id)) = (&self.host.agents, self.host.thread_id) else {
            let refused = CallResponse::Error {
                kind: CallErrorKind::Unavailable,
                message: "no agent may be asked outside a thread".into(),
            };
            return Ok(vec![refused; calls.len()]);
        };
        // The host binds agents to the roles a bundle declares, and to nothing else.
        let bindings: Vec<_> = calls.iter().map(|c| agents.for_role(&c.role).cloned()).collect();
        let mut responses: Vec<Option<CallResponse>> = vec![None; calls.len()];
        let mut fresh = Vec::new();
        for ((index, call), bound) in calls.into_iter().enumerate().zip(bindings) {
            let Some(bound) = bound else {
                let shown: String = call.role.chars().take(64).collect();
                self.host.info.write(
                    LogLevel::Warn,
                    TAG_AGENT,
                    &format!("refused an agent request for undeclared role `{shown}`"),
                );
                responses[index] = Some(CallResponse::Error {
                    kind: CallErrorKind::Unavailable,
                    message: format!(
                        "the bundle declares no role `{shown}`: agents answer only declared roles"
                    ),
                });
                continue;
            };
            let (seq, replay) =
                self.host.journal.next_call(CallKind::Agent, &call.role, &call.digest)?;
            match replay {
                Replay::Recorded(response) => {
                    self.host.info.write(
                        LogLevel::Info,
                        TAG_AGENT,
                        &format!("role `{}`: answer replayed from the call journal", call.role),
                    );
                    let usage = match &response {
                        CallResponse::Ok { usage, .. } => usage.clone(),
                        CallResponse::Error { .. } => None,
                    };
                    let agent = self.answered_by(&call.role, &bound);
                    self.host.answered.push(AnsweredCall {
                        role: call.role.clone(),
                        agent,
                        elapsed: Duration::ZERO,
                        usage,
                    });
                    responses[index] = Some(response);
                }
                Replay::Fresh => {
                    let context = self.agent_context(thread_id, &call);
                    if let Some(response) =
                        self.answer_from_baseline(seq, &call, &context, &bound)?
                    {
                        responses[index] = Some(response);
                        continue;
                    }
                    let turns = None;
                    fresh.push(Fresh { index, seq, bound, digest: call.digest, context, turns });
                }
            }
        }
        if !fresh.is_empty() {
            self.check_budget(fresh.len())?;
            self.ask_fresh(fresh, &mut responses).await?;
        }
        let responses: Vec<CallResponse> =
            responses.into_iter().map(|r| r.expect("every call has a response")).collect();
        self.host.agent_meta = responses
            .iter()
            .filter_map(|r| match r {
                CallResponse::Ok { value, meta: Some(meta), .. } => {
                    Some((value.clone(), meta.clone()))
                }
                _ => None,
            })
            .collect();
        Ok(responses)
    }

    /// Stops the thread (it pauses, reason `budget`) if `calls` more agent calls would go over
    /// its budget: what the calls in its journal cost so far, and its age.
    fn check_budget(&mut self, calls: usize) -> wasmtime::Result<()> {
        let shared = self.host.control.shared_budget().and_then(|b| b.exceeded(calls as u64));
        let budget = &self.host.thread.budget;
        if budget.is_empty() && shared.is_none() {
            return Ok(());
        }
        let own = || {
            let spent = self.host.journal.spent();
            let elapsed = crate::clock::now_ms().saturating_sub(self.host.thread.started);
            budget.exceeded(&spent, elapsed, calls as u64)
        };
        let Some(reason) = shared.or_else(own) else { return Ok(()) };
        self.host.info.write(LogLevel::Warn, TAG_AGENT, &format!("over budget: {reason}"));
        self.host.rest = Some((PauseReason::Budget, reason.clone()));
        Err(wasmtime::Error::msg(format!("paused by its budget: {reason}")))
    }

    /// Asks the agents of `fresh` calls concurrently and journals each answer as it comes.
    async fn ask_fresh(
        &mut self,
        mut fresh: Vec<Fresh>,
        responses: &mut [Option<CallResponse>],
    ) -> wasmtime::Result<()> {
        self.durable_turns(&mut fresh);
        let roles: Vec<&str> = fresh.iter().map(|f| f.context.role.name.as_str()).collect();
        let mut labels: Vec<&str> = fresh.iter().map(|f| f.bound.label.as_str()).collect();
        labels.dedup();
        self.host
            .control
            .set_activity(Some(Activity { role: roles.join(", "), agent: labels.join(", ") }));
        // A rebuilt instance asks again the calls its batch out is making: it takes their
        // answers when they come, and nobody is asked twice.
        let step = self.host.journal.step();
        let keys: Vec<(usize, &str)> = fresh.iter().map(|f| (f.seq, f.digest.as_str())).collect();
        let adopted = self.host.calls_out.as_ref().is_some_and(|out| out.holds(step, &keys));
        let indexes: Vec<(usize, usize)> = fresh.iter().map(|f| (f.seq, f.index)).collect();
        if !adopted {
            for f in &fresh {
                self.host.info.write(
                    LogLevel::Info,
                    TAG_AGENT,
                    &format!("role `{}`: asking agent `{}`", f.context.role.name, f.bound.label),
                );
                crash_point("agent-call");
            }
        }
        let info = self.host.info.clone();
        let human = self.host.control.human.clone();
        let schemas = self.host.thread.role_schemas.clone();
        let settings = self.host.thread.step_settings.clone();
        let llm_extractor = self.host.agents.as_ref().is_some_and(|a| a.extractor().is_some());
        let view = &self.host.thread;
        let (children, depth, child_request) =
            (view.children.clone(), view.depth, view.child_request.clone());
        let (parent, step) = (self.host.thread_id, self.host.journal.step());
        let ask = |f: Fresh| {
            let (info, human, schemas) = (info.clone(), human.clone(), schemas.clone());
            let timeout = settings.timeouts.get(&f.context.role.name).copied();
            // A step that runs a child workflow: the call goes to the child, not to an agent.
            let child = settings.children.get(&f.context.role.name).map(|c| {
                let call = ChildCall {
                    parent: parent.expect("a thread's calls have its id"),
                    role: f.context.role.name.clone(),
                    step,
                    seq: f.seq,
                    digest: f.digest.clone(),
                    workflow: c.workflow.clone(),
                    prompt: c.prompt.clone(),
                    input: f.context.input.clone(),
                    depth,
                    request: child_request.clone(),
                };
                (call, children.clone())
            });
            let span = f.bound.span(&f.context.role.name);
            let traced = span.clone();
            async move {
                let started = Instant::now();
                let role = &f.context.role.name;
                let mut waits_on = None;
                let answer = match (child, &*f.bound.agent) {
                    (Some((call, Some(children))), _) => match children.call(call).await {
                        ChildState::Ended(answer) => answer,
                        ChildState::Running(id) => {
                            waits_on = Some(id);
                            Err(AgentFailure::Waiting)
                        }
                    },
                    (Some((call, None)), _) => Err(AgentFailure::Unavailable(format!(
                        "workflow `{}` cannot be run as a child here (`step` runs one step \
                         in its own process; `resume` runs it in a worker)",
                        call.workflow
                    ))),
                    (None, Agent::Human) => {
                        // What the answer must hold, worked out only for a person (shown it).
                        let shape =
                            schemas.get(role).and_then(|s| AnswerShape::of(role, s, llm_extractor));
                        let text = human.ask(&f.context, shape.as_ref()).await;
                        let answer = |content| AgentAnswer { content, meta: None, usage: None };
                        text.map(answer).ok_or(AgentFailure::Waiting)
                    }
                    (None, _) => {
                        within(timeout, f.bound.answer(&f.context, &info, f.turns.as_ref())).await
                    }
                };
                trace_answer(&traced, &answer);
                Done { fresh: f, answer, elapsed: started.elapsed(), child: waits_on }
            }
            .instrument(span)
        };
        let mut stops = Stops::default();
        let mut store_failure = None;
        if let Some(out) = self.host.calls_out.as_mut() {
            // In a worker: the calls run on a task of their own, which outlives this instance
            // if the thread gives it up while it waits (see `crate::run::runner`).
            if !adopted {
                let keys = fresh.iter().map(|f| (f.seq, f.digest.clone())).collect();
                out.send(step, keys, fresh.into_iter().map(ask).collect());
            }
            // Only a thread whose calls did not answer at once waits: it lets go of its files
            // then (an answer at once, as a scripted agent's, costs no reopening a step).
            if out.waiting() {
                self.host.before_wait();
            }
            while let Some(mut done) = self.next_out().await {
                // The instance that sent the batch may not be this one: the index is ours.
                if let Some((_, index)) = indexes.iter().find(|(seq, _)| *seq == done.fresh.seq) {
                    done.fresh.index = *index;
                }
                if let Err(e) = self.answered(done, responses, &mut stops) {
                    store_failure = Some(e);
                    if let Some(out) = self.host.calls_out.as_mut() {
                        out.stop();
                    }
                    break;
                }
            }
        } else {
            // A process running one thread (`step`, `replay`): the calls are polled here, not
            // spawned, so when the thread is killed this future is dropped, and with it every
            // call in flight (and the process group of each command agent).
            self.host.before_wait();
            let mut running: FuturesUnordered<_> = fresh.into_iter().map(ask).collect();
            while let Some(done) = running.next().await {
                if let Err(e) = self.answered(done, responses, &mut stops) {
                    // The calls still in flight are dropped (stopped) when this returns.
                    store_failure = Some(e);
                    break;
                }
            }
        }
        if let Some(error) = store_failure {
            return Err(self.host.store_failed(error));
        }
        if let Some((role, call)) = stops.waiting {
            let on = match (&call.child, &call.tool) {
                (Some(child), _) => format!("child thread {child}"),
                (None, Some(tool)) => format!("a decision about tool call `{}`", tool.tool),
                (None, None) => "a human answer".into(),
            };
            self.host.waiting = Some((role.clone(), call));
            return Err(wasmtime::Error::msg(format!("waiting for {on} for role `{role}`")));
        }
        if let Some((why, reason)) = stops.rest {
            self.host.info.write(LogLevel::Warn, TAG_AGENT, &reason);
            self.host.rest = Some((why, reason.clone()));
            return Err(wasmtime::Error::msg(format!("paused: {reason}")));
        }
        if stops.paused {
            self.host.paused = true;
            return Err(wasmtime::Error::msg("paused between an agent's turns"));
        }
        // A call whose task died (it panicked) answered nothing: it failed.
        for (_, index) in indexes {
            responses[index].get_or_insert_with(|| CallResponse::Error {
                kind: CallErrorKind::Failed,
                message: "the agent call stopped without an answer (the host failed)".into(),
            });
        }
        Ok(())
    }

    /// The next answer of the calls out to take, `None` once all are taken.
    async fn next_out(&mut self) -> Option<Done> {
        self.host.calls_out.as_mut()?.next().await
    }

    /// Gives each fresh call to an `openai` binding its loop in the journal and the thread's
    /// say between its turns (its budget, a pause, a person at the terminal, its followers).
    fn durable_turns(&self, fresh: &mut [Fresh]) {
        let budget = &self.host.thread.budget;
        let spent = match budget.is_empty() {
            true => Default::default(),
            false => self.host.journal.spent(),
        };
        let spending = Spending::from(spent);
        for f in fresh.iter_mut().filter(|f| matches!(&*f.bound.agent, Agent::OpenAi(_))) {
            let host = ThreadTurns {
                control: self.host.control.clone(),
                budget: budget.clone(),
                started: self.host.thread.started,
                spending: spending.clone(),
                prices: f.bound.prices.clone(),
                role: f.context.role.name.clone(),
                credentials: self.host.thread.credentials.clone(),
                baseline: self.host.thread.baseline.clone(),
            };
            f.turns = Some(CallTurns {
                journal: self.host.journal.loop_of(f.seq),
                host: Arc::new(host),
                secrets: f.bound.secrets.clone(),
            });
        }
    }

    /// Journals an answered call and keeps its response for the bundle; a call a person must
    /// answer (or decide about), with nobody there, or a running child workflow (`child`)
    /// must, is kept in `stops` instead (the first one), as is a call that stopped between
    /// its turns.
    fn answered(
        &mut self,
        done: Done,
        responses: &mut [Option<CallResponse>],
        stops: &mut Stops,
    ) -> crate::Result<()> {
        let Done { fresh: f, answer, elapsed, child } = done;
        let role = f.context.role.name.clone();
        let runs_child = self.host.thread.step_settings.children.contains_key(&role);
        let response = match self.settle(&f, answer, elapsed) {
            Settled::Response(response) => response,
            Settled::Wait(tool) => {
                // Nobody to ask: the thread stops once the others have answered; `answer`
                // journals this call's answer (or the decision) and the resumed thread
                // replays it (or goes on from it).
                let system_prompt =
                    Some(f.context.role.system_prompt.clone()).filter(|p| !p.is_empty());
                let call = PendingCall {
                    step: self.host.journal.step(),
                    seq: f.seq,
                    digest: f.digest,
                    system_prompt,
                    input: f.context.input.clone(),
                    child,
                    tool,
                };
                stops.waiting.get_or_insert((role, call));
                return Ok(());
            }
            Settled::Rest(why, reason) => {
                stops.rest.get_or_insert((why, reason));
                return Ok(());
            }
            Settled::Paused => {
                stops.paused = true;
                return Ok(());
            }
        };
        let usage = match &response {
            CallResponse::Ok { usage, .. } => usage.clone(),
            CallResponse::Error { .. } => None,
        };
        let agent = self.answered_by(&role, &f.bound);
        if let Some(shared) = self.host.control.shared_budget() {
            shared.spend(usage.as_ref());
        }
        self.host.answered.push(AnsweredCall { role: role.clone(), agent, elapsed, usage });
        // A child's result is not made again at no cost: it is always kept durably.
        let durable = runs_child || !matches!(&*f.bound.agent, Agent::Scripted(_));
        let origin = CallOrigin {
            request: Some(self.host.context_digests.digest(&f.context)),
            ..CallOrigin::default()
        };
        self.host.journal.record_from(
            f.seq,
            CallKind::Agent,
            &role,
            f.digest,
            response.clone(),
            durable,
            origin,
        )?;
        crash_point("agent-recorded");
        responses[f.index] = Some(response);
        Ok(())
    }

    /// An agent's answer as the response the bundle gets (and the journal keeps), logged;
    /// or why there is none yet (a person must answer and nobody is there, or the call stopped
    /// between its turns).
    fn settle(
        &mut self,
        call: &Fresh,
        answer: Result<AgentAnswer, AgentFailure>,
        elapsed: Duration,
    ) -> Settled {
        let (role, label, ms) = (&call.context.role.name, &call.bound.label, elapsed.as_millis());
        let max = self.limits().string_bytes;
        let answer = answer.and_then(|answer| match answer.content.len() > max {
            true => Err(AgentFailure::failed(format!(
                "the answer is {}, over the string limit ({}; limits.string)",
                Size(answer.content.len()),
                Size(max)
            ))),
            false => Ok(answer),
        });
        Settled::Response(match answer {
            Ok(answer) => {
                self.host.info.write(
                    LogLevel::Info,
                    TAG_AGENT,
                    &format!(
                        "role `{role}`: agent `{label}` answered in {ms} ms ({} bytes)",
                        answer.content.len()
                    ),
                );
                CallResponse::Ok { value: answer.content, meta: answer.meta, usage: answer.usage }
            }
            Err(AgentFailure::Waiting) => return Settled::Wait(None),
            Err(AgentFailure::Decide(wait)) => {
                self.host.info.write(
                    LogLevel::Info,
                    TAG_AGENT,
                    &format!(
                        "role `{role}`: agent `{label}` waits for a decision about tool call `{}`",
                        crate::terminal::line(&wait.tool)
                    ),
                );
                return Settled::Wait(Some(*wait));
            }
            Err(AgentFailure::OverBudget(reason)) => {
                return Settled::Rest(PauseReason::Budget, format!("over budget: {reason}"));
            }
            Err(AgentFailure::SignIn(reason)) => return Settled::Rest(PauseReason::SignIn, reason),
            Err(AgentFailure::Paused) => return Settled::Paused,
            Err(failure) => {
                self.host.info.write(
                    LogLevel::Error,
                    TAG_AGENT,
                    &format!("role `{role}`: agent `{label}` failed after {ms} ms: {failure}"),
                );
                let kind = match failure {
                    AgentFailure::Unavailable(_) => CallErrorKind::Unavailable,
                    AgentFailure::Timeout(_) => CallErrorKind::Timeout,
                    _ => CallErrorKind::Failed,
                };
                CallResponse::Error { kind, message: failure.to_string() }
            }
        })
    }

    /// Who answers `role`, as its steps record it: the workflow a step runs as its child
    /// (`workflow:NAME`), or the agent bound to it.
    pub(super) fn answered_by(&self, role: &str, bound: &Bound) -> String {
        match self.host.thread.step_settings.children.get(role) {
            Some(child) => format!("workflow:{}", child.workflow),
            None => bound.label.clone(),
        }
    }

    /// The context an agent is given for `call`: the thread as the host recorded it. The
    /// thread id is the host's own: nothing a bundle sends reaches an agent program's
    /// arguments.
    fn agent_context(&self, thread_id: ThreadId, call: &Call) -> AgentContext {
        let view = &self.host.thread;
        let system_prompt = call
            .system_prompt
            .clone()
            .or_else(|| view.system_prompts.get(&call.role).cloned())
            .unwrap_or_default();
        AgentContext {
            thread_id: thread_id.to_string(),
            prompt: view.prompt.clone(),
            steps: view.steps.clone(),
            role: RoleRef { name: call.role.clone(), system_prompt },
            input: call.input.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step timeout holds the call it times once: a waiting thread keeps the call's future
    /// on its fiber stack.
    #[test]
    fn a_timed_call_is_held_once() {
        let call = async {
            let room = [0u8; 4096];
            std::future::pending::<()>().await;
            std::hint::black_box(room);
            Err(AgentFailure::Waiting)
        };
        let alone = std::mem::size_of_val(&call);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _in_runtime = runtime.enter();
        let timed = std::mem::size_of_val(&within(Some(Duration::from_secs(1)), call));
        assert!(timed < alone + 1024, "{alone} bytes alone, {timed} with a timeout");
    }
}
