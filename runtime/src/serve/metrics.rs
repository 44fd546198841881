//! `GET /metrics`: what `serve` sees, in the Prometheus text format — threads by status (the
//! queue depth among them), steps stored, how long agent calls took, each provider limit's use
//! and the time calls waited for it, and webhook deliveries by outcome. Read from the store at
//! each scrape (a listing, as `threads` reads it; each limit's shared state), so every `serve`
//! on one database reports the same threads and limits; delivery counts are this process's own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::Result;
use crate::ids::ThreadId;
use crate::store::Storage;
use crate::store::capacity::LimitUse;
use crate::store::records::{ThreadStatus, ThreadSummary};

/// Webhook deliveries this process answered, by outcome.
#[derive(Debug, Default)]
pub struct Deliveries {
    pub started: AtomicU64,
    pub replayed: AtomicU64,
    pub refused: AtomicU64,
}

impl Deliveries {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The upper bounds (seconds) of the agent-call latency histogram's buckets: from a scripted
/// answer to a long model call or a command agent's build.
const LATENCY_BUCKETS: [f64; 11] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// How long agent calls took, over the steps stored (each step records its call's duration).
/// Kept per thread with the number of steps it was counted at, so that a scrape reads again
/// only the threads that took steps since the one before.
#[derive(Debug, Default)]
pub struct Latencies {
    by_thread: Mutex<HashMap<ThreadId, Counted>>,
}

/// One thread's agent calls, counted at `steps`.
#[derive(Debug, Default, Clone)]
struct Counted {
    steps: usize,
    /// Calls per bucket (not cumulative), the last one past every bound.
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
    seconds: f64,
}

impl Latencies {
    /// The histogram over `summaries`' threads: those counted before at the same number of
    /// steps are not read again; those no longer listed are forgotten.
    fn histogram(&self, store: &Storage, summaries: &[ThreadSummary]) -> Counted {
        let mut by_thread = self.by_thread.lock();
        by_thread.retain(|id, _| summaries.iter().any(|t| t.thread_id == *id));
        let mut total = Counted::default();
        for summary in summaries {
            let stale = by_thread.get(&summary.thread_id).is_none_or(|c| c.steps != summary.steps);
            if stale {
                // A thread that cannot be read now (removed meanwhile) is counted next time.
                let Ok(record) = store.threads().read(summary.thread_id) else { continue };
                let mut counted = Counted { steps: summary.steps, ..Counted::default() };
                for step in record.steps.iter().filter(|s| s.agent.is_some()) {
                    let Some(ms) = step.duration_ms else { continue };
                    let seconds = ms as f64 / 1000.0;
                    let bucket = LATENCY_BUCKETS.iter().position(|&le| seconds <= le);
                    counted.buckets[bucket.unwrap_or(LATENCY_BUCKETS.len())] += 1;
                    counted.seconds += seconds;
                }
                by_thread.insert(summary.thread_id, counted);
            }
            let counted = &by_thread[&summary.thread_id];
            for (sum, n) in total.buckets.iter_mut().zip(counted.buckets) {
                *sum += n;
            }
            total.seconds += counted.seconds;
        }
        total
    }
}

/// A series of a provider limit: its name, its kind, its help, its value in a limit's use.
type Series = (&'static str, &'static str, &'static str, fn(&LimitUse) -> f64);

/// Each provider limit of config.yaml: its last minute's use and who waits for it, from the
/// state every worker shares (names are checked when config.yaml is read: safe as labels).
fn limits(text: &mut String, store: &Storage) -> Result<()> {
    let config = store.config()?;
    if config.provider_limits.is_empty() {
        return Ok(());
    }
    let mut uses = Vec::new();
    for name in config.provider_limits.keys() {
        uses.push((name, store.limiter().usage(name)?));
    }
    let series: [Series; 7] = [
        (
            "limit_requests",
            "gauge",
            "Requests a provider limit let through in the last minute.",
            |u| u.requests as f64,
        ),
        (
            "limit_tokens",
            "gauge",
            "Tokens counted against a provider limit in the last minute (estimates of calls not yet answered among them).",
            |u| u.tokens as f64,
        ),
        (
            "limit_in_flight",
            "gauge",
            "Requests of a provider limit sent and not yet answered.",
            |u| u.in_flight as f64,
        ),
        ("limit_waiting", "gauge", "Requests waiting for their turn in a provider limit.", |u| {
            u.waiting as f64
        }),
        (
            "limit_closed",
            "gauge",
            "1 while a provider's 429 or Retry-After holds every call of the limit.",
            |u| f64::from(u8::from(u.closed_until.is_some())),
        ),
        (
            "limit_requests_served_total",
            "counter",
            "Requests a provider limit let through, since it was first used.",
            |u| u.served as f64,
        ),
        (
            "limit_wait_seconds_total",
            "counter",
            "Time requests waited for their turn in a provider limit, added up.",
            |u| u.waited_ms as f64 / 1000.0,
        ),
    ];
    for (name, kind, help, value) in series {
        let name = format!("uncaged_workflow_{name}");
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (limit, used) in &uses {
            let _ = writeln!(text, "{name}{{limit=\"{limit}\"}} {}", value(used));
        }
    }
    Ok(())
}

/// The exposition text.
pub fn render(store: &Storage, deliveries: &Deliveries, latencies: &Latencies) -> Result<String> {
    let summaries = store.threads().summaries()?;
    let mut text = String::new();
    let gauge = |text: &mut String, name: &str, help: &str| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
    };
    gauge(&mut text, "uncaged_workflow_threads", "Threads in the store, by status.");
    for status in ThreadStatus::ALL {
        let n = summaries.iter().filter(|t| t.status == status).count();
        let _ = writeln!(text, "uncaged_workflow_threads{{status=\"{}\"}} {n}", status.as_str());
    }
    gauge(&mut text, "uncaged_workflow_queue_depth", "Threads waiting in the queue for a worker.");
    let queued = summaries.iter().filter(|t| t.status == ThreadStatus::Queued).count();
    let _ = writeln!(text, "uncaged_workflow_queue_depth {queued}");
    gauge(&mut text, "uncaged_workflow_steps", "Steps stored, over every thread in the store.");
    let steps: usize = summaries.iter().map(|t| t.steps).sum();
    let _ = writeln!(text, "uncaged_workflow_steps {steps}");
    let histogram = latencies.histogram(store, &summaries);
    let name = "uncaged_workflow_agent_call_duration_seconds";
    let _ = writeln!(
        text,
        "# HELP {name} How long agent calls took (a step of one call: the whole step), over the \
         steps stored.\n# TYPE {name} histogram"
    );
    let mut below = 0;
    for (le, n) in LATENCY_BUCKETS.iter().zip(histogram.buckets) {
        below += n;
        let _ = writeln!(text, "{name}_bucket{{le=\"{le}\"}} {below}");
    }
    let count: u64 = histogram.buckets.iter().sum();
    let _ = writeln!(text, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(text, "{name}_sum {}\n{name}_count {count}", histogram.seconds);
    limits(&mut text, store)?;
    let _ = writeln!(
        text,
        "# HELP uncaged_workflow_webhook_deliveries_total Webhook deliveries this server \
         answered, by outcome.\n# TYPE uncaged_workflow_webhook_deliveries_total counter"
    );
    for (outcome, counter) in [
        ("started", &deliveries.started),
        ("replayed", &deliveries.replayed),
        ("refused", &deliveries.refused),
    ] {
        let n = counter.load(Ordering::Relaxed);
        let _ = writeln!(
            text,
            "uncaged_workflow_webhook_deliveries_total{{outcome=\"{outcome}\"}} {n}"
        );
    }
    Ok(text)
}
