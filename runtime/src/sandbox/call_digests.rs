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
