//! The host side of the WIT imports (`uncaged:workflow/host`): what a bundle can ask of the
//! host, and nothing more.

use std::time::Instant;

use crate::agent::{AgentContext, AgentFailure, RoleRef};
use crate::bindings::uncaged::workflow::{host, types};
use crate::bindings::{AgentError, AgentRequest, ExtractError, ExtractRequest, LogLevel};
use crate::extract::ExtractFailure;
use crate::ids::tag;
use crate::sandbox::ThreadState;
use crate::thread_log::{StepRecord, now_ms};

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
        let Some(agents) = &self.host.agents else {
            return Ok(Err(AgentError::Unavailable(
                "no agent may be asked outside a thread".into(),
            )));
        };
        let bound = agents.for_role(&request.role).clone();
        let context = AgentContext {
            thread_id: request.context.thread_id,
            prompt: request.context.prompt,
            steps: request
                .context
                .steps
                .into_iter()
                .map(|s| StepRecord {
                    meta: serde_json::from_str(&s.meta)
                        .unwrap_or(serde_json::Value::String(s.meta)),
                    role: s.role,
                    content: s.content,
                    timestamp: s.timestamp,
                })
                .collect(),
            role: RoleRef { name: request.role, system_prompt: request.system_prompt },
        };
        let role = &context.role.name;
        self.host.info.write(
            "info",
            TAG_AGENT,
            &format!("role `{role}`: asking agent `{}`", bound.label),
        );
        let answer = bound.agent.answer(&context).await;
        let spent = started.elapsed();
        self.clock.add_host_time(spent);
        let ms = spent.as_millis();
        Ok(match answer {
            Ok(answer) => {
                self.host.info.write(
                    "info",
                    TAG_AGENT,
                    &format!(
                        "role `{role}`: agent `{}` answered in {ms} ms ({} bytes)",
                        bound.label,
                        answer.content.len()
                    ),
                );
                self.host.agent_meta = answer.meta.map(|meta| (answer.content.clone(), meta));
                Ok(answer.content)
            }
            Err(failure) => {
                self.host.info.write(
                    "error",
                    TAG_AGENT,
                    &format!(
                        "role `{role}`: agent `{}` failed after {ms} ms: {failure}",
                        bound.label
                    ),
                );
                Err(match failure {
                    AgentFailure::Unavailable(m) => AgentError::Unavailable(m),
                    AgentFailure::Failed(m) => AgentError::Failed(m),
                    AgentFailure::Timeout(m) => AgentError::Timeout(m),
                })
            }
        })
    }

    async fn extract(
        &mut self,
        request: ExtractRequest,
    ) -> wasmtime::Result<Result<String, ExtractError>> {
        let started = Instant::now();
        let preferred = match self.host.agent_meta.take() {
            Some((content, meta)) if content == request.content => Some(meta),
            _ => None,
        };
        let result =
            self.host.extractor.extract(&request.schema, &request.content, preferred.as_ref());
        self.clock.add_host_time(started.elapsed());
        Ok(match result {
            Ok(value) => Ok(value.to_string()),
            Err(failure) => {
                self.host.info.write("warn", TAG_EXTRACT, &failure.to_string());
                Err(match failure {
                    ExtractFailure::InvalidSchema(m) => ExtractError::InvalidSchema(m),
                    ExtractFailure::NoJson => ExtractError::NoJson(failure.to_string()),
                    ExtractFailure::SchemaMismatch(_) => {
                        ExtractError::SchemaMismatch(failure.to_string())
                    }
                })
            }
        })
    }

    async fn log(&mut self, level: LogLevel, tag: String, message: String) -> wasmtime::Result<()> {
        let level = match level {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        if tag::is_valid(&tag) {
            self.host.info.write(level, &tag, &message);
        } else {
            // Keep the line, but make clear the tag is not a code location.
            self.host.info.write(
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
