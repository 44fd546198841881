//! The project's clock: every timestamp the host records (steps, ends, pauses, log lines,
//! journal entries) is milliseconds since the Unix epoch from here, never from a bundle; and
//! every decision made on the time of day — which cron instants are due, whether a poll is
//! due, how long `serve` waits for the next firing — reads it here too.
//!
//! It is the system clock, unless `UNCAGED_WORKFLOW_CLOCK` names a file holding the time (in
//! ms since the epoch): then every process of the run (a command, the workers it starts,
//! `serve`) reads the time from that file, and a test moves time by writing it instead of
//! sleeping. Durations measured on the machine (agent timeouts, CPU limits) stay on the
//! monotonic clock, and leases on the database's own clock, one for every machine.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable naming a file to read the time from (for tests).
pub const CLOCK_ENV: &str = "UNCAGED_WORKFLOW_CLOCK";

/// How often a wait on a file clock looks whether the time was moved.
const FILE_CLOCK_POLL: Duration = Duration::from_millis(10);

/// Where this process reads the time.
#[derive(Debug)]
enum Source {
    System,
    File(PathBuf),
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| match std::env::var_os(CLOCK_ENV) {
        Some(path) if !path.is_empty() => Source::File(path.into()),
        _ => Source::System,
    })
}

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_ms() -> u64 {
    match source() {
        Source::System => system_ms(),
        Source::File(path) => file_ms(path),
    }
}

fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The time a clock file holds. A file being rewritten may read empty for an instant: the
/// read is tried again, and a file that never holds a time is a broken test setup.
fn file_ms(path: &std::path::Path) -> u64 {
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(ms) = text.trim().parse()
        {
            return ms;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("{CLOCK_ENV}={} holds no time in ms", path.display())
}

/// Waits until the clock reads `at_ms` or later, or for `at_most` of the machine's time,
/// whichever comes first.
pub async fn sleep_until(at_ms: u64, at_most: Duration) {
    match source() {
        Source::System => {
            let wait = Duration::from_millis(at_ms.saturating_sub(system_ms())).min(at_most);
            tokio::time::sleep(wait).await;
        }
        // The time moves when the test writes it: look often, within the same bound.
        Source::File(path) => {
            let started = tokio::time::Instant::now();
            while file_ms(path) < at_ms && started.elapsed() < at_most {
                tokio::time::sleep(FILE_CLOCK_POLL).await;
            }
        }
    }
}

/// `ms` since the epoch as an RFC 3339 instant in UTC, to the millisecond.
pub fn rfc3339(ms: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
