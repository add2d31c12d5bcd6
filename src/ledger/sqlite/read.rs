//! Read-side queries on an SQLite ledger, each on its own read-only connection (audit,
//! demo, CLI).

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};

use crate::ledger::read::{AttemptRow, BudgetRow, RequestRow};
use crate::ledger::{LedgerError, StoredTurn};

pub fn open_reader(path: &Path) -> Result<Connection, LedgerError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.create_aggregate_function(
        "dsum",
        1,
        rusqlite::functions::FunctionFlags::SQLITE_UTF8
            | rusqlite::functions::FunctionFlags::SQLITE_DETERMINISTIC,
        super::DecimalSum,
    )?;
    Ok(conn)
}

/// The request columns `request_from_row` reads, in order, qualified by alias `r`.
pub(super) const REQUEST_COLUMNS_R: &str = "r.id, r.received_at, r.client, r.policy, r.plan_id, r.model, r.mode, r.ceiling, r.worst_case, \
     r.outcome, r.error_code, r.served_by, r.cost, r.ingress";

/// The attempt columns `attempt_from_row` reads, in order, qualified by alias `a`.
pub(super) const ATTEMPT_COLUMNS_A: &str = "a.seq, a.provider, a.upstream_model, a.jurisdiction, a.started_at, a.finished_at, a.state, a.status, \
     a.class, a.billing, a.decision, a.reason, a.input_tokens, a.output_tokens, a.cost, a.worst_case, a.message, a.cost_basis, \
     a.cache_read_tokens, a.cache_write_tokens, a.cache_write_5m_tokens, a.cache_write_1h_tokens, a.response_id";

pub(super) fn request_from_row(r: &Row<'_>) -> rusqlite::Result<RequestRow> {
    Ok(RequestRow {
        id: r.get(0)?,
        received_at: r.get(1)?,
        client: r.get(2)?,
        policy: r.get(3)?,
        plan_id: r.get(4)?,
        model: r.get(5)?,
        mode: r.get(6)?,
        ceiling: r.get(7)?,
        worst_case: r.get(8)?,
        outcome: r.get(9)?,
        error_code: r.get(10)?,
        served_by: r.get(11)?,
        cost: r.get(12)?,
        ingress: r.get(13)?,
        attempts: vec![],
    })
}

/// An attempt from `ATTEMPT_COLUMNS_A` starting at column `base`.
pub(super) fn attempt_from_row(r: &Row<'_>, base: usize) -> rusqlite::Result<AttemptRow> {
    Ok(AttemptRow {
        seq: r.get(base)?,
        provider: r.get(base + 1)?,
        upstream_model: r.get(base + 2)?,
        jurisdiction: r.get(base + 3)?,
        started_at: r.get(base + 4)?,
        finished_at: r.get(base + 5)?,
        state: r.get(base + 6)?,
        status: r.get(base + 7)?,
        class: r.get(base + 8)?,
        billing: r.get(base + 9)?,
        decision: r.get(base + 10)?,
        reason: r.get(base + 11)?,
        input_tokens: r.get(base + 12)?,
        output_tokens: r.get(base + 13)?,
        cost: r.get(base + 14)?,
        worst_case: r.get(base + 15)?,
        message: r.get(base + 16)?,
        cost_basis: r.get(base + 17)?,
        cache_read_tokens: r.get(base + 18)?,
        cache_write_tokens: r.get(base + 19)?,
        cache_write_5m_tokens: r.get(base + 20)?,
        cache_write_1h_tokens: r.get(base + 21)?,
        response_id: r.get(base + 22)?,
    })
}

/// A request's attempts in order.
pub(super) fn attempts_of(conn: &Connection, id: &str) -> rusqlite::Result<Vec<AttemptRow>> {
    conn.prepare_cached(&format!(
        "SELECT {ATTEMPT_COLUMNS_A} FROM attempts a WHERE a.request_id = ?1 ORDER BY a.seq"
    ))?
    .query_map(params![id], |r| attempt_from_row(r, 0))?
    .collect()
}

pub fn request(conn: &Connection, id: &str) -> Result<Option<RequestRow>, LedgerError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS_R} FROM requests r WHERE r.id = ?1"
        ))?
        .query_row(params![id], request_from_row)
        .optional()?;
    let Some(mut row) = row else { return Ok(None) };
    row.attempts = attempts_of(conn, id)?;
    Ok(Some(row))
}

pub fn budgets(conn: &Connection) -> Result<Vec<BudgetRow>, LedgerError> {
    Ok(conn
        .prepare("SELECT policy, period, window_start, limit_amount, spent, reserved FROM budget_windows ORDER BY policy, period, window_start DESC")?
        .query_map([], |r| {
            Ok(BudgetRow { policy: r.get(0)?, period: r.get(1)?, window_start: r.get(2)?, limit: r.get(3)?, spent: r.get(4)?, reserved: r.get(5)? })
        })?
        .collect::<Result<_, _>>()?)
}

/// Exact total of billed attempt costs.
pub fn total_cost(conn: &Connection) -> Result<String, LedgerError> {
    Ok(
        conn.query_row("SELECT COALESCE(dsum(cost), '0') FROM attempts", [], |r| {
            r.get(0)
        })?,
    )
}

/// The attempt of `policy` that recorded the stored response `response_id`, if any
/// (served by the partial index on `response_id`).
pub fn stored_turn(
    conn: &Connection,
    response_id: &str,
    policy: &str,
) -> Result<Option<StoredTurn>, LedgerError> {
    let row = conn
        .prepare_cached(
            "SELECT a.request_id, a.provider, a.upstream_model, a.input_tokens, a.output_tokens,
                    a.response_items
             FROM attempts a JOIN requests r ON r.id = a.request_id
             WHERE a.response_id = ?1 AND r.policy = ?2
             ORDER BY a.finished_at DESC LIMIT 1",
        )?
        .query_row(params![response_id, policy], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<i64>>(3)?,
                r.get::<_, Option<i64>>(4)?,
                r.get::<_, Option<i64>>(5)?,
            ))
        })
        .optional()?;
    let count = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok());
    Ok(row.map(
        |(request_id, provider, upstream_model, i, o, items)| StoredTurn {
            request_id,
            provider,
            upstream_model,
            input_tokens: count(i),
            output_tokens: count(o),
            output_items: count(items).unwrap_or(0),
        },
    ))
}
