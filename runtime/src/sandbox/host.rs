//! The host side of the WIT imports of every contract version: what a bundle can ask of the
//! host, and nothing more. Agent calls have one implementation (`agent_calls`): 0.2's and
//! 0.3's `agents` is a batch of calls run concurrently, 0.1's `agent` a batch of one.
//! Extract, log and sleep are here.

use super::agent_calls::Call;
use super::bindings::ExtractRequest;
use super::bindings::v0_1;
use super::call_digests::{agent_request_digest, call_digest};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::state::{AnsweredCall, ThreadState};
use crate::agents::extract::ExtractFailure;
use crate::clock::now_ms;
use crate::ids::tag;
use crate::store::debug_log::LogLevel;
use crate::store::journal::{CallErrorKind, CallKind, CallResponse, Replay, digest};
use crate::telemetry;

/// Log tags of this module's call sites.
const TAG_EXTRACT: &str = "EXT4R9KD";
const TAG_BAD_TAG: &str = "BDT6G0N3";

/// A response as the `result<string, agent-error>` of either contract version: their types
/// are distinct and alike.
macro_rules! agent_result {
    ($response:expr, $error:ident) => {
        match $response {
            CallResponse::Ok { value, .. } => Ok(value),
            CallResponse::Error { kind, message } => Err(match kind {
                CallErrorKind::Unavailable => $error::Unavailable(message),
                CallErrorKind::Timeout => $error::Timeout(message),
                _ => $error::Failed(message),
            }),
        }
    };
}

/// A response as the `result<string, extract-error>` of either contract version.
macro_rules! extract_result {
    ($response:expr, $error:ident) => {
        match $response {
            CallResponse::Ok { value, .. } => Ok(value),
            CallResponse::Error { kind, message } => Err(match kind {
                CallErrorKind::InvalidSchema => $error::InvalidSchema(message),
                CallErrorKind::NoJson => $error::NoJson(message),
                CallErrorKind::Unavailable => $error::Unavailable(message),
                _ => $error::SchemaMismatch(message),
            }),
        }
    };
}

/// A guest's `log-level` of either contract version as the debug log's.
macro_rules! log_level {
    ($level:expr, $wit:ident) => {
        match $level {
            $wit::Trace => LogLevel::Trace,
            $wit::Debug => LogLevel::Debug,
            $wit::Info => LogLevel::Info,
            $wit::Warn => LogLevel::Warn,
            $wit::Error => LogLevel::Error,
        }
    };
}

/// The imports of 0.2.0 and of 0.3.0, which has the same `host` interface: one
/// implementation, for each version's generated types.
macro_rules! batch_host {
    ($($wit:ident)::+) => {
        impl $($wit)::+::types::Host for ThreadState {}

        impl $($wit)::+::host::Host for ThreadState {
            async fn agents(
                &mut self,
                calls: Vec<$($wit)::+::types::AgentCall>,
            ) -> wasmtime::Result<Vec<Result<String, $($wit)::+::types::AgentError>>> {
                use $($wit)::+::types::AgentError;
                let calls = calls
                    .into_iter()
                    .map(|c| Call {
                        digest: call_digest(&c.role, c.input.as_deref()),
                        role: c.role,
                        input: c.input,
                        system_prompt: None,
                    })
                    .collect();
                let responses = self.ask_agents(calls).await?;
                Ok(responses
                    .into_iter()
                    .map(|response| agent_result!(response, AgentError))
                    .collect())
            }

            async fn extract(
                &mut self,
                request: $($wit)::+::types::ExtractRequest,
            ) -> wasmtime::Result<Result<String, $($wit)::+::types::ExtractError>> {
                use $($wit)::+::types::ExtractError;
                let request = ExtractRequest {
                    schema: request.schema,
                    prompt: request.prompt,
                    content: request.content,
                };
                Ok(extract_result!(self.extract_json(request).await?, ExtractError))
            }

            async fn log(
                &mut self,
                level: $($wit)::+::types::LogLevel,
                tag: String,
                message: String,
            ) -> wasmtime::Result<()> {
                use $($wit)::+::types::LogLevel as Wit;
                self.guest_log(log_level!(level, Wit), tag, message)
            }

            async fn now(&mut self) -> wasmtime::Result<u64> {
                Ok(now_ms())
            }

            async fn sleep(&mut self, ms: u32) -> wasmtime::Result<()> {
                self.sleep_ms(ms).await
            }
        }
    };
}

batch_host!(super::bindings::uncaged::workflow);
batch_host!(super::bindings::v0_2::uncaged::workflow);

impl v0_1::uncaged::workflow::types::Host for ThreadState {}

