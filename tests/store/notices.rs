//! `NoticeBackend`: deliveries of waits, each claimed by one sender at a time.

use uncaged_workflow::store::notices::{Attempt, Notice, NoticeState};

use super::*;

fn notice(thread: ThreadId, channel: &str) -> Notice {
    let key = format!("{thread}/2.0/d1/{channel}/");
    Notice::fresh(key, thread, "2.0".into(), "approve", channel.into(), None)
}

contract! {
    /// A delivery is claimed once while its lease holds; a failed attempt comes due again at
    /// its retry time, a sender whose lease ran out is replaced (and its late settle ignored),
    /// and a sent one is never claimed again. A thread's deliveries are listed.
    fn a_delivery_is_claimed_by_one_sender_until_settled(store: &Storage) -> Result<()> {
        let thread = ThreadId::new();
        let fresh = notice(thread, "hook");
        let first = store.notices().claim(&fresh, "one", 100, 50)?.context("claimed")?;
        ensure!(first.attempts == 1 && first.owner.as_deref() == Some("one") && first.next_at == 150);
        ensure!(store.notices().claim(&fresh, "two", 120, 50)?.is_none(), "claimed twice");
        store.notices().settle(&first, &Attempt::Failed { error: "HTTP 503".into(), retry_at: Some(300) })?;
        ensure!(store.notices().claim(&fresh, "two", 200, 50)?.is_none(), "due before its retry");
        let second = store.notices().claim(&fresh, "two", 300, 50)?.context("due again")?;
        ensure!(second.attempts == 2 && second.last_error.as_deref() == Some("HTTP 503"));
        // Two's lease runs out: three takes it, and two's settle is ignored.
        let third = store.notices().claim(&fresh, "three", 400, 50)?.context("lease out")?;
        store.notices().settle(&second, &Attempt::Sent { at: 401 })?;
        let listed = store.notices().of_thread(thread)?;
        ensure!(listed.len() == 1 && listed[0].state == NoticeState::Sending, "{listed:?}");
        store.notices().settle(&third, &Attempt::Sent { at: 402 })?;
        ensure!(store.notices().claim(&fresh, "four", 10_000, 50)?.is_none(), "a sent one");
        let other = notice(thread, "mail");
        let mailed = store.notices().claim(&other, "one", 500, 50)?.context("another channel")?;
        store.notices().settle(&mailed, &Attempt::Failed { error: "gone".into(), retry_at: None })?;
        ensure!(store.notices().claim(&other, "one", 10_000, 50)?.is_none(), "given up");
        let listed = store.notices().of_thread(thread)?;
        let states: Vec<(String, NoticeState, u32)> =
            listed.iter().map(|n| (n.channel.clone(), n.state, n.attempts)).collect();
        let mut states = states;
        states.sort_by(|a, b| a.0.cmp(&b.0));
        ensure!(
            states == [("hook".into(), NoticeState::Sent, 3), ("mail".into(), NoticeState::Failed, 1)],
            "{states:?}"
        );
        ensure!(store.notices().of_thread(ThreadId::new())?.is_empty());
        Ok(())
    }

    /// Claims at once, from many threads of a process: one sender gets the delivery.
    fn of_claims_at_once_one_sends(store: &Storage) -> Result<()> {
        let fresh = notice(ThreadId::new(), "hook");
        let claims = std::thread::scope(|scope| {
            let claims: Vec<_> = (0..4)
                .map(|i| {
                    let fresh = &fresh;
                    scope.spawn(move || store.notices().claim(fresh, &format!("s{i}"), 100, 1_000))
                })
                .collect();
            claims.into_iter().map(|c| c.join().expect("a claim")).collect::<Result<Vec<_>, _>>()
        })?;
        ensure!(claims.iter().filter(|c| c.is_some()).count() == 1, "{claims:?}");
        Ok(())
    }
}
