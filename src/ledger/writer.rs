//! The writer: applies operations in groups, one transaction per group; a group
//! spoiled by one failing operation is redone one operation per transaction.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, TryLockError};

use tokio::sync::oneshot;

use super::{
    AttemptResult, BudgetLimit, LedgerError, NewAttempt, NewRequest, Recovered, RequestResult,
    rfc3339, window_start,
};
use crate::money::Money;

/// Most operations committed together; bounds the latency one commit adds.
const MAX_GROUP: usize = 1024;

#[derive(Debug)]
pub enum Op {
    Admit {
        req: NewRequest,
        budgets: Vec<BudgetLimit>,
        /// The first attempt, written with the admission (one commit instead of two).
        first: Option<NewAttempt>,
    },
    Refusal {
        req: NewRequest,
        error_code: String,
    },
    BeginAttempt(NewAttempt),
    FinishAttempt(AttemptResult),
    FinishRequest(RequestResult),
    /// The last attempt and its request, completed together.
    Finish(AttemptResult, RequestResult),
    Settle {
        request_id: String,
        cost: Money,
    },
}

pub struct Envelope {
    pub op: Op,
    pub reply: oneshot::Sender<Result<(), LedgerError>>,
}

/// The write connection and the operations waiting for it. There is no writer
/// thread: whichever caller finds the connection free commits everything queued so
/// far as one group, on its own thread. A request thus costs no thread hand-off, and
/// concurrent requests still share commits (see `Ledger::call`).
pub struct Writer {
    queue: Mutex<Vec<Envelope>>,
    conn: Mutex<Connection>,
    /// Whether the last group could write at all (readiness).
    writable: AtomicBool,
}

impl Writer {
    pub fn new(conn: Connection) -> Self {
        Writer {
            queue: Mutex::new(Vec::new()),
            conn: Mutex::new(conn),
            writable: AtomicBool::new(true),
        }
    }

    pub fn writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }

    pub fn enqueue(&self, env: Envelope) {
        lock(&self.queue).push(env);
    }

    /// Commit every queued operation, in groups of at most `MAX_GROUP`. Returns at
    /// once when another thread holds the connection: that thread looks at the queue
    /// again after releasing it, so nothing queued is left behind.
    pub fn flush(&self) {
        loop {
            {
                let mut conn = match self.conn.try_lock() {
                    Ok(c) => c,
                    // A panic mid-group dropped its transaction, which rolled back:
                    // the connection itself is sound.
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => return,
                };
                loop {
                    let group: Vec<Envelope> = {
                        let mut q = lock(&self.queue);
                        let n = q.len().min(MAX_GROUP);
                        q.drain(..n).collect()
                    };
                    if group.is_empty() {
                        break;
                    }
                    self.commit(&mut conn, group);
                }
            }
            // An operation queued after the last drain, whose caller found the
            // connection taken, is ours to commit.
            if lock(&self.queue).is_empty() {
                return;
            }
        }
    }

    fn commit(&self, conn: &mut Connection, group: Vec<Envelope>) {
        let results = apply_group(conn, &group);
        // Refusals of the operation itself (a budget, an unknown id) say nothing about
        // the disk; an SQLite failure of every operation does.
        let wrote = results
            .iter()
            .any(|r| !matches!(r, Err(LedgerError::Sqlite(_) | LedgerError::RolledBack)));
        self.writable.store(wrote, Ordering::Relaxed);
        for (env, res) in group.into_iter().zip(results) {
            let _ = env.reply.send(res);
        }
    }
}

/// The queue's lock is held only to push or drain, never across a panic point that
/// matters: a poisoned queue is still a valid queue.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One transaction for the whole group. An operation that fails for any reason other
/// than a refused budget spoils the group: it is rolled back and every operation is
/// then applied in its own transaction, so each caller learns its own fate and no
/// operation is ever half-applied. (Per-operation savepoints gave the same guarantee
/// at a cost on every operation; failures are rare, so the group pays only then.)
fn apply_group(conn: &mut Connection, group: &[Envelope]) -> Vec<Result<(), LedgerError>> {
    match try_group(conn, group) {
        Some(results) => results,
        None => group.iter().map(|env| apply_alone(conn, &env.op)).collect(),
    }
}

