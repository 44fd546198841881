//! `GET /metrics`: what `serve` sees, in the Prometheus text format — threads by status (the
//! queue depth among them), steps stored, and webhook deliveries by outcome. Read from the
//! store at each scrape (a listing, as `threads` reads it), so every `serve` on one database
//! reports the same threads; delivery counts are this process's own.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::store::Storage;
use crate::store::records::ThreadStatus;

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

/// The exposition text.
pub fn render(store: &Storage, deliveries: &Deliveries) -> Result<String> {
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
