//! A database store's live text: a model's deltas, sent by the worker that runs a thread as
//! notifications on a channel of the thread's own (`uncaged_live_<ulid>`), heard by each
//! follower on a `LISTEN` session of its own. Nothing is stored; a notification nobody listens
//! for costs the server nothing.
//!
//! One task per process sends them, in order: what piles up while it sends is joined, per
//! thread, role and turn, into one notification (under the server's 8,000-byte payload
//! limit), so a fast model never queues more notifications than the database can take.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::types::Type;

use crate::error::Result;
use crate::ids::ThreadId;
use crate::store::postgres::Postgres;
use crate::store::queue::{LiveChannel, LivePublisher, LiveText};

/// The most text one notification carries (the server refuses payloads of 8,000 bytes).
const PAYLOAD_TEXT: usize = 6000;

/// How long the probe a listening session sends itself may take before notifications count
/// as not reaching this process (a millisecond on a direct connection).
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// How often a listener whose follower may have gone looks (it learns it at once when text
/// arrives).
const FOLLOWER_CHECK: Duration = Duration::from_secs(5);

/// The live text of the store `pg` is connected to.
#[derive(Debug, Clone)]
pub struct PgLive {
    pg: Postgres,
    /// The sending task's queue, once something was published.
    sender: Arc<OnceLock<mpsc::UnboundedSender<(ThreadId, LiveText)>>>,
}

/// The channel thread `id`'s text goes out on.
fn channel(id: ThreadId) -> String {
    format!("uncaged_live_{}", id.to_string().to_lowercase())
}

impl PgLive {
    pub fn new(pg: &Postgres) -> Self {
        PgLive { pg: pg.clone(), sender: Arc::default() }
    }

    /// The sending task's queue, started at first use.
    fn sender(&self) -> mpsc::UnboundedSender<(ThreadId, LiveText)> {
        self.sender
            .get_or_init(|| {
                let (sender, receiver) = mpsc::unbounded_channel();
                self.pg.spawn(send(self.pg.clone(), receiver));
                sender
            })
            .clone()
    }
}

/// Sends what is published, joining what piled up per thread, role and turn.
async fn send(pg: Postgres, mut queue: mpsc::UnboundedReceiver<(ThreadId, LiveText)>) {
    while let Some(first) = queue.recv().await {
        let mut batch: VecDeque<(ThreadId, LiveText)> = VecDeque::from([first]);
        while let Ok(next) = queue.try_recv() {
            match batch.back_mut() {
                Some((id, last))
                    if *id == next.0
                        && last.role == next.1.role
                        && last.turn == next.1.turn
                        && last.text.len() + next.1.text.len() <= PAYLOAD_TEXT =>
                {
                    last.text.push_str(&next.1.text);
                }
                _ => batch.push_back(next),
            }
        }
        for (id, text) in batch {
            for piece in pieces(&text.text) {
                let payload = serde_json::to_string(&LiveText {
                    role: text.role.clone(),
                    turn: text.turn,
                    text: piece.to_string(),
                })
                .expect("live text serializes");
                let channel = channel(id);
                // The shared connection, as the driver's own tasks use it: a lost connection
                // loses live text, never a record.
                let client = pg.current_client();
                let sent = client
                    .execute_typed(
                        "SELECT pg_notify($1, $2)",
                        &[(&channel, Type::TEXT), (&payload, Type::TEXT)],
                    )
                    .await;
                if let Err(e) = sent {
                    tracing::debug!("live text of thread {id} not sent: {e}");
                }
            }
        }
    }
}

/// `text` in pieces a notification can carry, cut at character boundaries.
fn pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while rest.len() > PAYLOAD_TEXT {
        let cut = (0..=PAYLOAD_TEXT).rev().find(|&i| rest.is_char_boundary(i)).unwrap_or(0);
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    pieces.push(rest);
    pieces
}

impl LiveChannel for PgLive {
    fn publisher(&self, id: ThreadId) -> LivePublisher {
        let sender = self.sender();
        Arc::new(move |text| {
            let _ = sender.send((id, text));
        })
    }

    fn follow(&self, id: ThreadId) -> Result<Option<mpsc::UnboundedReceiver<LiveText>>> {
        if self.pg.inner.no_notifications.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let channel = channel(id);
        let (client, mut notes) = self.pg.listening(&[&channel])?;
        // Whether notifications reach this session at all (not through a transaction-pooling
        // PgBouncer, which hands the listening server connection to others): a probe sent to
        // itself.
        self.pg.wait(
            "probe the live text's channel",
            self.pg.client()?.execute_typed(
                "SELECT pg_notify($1, '{\"probe\": true}')",
                &[(&channel, Type::TEXT)],
            ),
        )?;
        let probe = self.pg.spawn(async move {
            let heard = tokio::time::timeout(PROBE_WAIT, notes.recv()).await;
            (matches!(heard, Ok(Some(_))), notes)
        });
        let (heard, mut notes) =
            futures::executor::block_on(probe).expect("the probe task is not aborted");
        if !heard {
            self.pg.inner.no_notifications.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                "{}: a notification did not arrive within {PROBE_WAIT:?}: LISTEN needs a \
                 session of its own, which a transaction-pooling PgBouncer does not keep; no \
                 live text reaches followers here",
                self.pg.target()
            );
            return Ok(None);
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        // The session lives while its follower does.
        self.pg.spawn(async move {
            let _client = client;
            let mut check = tokio::time::interval(FOLLOWER_CHECK);
            loop {
                tokio::select! {
                    note = notes.recv() => {
                        let Some((_, payload)) = note else { return };
                        let Ok(text) = serde_json::from_str::<LiveText>(&payload) else { continue };
                        if sender.send(text).is_err() {
                            return;
                        }
                    }
                    _ = check.tick() => if sender.is_closed() { return },
                }
            }
        });
        Ok(Some(receiver))
    }
}
