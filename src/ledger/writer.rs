//! The writer: applies operations in groups, one transaction per group; a group
//! spoiled by one failing operation is redone one operation per transaction.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, TryLockError};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use super::{
    AttemptResult, BudgetLimit, LedgerError, NewAttempt, NewRequest, Recovered, RequestResult,
    rfc3339, window_start,
};
use crate::money::Money;
use crate::pricing::CostBasis;

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
    TopUp {
        request_id: String,
        extra: Money,
    },
    Interrupt {
        request_id: String,
        reason: String,
    },
    Probe,
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
    conn: Mutex<(Connection, Books)>,
    /// Whether the last group could write at all (readiness).
    writable: AtomicBool,
}

impl Writer {
    pub fn new(conn: Connection) -> Self {
        Writer {
            queue: Mutex::new(Vec::new()),
            conn: Mutex::new((conn, Books::default())),
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
                let (conn, books) = &mut *conn;
                loop {
                    let group: Vec<Envelope> = {
                        let mut q = lock(&self.queue);
                        let n = q.len().min(MAX_GROUP);
                        q.drain(..n).collect()
                    };
                    if group.is_empty() {
                        break;
                    }
                    self.commit(conn, books, group);
                }
            }
            // An operation queued after the last drain, whose caller found the
            // connection taken, is ours to commit.
            if lock(&self.queue).is_empty() {
                return;
            }
        }
    }

    fn commit(&self, conn: &mut Connection, books: &mut Books, group: Vec<Envelope>) {
        let results = apply_group(conn, books, &group);
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
fn apply_group(
    conn: &mut Connection,
    books: &mut Books,
    group: &[Envelope],
) -> Vec<Result<(), LedgerError>> {
    match try_group(conn, books, group) {
        Some(results) => results,
        None => group
            .iter()
            .map(|env| apply_alone(conn, books, &env.op))
            .collect(),
    }
}

/// The writer's transaction: `BEGIN IMMEDIATE` and `COMMIT` from the statement cache
/// (rusqlite's `Transaction` parses both again each time, about 5% of a request's
/// CPU in the gateway benchmark). Rolled back when dropped uncommitted.
struct Tx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> Tx<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Tx<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Tx { conn, open: true })
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            // Fails only when SQLite already rolled back on its own (a failed COMMIT).
            let _ = self
                .conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut st| st.execute([]));
        }
    }
}

/// `None` when an operation failed and the group was rolled back.
fn try_group(
    conn: &mut Connection,
    books: &mut Books,
    group: &[Envelope],
) -> Option<Vec<Result<(), LedgerError>>> {
    let failed = |e: &rusqlite::Error| {
        group
            .iter()
            .map(|_| Err(LedgerError::Sqlite(clone_err(e))))
            .collect()
    };
    let tx = match Tx::begin(conn) {
        Ok(tx) => tx,
        Err(e) => return Some(failed(&e)),
    };
    if let Err(e) = books.check(&tx) {
        return Some(failed(&e));
    }
    let mut results = Vec::with_capacity(group.len());
    for env in group {
        match apply_op(&tx, books, &env.op) {
            r @ (Ok(()) | Err(LedgerError::BudgetExhausted { .. })) => results.push(r),
            Err(_) => {
                books.forget();
                return None; // dropping `tx` rolls the group back
            }
        }
    }
    match books.write(&tx).and_then(|()| tx.commit()) {
        Ok(()) => Some(results),
        // Nothing in the group is durable: every caller is told, and fails closed.
        Err(e) => {
            books.forget();
            Some(failed(&e))
        }
    }
}

fn apply_alone(conn: &mut Connection, books: &mut Books, op: &Op) -> Result<(), LedgerError> {
    let tx = Tx::begin(conn)?;
    books.check(&tx)?;
    let r = apply_op(&tx, books, op);
    // A refused budget is recorded (the refused request row says why).
    let keep = matches!(r, Ok(()) | Err(LedgerError::BudgetExhausted { .. }));
    let done = if keep {
        books
            .write(&tx)
            .and_then(|()| tx.commit())
            .map_err(Into::into)
    } else {
        Ok(())
    };
    if !keep || done.is_err() {
        books.forget();
    }
    done.and(r)
}

