//! The SQL of each operation on SQLite, inside the writer's transaction.
//!
//! The per-request statements say `OR FAIL`: an error stops the statement without
//! undoing what it already wrote, so SQLite need not keep a statement journal for it
//! (with the rollup triggers and the foreign key it otherwise journals every page the
//! statement touches). Nothing is lost by it: an operation that fails is never
//! committed, its group is rolled back whole and redone one operation per transaction
//! (`group.rs`), where a failure rolls its own transaction back. So every operation
//! returns at the first SQL error; none may go on writing after one (after some
//! errors, a full disk among them, SQLite has already rolled the transaction back,
//! and further statements would each commit on their own).

use rusqlite::{Connection, OptionalExtension, params};

use super::books::{Books, WindowKey};
use crate::ledger::{
    AttemptResult, BudgetLimit, LedgerError, NewAttempt, NewRequest, Op, RequestResult, rfc3339,
    window_start,
};
use crate::money::Money;
use crate::policy::plan::Period;
use crate::pricing::CostBasis;

pub(super) fn apply_op(tx: &Connection, books: &mut Books, op: &Op) -> Result<(), LedgerError> {
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
        Op::TopUp {
            request_id,
            extra,
            limits,
        } => top_up(tx, books, request_id, *extra, limits),
        Op::Interrupt { request_id, reason } => interrupt(tx, books, request_id, reason),
        Op::ReseedWindows { windows, at } => reseed_windows(tx, books, windows, *at),
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
    let sh = r.shape.as_ref();
    tx.prepare_cached(
        "INSERT OR FAIL INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, error_code, reserved_in, ingress,
                               shape_input_tokens, shape_requested_output, shape_output_bound, shape_choices, shape_stream, shape_tools, shape_media, shape_unbounded)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
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
        r.ingress.as_str(),
        sh.and_then(|s| s.input_tokens).map(count),
        sh.and_then(|s| s.requested_output).map(count),
        sh.and_then(|s| s.output_bound).map(count),
        sh.map(|s| count(s.choices)),
        sh.map(|s| s.stream),
        sh.map(|s| s.tools),
        sh.map(|s| s.media),
        sh.map(|s| s.unbounded),
    ])?;
    Ok(())
}

/// A token count as SQLite's integer (counts beyond i64 do not occur; saturate).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn money_col(s: String) -> Result<Money, LedgerError> {
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
            period: b.period,
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
        "INSERT OR FAIL INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, state, billing, worst_case)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'in_flight', 'maybe_billed', ?7)",
    )?
    .execute(params![a.request_id, a.seq, a.provider, a.upstream_model, a.jurisdiction, rfc3339(a.started_at), a.worst_case.to_string()])?;
    Ok(())
}

fn finish_attempt(tx: &Connection, r: &AttemptResult) -> Result<(), LedgerError> {
    let n = tx
        .prepare_cached(
            "UPDATE OR FAIL attempts SET finished_at = ?3, state = 'done', status = ?4, class = ?5, billing = ?6, decision = ?7, reason = ?8,
             input_tokens = ?9, output_tokens = ?10, cost = ?11, message = ?12, cost_basis = ?13,
             cache_read_tokens = ?14, cache_write_tokens = ?15, cache_write_5m_tokens = ?16, cache_write_1h_tokens = ?17,
             response_id = ?18, response_items = ?19 WHERE request_id = ?1 AND seq = ?2",
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
            tokens(r.input_tokens),
            tokens(r.output_tokens),
            r.cost.to_string(),
            r.message,
            r.cost_basis.map(CostBasis::as_str),
            tokens(r.cache.read),
            tokens(r.cache.write),
            tokens(r.cache.write_5m),
            tokens(r.cache.write_1h),
            r.stored.as_ref().map(|s| s.id.as_str()),
            tokens(r.stored.as_ref().map(|s| s.output_items)),
        ])?;
    if n == 0 {
        return Err(LedgerError::UnknownRequest(format!(
            "{}#{}",
            r.request_id, r.seq
        )));
    }
    Ok(())
}

/// A token count as an SQLite integer (a count past i64 is recorded at the largest).
fn tokens(t: Option<u64>) -> Option<i64> {
    t.map(|t| i64::try_from(t).unwrap_or(i64::MAX))
}

