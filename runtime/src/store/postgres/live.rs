//! A database store's live text: a model's deltas, sent by the worker that runs a thread as
//! notifications on a channel of the thread's own (`uncaged_live_<ulid>`), heard by each
//! follower on the one `LISTEN` session of its process. Nothing is stored; a notification nobody listens
//! for costs the server nothing. On the same channel, the append of a thread someone follows
//! says that it stored something (migration 10), so a follower reads the store when there is
//! something to read rather than polling it.
//!
//! One task per process sends them, in order: what piles up while it sends is joined, per
//! thread, role and turn, into one notification (under the server's 8,000-byte payload
//! limit), so a fast model never queues more notifications than the database can take.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::Type;

use crate::error::Result;
use crate::ids::ThreadId;
use crate::store::postgres::Postgres;
use crate::store::queue::{Live, LiveChannel, LivePublisher, LiveText};

/// The most text one notification carries (the server refuses payloads of 8,000 bytes).
const PAYLOAD_TEXT: usize = 6000;

/// How long the probe a listening session sends itself may take before notifications count
/// as not reaching this process (a millisecond on a direct connection).
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// How often a listener whose follower may have gone looks (it learns it at once when text
/// arrives), and moves the time until which its thread counts as followed.
const FOLLOWER_CHECK: Duration = Duration::from_secs(5);

/// How long a thread counts as followed after its follower last said so: a follower that
/// died costs its thread's appends a notification for this long at most.
const FOLLOWED_FOR: &str = "30 seconds";

/// The payload of the notification an append of a followed thread sends.
const STORED: &str = "stored";

/// Marks threads `ids` as followed for [`FOLLOWED_FOR`] from now.
async fn followed(
    client: &tokio_postgres::Client,
    ids: &[String],
) -> std::result::Result<(), tokio_postgres::Error> {
    let statement = format!(
        "UPDATE uncaged_workflow.threads SET followed_until = now() + interval '{FOLLOWED_FOR}' \
         WHERE id = ANY($1)"
    );
    client.execute_typed(&statement, &[(&ids, Type::TEXT_ARRAY)]).await.map(drop)
}

/// The live text of the store `pg` is connected to.
#[derive(Debug, Clone)]
pub struct PgLive {
    pg: Postgres,
    /// The sending task's queue, once something was published.
    sender: Arc<OnceLock<mpsc::UnboundedSender<(ThreadId, LiveText)>>>,
    /// The listening session's task, once something was followed.
    session: Arc<Mutex<Option<mpsc::UnboundedSender<Command>>>>,
}

/// The channel thread `id`'s text goes out on.
fn channel(id: ThreadId) -> String {
    format!("uncaged_live_{}", id.to_string().to_lowercase())
}

impl PgLive {
    pub fn new(pg: &Postgres) -> Self {
        PgLive { pg: pg.clone(), sender: Arc::default(), session: Arc::default() }
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

    fn follow(&self, id: ThreadId) -> Result<Option<mpsc::UnboundedReceiver<Live>>> {
        // A session lost since the last follow is opened again, once.
        for _ in 0..2 {
            let Some(session) = self.session()? else { return Ok(None) };
            let (sender, receiver) = mpsc::unbounded_channel();
            let (done, answer) = oneshot::channel();
            if session.send(Command::Follow { id, sender, done }).is_err() {
                *self.session.lock() = None;
                continue;
            }
            match futures::executor::block_on(answer) {
                Ok(Ok(())) => return Ok(Some(receiver)),
                Ok(Err(e)) => return Err(self.pg.error("follow a thread's news", &e)),
                Err(_) => *self.session.lock() = None,
            }
        }
        Ok(None)
    }
}

impl PgLive {
    /// This process's listening session, opened at first use; None where notifications do
    /// not reach it.
    fn session(&self) -> Result<Option<mpsc::UnboundedSender<Command>>> {
        if self.pg.inner.no_notifications.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(None);
        }
        let mut session = self.session.lock();
        if let Some(commands) = session.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Some(commands.clone()));
        }
        // Whether notifications reach a session at all (not through a transaction-pooling
        // PgBouncer, which hands the listening server connection to others): a probe it
        // sends itself.
        let probe = format!("uncaged_probe_{}", ulid::Ulid::new().to_string().to_lowercase());
        let (client, mut notes) = self.pg.listening(&[&probe])?;
        self.pg.wait(
            "probe the live text's channel",
            self.pg.client()?.execute_typed("SELECT pg_notify($1, '')", &[(&probe, Type::TEXT)]),
        )?;
        let heard = self.pg.spawn(async move {
            let heard = tokio::time::timeout(PROBE_WAIT, notes.recv()).await;
            (matches!(heard, Ok(Some(_))), notes)
        });
        let (heard, notes) =
            futures::executor::block_on(heard).expect("the probe task is not aborted");
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
        let (commands, requests) = mpsc::unbounded_channel();
        self.pg.spawn(listen(client, notes, requests));
        *session = Some(commands.clone());
        Ok(Some(commands))
    }
}