/// Budget windows and what in-flight requests hold in them, kept in memory by the one
/// writer so that an admission and a settlement need not read them back: each window
/// touched by a group is written once, when the group commits. The copy is dropped whenever it may
/// be wrong: after a rollback, and when another connection (`purser settle`) has
/// written to the file since this one last looked.
#[derive(Default)]
pub(super) struct Books {
    windows: HashMap<WindowKey, Window>,
    /// What requests still in flight hold, as admitted by this writer.
    held: HashMap<String, Holding>,
    /// SQLite's `data_version` when the books were last known right.
    seen: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WindowKey {
    policy: String,
    period: String,
    start: String,
}

#[derive(Debug)]
struct Window {
    /// `None` while the stored limit is unknown (a window first read to settle).
    limit: Option<Money>,
    spent: Money,
    reserved: Money,
    dirty: bool,
}

/// A bound on what the books keep; past it they start over from the file.
const BOOKS_MAX: usize = 100_000;

impl Books {
    /// Start of a transaction (the write lock is held): forget everything if another
    /// connection has committed since.
    fn check(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        let version: i64 = tx
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        if self.seen != Some(version)
            || self.windows.len() > BOOKS_MAX
            || self.held.len() > BOOKS_MAX
        {
            self.forget();
            self.seen = Some(version);
        }
        Ok(())
    }

    fn forget(&mut self) {
        self.windows.clear();
        self.held.clear();
        self.seen = None;
    }

