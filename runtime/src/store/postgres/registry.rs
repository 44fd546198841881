//! The registry and the bundles in PostgreSQL: the same [`RegistryTable`] the home directory
//! keeps in `workflow.yaml`, read from and written back to rows, and each bundle's bytes and
//! descriptor by hash, checked against their SHA-256 whenever they are loaded.

use std::path::PathBuf;

use tokio_postgres::GenericClient;
use tokio_postgres::types::Type;

use crate::error::{DatabaseFailure, Error, Result};
use crate::ids::BundleHash;
use crate::store::bundles::BundleBackend;
use crate::store::descriptor::Descriptor;
use crate::store::postgres::Postgres;
use crate::store::registry::{
    BundleRecord, RegistryBackend, RegistryTable, Version, WorkflowEntry,
};

/// The advisory lock key that serialises registry changes ("uwreg").
const REGISTRY_LOCK: i64 = 0x0075_7772_6567;

/// The registry in the database.
#[derive(Debug)]
pub struct PgRegistry {
    pg: Postgres,
}

impl PgRegistry {
    pub fn new(pg: &Postgres) -> Self {
        PgRegistry { pg: pg.clone() }
    }
}

impl RegistryBackend for PgRegistry {
    fn load(&self) -> Result<RegistryTable> {
        let pg = &self.pg;
        let client = pg.client()?;
        pg.wait("read the registry", read(&*client))?.map_err(|reason| corrupt(pg, reason))
    }

    /// Changes the registry in one transaction, under a lock that serialises changes from
    /// every machine: read, apply `change`, write back what changed. Nothing is written if
    /// `change` fails.
    fn update(&self, change: &mut dyn FnMut(&mut RegistryTable) -> Result<()>) -> Result<()> {
        let pg = &self.pg;
        let mut client = pg.dedicated()?;
        let tx = pg.wait("change the registry", client.transaction())?;
        pg.wait(
            "lock the registry",
            tx.execute_typed("SELECT pg_advisory_xact_lock($1)", &[(&REGISTRY_LOCK, Type::INT8)]),
        )?;
        let mut file =
            pg.wait("read the registry", read(&tx))?.map_err(|reason| corrupt(pg, reason))?;
        let before = file.clone();
        change(&mut file)?;
        for (name, entry) in &file.workflows {
            if before.workflows.get(name) != Some(entry) {
                pg.wait("write the registry", write_entry(&tx, name, Some(entry)))?;
            }
        }
        for name in before.workflows.keys().filter(|name| !file.workflows.contains_key(*name)) {
            pg.wait("write the registry", write_entry(&tx, name, None))?;
        }
        pg.wait("change the registry", tx.commit())
    }
}

/// The bundles in the database.
#[derive(Debug)]
pub struct PgBundles {
    pg: Postgres,
}

impl PgBundles {
    pub fn new(pg: &Postgres) -> Self {
        PgBundles { pg: pg.clone() }
    }

    /// Column `column` (`bytes` or `descriptor`) of bundle `hash`; `None` if it is not stored.
    fn column<T: for<'a> tokio_postgres::types::FromSql<'a>>(
        &self,
        column: &'static str,
        hash: BundleHash,
    ) -> Result<Option<T>> {
        let client = self.pg.client()?;
        let row = self.pg.wait(
            &format!("read the {column} of bundle {hash}"),
            client.query_typed_opt(
                &format!("SELECT {column} FROM uncaged_workflow.bundles WHERE hash = $1"),
                &[(&hash.to_string(), Type::TEXT)],
            ),
        )?;
        Ok(row.map(|row| row.get(0)))
    }
}

impl BundleBackend for PgBundles {
    fn prepare(&self) -> Result<()> {
        Ok(())
    }

    /// Stores a bundle's bytes and descriptor (an intact copy is left as it is, a damaged one
    /// is repaired).
    fn write(
        &self,
        hash: BundleHash,
        bytes: &[u8],
        descriptor: &Descriptor,
        record: &BundleRecord,
    ) -> Result<()> {
        let yaml = serde_yaml::to_string(descriptor).expect("descriptor serializes");
        let client = self.pg.client()?;
        self.pg.wait(
            &format!("store bundle {hash}"),
            client.execute_typed(
                "INSERT INTO uncaged_workflow.bundles \
                     (hash, sha256, size, summary, descriptor, bytes) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (hash) DO UPDATE SET bytes = EXCLUDED.bytes, \
                     descriptor = EXCLUDED.descriptor, summary = EXCLUDED.summary \
                 WHERE bundles.sha256 = EXCLUDED.sha256",
                &[
                    (&hash.to_string(), Type::TEXT),
                    (&record.sha256, Type::TEXT),
                    (&(record.size as i64), Type::INT8),
                    (&record.summary, Type::TEXT),
                    (&yaml, Type::TEXT),
                    (&bytes, Type::BYTEA),
                ],
            ),
        )?;
        Ok(())
    }