/// The 0.1.0 imports, on the same implementation: one agent call is a batch of one, whose
/// context the host builds from its own records like any other (the thread the request
/// carries is the bundle's copy of them). The journal keeps knowing the request by the
/// digest 0.1.0 hosts gave it, so a thread interrupted under an older host resumes.
impl v0_1::uncaged::workflow::host::Host for ThreadState {
    async fn agent(
        &mut self,
        request: v0_1::AgentRequest,
    ) -> wasmtime::Result<Result<String, v0_1::uncaged::workflow::types::AgentError>> {
        use v0_1::uncaged::workflow::types::AgentError;
        self.check_string("the agent request's system prompt", &request.system_prompt)?;
        self.check_string("the agent request's prompt", &request.context.prompt)?;
        for step in &request.context.steps {
            self.check_string("a step in the agent request", &step.content)?;
            self.check_string("a step's meta in the agent request", &step.meta)?;
        }
        let digest = match self.host.thread_id {
            Some(thread_id) => agent_request_digest(thread_id, &request),
            None => String::new(),
        };
        let call = Call {
            role: request.role,
            input: None,
            system_prompt: Some(request.system_prompt),
            digest,
        };
        let response = self.ask_agents(vec![call]).await?.pop().expect("one call, one response");
        Ok(agent_result!(response, AgentError))
    }

    async fn extract(
        &mut self,
        request: v0_1::uncaged::workflow::types::ExtractRequest,
    ) -> wasmtime::Result<Result<String, v0_1::uncaged::workflow::types::ExtractError>> {
        use v0_1::uncaged::workflow::types::ExtractError;
        let request = ExtractRequest {
            schema: request.schema,
            prompt: request.prompt,
            content: request.content,
        };
        Ok(extract_result!(self.extract_json(request).await?, ExtractError))
    }

    async fn log(
        &mut self,
        level: v0_1::uncaged::workflow::types::LogLevel,
        tag: String,
        message: String,
    ) -> wasmtime::Result<()> {
        use v0_1::uncaged::workflow::types::LogLevel as Wit;
        self.guest_log(log_level!(level, Wit), tag, message)
    }

    async fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(now_ms())
    }
}

/// The longest wait one `sleep` call may ask for.
const MAX_SLEEP_MS: u32 = 60 * 60 * 1000;

impl ThreadState {
    /// Waits on the host's time, once: a step replayed from the journal does not wait again.
    async fn sleep_ms(&mut self, ms: u32) -> wasmtime::Result<()> {
        let _in_host = self.clock.host_call();
        if ms > MAX_SLEEP_MS {
            return Err(self.exceed(format!(
                "limit exceeded: the bundle asked to sleep {ms} ms, over the limit of \
                 {MAX_SLEEP_MS} ms per call"
            )));
        }
        if self.host.thread_id.is_none() {
            return Ok(());
        }
        let key = ms.to_string();
        let (seq, replay) = self.host.journal.next_call(CallKind::Sleep, "", &key)?;
        if let Replay::Fresh = replay {
            self.host.before_wait();
            tokio::time::sleep(std::time::Duration::from_millis(ms.into())).await;
            let done = CallResponse::Ok { value: String::new(), meta: None, usage: None };
            self.host
                .journal
                .record(seq, CallKind::Sleep, "", key, done, true)
                .map_err(|e| self.host.store_failed(e))?;
        }
        Ok(())
    }

    /// Extracts JSON valid against a schema (see [`crate::agents::extract`]), journaled.
    async fn extract_json(&mut self, request: ExtractRequest) -> wasmtime::Result<CallResponse> {
        // Until this returns, the time is the host's, not the guest's.
        let _in_host = self.clock.host_call();
        self.check_string("the extract request's schema", &request.schema)?;
        self.check_string("the extract request's prompt", &request.prompt)?;
        self.check_string("the extract request's content", &request.content)?;
        let preferred = self
            .host
            .agent_meta
            .iter()
            .position(|(content, _)| *content == request.content)
            .map(|i| self.host.agent_meta.swap_remove(i).1);
        let key = digest(&(&request.schema, &request.prompt, &request.content, &preferred));
        let (seq, replay) = self.host.journal.next_call(CallKind::Extract, "", &key)?;
        let response = match replay {
            Replay::Recorded(response) => {
                self.extractor_spent(&response, Duration::ZERO);
                response
            }
            Replay::Fresh => {
                let started = Instant::now();
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
                        let span = llm.span();
                        let (result, usage) = llm
                            .extract(
                                &self.host.extractor,
                                &request.schema,
                                &request.prompt,
                                &request.content,
                                &self.host.info,
                            )
                            .instrument(span.clone())
                            .await;
                        if let Some(usage) = &usage {
                            usage.trace(&span);
                        }
                        if let Err(failure) = &result {
                            telemetry::record_failure(&span, "failed", &failure.to_string());
                        }
                        result.map(|value| (value, usage))
                    }
                    (result, _) => result.map(|value| (value, None)),
                };
                let response = match result {
                    Ok((value, usage)) => {
                        CallResponse::Ok { value: value.to_string(), meta: None, usage }
                    }
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
                self.extractor_spent(&response, started.elapsed());
                response
            }
        };
        Ok(response)
    }

    /// Counts what the LLM extractor spent in the step (on its first step, as calls that
    /// answered for no step of their own are): the thread's usage and cost include it.
    fn extractor_spent(&mut self, response: &CallResponse, elapsed: Duration) {
        if let CallResponse::Ok { usage: Some(usage), .. } = response {
            self.host.answered.push(AnsweredCall {
                role: String::new(),
                agent: "extractor".into(),
                elapsed,
                usage: Some(usage.clone()),
            });
        }
    }

    /// Writes a guest's log line to the thread's debug log.
    fn guest_log(&mut self, level: LogLevel, tag: String, message: String) -> wasmtime::Result<()> {
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
}