    /// The window, read from the file the first time it is needed.
    fn window(&mut self, tx: &Connection, key: &WindowKey) -> Result<&mut Window, LedgerError> {
        if !self.windows.contains_key(key) {
            let stored: Option<(String, String, String)> = tx
                .prepare_cached("SELECT spent, reserved, limit_amount FROM budget_windows WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
                .query_row(params![key.policy, key.period, key.start], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let w = match stored {
                Some((spent, reserved, limit)) => Window {
                    limit: Some(money_col(limit)?),
                    spent: money_col(spent)?,
                    reserved: money_col(reserved)?,
                    dirty: false,
                },
                None => Window {
                    limit: None,
                    spent: Money::ZERO,
                    reserved: Money::ZERO,
                    dirty: true,
                },
            };
            self.windows.insert(key.clone(), w);
        }
        self.windows
            .get_mut(key)
            .ok_or_else(|| LedgerError::Corrupt("budget window vanished from memory".into()))
    }

    /// Write every window changed since the last commit, inside `tx`.
    pub(super) fn write(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        for (key, w) in self.windows.iter_mut().filter(|(_, w)| w.dirty) {
            let Some(limit) = w.limit else {
                // Settled against a window the file never had: nothing to record it under.
                continue;
            };
            tx.prepare_cached(
                "INSERT INTO budget_windows (policy, period, window_start, limit_amount, spent, reserved)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (policy, period, window_start)
                 DO UPDATE SET limit_amount = excluded.limit_amount, spent = excluded.spent, reserved = excluded.reserved",
            )?
            .execute(params![key.policy, key.period, key.start, limit.to_string(), w.spent.to_string(), w.reserved.to_string()])?;
            w.dirty = false;
        }
        Ok(())
    }
}

fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e.sqlite_error() {
        Some(s) => rusqlite::Error::SqliteFailure(*s, Some(e.to_string())),
        None => rusqlite::Error::InvalidQuery,
    }
}

fn apply_op(tx: &Connection, books: &mut Books, op: &Op) -> Result<(), LedgerError> {
    match op {
        Op::Admit {
            req,
            budgets,
            first,
        } => admit(tx, books, req, budgets).and_then(|()| match first {
            Some(a) => begin_attempt(tx, a),
            None => Ok(()),
        }),
        Op::Refusal { req, error_code } => {
            insert_request(tx, req, "refused", Some(error_code), None)
        }
        Op::BeginAttempt(a) => begin_attempt(tx, a),
        Op::FinishAttempt(r) => finish_attempt(tx, r),
        Op::FinishRequest(r) => finish_request(tx, books, r),
        Op::Finish(a, r) => finish_attempt(tx, a).and_then(|()| finish_request(tx, books, r)),
        Op::Settle { request_id, cost } => settle(tx, books, request_id, *cost),
        Op::TopUp { request_id, extra } => top_up(tx, books, request_id, *extra),
        Op::Interrupt { request_id, reason } => interrupt(tx, books, request_id, reason),
        Op::Probe => {
            tx.prepare_cached("INSERT INTO liveness (id, at) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET at = excluded.at")?
                .execute(params![rfc3339(time::OffsetDateTime::now_utc())])?;
            Ok(())
        }
    }
}

fn insert_request(
    tx: &Connection,
    r: &NewRequest,
    outcome: &str,
    error_code: Option<&str>,
    reserved_in: Option<&str>,
) -> Result<(), LedgerError> {
    let ms = r.received_at.unix_timestamp_nanos() / 1_000_000;
    tx.prepare_cached(
        "INSERT INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, error_code, reserved_in)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
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
        reserved_in,
    ])?;
    Ok(())
}

fn money_col(s: String) -> Result<Money, LedgerError> {
    s.parse()
        .map_err(|_| LedgerError::Corrupt(format!("amount `{s}`")))
}

fn admit(
    tx: &Connection,
    books: &mut Books,
    req: &NewRequest,
    budgets: &[BudgetLimit],
) -> Result<(), LedgerError> {
    let mut keys = Vec::with_capacity(budgets.len());
    for b in budgets {
        let key = WindowKey {
            policy: req.policy.clone(),
            period: b.period.as_str().to_string(),
            start: window_start(b.period, req.received_at),
        };
        let w = books.window(tx, &key)?;
        // The limit is recorded as the plan has it now (a reload may have changed it).
        if w.limit != Some(b.limit) {
            w.limit = Some(b.limit);
            w.dirty = true;
        }
        let (spent, reserved) = (w.spent, w.reserved);
        if spent + reserved + req.worst_case > b.limit {
            insert_request(tx, req, "refused", Some("budget_exhausted"), None)?;
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
        keys.push(key);
    }
    let reserved_in = (!keys.is_empty()).then(|| reserved_in(&keys));
    insert_request(tx, req, "in_flight", None, reserved_in.as_deref())?;
    for key in &keys {
        let w = books.window(tx, key)?;
        w.reserved = w.reserved + req.worst_case;
        w.dirty = true;
    }
    if !keys.is_empty() {
        let h = Holding {
            windows: keys,
            amount: req.worst_case,
            interrupted: false,
        };
        books.held.insert(req.id.clone(), h);
    }
    Ok(())
}

fn begin_attempt(tx: &Connection, a: &NewAttempt) -> Result<(), LedgerError> {
    tx.prepare_cached(
        "INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, state, billing, worst_case)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'in_flight', 'maybe_billed', ?7)",
    )?
    .execute(params![a.request_id, a.seq, a.provider, a.upstream_model, a.jurisdiction, rfc3339(a.started_at), a.worst_case.to_string()])?;
    Ok(())
}

fn finish_attempt(tx: &Connection, r: &AttemptResult) -> Result<(), LedgerError> {
    let n = tx
        .prepare_cached(
            "UPDATE attempts SET finished_at = ?3, state = 'done', status = ?4, class = ?5, billing = ?6, decision = ?7, reason = ?8,
             input_tokens = ?9, output_tokens = ?10, cost = ?11, message = ?12, cost_basis = ?13 WHERE request_id = ?1 AND seq = ?2",
        )?
        .execute(params![
            r.request_id,
            r.seq,
            rfc3339(r.finished_at),
            r.status,
            r.class_name(),
            r.billing.as_str(),
            r.decision.as_str(),
            r.reason,
            r.input_tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            r.output_tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            r.cost.to_string(),
            r.message,
            r.cost_basis.map(CostBasis::as_str),
        ])?;
    if n == 0 {
        return Err(LedgerError::UnknownRequest(format!(
            "{}#{}",
            r.request_id, r.seq
        )));
    }
    Ok(())
}

/// A request's reservation is its worst case, held in the budget windows it names in
/// `requests.reserved_in` ("day@<start> month@<start>"): in `reserved` while it is in
/// flight, moved to `spent` when recovery found it interrupted, and cleared (NULL)
/// once settled. It lives in the request row, which admission writes anyway: a table
/// of its own cost two more B-tree writes per request.
fn reserved_in(keys: &[WindowKey]) -> String {
    keys.iter()
        .map(|k| format!("{}@{}", k.period, k.start))
        .collect::<Vec<_>>()
        .join(" ")
}

fn reserved_windows(policy: &str, reserved_in: &str) -> Result<Vec<WindowKey>, LedgerError> {
    reserved_in
        .split(' ')
        .map(|w| {
            let (period, start) = w
                .split_once('@')
                .ok_or_else(|| LedgerError::Corrupt(format!("reserved_in `{reserved_in}`")))?;
            Ok(WindowKey {
                policy: policy.to_string(),
                period: period.to_string(),
                start: start.to_string(),
            })
        })
        .collect()
}

/// What a request still holds in its budget windows, as stored.
struct Holding {
    windows: Vec<WindowKey>,
    amount: Money,
    /// Moved to `spent` by recovery, rather than held in `reserved`.
    interrupted: bool,
}

fn holding(tx: &Connection, request_id: &str) -> Result<Option<Holding>, LedgerError> {
    let row: Option<(String, String, Option<String>, String)> = tx
        .prepare_cached(
            "SELECT policy, COALESCE(reserved_amount, worst_case), reserved_in, outcome FROM requests WHERE id = ?1",
        )?
        .query_row(params![request_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    let Some((policy, worst, Some(reserved_in), outcome)) = row else {
        return Ok(None);
    };
    Ok(Some(Holding {
        windows: reserved_windows(&policy, &reserved_in)?,
        amount: money_col(worst)?,
        interrupted: outcome == "interrupted",
    }))
}

/// Replace what the request holds in its budget windows with `charged`.
fn release(
    books: &mut Books,
    tx: &Connection,
    h: Holding,
    charged: Money,
) -> Result<(), LedgerError> {
    for key in h.windows {
        let w = books.window(tx, &key)?;
        if h.interrupted {
            w.spent = w.spent.saturating_sub(h.amount);
        } else {
            w.reserved = w.reserved.saturating_sub(h.amount);
        }
        w.spent = w.spent + charged;
        w.dirty = true;
    }
    Ok(())
}

fn finish_request(
    tx: &Connection,
    books: &mut Books,
    r: &RequestResult,
) -> Result<(), LedgerError> {
    let held = match books.held.remove(&r.request_id) {
        Some(h) => Some(h),
        None => holding(tx, &r.request_id)?,
    };
    let n = tx
        .prepare_cached("UPDATE requests SET outcome = ?2, error_code = ?3, served_by = ?4, cost = ?5, reserved_in = NULL WHERE id = ?1")?
        .execute(params![r.request_id, r.outcome.as_str(), r.error_code, r.served_by, r.cost.to_string()])?;
    if n == 0 {
        return Err(LedgerError::UnknownRequest(r.request_id.clone()));
    }
    match held {
        Some(h) => release(books, tx, h, r.charged),
        None => Ok(()),
    }
}

/// Operator settlement of an interrupted request: `cost` is what its interrupted
/// attempt(s) really cost (from the vendor's usage records). That attempt becomes
/// `billed` (or `not_billed` at zero), the request's cost becomes the exact billed
/// total, and its budget reservations settle to that total.
pub(super) fn settle(
    tx: &Connection,
    books: &mut Books,
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
    let held = holding(tx, request_id)?;
    if open.is_empty() && held.is_none() {
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
        "UPDATE requests SET cost = ?2, reserved_in = NULL WHERE id = ?1",
        params![request_id, total.to_string()],
    )?;
    match held {
        Some(h) => release(books, tx, h, total),
        None => Ok(()),
    }
}

/// Raise the request's holding by `extra` in every window it names, all or nothing.
/// A request that holds nothing (its policy has no budgets) has nothing to raise.
fn top_up(
    tx: &Connection,
    books: &mut Books,
    request_id: &str,
    extra: Money,
) -> Result<(), LedgerError> {
    let held = match books.held.remove(request_id) {
        Some(h) => Some(h),
        None => holding(tx, request_id)?,
    };
    let Some(mut h) = held else {
        return Ok(());
    };
    if !extra.is_positive() || h.interrupted {
        books.held.insert(request_id.to_string(), h);
        return Ok(());
    }
    // Check every window first: a refusal must leave all of them as they were.
    let mut refusal = None;
    for key in &h.windows {
        let w = books.window(tx, key)?;
        let limit = w.limit.unwrap_or(Money::ZERO);
        if w.spent + w.reserved + extra > limit {
            refusal = Some(LedgerError::BudgetExhausted {
                policy: key.policy.clone(),
                period: period_name(&key.period),
                limit,
                spent: w.spent,
                reserved: w.reserved,
                remaining: limit.saturating_sub(w.spent + w.reserved),
                needed: extra,
            });
            break;
        }
    }
    if let Some(e) = refusal {
        books.held.insert(request_id.to_string(), h);
        return Err(e);
    }
    for key in &h.windows {
        let w = books.window(tx, key)?;
        w.reserved = w.reserved + extra;
        w.dirty = true;
    }
    h.amount = h.amount + extra;
    tx.prepare_cached("UPDATE requests SET reserved_amount = ?2 WHERE id = ?1")?
        .execute(params![request_id, h.amount.to_string()])?;
    books.held.insert(request_id.to_string(), h);
    Ok(())
}

/// The `&'static` name of a stored period, for the refusal's message.
fn period_name(stored: &str) -> &'static str {
    match stored {
        "month" => "month",
        _ => "day",
    }
}

/// A live process gives up on one request: what start-up recovery does to every
/// in-flight row, done to this one. Its holding moves to spent at what its attempts
/// may have cost (billed costs plus the worst case of each maybe-billed attempt).
fn interrupt(
    tx: &Connection,
    books: &mut Books,
    request_id: &str,
    reason: &str,
) -> Result<(), LedgerError> {
    let outcome: Option<String> = tx
        .prepare_cached("SELECT outcome FROM requests WHERE id = ?1")?
        .query_row(params![request_id], |r| r.get(0))
        .optional()?;
    if outcome.as_deref() != Some("in_flight") {
        return Ok(());
    }
    tx.prepare_cached(
        "UPDATE attempts SET state = 'interrupted', billing = 'maybe_billed', decision = 'stop', reason = ?2
         WHERE request_id = ?1 AND state = 'in_flight'",
    )?
    .execute(params![request_id, reason])?;
    let charged: String = tx
        .prepare_cached(
            "SELECT COALESCE(dsum(CASE billing WHEN 'billed' THEN cost WHEN 'maybe_billed' THEN worst_case ELSE '0' END), '0')
             FROM attempts WHERE request_id = ?1",
        )?
        .query_row(params![request_id], |r| r.get(0))?;
    let charged = money_col(charged)?;
    let cost: String = tx
        .prepare_cached(
            "SELECT COALESCE(dsum(CASE billing WHEN 'billed' THEN cost ELSE '0' END), '0') FROM attempts WHERE request_id = ?1",
        )?
        .query_row(params![request_id], |r| r.get(0))?;
    let held = match books.held.remove(request_id) {
        Some(h) => Some(h),
        None => holding(tx, request_id)?,
    };
    // Like recovery, the request keeps a holding (now in `spent`) until it finishes
    // late or an operator settles it; its amount becomes what was charged.
    let reserved_in: Option<String> = held.as_ref().map(|h| reserved_in(&h.windows));
    tx.prepare_cached(
        "UPDATE requests SET outcome = 'interrupted', cost = ?2, reserved_in = ?3, reserved_amount = ?4 WHERE id = ?1",
    )?
    .execute(params![request_id, money_col(cost)?.to_string(), reserved_in, charged.to_string()])?;
    if let Some(h) = held {
        for key in &h.windows {
            let w = books.window(tx, key)?;
            w.reserved = w.reserved.saturating_sub(h.amount);
            w.spent = w.spent + charged;
            w.dirty = true;
        }
    }
    Ok(())
}

/// Rows a previous process left in flight become `interrupted` / `maybe_billed`, and
/// their reservations stay counted (moved to spent) until an operator settles them.
pub fn recover(conn: &mut Connection) -> Result<Recovered, LedgerError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut books = Books::default();
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
        // Still in flight here, so what it holds is in `reserved`: move it to spent.
        if let Some(h) = holding(&tx, id)? {
            for key in h.windows {
                let w = books.window(&tx, &key)?;
                w.spent = w.spent + h.amount;
                w.reserved = w.reserved.saturating_sub(h.amount);
                w.dirty = true;
            }
        }
        tx.execute(
            "UPDATE requests SET outcome = 'interrupted' WHERE id = ?1",
            params![id],
        )?;
    }
    books.write(&tx)?;
    tx.commit()?;
    Ok(Recovered {
        attempts,
        requests: ids.len(),
    })
}
