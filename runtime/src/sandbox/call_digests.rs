//! The digests the call journal knows a bundle's agent requests by: the same request gives
//! the same digest whenever it is made again at the same step (a resumed or rebuilt thread).

use super::bindings::v0_1;
use crate::ids::ThreadId;

/// The journal key of a 0.2 agent call: the role and the input. The thread it is asked in is
/// the host's own record, the same whenever the call is made again at the same step.
pub(super) fn call_digest(role: &str, input: Option<&str>) -> String {
    use std::hash::Hasher;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write_u64(role.len() as u64);
    hasher.write(role.as_bytes());
    match input {
        Some(input) => {
            hasher.write_u8(1);
            hasher.write(input.as_bytes());
        }
        None => hasher.write_u8(0),
    }
    crate::ids::Digest::from_value(hasher.finish()).to_string()
}

/// XXH64 of an agent request, hashed field by field: the same request gives the same digest
/// without serializing the whole thread context on every call. The thread id is the host's;
/// steps' timestamps are left out, since the host stamps stored steps with its own clock and a
/// resumed bundle gets those back, not the ones it had in memory.
pub(super) fn agent_request_digest(thread_id: ThreadId, request: &v0_1::AgentRequest) -> String {
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

/// The XXH64 of everything an agent is given for a call — the thread's prompt, its steps'
/// roles, contents and meta, the call's role, system prompt and input — the same whenever the
/// agent would see the same request. The thread's id and steps' timestamps are left out, so a
/// thread of an eval asking what a recorded thread asked has the digest the recorded call has.
///
/// Made incrementally: a thread's steps only grow, so the hash of the prompt and the steps
/// hashed so far is carried from call to call and only new steps are hashed. A digest made
/// afresh each call hashed the whole thread every call (quadratic in its length).
#[derive(Debug, Default)]
pub(crate) struct ContextDigests {
    /// The steps hashed so far, and the hash of the prompt and those steps.
    prefix: Option<(usize, twox_hash::XxHash64)>,
}

impl ContextDigests {
    /// The digest of `context`.
    pub(crate) fn digest(&mut self, context: &crate::agents::AgentContext) -> String {
        use std::hash::Hasher;
        let steps = &context.steps;
        let (hashed, state) = match self.prefix.take() {
            Some((hashed, state)) if hashed <= steps.len() => (hashed, state),
            _ => {
                let mut state = twox_hash::XxHash64::with_seed(0);
                field(&mut state, context.prompt.as_bytes());
                (0, state)
            }
        };
        let mut hasher = Hashing(state);
        for step in &steps[hashed..] {
            field(&mut hasher.0, step.role.as_bytes());
            field(&mut hasher.0, step.content.as_bytes());
            // Hashed as it serializes, no string made.
            serde_json::to_writer(&mut hasher, &step.meta).expect("hashing writes no error");
            hasher.0.write_u8(0);
        }
        self.prefix = Some((steps.len(), hasher.0.clone()));
        let mut call = hasher.0;
        field(&mut call, context.role.name.as_bytes());
        field(&mut call, context.role.system_prompt.as_bytes());
        match &context.input {
            Some(input) => field(&mut call, input.as_bytes()),
            None => call.write_u8(0xff),
        }
        crate::ids::Digest::from_value(call.finish()).to_string()
    }
}

/// `bytes` hashed as one field: its length, then itself.
fn field(hasher: &mut twox_hash::XxHash64, bytes: &[u8]) {
    use std::hash::Hasher;
    hasher.write_u64(bytes.len() as u64);
    hasher.write(bytes);
}

/// A hasher written to as a byte sink.
struct Hashing(twox_hash::XxHash64);

impl std::io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        std::hash::Hasher::write(&mut self.0, bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::ContextDigests;
    use crate::agents::{AgentContext, RoleRef};
    use crate::store::records::StepRecord;

    fn context(steps: usize, system: &str) -> AgentContext {
        let step = |i: usize| StepRecord {
            role: "r".into(),
            content: format!("step {i}"),
            meta: serde_json::json!({"i": i}),
            timestamp: i as u64,
            group: None,
            agent: None,
            duration_ms: None,
            usage: None,
        };
        AgentContext {
            thread_id: "T".into(),
            prompt: "task".into(),
            steps: Arc::new((0..steps).map(step).collect()),
            role: RoleRef { name: "r".into(), system_prompt: system.into() },
            input: None,
        }
    }

    #[test]
    fn a_digest_made_step_by_step_is_the_one_made_at_once() {
        let mut carried = ContextDigests::default();
        for n in 0..5 {
            carried.digest(&context(n, "s"));
        }
        let at_once = ContextDigests::default().digest(&context(5, "s"));
        assert_eq!(carried.digest(&context(5, "s")), at_once);
        assert_ne!(ContextDigests::default().digest(&context(5, "t")), at_once);
        assert_ne!(ContextDigests::default().digest(&context(4, "s")), at_once);
    }
}
