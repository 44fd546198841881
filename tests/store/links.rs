//! `LinkBackend`: signed one-time links, used once from any process.

use uncaged_workflow::store::links::{Consumed, Link, LinkUse};

use super::*;

fn link(thread: ThreadId, hash: &str, expires: u64) -> Link {
    Link {
        hash: hash.into(),
        thread,
        wait_key: "2.0".into(),
        digest: "d1".into(),
        action: "approve".into(),
        channel: "mail".into(),
        approver: Some("ada@example.com".into()),
        created: 10,
        expires,
        used: None,
    }
}

fn use_at(at: u64) -> LinkUse {
    LinkUse {
        at,
        decision: serde_json::json!({"action": "approve"}),
        applied: false,
        outcome: None,
    }
}

fn hex(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

contract! {
    /// A link is kept whole and found by its hash; used once — a second use gets the first, as
    /// kept — and its use is unapplied until marked applied; a hash nobody made is unknown.
    fn a_link_is_used_once_and_its_use_applied_once(store: &Storage) -> Result<()> {
        let thread = ThreadId::new();
        let kept = link(thread, &hex(1), 500);
        store.links().create(&kept)?;
        ensure!(store.links().get(&hex(1))?.as_ref() == Some(&kept));
        ensure!(store.links().get(&hex(2))?.is_none());
        ensure!(store.links().get("../../etc/passwd")?.is_none());
        ensure!(store.links().consume(&hex(2), &use_at(20))? == Consumed::Unknown);
        let Consumed::Taken(taken) = store.links().consume(&hex(1), &use_at(20))? else {
            anyhow::bail!("the first use did not take it");
        };
        ensure!(taken.used == Some(use_at(20)));
        let Consumed::UsedBefore(before) = store.links().consume(&hex(1), &use_at(30))? else {
            anyhow::bail!("a second use took it");
        };
        ensure!(before.used.as_ref().map(|u| u.at) == Some(20));
        let unapplied: Vec<String> = store.links().unapplied()?.into_iter().map(|l| l.hash).collect();
        ensure!(unapplied == [hex(1)], "{unapplied:?}");
        store.links().applied(&hex(1), "applied")?;
        ensure!(store.links().unapplied()?.is_empty());
        let read = store.links().get(&hex(1))?.context("the link")?;
        ensure!(read.used.as_ref().is_some_and(|u| u.applied && u.outcome.as_deref() == Some("applied")));
        Ok(())
    }

    /// Uses at once, from many threads of a process: one takes the link.
    fn of_uses_at_once_one_takes_the_link(store: &Storage) -> Result<()> {
        store.links().create(&link(ThreadId::new(), &hex(3), 500))?;
        let taken = std::thread::scope(|scope| {
            let uses: Vec<_> = (0..4)
                .map(|i| scope.spawn(move || store.links().consume(&hex(3), &use_at(40 + i))))
                .collect();
            uses.into_iter().map(|u| u.join().expect("a use")).collect::<Result<Vec<_>, _>>()
        })?;
        let took = taken.iter().filter(|c| matches!(c, Consumed::Taken(_))).count();
        ensure!(took == 1, "{taken:?}");
        Ok(())
    }

    /// A thread's links are listed oldest first; links that expired before a cutoff and have
    /// nothing left to apply are forgotten, a used one not yet applied is kept.
    fn expired_links_are_forgotten_unless_a_use_waits(store: &Storage) -> Result<()> {
        let thread = ThreadId::new();
        store.links().create(&link(thread, &hex(4), 100))?;
        store.links().create(&Link { created: 5, ..link(thread, &hex(5), 100) })?;
        store.links().create(&link(thread, &hex(6), 900))?;
        store.links().create(&link(ThreadId::new(), &hex(7), 100))?;
        let listed: Vec<String> = store.links().of_thread(thread)?.into_iter().map(|l| l.hash).collect();
        ensure!(listed.len() == 3 && listed[0] == hex(5), "{listed:?}");
        store.links().consume(&hex(4), &use_at(50))?;
        let forgotten = store.links().forget_expired(500)?;
        ensure!(forgotten == 2, "{forgotten}");
        ensure!(store.links().get(&hex(4))?.is_some(), "a use waiting to be applied was forgotten");
        ensure!(store.links().get(&hex(5))?.is_none() && store.links().get(&hex(6))?.is_some());
        Ok(())
    }
}
