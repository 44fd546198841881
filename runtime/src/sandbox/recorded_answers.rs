//! A thread of an eval taking a recorded answer: the sandbox's side of
//! [`Baseline`](super::baseline::Baseline) — the call answered from the recorded thread's
//! journal is journaled as this thread's own (unsynced: a crash has the recorded thread answer
//! it again), with where it came from, and counted as the step's.

use std::time::Duration;

use super::agent_calls::{Call, TAG_AGENT};
use super::state::{AnsweredCall, ThreadState};
use crate::agents::{AgentContext, Bound};
use crate::store::debug_log::LogLevel;
use crate::store::journal::{CallKind, CallOrigin, CallResponse};

impl ThreadState {
    /// For a thread of an eval: the recorded thread's answer to `call` (call `seq` of this
    /// step, asked with `context`), journaled as this thread's, when the recorded thread asked
    /// the same and its role is not asked live.
    pub(super) fn answer_from_baseline(
        &mut self,
        seq: usize,
        call: &Call,
        context: &AgentContext,
        bound: &Bound,
    ) -> wasmtime::Result<Option<CallResponse>> {
        let Some(baseline) = self.host.thread.baseline.clone() else { return Ok(None) };
        let request = self.host.context_digests.digest(context);
        let step = self.host.journal.step();
        let Some(response) = baseline.answer(step, &call.digest, &request, context) else {
            return Ok(None);
        };
        self.host.info.write(
            LogLevel::Info,
            TAG_AGENT,
            &format!("role `{}`: answer taken from recorded thread {}", call.role, baseline.thread),
        );
        let usage = match &response {
            CallResponse::Ok { usage, .. } => usage.clone(),
            CallResponse::Error { .. } => None,
        };
        let agent = format!("journal:{}", self.answered_by(&call.role, bound));
        self.host.answered.push(AnsweredCall {
            role: call.role.clone(),
            agent,
            elapsed: Duration::ZERO,
            usage,
        });
        // Not synced: after a crash the recorded thread answers it again, the same way.
        let origin = CallOrigin {
            request: Some(request),
            recorded_in: Some(baseline.thread),
            ..CallOrigin::default()
        };
        let recorded = self.host.journal.record_from(
            seq,
            CallKind::Agent,
            &call.role,
            call.digest.clone(),
            response.clone(),
            false,
            origin,
        );
        recorded.map_err(|e| self.host.store_failed(e))?;
        Ok(Some(response))
    }
}
