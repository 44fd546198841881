//! The failure policy of agent calls: transient failures are retried with exponential
//! backoff, and every failed attempt is written to the thread's debug log.

use std::time::{Duration, Instant};

use super::AgentFailure;
use crate::store::debug_log::{DebugLog, LogLevel};

/// Log tag of agent call attempts.
const TAG_ATTEMPT: &str = "AGT9RY5E";

/// Retries of transient failures, with exponential backoff (factor 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub initial_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_retries: 2, initial_delay: Duration::from_secs(1) }
    }
}

/// Runs `call` until it succeeds, fails permanently, or has failed transiently
/// `policy.max_retries + 1` times, waiting `initial_delay`, then twice as long, between
/// attempts. Every failed attempt is written to the thread's debug log.
pub async fn with_retries<T, F, Fut>(
    policy: RetryPolicy,
    info: &DebugLog,
    what: &str,
    mut call: F,
) -> Result<T, AgentFailure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, AgentFailure>>,
{
    let mut delay = policy.initial_delay;
    let attempts = policy.max_retries + 1;
    let mut attempt = 1;
    loop {
        let started = Instant::now();
        let failure = match call().await {
            Ok(value) => return Ok(value),
            Err(stop) if stop.is_stop() => return Err(stop),
            Err(failure) => failure,
        };
        let ms = started.elapsed().as_millis();
        let retry = failure.is_transient() && attempt < attempts;
        // A service that says when to come back is believed (bounded by the agent itself).
        let wait = match &failure {
            AgentFailure::RateLimited { retry_after, .. } => *retry_after,
            _ => delay,
        };
        info.write(
            LogLevel::Warn,
            TAG_ATTEMPT,
            &format!(
                "{what} attempt {attempt}/{attempts} failed after {ms} ms ({}): {failure}{}",
                if failure.is_transient() { "transient" } else { "permanent" },
                if retry {
                    format!("; retrying in {}", humantime::format_duration(wait))
                } else {
                    String::new()
                }
            ),
        );
        if !retry {
            return Err(match failure {
                AgentFailure::Failed { message, transient } if attempt > 1 => {
                    AgentFailure::Failed {
                        message: format!("{message} (after {attempt} attempts)"),
                        transient,
                    }
                }
                AgentFailure::Timeout(message) if attempt > 1 => {
                    AgentFailure::Timeout(format!("{message} (after {attempt} attempts)"))
                }
                other => other,
            });
        }
        tokio::time::sleep(wait).await;
        delay *= 2;
        attempt += 1;
    }
}
