//! `LiveChannel`: a worker's live text (a model's deltas) carried by the store to followers in
//! other processes — a database's notifications; none on a home directory, whose followers
//! hear the worker's socket, and none through a transaction-pooling PgBouncer.

use super::*;

contract! {
    /// What a worker publishes for a thread reaches its follower whole and in order (a piece
    /// longer than a notification carries too), and another thread's text does not.
    fn live_text_reaches_a_follower_in_order(store: &Storage) -> Result<()> {
        let Some(live) = store.queue().live() else {
            ensure!(store.url().is_none(), "a database carries live text");
            return Ok(());
        };
        let (id, other) = (ThreadId::new(), ThreadId::new());
        // Behind a PgBouncer in transaction mode the follower is told there is none.
        let Some(mut heard) = live.follow(id)? else { return Ok(()) };
        let (publish, elsewhere) = (live.publisher(id), live.publisher(other));
        let long = "x".repeat(20_000);
        for text in ["Let me ", "read ", long.as_str()] {
            publish(LiveText { role: "developer".into(), turn: 1, text: text.into() });
            elsewhere(LiveText { role: "developer".into(), turn: 1, text: "not yours".into() });
        }
        let expected = format!("Let me read {long}");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let text = runtime.block_on(async {
            let mut text = String::new();
            while text.len() < expected.len() {
                let piece = tokio::time::timeout(std::time::Duration::from_secs(10), heard.recv())
                    .await
                    .context("the live text stopped coming")?
                    .context("the live text ended")?;
                let Live::Text(piece) = piece else { continue };
                ensure!(piece.role == "developer", "{piece:?}");
                text.push_str(&piece.text);
            }
            Ok::<_, anyhow::Error>(text)
        })?;
        ensure!(text == expected, "{} bytes, not in order or not whole", text.len());
        Ok(())
    }
}