/// What a follower asks of the listening session.
enum Command {
    /// Hand thread `id`'s news to `sender` from now on; `done` once it is listened for.
    Follow {
        id: ThreadId,
        sender: mpsc::UnboundedSender<Live>,
        done: oneshot::Sender<std::result::Result<(), tokio_postgres::Error>>,
    },
}

/// The listening session's task: one `LISTEN` per followed thread, each notification handed
/// to the thread's followers, a channel nobody follows any more given up, and the followed
/// threads marked so every [`FOLLOWER_CHECK`]. One task does all of it, in order, so a
/// `LISTEN` and an `UNLISTEN` of one channel never cross. When the session is lost, every
/// follower's news ends (each reads the store again, and follows anew).
async fn listen(
    client: tokio_postgres::Client,
    mut notes: mpsc::UnboundedReceiver<(String, String)>,
    mut requests: mpsc::UnboundedReceiver<Command>,
) {
    let mut followers: HashMap<String, (ThreadId, Vec<mpsc::UnboundedSender<Live>>)> =
        HashMap::new();
    let mut check = tokio::time::interval(FOLLOWER_CHECK);
    check.tick().await;
    loop {
        tokio::select! {
            note = notes.recv() => {
                let Some((channel, payload)) = note else { return };
                let Some((_, senders)) = followers.get_mut(&channel) else { continue };
                let heard = if payload == STORED {
                    Live::Stored
                } else {
                    let Ok(text) = serde_json::from_str(&payload) else { continue };
                    Live::Text(text)
                };
                senders.retain(|sender| sender.send(heard.clone()).is_ok());
            }
            request = requests.recv() => {
                let Some(Command::Follow { id, sender, done }) = request else { return };
                let name = channel(id);
                // Listened for first, then marked followed: whatever is stored after the mark
                // is told, and the follower reads what was stored before it.
                let mut listened = Ok(());
                if !followers.contains_key(&name) {
                    listened = client.batch_execute(&format!("LISTEN {name}")).await;
                }
                let listened = match listened {
                    Ok(()) => followed(&client, &[id.to_string()]).await,
                    Err(e) => Err(e),
                };
                if listened.is_ok() {
                    followers.entry(name).or_insert_with(|| (id, Vec::new())).1.push(sender);
                }
                let lost = listened.as_ref().is_err_and(|e| e.is_closed());
                let _ = done.send(listened);
                if lost {
                    return;
                }
            }
            _ = check.tick() => {
                let mut gone = Vec::new();
                followers.retain(|name, (_, senders)| {
                    senders.retain(|s| !s.is_closed());
                    if senders.is_empty() {
                        gone.push(format!("UNLISTEN {name};"));
                    }
                    !senders.is_empty()
                });
                let ids: Vec<String> = followers.values().map(|(id, _)| id.to_string()).collect();
                let kept = async {
                    if !gone.is_empty() {
                        client.batch_execute(&gone.concat()).await?;
                    }
                    if !ids.is_empty() {
                        followed(&client, &ids).await?;
                    }
                    Ok::<_, tokio_postgres::Error>(())
                };
                if let Err(e) = kept.await {
                    tracing::debug!("the live session was lost: {e}");
                    return;
                }
            }
        }
    }
}
