//! `CapacityBackend`: provider limits' shared state, changed under a lock that every process of
//! the store respects, and the turns of two processes' limiters drawing on one limit.

use std::sync::Arc;
use std::time::Duration;

use uncaged_workflow::store::capacity::{Ask, LimitState, ProviderLimit};
use uncaged_workflow::store::limiter::Limiter;

use super::*;

/// Two changes at once never lose one another: each reads what the other wrote.
fn changes_at_once(store: &Storage, name: &str, each: u64) -> Result<()> {
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let capacity = store.capacity();
            let name = name.to_string();
            std::thread::spawn(move || -> Result<()> {
                for _ in 0..each {
                    capacity.update(&name, &mut |state: &mut LimitState| state.last += 1)?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    Ok(())
}

contract! {
    /// A limit nobody drew on reads empty; changes are kept, made one at a time, and limits
    /// are kept apart by name.
    fn a_limits_state_is_changed_one_at_a_time_and_kept(store: &Storage) -> Result<()> {
        let capacity = store.capacity();
        ensure!(capacity.read("openai-main")? == LimitState::default());
        changes_at_once(store, "openai-main", 40)?;
        ensure!(capacity.read("openai-main")?.last == 80, "a change was lost");
        capacity.update("other.limit_2", &mut |state| state.close(5_000))?;
        ensure!(capacity.read("other.limit_2")?.closed_until == 5_000);
        ensure!(capacity.read("openai-main")?.closed_until == 0);
        // A change that changes nothing is no write, and still no error.
        capacity.update("openai-main", &mut |_| {})?;
        ensure!(capacity.read("openai-main")?.last == 80);
        Ok(())
    }

    /// Two processes' limiters on one store draw on one limit: with one call at a time
    /// allowed, the second waits until the first is settled, then counts what it used.
    fn two_limiters_on_one_store_share_a_limit(store: &Storage) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let limit = ProviderLimit {
            requests_per_minute: Some(100),
            tokens_per_minute: Some(100_000),
            concurrent: Some(1),
        };
        let (one, two) =
            (Arc::new(Limiter::new(store.capacity())), Arc::new(Limiter::new(store.capacity())));
        let ask = |thread: &str| Ask { workflow: "w".into(), thread: thread.into(), tokens: 500 };
        runtime.block_on(async {
            let mut first = one.join("shared", limit, ask("a"));
            let first = tokio::time::timeout(Duration::from_secs(10), first.turn())
                .await
                .context("the first call's turn")?
                .map_err(anyhow::Error::msg)?;
            let mut second = two.join("shared", limit, ask("b"));
            let early = tokio::time::timeout(Duration::from_millis(600), second.turn()).await;
            ensure!(early.is_err(), "the second call went while the first was in flight");
            let usage = one.usage("shared")?;
            ensure!(usage.in_flight == 1 && usage.waiting == 1, "{usage:?}");
            first.settle(Some(42));
            let second = tokio::time::timeout(Duration::from_secs(10), second.turn())
                .await
                .context("the second call's turn after the first was settled")?
                .map_err(anyhow::Error::msg)?;
            let usage = two.usage("shared")?;
            ensure!(usage.requests == 2 && usage.in_flight == 1, "{usage:?}");
            ensure!(usage.tokens == 42 + 500, "settled at what it used: {usage:?}");
            drop(second);
            Ok(())
        })?;
        // A call dropped unsettled keeps its estimate for the minute, but frees its place.
        eventually("the dropped call is no longer in flight", || {
            Ok(one.usage("shared")?.in_flight == 0)
        })?;
        ensure!(one.usage("shared")?.tokens == 542);
        Ok(())
    }

    /// A provider's `Retry-After` closes the limit for every caller on the store until then.
    fn a_closed_limit_holds_every_limiters_calls(store: &Storage) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let limit = ProviderLimit { requests_per_minute: Some(100), ..Default::default() };
        let (one, two) =
            (Arc::new(Limiter::new(store.capacity())), Arc::new(Limiter::new(store.capacity())));
        let until = uncaged_workflow::clock::now_ms() + 1_500;
        runtime.block_on(async {
            one.close("closing", limit, until);
            // The close reaches the store with the limiter's next round.
            eventually_async(|| Ok(two.usage("closing")?.closed_until == Some(until))).await?;
            let mut place =
                two.join("closing", limit, Ask { workflow: "w".into(), thread: "t".into(), tokens: 1 });
            let granted = tokio::time::timeout(Duration::from_secs(10), place.turn())
                .await
                .context("the call's turn once the limit opened")?
                .map_err(anyhow::Error::msg)?;
            let now = uncaged_workflow::clock::now_ms();
            ensure!(now >= until, "let through {} ms before the limit opened", until - now);
            granted.settle(Some(1));
            Ok(())
        })
    }
}

/// [`eventually`], for a test inside a runtime.
async fn eventually_async(mut check: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !check()? {
        ensure!(std::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
