//! The host side of the WIT imports (`uncaged:workflow/host`): what a bundle can ask of the
//! host, and nothing more.

use std::time::Instant;

use super::bindings::uncaged::workflow::{host, types};
use super::bindings::{AgentError, AgentRequest, ExtractError, ExtractRequest};
use super::control::Activity;
use super::state::ThreadState;
use crate::agents::extract::ExtractFailure;
use crate::agents::{Agent, AgentAnswer, AgentContext, AgentFailure, RoleRef};
use crate::clock::now_ms;
use crate::faults::crash_point;
use crate::ids::{ThreadId, tag};
use crate::limits::Size;
use crate::store::info_log::LogLevel;
use crate::store::journal::{CallErrorKind, CallKind, CallResponse, Replay, digest};
use crate::store::records::{PendingCall, StepRecord};

/// Log tags of this module's call sites.
const TAG_AGENT: &str = "AGM7Q2XW";
const TAG_EXTRACT: &str = "EXT4R9KD";
const TAG_BAD_TAG: &str = "BDT6G0N3";

impl types::Host for ThreadState {}

impl host::Host for ThreadState {
    async fn agent(
        &mut self,
        request: AgentRequest,
    ) -> wasmtime::Result<Result<String, AgentError>> {
        let started = Instant::now();
        // Until this returns, the time is the host's, not the guest's.
        let _in_host = self.clock.host_call();
        self.check_string("the agent request's system prompt", &request.system_prompt)?;
        self.check_string("the agent request's prompt", &request.context.prompt)?;
        for step in &request.context.steps {
            self.check_string("a step in the agent request", &step.content)?;
            self.check_string("a step's meta in the agent request", &step.meta)?;
        }
        let role = request.role.clone();
        let (Some(agents), Some(thread_id)) = (&self.host.agents, self.host.thread_id) else {
            return Ok(Err(AgentError::Unavailable(
                "no agent may be asked outside a thread".into(),
            )));
        };
        // The host binds agents to the roles a bundle declares, and to nothing else.
        let Some(bound) = agents.for_role(&role).cloned() else {
            let shown: String = role.chars().take(64).collect();
            self.host.info.write(
                LogLevel::Warn,
                TAG_AGENT,
                &format!("refused an agent request for undeclared role `{shown}`"),
            );
            return Ok(Err(AgentError::Unavailable(format!(
                "the bundle declares no role `{shown}`: agents answer only declared roles"
            ))));
        };
        self.host
            .control
            .set_activity(Some(Activity { role: role.clone(), agent: bound.label.clone() }));
        let request_digest = agent_request_digest(thread_id, &request);
        let (seq, replay) = self.host.journal.next_call(CallKind::Agent, &role, &request_digest)?;
        let response = match replay {
            Replay::Recorded(response) => {
                self.host.info.write(
                    LogLevel::Info,
                    TAG_AGENT,
                    &format!("role `{role}`: answer replayed from the call journal"),
                );
                response
            }
            Replay::Fresh => {
                let context = agent_context(thread_id, request);
                self.host.info.write(
                    LogLevel::Info,
                    TAG_AGENT,
                    &format!("role `{role}`: asking agent `{}`", bound.label),
                );
                crash_point("agent-call");
                self.host.before_wait();
                let answer = match &*bound.agent {
                    Agent::Human => match self.host.control.human.ask(&context).await {
                        Some(text) => Ok(AgentAnswer { content: text, meta: None }),
                        None => Err(AgentFailure::Waiting),
                    },
                    _ => bound.answer(&context, &self.host.info).await,
                };
                let ms = started.elapsed().as_millis();
                let max = self.limits().string_bytes;
                let answer = answer.and_then(|answer| match answer.content.len() > max {
                    true => Err(AgentFailure::failed(format!(
                        "the answer is {}, over the string limit ({}; limits.string)",
                        Size(answer.content.len()),
                        Size(max)
                    ))),
                    false => Ok(answer),
                });
                let response = match answer {
                    Ok(answer) => {
                        self.host.info.write(
                            LogLevel::Info,
                            TAG_AGENT,
                            &format!(
                                "role `{role}`: agent `{}` answered in {ms} ms ({} bytes)",
                                bound.label,
                                answer.content.len()
                            ),
                        );
                        CallResponse::Ok { value: answer.content, meta: answer.meta }
                    }
                    Err(AgentFailure::Waiting) => {
                        // Nobody to ask: stop the thread here; `answer` journals this call's
                        // answer and the resumed thread replays it.
                        self.host.waiting = Some((
                            role.clone(),
                            PendingCall {
                                step: self.host.journal.step(),
                                seq,
                                digest: request_digest,
                            },
                        ));
                        return Err(wasmtime::Error::msg(format!(
                            "waiting for a human answer for role `{role}`"
                        )));
                    }
                    Err(failure) => {
                        self.host.info.write(
                            LogLevel::Error,
                            TAG_AGENT,
                            &format!(
                                "role `{role}`: agent `{}` failed after {ms} ms: {failure}",
                                bound.label
                            ),
                        );
                        let kind = match failure {
                            AgentFailure::Unavailable(_) => CallErrorKind::Unavailable,
                            AgentFailure::Timeout(_) => CallErrorKind::Timeout,
                            AgentFailure::Failed { .. }
                            | AgentFailure::RateLimited { .. }
                            | AgentFailure::Waiting => CallErrorKind::Failed,
                        };
                        CallResponse::Error { kind, message: failure.to_string() }
                    }
                };
                let durable = !matches!(&*bound.agent, Agent::Scripted(_));
                self.host
                    .journal
                    .record(seq, CallKind::Agent, &role, request_digest, response.clone(), durable)
                    .map_err(|e| self.host.store_failed(e))?;
                crash_point("agent-recorded");
                response
            }
        };
        Ok(match response {
            CallResponse::Ok { value, meta } => {
                self.host.agent_meta = meta.map(|meta| (value.clone(), meta));
                Ok(value)
            }
            CallResponse::Error { kind, message } => Err(match kind {
                CallErrorKind::Unavailable => AgentError::Unavailable(message),
                CallErrorKind::Timeout => AgentError::Timeout(message),
                _ => AgentError::Failed(message),
            }),
        })
    }

