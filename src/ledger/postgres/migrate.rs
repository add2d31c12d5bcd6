//! PostgreSQL migrations: the files of `migrations/postgres/`, in order, each applied in
//! its own transaction and recorded in `schema_migrations`. Replicas starting together
//! take turns through a session advisory lock, so a migration runs once.

use deadpool_postgres::Client;

use crate::ledger::LedgerError;

/// (version, name, SQL), in order. Append only: never edit a released migration.
pub const MIGRATIONS: [(u32, &str, &str); 7] = [
    (
        1,
        "0001_init",
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        2,
        "0002_window_seed",
        include_str!("../../../migrations/postgres/0002_window_seed.sql"),
    ),
    (
        3,
        "0003_ingress",
        include_str!("../../../migrations/postgres/0003_ingress.sql"),
    ),
    (
        4,
        "0004_request_shape",
        include_str!("../../../migrations/postgres/0004_request_shape.sql"),
    ),
    (
        5,
        "0005_rollups",
        include_str!("../../../migrations/postgres/0005_rollups.sql"),
    ),
    (
        6,
        "0006_cache_tokens",
        include_str!("../../../migrations/postgres/0006_cache_tokens.sql"),
    ),
    (
        7,
        "0007_window_holders",
        include_str!("../../../migrations/postgres/0007_window_holders.sql"),
    ),
];

/// The advisory lock that serializes migrations, one per schema (so ledgers in two
/// schemas of one database do not wait on each other).
const LOCK: &str = "SELECT pg_advisory_lock(hashtext('purser.migrate.' || current_schema()))";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtext('purser.migrate.' || current_schema()))";

pub fn latest() -> u32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

pub async fn current_version(client: &Client) -> Result<u32, LedgerError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    let v: i32 = client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    u32::try_from(v).map_err(|_| LedgerError::Corrupt(format!("schema version {v}")))
}

/// Apply every migration above the database's version; refuse a newer database.
pub async fn migrate(client: &mut Client) -> Result<u32, LedgerError> {
    migrate_to(client, latest()).await
}

/// Apply every migration above the database's version, up to `target` (tests and
/// benches build a ledger as an earlier version left it).
pub async fn migrate_to(client: &mut Client, target: u32) -> Result<u32, LedgerError> {
    client.batch_execute(LOCK).await?;
    let result = migrate_locked(client, target).await;
    // A failed unlock only matters while this session lives; the pool drops a broken one.
    let _ = client.batch_execute(UNLOCK).await;
    result
}

async fn migrate_locked(client: &mut Client, target: u32) -> Result<u32, LedgerError> {
    let have = current_version(client).await?;
    if have > latest() {
        return Err(LedgerError::TooNew {
            database: have,
            binary: latest(),
        });
    }
    for (version, name, sql) in MIGRATIONS {
        if version <= have || version > target {
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(sql)
            .await
            .map_err(|e| LedgerError::PgMigration { name, source: e })?;
        let v = i32::try_from(version).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&v, &name],
        )
        .await?;
        tx.commit().await?;
    }
    current_version(client).await
}
