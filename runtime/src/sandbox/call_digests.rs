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

/// XXH64 of everything an agent is given for a call (its role and system prompt, the thread's
/// prompt, its steps' roles, contents and meta, the call's input): the same whenever the agent
/// would see the same request. The thread's id and steps' timestamps are left out, so a thread
/// of an eval asking what a recorded thread asked has the digest the recorded call has.
pub(crate) fn context_digest(context: &crate::agents::AgentContext) -> String {
    use std::hash::Hasher;
    let mut hasher = Hashing(twox_hash::XxHash64::with_seed(0));
    let field = |hasher: &mut Hashing, bytes: &[u8]| {
        hasher.0.write_u64(bytes.len() as u64);
        hasher.0.write(bytes);
    };
    field(&mut hasher, context.role.name.as_bytes());
    field(&mut hasher, context.role.system_prompt.as_bytes());
    field(&mut hasher, context.prompt.as_bytes());
    for step in context.steps.iter() {
        field(&mut hasher, step.role.as_bytes());
        field(&mut hasher, step.content.as_bytes());
        // Hashed as it serializes: a thread of 100 steps is not 100 strings made per call.
        serde_json::to_writer(&mut hasher, &step.meta).expect("hashing writes no error");
        hasher.0.write_u8(0);
    }
    match &context.input {
        Some(input) => field(&mut hasher, input.as_bytes()),
        None => hasher.0.write_u8(0xff),
    }
    crate::ids::Digest::from_value(hasher.0.finish()).to_string()
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