/// `None` when an operation failed and the group was rolled back.
fn try_group(conn: &mut Connection, group: &[Envelope]) -> Option<Vec<Result<(), LedgerError>>> {
    let tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            return Some(
                group
                    .iter()
                    .map(|_| Err(LedgerError::Sqlite(clone_err(&e))))
                    .collect(),
            );
        }
    };
    let mut results = Vec::with_capacity(group.len());
    for env in group {
        match apply_op(&tx, &env.op) {
            r @ (Ok(()) | Err(LedgerError::BudgetExhausted { .. })) => results.push(r),
            Err(_) => return None, // dropping `tx` rolls the group back
        }
    }
    match tx.commit() {
        Ok(()) => Some(results),
        // Nothing in the group is durable: every caller is told, and fails closed.
        Err(e) => Some(
            results
                .into_iter()
                .map(|_| Err(LedgerError::Sqlite(clone_err(&e))))
                .collect(),
        ),
    }
}

fn apply_alone(conn: &mut Connection, op: &Op) -> Result<(), LedgerError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let r = apply_op(&tx, op);
    match r {
        // A refused budget is recorded (the refused request row says why).
        Ok(()) | Err(LedgerError::BudgetExhausted { .. }) => {
            tx.commit()?;
            r
        }
        Err(e) => Err(e),
    }
}

fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e.sqlite_error() {
        Some(s) => rusqlite::Error::SqliteFailure(*s, Some(e.to_string())),
        None => rusqlite::Error::InvalidQuery,
    }
}

fn apply_op(tx: &Transaction<'_>, op: &Op) -> Result<(), LedgerError> {
    match op {
        Op::Admit {
            req,
            budgets,
            first,
        } => admit(tx, req, budgets).and_then(|()| match first {
            Some(a) => begin_attempt(tx, a),
            None => Ok(()),
        }),
        Op::Refusal { req, error_code } => insert_request(tx, req, "refused", Some(error_code)),
        Op::BeginAttempt(a) => begin_attempt(tx, a),
        Op::FinishAttempt(r) => finish_attempt(tx, r),
        Op::FinishRequest(r) => finish_request(tx, r),
        Op::Finish(a, r) => finish_attempt(tx, a).and_then(|()| finish_request(tx, r)),
        Op::Settle { request_id, cost } => settle(tx, request_id, *cost),
    }
}

fn insert_request(
    tx: &Transaction<'_>,
    r: &NewRequest,
    outcome: &str,
    error_code: Option<&str>,
) -> Result<(), LedgerError> {
    let ms = r.received_at.unix_timestamp_nanos() / 1_000_000;
    tx.prepare_cached(
        "INSERT INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, error_code, ledger_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, (SELECT COALESCE(MAX(ledger_seq), 0) + 1 FROM requests))",
    )?
    .execute(params![
        r.id,
        rfc3339(r.received_at),
        i64::try_from(ms).unwrap_or(i64::MAX),
        r.client,
        r.policy,
        r.plan_id,
        r.model,
        r.mode.as_str(),
        r.ceiling.to_string(),
        r.worst_case.to_string(),
        outcome,
        error_code,
    ])?;
    Ok(())
}

fn money_col(s: String) -> Result<Money, LedgerError> {
    s.parse()
        .map_err(|_| LedgerError::Corrupt(format!("amount `{s}`")))
}