    fn read(&self, hash: BundleHash) -> Result<Option<Vec<u8>>> {
        self.column("bytes", hash)
    }

    /// The row's version: any update of it (a repair, a tampering) gives another.
    fn stamp(&self, hash: BundleHash) -> Result<Option<String>> {
        self.column("xmin::text", hash)
    }

    fn read_descriptor(&self, hash: BundleHash) -> Result<Option<String>> {
        self.column("descriptor", hash)
    }

    fn place(&self, hash: BundleHash) -> PathBuf {
        PathBuf::from(format!("{} bundle {hash}", self.pg.target()))
    }

    fn database(&self) -> Option<String> {
        Some(self.pg.target().to_string())
    }
}

async fn read(
    client: &impl GenericClient,
) -> std::result::Result<std::result::Result<RegistryTable, String>, tokio_postgres::Error> {
    let mut file = RegistryTable::default();
    let workflows = "SELECT name, hash, since_ms FROM uncaged_workflow.workflows";
    for row in client.query_typed(workflows, &[]).await? {
        let name: String = row.get(0);
        let Ok(hash) = row.get::<_, &str>(1).parse() else {
            return Ok(Err(format!("workflow `{name}` has a malformed bundle id")));
        };
        let entry = WorkflowEntry { hash, timestamp: row.get::<_, i64>(2) as u64, history: vec![] };
        file.workflows.insert(name, entry);
    }
    let history = client
        .query_typed(
            "SELECT name, hash, since_ms FROM uncaged_workflow.workflow_history \
             ORDER BY name, position",
            &[],
        )
        .await?;
    for row in history {
        let name: &str = row.get(0);
        let Ok(hash) = row.get::<_, &str>(1).parse() else {
            return Ok(Err(format!("workflow `{name}` has a malformed bundle id in its history")));
        };
        if let Some(entry) = file.workflows.get_mut(name) {
            entry.history.push(Version { hash, timestamp: row.get::<_, i64>(2) as u64 });
        }
    }
    let bundles = "SELECT hash, sha256, size, summary FROM uncaged_workflow.bundles";
    for row in client.query_typed(bundles, &[]).await? {
        let Ok(hash) = row.get::<_, &str>(0).parse::<BundleHash>() else {
            return Ok(Err("a stored bundle has a malformed id".into()));
        };
        let record = BundleRecord {
            sha256: row.get(1),
            size: row.get::<_, i64>(2) as u64,
            summary: row.get(3),
        };
        file.bundles.insert(hash, record);
    }
    Ok(Ok(file))
}

async fn write_entry(
    client: &impl GenericClient,
    name: &str,
    entry: Option<&WorkflowEntry>,
) -> std::result::Result<(), tokio_postgres::Error> {
    client
        .execute_typed(
            "DELETE FROM uncaged_workflow.workflows WHERE name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    let Some(entry) = entry else { return Ok(()) };
    client
        .execute_typed(
            "INSERT INTO uncaged_workflow.workflows (name, hash, since_ms) VALUES ($1, $2, $3)",
            &[
                (&name, Type::TEXT),
                (&entry.hash.to_string(), Type::TEXT),
                (&(entry.timestamp as i64), Type::INT8),
            ],
        )
        .await?;
    let hashes: Vec<String> = entry.history.iter().map(|v| v.hash.to_string()).collect();
    let since: Vec<i64> = entry.history.iter().map(|v| v.timestamp as i64).collect();
    client
        .execute_typed(
            "INSERT INTO uncaged_workflow.workflow_history (name, position, hash, since_ms) \
             SELECT $1, (v.i - 1)::integer, v.hash, v.since \
             FROM unnest($2::text[], $3::bigint[]) WITH ORDINALITY AS v(hash, since, i)",
            &[(&name, Type::TEXT), (&hashes, Type::TEXT_ARRAY), (&since, Type::INT8_ARRAY)],
        )
        .await?;
    Ok(())
}

fn corrupt(pg: &Postgres, reason: String) -> Error {
    Error::Database {
        target: pg.target().to_string(),
        failure: DatabaseFailure::Query,
        reason: format!("the registry is damaged: {reason}"),
    }
}
