//! Read-side queries on their own connections (audit, demo, CLI).

use std::path::Path;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde::Serialize;

use super::LedgerError;

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

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AttemptRow {
    pub seq: u32,
    pub provider: String,
    pub upstream_model: String,
    pub jurisdiction: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub state: String,
    pub status: Option<u16>,
    pub class: Option<String>,
    pub billing: String,
    pub decision: Option<String>,
    pub reason: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cost: String,
    pub worst_case: String,
    pub message: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequestRow {
    pub id: String,
    pub received_at: String,
    pub client: String,
    pub policy: String,
    pub plan_id: String,
    pub model: String,
    pub mode: String,
    pub ceiling: String,
    pub worst_case: String,
    pub outcome: String,
    pub error_code: Option<String>,
    pub served_by: Option<String>,
    pub cost: String,
    pub attempts: Vec<AttemptRow>,
}

pub fn request(conn: &Connection, id: &str) -> Result<Option<RequestRow>, LedgerError> {
    let row = conn
        .query_row(
            "SELECT id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, error_code, served_by, cost
             FROM requests WHERE id = ?1",
            params![id],
            |r| {
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
                    attempts: vec![],
                })
            },
        )
        .optional()?;
    let Some(mut row) = row else { return Ok(None) };
    row.attempts = conn
        .prepare_cached(
            "SELECT seq, provider, upstream_model, jurisdiction, started_at, finished_at, state, status, class, billing, decision,
             reason, input_tokens, output_tokens, cost, worst_case, message FROM attempts WHERE request_id = ?1 ORDER BY seq",
        )?
        .query_map(params![id], |r| {
            Ok(AttemptRow {
                seq: r.get(0)?,
                provider: r.get(1)?,
                upstream_model: r.get(2)?,
                jurisdiction: r.get(3)?,
                started_at: r.get(4)?,
                finished_at: r.get(5)?,
                state: r.get(6)?,
                status: r.get(7)?,
                class: r.get(8)?,
                billing: r.get(9)?,
                decision: r.get(10)?,
                reason: r.get(11)?,
                input_tokens: r.get(12)?,
                output_tokens: r.get(13)?,
                cost: r.get(14)?,
                worst_case: r.get(15)?,
                message: r.get(16)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(Some(row))
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BudgetRow {
    pub policy: String,
    pub period: String,
    pub window_start: String,
    pub limit: String,
    pub spent: String,
    pub reserved: String,
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
