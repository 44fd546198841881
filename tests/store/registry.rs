//! `RegistryBackend`: the registry of names and versions, read and changed under its lock.

use super::*;

contract! {
    /// The registry: a name registered points at its bundle, its earlier versions kept newest
    /// first.
    fn the_registry_keeps_each_names_versions(store: &Storage) -> Result<()> {
        let registry = store.registry();
        registry.update(|file| {
            file.register("flow", hash(1), 100);
            Ok(())
        })?;
        registry.update(|file| {
            file.register("flow", hash(2), 200);
            Ok(())
        })?;
        let entry = registry.get("flow")?;
        ensure!(entry.hash == hash(2) && entry.timestamp == 200, "{entry:?}");
        ensure!(entry.history.len() == 1 && entry.history[0].hash == hash(1), "{entry:?}");
        ensure!(matches!(registry.get("flows"), Err(Error::UnknownWorkflow { .. })));
        Ok(())
    }

    /// The backend reads what it was last given, and a change that fails writes nothing.
    fn a_failed_change_writes_nothing(store: &Storage) -> Result<()> {
        let backend = store.registry().backend();
        ensure!(backend.load()?.workflows.is_empty(), "a new store's registry is empty");
        backend.update(&mut |table| {
            table.register("flow", hash(18), 100);
            Ok(())
        })?;
        let failed = backend.update(&mut |table| {
            table.register("other", hash(19), 200);
            Err(Error::Usage("refused".into()))
        });
        ensure!(matches!(failed, Err(Error::Usage(_))), "{failed:?}");
        let table = backend.load()?;
        ensure!(table.workflows.len() == 1 && table.workflows["flow"].hash == hash(18));
        Ok(())
    }
}