    async fn extract(
        &mut self,
        request: ExtractRequest,
    ) -> wasmtime::Result<Result<String, ExtractError>> {
        // Until this returns, the time is the host's, not the guest's.
        let _in_host = self.clock.host_call();
        self.check_string("the extract request's schema", &request.schema)?;
        self.check_string("the extract request's prompt", &request.prompt)?;
        self.check_string("the extract request's content", &request.content)?;
        let preferred = match self.host.agent_meta.take() {
            Some((content, meta)) if content == request.content => Some(meta),
            _ => None,
        };
        let key = digest(&(&request.schema, &request.prompt, &request.content, &preferred));
        let (seq, replay) = self.host.journal.next_call(CallKind::Extract, "", &key)?;
        let response = match replay {
            Replay::Recorded(response) => response,
            Replay::Fresh => {
                let local = self.host.extractor.extract(
                    &request.schema,
                    &request.content,
                    preferred.as_ref(),
                );
                let llm = self.host.agents.as_ref().and_then(|a| a.extractor().cloned());
                let asked_llm = local.is_err() && llm.is_some();
                let result = match (local, llm) {
                    (
                        Err(ExtractFailure::NoJson | ExtractFailure::SchemaMismatch(_)),
                        Some(llm),
                    ) => {
                        self.host.info.write(
                            LogLevel::Info,
                            TAG_EXTRACT,
                            "no valid meta in the answer; asking the LLM extractor",
                        );
                        self.host.before_wait();
                        llm.extract(
                            &self.host.extractor,
                            &request.schema,
                            &request.prompt,
                            &request.content,
                            &self.host.info,
                        )
                        .await
                    }
                    (result, _) => result,
                };
                let response = match result {
                    Ok(value) => CallResponse::Ok { value: value.to_string(), meta: None },
                    Err(failure) => {
                        self.host.info.write(LogLevel::Warn, TAG_EXTRACT, &failure.to_string());
                        let kind = match failure {
                            ExtractFailure::InvalidSchema(_) => CallErrorKind::InvalidSchema,
                            ExtractFailure::NoJson => CallErrorKind::NoJson,
                            ExtractFailure::SchemaMismatch(_) => CallErrorKind::SchemaMismatch,
                            ExtractFailure::Unavailable(_) => CallErrorKind::Unavailable,
                        };
                        CallResponse::Error { kind, message: failure.to_string() }
                    }
                };
                self.host
                    .journal
                    .record(seq, CallKind::Extract, "", key, response.clone(), asked_llm)
                    .map_err(|e| self.host.store_failed(e))?;
                response
            }
        };
        Ok(match response {
            CallResponse::Ok { value, .. } => Ok(value),
            CallResponse::Error { kind, message } => Err(match kind {
                CallErrorKind::InvalidSchema => ExtractError::InvalidSchema(message),
                CallErrorKind::NoJson => ExtractError::NoJson(message),
                CallErrorKind::Unavailable => ExtractError::Unavailable(message),
                _ => ExtractError::SchemaMismatch(message),
            }),
        })
    }

