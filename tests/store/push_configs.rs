//! `PushConfigBackend`: where A2A clients asked to be told of their tasks' changes.

use uncaged_workflow::store::push_configs::PushConfig;

use super::*;

fn config(thread: ThreadId, id: &str, created: u64) -> PushConfig {
    PushConfig {
        thread,
        id: id.into(),
        config: serde_json::json!({"url": "https://client.example/push", "token": "t"}),
        owner: "token:ci".into(),
        created,
    }
}

contract! {
    /// Configs are kept by thread and id (replaced when put again), listed by thread and all
    /// together, and forgotten one at a time; an id that could reach a path is refused.
    fn push_configs_are_kept_by_task_and_id(store: &Storage) -> Result<()> {
        let (a, b) = (ThreadId::new(), ThreadId::new());
        ensure!(store.push_configs().all()?.is_empty());
        store.push_configs().put(&config(a, "one", 2))?;
        store.push_configs().put(&config(a, "two", 1))?;
        store.push_configs().put(&config(b, "one", 3))?;
        let mut again = config(a, "one", 2);
        again.config = serde_json::json!({"url": "https://client.example/other"});
        store.push_configs().put(&again)?;
        let of_a = store.push_configs().of_thread(a)?;
        ensure!(of_a.len() == 2 && of_a[0].id == "two" && of_a[1] == again, "{of_a:?}");
        ensure!(store.push_configs().all()?.len() == 3);
        ensure!(store.push_configs().delete(a, "two")?);
        ensure!(!store.push_configs().delete(a, "two")?);
        ensure!(store.push_configs().of_thread(a)? == [again]);
        ensure!(store.push_configs().put(&config(a, "../x", 4)).is_err());
        Ok(())
    }
}
