//! The store's schema and its versioned migrations: created on first use, migrated forward
//! by whichever process connects first (under an advisory lock, so many workers starting at
//! once migrate it once), and never touched when it belongs to someone else or is newer than
//! this binary.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::{DatabaseFailure, Error, Result};
use crate::store::postgres::Postgres;

/// The PostgreSQL schema (namespace) every table of the store lives in.
pub const SCHEMA: &str = "uncaged_workflow";

/// What `meta.application` holds in a database this program created.
const APPLICATION: &str = "uncaged-workflow";

/// The migrations, in order: version, name, SQL. A migration is never edited once released;
/// a change is a new one.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "store", include_str!("migrations/0001_store.sql")),
    (2, "schedules", include_str!("migrations/0002_schedules.sql")),
    (3, "api", include_str!("migrations/0003_api.sql")),
    (4, "fire lock", include_str!("migrations/0004_fire_lock.sql")),
    (5, "summary columns", include_str!("migrations/0005_summary_columns.sql")),
    (6, "append function", include_str!("migrations/0006_append_function.sql")),
    (7, "packed listing", include_str!("migrations/0007_packed_listing.sql")),
    (8, "cascade by statement", include_str!("migrations/0008_cascade_by_statement.sql")),
    (9, "bundle compression", include_str!("migrations/0009_bundle_compression.sql")),
    (10, "followed threads", include_str!("migrations/0010_followed_threads.sql")),
    (11, "tool credentials", include_str!("migrations/0011_tool_credentials.sql")),
    (12, "provider limits", include_str!("migrations/0012_provider_limits.sql")),
    (13, "evals", include_str!("migrations/0013_evals.sql")),
    (14, "reach", include_str!("migrations/0014_reach.sql")),
];

/// The schema version this binary writes.
pub const LATEST: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The advisory lock key that serialises schema changes ("uwflow").
const LOCK_KEY: i64 = 0x7577_666c_6f77;

/// What the database turned out to be.
enum Found {
    Ready,
    Foreign(String),
    Newer(i32),
}

/// Makes sure the database holds the store at [`LATEST`], creating or migrating it.
pub fn prepare(postgres: &Postgres) -> Result<()> {
    // Every command connects: a store already at this version is seen in one read on the
    // connection it will use anyway, without a connection of its own and a lock.
    if postgres.wait("read the store's schema version", is_current(&*postgres.client()?))? {
        return Ok(());
    }
    let mut client = postgres.dedicated()?;
    let found = postgres.wait("prepare the store's schema", migrate(&mut client))?;
    let target = postgres.target().to_string();
    match found {
        Found::Ready => Ok(()),
        Found::Foreign(what) => Err(Error::Database {
            target,
            failure: DatabaseFailure::Foreign,
            reason: format!(
                "not an uncaged-workflow store: {what}; give uncaged-workflow a database of \
                 its own (`createdb`)"
            ),
        }),
        Found::Newer(version) => Err(Error::Database {
            target,
            failure: DatabaseFailure::NewerSchema,
            reason: format!(
                "the store is at schema version {version}, written by a newer uncaged-workflow; \
                 this one knows versions up to {LATEST} (upgrade it)"
            ),
        }),
    }
}

/// Whether the database holds this program's store at [`LATEST`] (false when it holds no
/// store, another program's, or another version: [`migrate`] tells which).
async fn is_current(client: &Client) -> std::result::Result<bool, tokio_postgres::Error> {
    let read = client
        .query_typed_opt(
            &format!(
                "SELECT a.value, v.value FROM {SCHEMA}.meta a, {SCHEMA}.meta v \
                 WHERE a.key = 'application' AND v.key = 'schema_version'"
            ),
            &[],
        )
        .await;
    match read {
        Ok(Some(row)) => Ok(row.get::<_, &str>(0) == APPLICATION
            && row.get::<_, &str>(1).parse::<i32>().ok() == Some(LATEST)),
        Ok(None) => Ok(false),
        // No such table (or no such schema): not a store yet.
        Err(e) if e.as_db_error().is_some() => Ok(false),
        Err(e) => Err(e),
    }
}

async fn migrate(client: &mut Client) -> std::result::Result<Found, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute_typed("SELECT pg_advisory_xact_lock($1)", &[(&LOCK_KEY, Type::INT8)]).await?;
    let has_schema: bool = tx
        .query_typed_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[(&SCHEMA, Type::TEXT)],
        )
        .await?
        .get(0);
    let version = if has_schema {
        let has_meta: bool = tx
            .query_typed_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[(&format!("{SCHEMA}.meta"), Type::TEXT)],
            )
            .await?
            .get(0);
        if !has_meta {
            return Ok(Found::Foreign(format!(
                "it has a schema `{SCHEMA}` this program did not make"
            )));
        }
        let meta = |key: &'static str| {
            let tx = &tx;
            async move {
                let row = tx
                    .query_typed_opt(
                        &format!("SELECT value FROM {SCHEMA}.meta WHERE key = $1"),
                        &[(&key, Type::TEXT)],
                    )
                    .await?;
                Ok::<_, tokio_postgres::Error>(row.map(|row| row.get::<_, String>(0)))
            }
        };
        if meta("application").await?.as_deref() != Some(APPLICATION) {
            return Ok(Found::Foreign(format!("its schema `{SCHEMA}` belongs to another program")));
        }
        let version =
            meta("schema_version").await?.and_then(|v| v.parse::<i32>().ok()).unwrap_or(0);
        if version > LATEST {
            return Ok(Found::Newer(version));
        }
        version
    } else {
        let tables: i64 = tx
            .query_typed_one(
                "SELECT count(*) FROM pg_tables \
                 WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
                &[],
            )
            .await?
            .get(0);
        if tables > 0 {
            return Ok(Found::Foreign(format!(
                "it holds {tables} table(s) of another application and no uncaged-workflow store"
            )));
        }
        tx.batch_execute(&format!(
            "CREATE SCHEMA {SCHEMA};
             CREATE TABLE {SCHEMA}.meta (key text PRIMARY KEY, value text NOT NULL);
             CREATE TABLE {SCHEMA}.migrations (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );
             INSERT INTO {SCHEMA}.meta (key, value)
                 VALUES ('application', '{APPLICATION}'), ('schema_version', '0');"
        ))
        .await?;
        0
    };
    for &(number, name, sql) in MIGRATIONS.iter().filter(|(number, ..)| *number > version) {
        tx.batch_execute(&format!("SET LOCAL search_path TO {SCHEMA};\n{sql}")).await?;
        tx.execute_typed(
            &format!("INSERT INTO {SCHEMA}.migrations (version, name) VALUES ($1, $2)"),
            &[(&number, Type::INT4), (&name, Type::TEXT)],
        )
        .await?;
        tx.execute_typed(
            &format!("UPDATE {SCHEMA}.meta SET value = $1 WHERE key = 'schema_version'"),
            &[(&number.to_string(), Type::TEXT)],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Found::Ready)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_statements_name_this_schema() {
        // Every statement of the store names its tables with the schema, literally (no
        // `search_path`: a transaction pooler does not keep one): renaming it means them too.
        assert_eq!(super::SCHEMA, "uncaged_workflow");
    }
}