    async fn log(
        &mut self,
        level: types::LogLevel,
        tag: String,
        message: String,
    ) -> wasmtime::Result<()> {
        let level = match level {
            types::LogLevel::Trace => LogLevel::Trace,
            types::LogLevel::Debug => LogLevel::Debug,
            types::LogLevel::Info => LogLevel::Info,
            types::LogLevel::Warn => LogLevel::Warn,
            types::LogLevel::Error => LogLevel::Error,
        };
        self.check_string("a log message", &message)?;
        if tag::is_valid(&tag) {
            self.output.log(level, &tag, &message);
        } else {
            // Keep the line, but make clear the tag is not a code location.
            let tag = tag.chars().take(16).collect::<String>();
            self.output.log(
                level,
                TAG_BAD_TAG,
                &format!("[guest tag `{tag}` is not 8 Crockford characters] {message}"),
            );
        }
        Ok(())
    }

    async fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(now_ms())
    }
}

/// XXH64 of an agent request, hashed field by field: the same request gives the same digest
/// without serializing the whole thread context on every call. The thread id is the host's;
/// steps' timestamps are left out, since the host stamps stored steps with its own clock and a
/// resumed bundle gets those back, not the ones it had in memory.
fn agent_request_digest(thread_id: ThreadId, request: &AgentRequest) -> String {
    use std::hash::Hasher;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    let mut field = |bytes: &[u8]| {
        hasher.write_u64(bytes.len() as u64);
        hasher.write(bytes);
    };
    field(request.role.as_bytes());
    field(request.system_prompt.as_bytes());
    field(thread_id.to_string().as_bytes());
    field(request.context.prompt.as_bytes());
    for step in &request.context.steps {
        field(step.role.as_bytes());
        field(step.content.as_bytes());
        field(step.meta.as_bytes());
    }
    crate::ids::Digest::from_value(hasher.finish()).to_string()
}

/// The agent context as agents see it. The thread id is the host's own: what a bundle puts in
/// its request never reaches an agent program's arguments.
fn agent_context(thread_id: ThreadId, request: AgentRequest) -> AgentContext {
    AgentContext {
        thread_id: thread_id.to_string(),
        prompt: request.context.prompt,
        steps: request
            .context
            .steps
            .into_iter()
            .map(|s| StepRecord {
                meta: serde_json::from_str(&s.meta).unwrap_or(serde_json::Value::String(s.meta)),
                role: s.role,
                content: s.content,
                timestamp: s.timestamp,
            })
            .collect(),
        role: RoleRef { name: request.role, system_prompt: request.system_prompt },
    }
}
