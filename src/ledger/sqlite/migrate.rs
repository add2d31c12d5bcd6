//! SQLite: ordered, embedded schema migrations (`migrations/sqlite/`; the recorded
//! names predate the folder and stay as they are), each applied in its own transaction and
//! recorded in `schema_migrations`. A database newer than this binary is refused.

use rusqlite::Connection;

use crate::ledger::LedgerError;

/// (version, name, SQL), in order. Append only: never edit a released migration.
pub const MIGRATIONS: [(u32, &str, &str); 12] = [
    (
        1,
        "0001_init",
        include_str!("../../../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "0002_audit_indexes",
        include_str!("../../../migrations/sqlite/0002_audit_indexes.sql"),
    ),
    (
        3,
        "0003_audit",
        include_str!("../../../migrations/sqlite/0003_audit.sql"),
    ),
    (
        4,
        "0004_reservations_in_requests",
        include_str!("../../../migrations/sqlite/0004_reservations_in_requests.sql"),
    ),
    (
        5,
        "0005_cheaper_rows",
        include_str!("../../../migrations/sqlite/0005_cheaper_rows.sql"),
    ),
    (
        6,
        "0006_cost_basis",
        include_str!("../../../migrations/sqlite/0006_cost_basis.sql"),
    ),
    (
        7,
        "0007_ingress",
        include_str!("../../../migrations/sqlite/0007_ingress.sql"),
    ),
    (
        8,
        "0008_request_shape",
        include_str!("../../../migrations/sqlite/0008_request_shape.sql"),
    ),
    (
        9,
        "0009_rollups",
        include_str!("../../../migrations/sqlite/0009_rollups.sql"),
    ),
    (
        10,
        "0010_cache_tokens",
        include_str!("../../../migrations/sqlite/0010_cache_tokens.sql"),
    ),
    (
        11,
        "0011_rollup_deltas",
        include_str!("../../../migrations/sqlite/0011_rollup_deltas.sql"),
    ),
    (
        12,
        "0012_rollup_batching",
        include_str!("../../../migrations/sqlite/0012_rollup_batching.sql"),
    ),
];

pub fn latest() -> u32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

pub fn current_version(conn: &Connection) -> Result<u32, LedgerError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
    )?;
    Ok(conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )?)
}

/// The version of a database opened read-only (no table is created).
pub fn current_version_read(conn: &Connection) -> Result<u32, LedgerError> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE name = 'schema_migrations')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(0);
    }
    Ok(conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )?)
}

/// Apply every migration above the database's version, up to `target`.
pub fn migrate_to(conn: &mut Connection, target: u32) -> Result<u32, LedgerError> {
    let have = current_version(conn)?;
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
        let tx = conn.transaction()?;
        tx.execute_batch(sql)
            .map_err(|e| LedgerError::Migration { name, source: e })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%SZ','now'))",
            rusqlite::params![version, name],
        )?;
        tx.commit()?;
    }
    current_version(conn)
}