/// (spent, reserved) of one budget window.
fn window(
    tx: &Transaction<'_>,
    policy: &str,
    period: &str,
    start: &str,
) -> Result<(Money, Money), LedgerError> {
    let (spent, reserved): (String, String) = tx
        .prepare_cached("SELECT spent, reserved FROM budget_windows WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
        .query_row(params![policy, period, start], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((money_col(spent)?, money_col(reserved)?))
}

/// The window's spent and reserved, creating the window on its first request and
/// recording the limit only when the plan changed it (most admissions write nothing
/// here).
fn open_window(
    tx: &Transaction<'_>,
    policy: &str,
    b: &BudgetLimit,
    start: &str,
) -> Result<(Money, Money), LedgerError> {
    let period = b.period.as_str();
    let stored: Option<(String, String, String)> = tx
        .prepare_cached("SELECT spent, reserved, limit_amount FROM budget_windows WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
        .query_row(params![policy, period, start], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((spent, reserved, limit)) = stored else {
        tx.prepare_cached("INSERT INTO budget_windows (policy, period, window_start, limit_amount) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![policy, period, start, b.limit.to_string()])?;
        return Ok((Money::ZERO, Money::ZERO));
    };
    if money_col(limit)? != b.limit {
        tx.prepare_cached("UPDATE budget_windows SET limit_amount = ?4 WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
            .execute(params![policy, period, start, b.limit.to_string()])?;
    }
    Ok((money_col(spent)?, money_col(reserved)?))
}

fn set_window(
    tx: &Transaction<'_>,
    policy: &str,
    period: &str,
    start: &str,
    spent: Money,
    reserved: Money,
) -> Result<(), LedgerError> {
    tx.prepare_cached("UPDATE budget_windows SET spent = ?4, reserved = ?5 WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
        .execute(params![policy, period, start, spent.to_string(), reserved.to_string()])?;
    Ok(())
}

fn admit(
    tx: &Transaction<'_>,
    req: &NewRequest,
    budgets: &[BudgetLimit],
) -> Result<(), LedgerError> {
    let mut windows = Vec::with_capacity(budgets.len());
    for b in budgets {
        let start = window_start(b.period, req.received_at);
        let (spent, reserved) = open_window(tx, &req.policy, b, &start)?;
        if spent + reserved + req.worst_case > b.limit {
            insert_request(tx, req, "refused", Some("budget_exhausted"))?;
            return Err(LedgerError::BudgetExhausted {
                policy: req.policy.clone(),
                period: b.period.as_str(),
                limit: b.limit,
                spent,
                reserved,
                remaining: b.limit.saturating_sub(spent + reserved),
                needed: req.worst_case,
            });
        }
        windows.push((b.period, start, spent, reserved));
    }
    insert_request(tx, req, "in_flight", None)?;
    for (period, start, spent, reserved) in windows {
        set_window(
            tx,
            &req.policy,
            period.as_str(),
            &start,
            spent,
            reserved + req.worst_case,
        )?;
        tx.prepare_cached("INSERT INTO reservations (request_id, policy, period, window_start, amount, state) VALUES (?1, ?2, ?3, ?4, ?5, 'held')")?
            .execute(params![req.id, req.policy, period.as_str(), start, req.worst_case.to_string()])?;
    }
    Ok(())
}

fn begin_attempt(tx: &Transaction<'_>, a: &NewAttempt) -> Result<(), LedgerError> {
    tx.prepare_cached(
        "INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, state, billing, worst_case)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'in_flight', 'maybe_billed', ?7)",
    )?
    .execute(params![a.request_id, a.seq, a.provider, a.upstream_model, a.jurisdiction, rfc3339(a.started_at), a.worst_case.to_string()])?;
    Ok(())
}

fn finish_attempt(tx: &Transaction<'_>, r: &AttemptResult) -> Result<(), LedgerError> {
    let n = tx
        .prepare_cached(
            "UPDATE attempts SET finished_at = ?3, state = 'done', status = ?4, class = ?5, billing = ?6, decision = ?7, reason = ?8,
             input_tokens = ?9, output_tokens = ?10, cost = ?11, message = ?12 WHERE request_id = ?1 AND seq = ?2",
        )?
        .execute(params![
            r.request_id,
            r.seq,
            rfc3339(r.finished_at),
            r.status,
            r.class,
            r.billing.as_str(),
            r.decision,
            r.reason,
            r.input_tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            r.output_tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            r.cost.to_string(),
            r.message,
        ])?;
    if n == 0 {
        return Err(LedgerError::UnknownRequest(format!(
            "{}#{}",
            r.request_id, r.seq
        )));
    }
    Ok(())
}

/// Replace the request's held reservations with `charged`.
fn release(
    tx: &Transaction<'_>,
    request_id: &str,
    charged: Money,
    states: &[&str],
) -> Result<(), LedgerError> {
    let rows: Vec<(String, String, String, String, String)> = tx
        .prepare_cached("SELECT policy, period, window_start, amount, state FROM reservations WHERE request_id = ?1")?
        .query_map(params![request_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?
        .collect::<Result<_, _>>()?;
    for (policy, period, start, amount, state) in rows {
        if !states.contains(&state.as_str()) {
            continue;
        }
        let amount = money_col(amount)?;
        let (mut spent, mut reserved) = window(tx, &policy, &period, &start)?;
        if state == "held" {
            reserved = reserved.saturating_sub(amount);
        } else {
            // An interrupted reservation was moved to spent at recovery.
            spent = spent.saturating_sub(amount);
        }
        spent = spent + charged;
        set_window(tx, &policy, &period, &start, spent, reserved)?;
        tx.prepare_cached("UPDATE reservations SET state = 'settled', amount = ?3 WHERE request_id = ?1 AND period = ?2")?
            .execute(params![request_id, period, charged.to_string()])?;
    }
    Ok(())
}

fn finish_request(tx: &Transaction<'_>, r: &RequestResult) -> Result<(), LedgerError> {
    let n = tx
        .prepare_cached("UPDATE requests SET outcome = ?2, error_code = ?3, served_by = ?4, cost = ?5 WHERE id = ?1")?
        .execute(params![r.request_id, r.outcome.as_str(), r.error_code, r.served_by, r.cost.to_string()])?;
    if n == 0 {
        return Err(LedgerError::UnknownRequest(r.request_id.clone()));
    }
    release(tx, &r.request_id, r.charged, &["held"])
}

/// Operator settlement of an interrupted request: `cost` is what its interrupted
/// attempt(s) really cost (from the vendor's usage records). That attempt becomes
/// `billed` (or `not_billed` at zero), the request's cost becomes the exact billed
/// total, and its budget reservations settle to that total.
pub(super) fn settle(
    tx: &Transaction<'_>,
    request_id: &str,
    cost: Money,
) -> Result<(), LedgerError> {
    let not_settleable = |why: String| LedgerError::NotSettleable {
        request_id: request_id.to_string(),
        why,
    };
    let outcome: Option<String> = tx
        .query_row(
            "SELECT outcome FROM requests WHERE id = ?1",
            params![request_id],
            |r| r.get(0),
        )
        .optional()?;
    match outcome.as_deref() {
        None => return Err(LedgerError::UnknownRequest(request_id.to_string())),
        Some("interrupted") => {}
        Some(other) => {
            return Err(not_settleable(format!(
                "it is `{other}`; only interrupted requests are settled by hand"
            )));
        }
    }
    let open: Vec<u32> = tx
        .prepare("SELECT seq FROM attempts WHERE request_id = ?1 AND state = 'interrupted' AND billing = 'maybe_billed' ORDER BY seq")?
        .query_map(params![request_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let unsettled: i64 = tx.query_row(
        "SELECT count(*) FROM reservations WHERE request_id = ?1 AND state IN ('interrupted', 'held')",
        params![request_id],
        |r| r.get(0),
    )?;
    if open.is_empty() && unsettled == 0 {
        return Err(not_settleable("it is already settled".into()));
    }
    if open.is_empty() && cost.is_positive() {
        return Err(not_settleable(
            "no attempt of it may have been billed, so its cost can only be settled to 0".into(),
        ));
    }
    for (i, seq) in open.iter().enumerate() {
        let (amount, billing) = match (i, cost.is_positive()) {
            (0, true) => (cost, "billed"),
            _ => (Money::ZERO, "not_billed"),
        };
        tx.execute(
            "UPDATE attempts SET billing = ?3, cost = ?4,
             reason = reason || '; settled by an operator to ' || ?4 WHERE request_id = ?1 AND seq = ?2",
            params![request_id, seq, billing, amount.to_string()],
        )?;
    }
    let total: String = tx.query_row(
        "SELECT COALESCE(dsum(cost), '0') FROM attempts WHERE request_id = ?1",
        params![request_id],
        |r| r.get(0),
    )?;
    let total = money_col(total)?;
    tx.execute(
        "UPDATE requests SET cost = ?2 WHERE id = ?1",
        params![request_id, total.to_string()],
    )?;
    release(tx, request_id, total, &["interrupted", "held"])
}

/// Rows a previous process left in flight become `interrupted` / `maybe_billed`, and
/// their reservations stay counted (moved to spent) until an operator settles them.
pub fn recover(conn: &mut Connection) -> Result<Recovered, LedgerError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let attempts = tx.execute(
        "UPDATE attempts SET state = 'interrupted', billing = 'maybe_billed', decision = 'stop',
         reason = 'the gateway stopped while this attempt was in flight; the upstream may have billed it'
         WHERE state = 'in_flight'",
        [],
    )?;
    let ids: Vec<String> = tx
        .prepare("SELECT id FROM requests WHERE outcome = 'in_flight'")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for id in &ids {
        tx.execute(
            "UPDATE requests SET outcome = 'interrupted' WHERE id = ?1",
            params![id],
        )?;
        let held: Vec<(String, String, String, String)> = tx
            .prepare("SELECT policy, period, window_start, amount FROM reservations WHERE request_id = ?1 AND state = 'held'")?
            .query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<Result<_, _>>()?;
        for (policy, period, start, amount) in held {
            let amount = money_col(amount)?;
            let (spent, reserved) = window(&tx, &policy, &period, &start)?;
            set_window(
                &tx,
                &policy,
                &period,
                &start,
                spent + amount,
                reserved.saturating_sub(amount),
            )?;
            tx.execute("UPDATE reservations SET state = 'interrupted' WHERE request_id = ?1 AND period = ?2", params![id, period])?;
        }
    }
    tx.commit()?;
    Ok(Recovered {
        attempts,
        requests: ids.len(),
    })
}
