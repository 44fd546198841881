//! The project's clock: every timestamp the host records (steps, ends, pauses, log lines,
//! journal entries) is milliseconds since the Unix epoch from here, never from a bundle.

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