/// A request's reservation is its worst case, held in the budget windows it names in
/// `requests.reserved_in` ("day@<start> month@<start>"): in `reserved` while it is in
/// flight, moved to `spent` when recovery found it interrupted, and cleared (NULL)
/// once settled. It lives in the request row, which admission writes anyway: a table
/// of its own cost two more B-tree writes per request.
fn reserved_in(keys: &[WindowKey]) -> String {
    keys.iter()
        .map(|k| format!("{}@{}", k.period.as_str(), k.start))
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
                period: period_of(period)?,
                start: start.to_string(),
            })
        })
        .collect()
}

/// What a request still holds in its budget windows, as stored.
pub(super) struct Holding {
    pub(super) windows: Vec<WindowKey>,
    pub(super) amount: Money,
    /// Moved to `spent` by recovery, rather than held in `reserved`.
    pub(super) interrupted: bool,
}

/// What the request holds, out of the writer's memory if it admitted the request,
/// else as stored.
fn take_holding(
    tx: &Connection,
    books: &mut Books,
    request_id: &str,
) -> Result<Option<Holding>, LedgerError> {
    match books.held.remove(request_id) {
        Some(h) => Ok(Some(h)),
        None => holding(tx, request_id),
    }
}

pub(super) fn holding(tx: &Connection, request_id: &str) -> Result<Option<Holding>, LedgerError> {
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
    let held = take_holding(tx, books, &r.request_id)?;
    let n = tx
        .prepare_cached("UPDATE OR FAIL requests SET outcome = ?2, error_code = ?3, served_by = ?4, cost = ?5, reserved_in = NULL WHERE id = ?1")?
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
    // The request costs what its attempts billed; its budgets are charged that plus
    // the worst case of every other attempt still `maybe_billed` (an earlier attempt
    // that failed without proof of billing keeps its worst case: the operator settled
    // the interrupted one only).
    let (total, charged): (String, String) = tx.query_row(
        "SELECT COALESCE(dsum(CASE billing WHEN 'billed' THEN cost ELSE '0' END), '0'),
                COALESCE(dsum(CASE billing WHEN 'billed' THEN cost WHEN 'maybe_billed' THEN worst_case ELSE '0' END), '0')
         FROM attempts WHERE request_id = ?1",
        params![request_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let (total, charged) = (money_col(total)?, money_col(charged)?);
    tx.execute(
        "UPDATE requests SET cost = ?2, reserved_in = NULL WHERE id = ?1",
        params![request_id, total.to_string()],
    )?;
    match held {
        Some(h) => release(books, tx, h, charged),
        None => Ok(()),
    }
}

/// Raise the request's holding by `extra` in every window it names, all or nothing,
/// each checked against the running plan's limit for its period (`limits`; a period
/// the plan no longer budgets is not limited). A request that holds nothing (its
/// policy had no budgets) has nothing to raise; one no longer in flight may not go on.
fn top_up(
    tx: &Connection,
    books: &mut Books,
    request_id: &str,
    extra: Money,
    limits: &[BudgetLimit],
) -> Result<(), LedgerError> {
    let held = match books.held.remove(request_id) {
        // Held in memory: admitted by this writer and not finished, so in flight.
        Some(h) => Some(h),
        None => {
            let outcome: Option<String> = tx
                .prepare_cached("SELECT outcome FROM requests WHERE id = ?1")?
                .query_row(params![request_id], |r| r.get(0))
                .optional()?;
            match outcome.as_deref() {
                None => return Err(LedgerError::UnknownRequest(request_id.to_string())),
                Some("in_flight") => holding(tx, request_id)?,
                Some(_) => return Err(LedgerError::NotInFlight(request_id.to_string())),
            }
        }
    };
    let restore = |books: &mut Books, h: Option<Holding>| {
        if let Some(h) = h {
            books.held.insert(request_id.to_string(), h);
        }
    };
    if !extra.is_positive() || held.as_ref().is_some_and(|h| h.interrupted) {
        restore(books, held);
        return Ok(());
    }
    let held_keys: Vec<WindowKey> = held.as_ref().map_or_else(Vec::new, |h| h.windows.clone());
    // Budgets the running plan has that the request holds nothing in (added since its
    // admission): their window is created, or counted again, from the ledger, which
    // makes the request one of its holders (`Books::seed`), so it is raised there like
    // in every other window it holds and settles into it.
    let unheld = unheld_windows(tx, request_id, &held_keys, limits)?;
    let held = if unheld.is_empty() {
        held
    } else {
        for key in &unheld {
            books.reseed(tx, key)?;
            let w = books.window(tx, key)?;
            if w.limit.is_none() {
                w.limit = limit_of_period(limits, key.period);
                w.dirty = true;
            }
        }
        books.held.remove(request_id);
        holding(tx, request_id)?
    };
    let held_keys: Vec<WindowKey> = held.as_ref().map_or_else(Vec::new, |h| h.windows.clone());
    let limit_of = |key: &WindowKey| limit_of_period(limits, key.period);
    // Check every window first: a refusal must leave all of them as they were.
    let mut refusal = None;
    for key in &held_keys {
        let Some(limit) = limit_of(key) else {
            continue;
        };
        let w = books.window(tx, key)?;
        if w.limit != Some(limit) {
            w.limit = Some(limit);
            w.dirty = true;
        }
        if w.spent + w.reserved + extra > limit {
            refusal = Some(LedgerError::BudgetExhausted {
                policy: key.policy.clone(),
                period: key.period.as_str(),
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
        restore(books, held);
        return Err(e);
    }
    let Some(mut h) = held else {
        // Held in no window: what it may now cost is still recorded, so a window the
        // ledger seeds while it is in flight holds that (as PostgreSQL's top-up does).
        tx.prepare_cached(
            "UPDATE requests SET reserved_amount = ?2 WHERE id = ?1 AND outcome = 'in_flight'",
        )?
        .execute(params![
            request_id,
            (held_amount(tx, request_id)? + extra).to_string()
        ])?;
        return Ok(());
    };
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

/// The windows of `limits` that the request holds nothing in, keyed by its policy and
/// the time it was received.
fn unheld_windows(
    tx: &Connection,
    request_id: &str,
    held: &[WindowKey],
    limits: &[BudgetLimit],
) -> Result<Vec<WindowKey>, LedgerError> {
    if limits
        .iter()
        .all(|b| held.iter().any(|k| k.period == b.period))
    {
        return Ok(Vec::new());
    }
    let (policy, received_ms): (String, i64) = tx
        .prepare_cached("SELECT policy, received_ms FROM requests WHERE id = ?1")?
        .query_row(params![request_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let received =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(received_ms) * 1_000_000)
            .map_err(|e| {
                LedgerError::Corrupt(format!(
                    "request {request_id} received at {received_ms} ms: {e}"
                ))
            })?;
    Ok(limits
        .iter()
        .filter(|b| !held.iter().any(|k| k.period == b.period))
        .map(|b| WindowKey {
            policy: policy.clone(),
            period: b.period,
            start: window_start(b.period, received),
        })
        .collect())
}

/// A period as stored in `reserved_in`.
fn period_of(stored: &str) -> Result<Period, LedgerError> {
    match stored {
        "day" => Ok(Period::Day),
        "month" => Ok(Period::Month),
        other => Err(LedgerError::Corrupt(format!("period `{other}`"))),
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
    // One pass over the attempts: what may have been charged, and what was billed.
    let (charged, cost): (String, String) = tx
        .prepare_cached(
            "SELECT COALESCE(dsum(CASE billing WHEN 'billed' THEN cost WHEN 'maybe_billed' THEN worst_case ELSE '0' END), '0'),
                    COALESCE(dsum(CASE billing WHEN 'billed' THEN cost ELSE '0' END), '0')
             FROM attempts WHERE request_id = ?1",
        )?
        .query_row(params![request_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let charged = money_col(charged)?;
    let held = take_holding(tx, books, request_id)?;
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

/// Count again the current window of each re-added budget (see
/// `Op::ReseedWindows` and `Books::seed`); a window that does not exist yet is seeded
/// when created.
fn reseed_windows(
    tx: &Connection,
    books: &mut Books,
    windows: &[(String, Period)],
    at: time::OffsetDateTime,
) -> Result<(), LedgerError> {
    for (policy, period) in windows {
        let key = WindowKey {
            policy: policy.clone(),
            period: *period,
            start: window_start(*period, at),
        };
        books.reseed(tx, &key)?;
    }
    Ok(())
}

/// The running plan's limit for `period`.
fn limit_of_period(limits: &[BudgetLimit], period: Period) -> Option<Money> {
    limits.iter().find(|b| b.period == period).map(|b| b.limit)
}

/// What a request holds as stored: its topped-up reservation, else its worst case.
fn held_amount(tx: &Connection, request_id: &str) -> Result<Money, LedgerError> {
    let held: String = tx
        .prepare_cached("SELECT COALESCE(reserved_amount, worst_case) FROM requests WHERE id = ?1")?
        .query_row(params![request_id], |r| r.get(0))?;
    money_col(held)
}
