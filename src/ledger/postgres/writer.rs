//! Group commit on PostgreSQL: one task per replica takes every operation queued since
//! its last commit and applies them in one transaction, their statements pipelined on
//! one connection (sent together, answered together), so a group costs a few round
//! trips and one WAL flush however many requests share it. Operations whose next step
//! depends on an answer (a refused admission to take back, a settlement, a top-up) run
//! after the pipeline, in the same transaction.
//!
//! A statement that fails spoils the transaction: the group is rolled back and each
//! operation is applied again in its own transaction, so each caller learns its own
//! fate and nothing is half-applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::{Client, Pool};
use futures_util::future::join_all;
use rust_decimal::Decimal;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::ToSql;

use super::sql;
use crate::ledger::{
    AttemptResult, BudgetLimit, LedgerError, NewAttempt, NewRequest, Op, RequestResult,
};
use crate::money::Money;
use crate::policy::plan::Period;

/// Most operations committed together; bounds the latency one commit adds.
const MAX_GROUP: usize = 512;

pub struct Envelope {
    pub op: Op,
    pub reply: oneshot::Sender<Result<(), LedgerError>>,
}

/// What the writer task shares with the handle.
pub struct Shared {
    pub pool: Pool,
    pub replica: Arc<str>,
    /// Whether the last group could reach PostgreSQL (readiness).
    pub writable: AtomicBool,
}

/// Start the writer task; operations sent to the returned queue are applied in order
/// of arrival, in groups. The task ends when every sender is gone.
pub fn spawn(shared: Arc<Shared>) -> mpsc::UnboundedSender<Envelope> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Envelope>();
    tokio::spawn(async move {
        let mut group = Vec::new();
        while let Some(first) = rx.recv().await {
            group.push(first);
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(env) => group.push(env),
                    Err(_) => break,
                }
            }
            let results = apply_group(&shared, &group).await;
            // A refusal of the operation itself (a budget, an unknown id) says the
            // database answered; only a failure of every operation to reach it does not.
            let reached = results.iter().any(|r| !r.as_ref().is_err_and(unreachable));
            shared.writable.store(reached, Ordering::Relaxed);
            for (env, res) in group.drain(..).zip(results) {
                let _ = env.reply.send(res);
            }
        }
    });
    tx
}

/// Whether an error says the database could not be reached or could not commit, as
/// opposed to refusing one operation.
pub fn unreachable(e: &LedgerError) -> bool {
    match e {
        LedgerError::Postgres(e) => e.code().is_none() || e.is_closed(),
        LedgerError::Unavailable(_) => true,
        _ => false,
    }
}

async fn apply_group(shared: &Shared, group: &[Envelope]) -> Vec<Result<(), LedgerError>> {
    let client = match shared.pool.get().await {
        Ok(c) => c,
        Err(e) => {
            let why = e.to_string();
            return group
                .iter()
                .map(|_| Err(LedgerError::Unavailable(why.clone())))
                .collect();
        }
    };
    match try_group(&client, &shared.replica, group).await {
        Ok(results) => results,
        Err(e) if unreachable(&e) => group.iter().map(|_| Err(clone_err(&e))).collect(),
        Err(_) => {
            let mut results = Vec::with_capacity(group.len());
            for env in group {
                let one = std::slice::from_ref(env);
                let r = match try_group(&client, &shared.replica, one).await {
                    Ok(mut r) => r.pop().unwrap_or(Ok(())),
                    Err(e) => Err(e),
                };
                results.push(r);
            }
            results
        }
    }
}

/// A copy of a group-wide failure for each caller.
fn clone_err(e: &LedgerError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// What the pipelined first step of an operation left to do.
enum Next {
    Done(Result<(), LedgerError>),
    /// Admission refused: take back what the windows in `took` reserved, and say which
    /// window refused.
    Refused {
        took: Vec<String>,
    },
    /// Runs after the pipeline (it reads, then decides).
    Later,
}

/// Apply `group` in one transaction. `Err` means the transaction was rolled back:
/// nothing in it was applied.
async fn try_group(
    client: &Client,
    replica: &str,
    group: &[Envelope],
) -> Result<Vec<Result<(), LedgerError>>, LedgerError> {
    if let Err(e) = client.batch_execute(sql::BEGIN_WRITE).await {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(e.into());
    }
    match run_in_tx(client, replica, group).await {
        Ok(results) => {
            client.batch_execute("COMMIT").await?;
            Ok(results)
        }
        Err(e) => {
            // A failed rollback leaves a broken connection, which the pool then drops.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

async fn run_in_tx(
    client: &Client,
    replica: &str,
    group: &[Envelope],
) -> Result<Vec<Result<(), LedgerError>>, LedgerError> {
    let firsts = join_all(group.iter().map(|env| first_step(client, replica, &env.op))).await;
    let mut results = Vec::with_capacity(group.len());
    for (env, first) in group.iter().zip(firsts) {
        let r = match first? {
            Next::Done(r) => r,
            Next::Refused { took } => match &env.op {
                Op::Admit { req, budgets, .. } => Err(refused(client, req, budgets, &took).await?),
                _ => Err(LedgerError::Corrupt("a refusal of no admission".into())),
            },
            Next::Later => later_step(client, &env.op).await?,
        };
        results.push(r);
    }
    Ok(results)
}

fn ms(d: Money) -> Decimal {
    d.decimal()
}

fn int(v: Option<u64>) -> Option<i64> {
    v.map(|t| i64::try_from(t).unwrap_or(i64::MAX))
}

fn seq(s: u32) -> i32 {
    i32::try_from(s).unwrap_or(i32::MAX)
}

/// The UTC start of `period`'s window containing `t`.
pub fn window_start_at(period: Period, t: OffsetDateTime) -> OffsetDateTime {
    let t = t.to_offset(time::UtcOffset::UTC);
    let date = match period {
        Period::Day => t.date(),
        Period::Month => t.date().replace_day(1).unwrap_or(t.date()),
    };
    date.midnight().assume_utc()
}

/// The first step of `op`, sent in the group's pipeline. `Err`: a statement failed
/// and the transaction is spoiled.
async fn first_step(client: &Client, replica: &str, op: &Op) -> Result<Next, LedgerError> {
    match op {
        Op::Admit {
            req,
            budgets,
            first,
        } => admit(client, replica, req, budgets, first.as_ref()).await,
        Op::Refusal { req, error_code } => {
            let st = client.prepare_cached(sql::REFUSAL).await?;
            client
                .execute(
                    &st,
                    &[
                        &req.id,
                        &req.received_at,
                        &req.client,
                        &req.policy,
                        &req.plan_id,
                        &req.model,
                        &req.mode.as_str(),
                        &ms(req.ceiling),
                        &ms(req.worst_case),
                        error_code,
                        &replica,
                    ],
                )
                .await?;
            Ok(Next::Done(Ok(())))
        }
        Op::BeginAttempt(a) => {
            begin_attempt(client, replica, a).await?;
            Ok(Next::Done(Ok(())))
        }
        Op::FinishAttempt(r) => Ok(Next::Done(finish_attempt(client, r).await?)),
        Op::FinishRequest(r) => Ok(Next::Done(finish_request(client, r).await?)),
        Op::Finish(a, r) => {
            // Both sent at once: the second does not wait for the first's answer.
            let (a, r) = futures_util::join!(finish_attempt(client, a), finish_request(client, r));
            Ok(Next::Done(a?.and(r?)))
        }
        Op::Probe => {
            let st = client.prepare_cached(sql::PROBE).await?;
            client.execute(&st, &[&replica]).await?;
            Ok(Next::Done(Ok(())))
        }
        Op::Settle { .. } | Op::TopUp { .. } | Op::Interrupt { .. } => Ok(Next::Later),
    }
}

async fn admit(
    client: &Client,
    replica: &str,
    req: &NewRequest,
    budgets: &[BudgetLimit],
    first: Option<&NewAttempt>,
) -> Result<Next, LedgerError> {
    let periods: Vec<&str> = budgets.iter().map(|b| b.period.as_str()).collect();
    let starts: Vec<OffsetDateTime> = budgets
        .iter()
        .map(|b| window_start_at(b.period, req.received_at))
        .collect();
    let limits: Vec<Decimal> = budgets.iter().map(|b| ms(b.limit)).collect();
    let st = client.prepare_cached(sql::ADMIT).await?;
    let (has, a_seq, provider, upstream, jurisdiction, started, a_worst) = match first {
        Some(a) => (
            true,
            seq(a.seq),
            a.provider.as_str(),
            a.upstream_model.as_str(),
            a.jurisdiction.as_str(),
            a.started_at,
            ms(a.worst_case),
        ),
        None => (false, 1, "", "", "", req.received_at, Decimal::ZERO),
    };
    let params: [&(dyn ToSql + Sync); 20] = [
        &req.id,
        &req.received_at,
        &req.client,
        &req.policy,
        &req.plan_id,
        &req.model,
        &req.mode.as_str(),
        &ms(req.ceiling),
        &ms(req.worst_case),
        &periods,
        &starts,
        &limits,
        &replica,
        &has,
        &a_seq,
        &provider,
        &upstream,
        &jurisdiction,
        &started,
        &a_worst,
    ];
    let row = client.query_one(&st, &params).await?;
    let admitted: bool = row.try_get(0)?;
    let took: Vec<String> = row.try_get(1)?;
    Ok(if admitted {
        Next::Done(Ok(()))
    } else {
        Next::Refused { took }
    })
}

/// Take a partial reservation back and name the window that refused.
async fn refused(
    client: &Client,
    req: &NewRequest,
    budgets: &[BudgetLimit],
    took: &[String],
) -> Result<LedgerError, LedgerError> {
    let start_of = |period: &str| {
        budgets
            .iter()
            .find(|b| b.period.as_str() == period)
            .map(|b| window_start_at(b.period, req.received_at))
    };
    if !took.is_empty() {
        let starts: Vec<OffsetDateTime> = took.iter().filter_map(|p| start_of(p)).collect();
        let st = client.prepare_cached(sql::UNRESERVE).await?;
        client
            .execute(&st, &[&req.policy, &took, &starts, &ms(req.worst_case)])
            .await?;
    }
    let periods: Vec<&str> = budgets.iter().map(|b| b.period.as_str()).collect();
    let starts: Vec<OffsetDateTime> = budgets
        .iter()
        .map(|b| window_start_at(b.period, req.received_at))
        .collect();
    let st = client.prepare_cached(sql::WINDOWS).await?;
    let rows = client.query(&st, &[&req.policy, &periods, &starts]).await?;
    let mut stored = Vec::with_capacity(rows.len());
    for row in rows {
        let period: String = row.try_get(0)?;
        let spent = Money::new(row.try_get(2)?);
        let reserved = Money::new(row.try_get(3)?);
        stored.push((period, spent, reserved));
    }
    // The window that refused: the first (in the plan's order) where the worst case does
    // not fit now. Should another replica have freed room meanwhile, the first window.
    let state = |b: &BudgetLimit| {
        stored
            .iter()
            .find(|(p, _, _)| p == b.period.as_str())
            .map(|(_, s, r)| (*s, *r))
            .unwrap_or((Money::ZERO, Money::ZERO))
    };
    let culprit = budgets
        .iter()
        .find(|b| {
            let (s, r) = state(b);
            s + r + req.worst_case > b.limit
        })
        .or(budgets.first())
        .ok_or_else(|| LedgerError::Corrupt("refused with no budget".into()))?;
    let (spent, reserved) = state(culprit);
    Ok(LedgerError::BudgetExhausted {
        policy: req.policy.clone(),
        period: culprit.period.as_str(),
        limit: culprit.limit,
        spent,
        reserved,
        remaining: culprit.limit.saturating_sub(spent + reserved),
        needed: req.worst_case,
    })
}

async fn begin_attempt(client: &Client, replica: &str, a: &NewAttempt) -> Result<(), LedgerError> {
    let st = client.prepare_cached(sql::BEGIN_ATTEMPT).await?;
    client
        .execute(
            &st,
            &[
                &a.request_id,
                &seq(a.seq),
                &a.provider,
                &a.upstream_model,
                &a.jurisdiction,
                &a.started_at,
                &ms(a.worst_case),
                &replica,
            ],
        )
        .await?;
    Ok(())
}

/// `Ok(Err(_))`: the operation is refused (no such attempt) but the group goes on.
async fn finish_attempt(
    client: &Client,
    r: &AttemptResult,
) -> Result<Result<(), LedgerError>, LedgerError> {
    let st = client.prepare_cached(sql::FINISH_ATTEMPT).await?;
    let status = r.status.map(i32::from);
    let cols = super::AttemptColumns::of(r);
    let n = client
        .execute(
            &st,
            &[
                &r.request_id,
                &seq(r.seq),
                &r.finished_at,
                &status,
                &cols.class,
                &r.billing.as_str(),
                &cols.decision,
                &r.reason,
                &int(r.input_tokens),
                &int(r.output_tokens),
                &ms(r.cost),
                &cols.cost_basis,
                &r.message,
            ],
        )
        .await?;
    Ok(if n == 0 {
        Err(LedgerError::UnknownRequest(format!(
            "{}#{}",
            r.request_id, r.seq
        )))
    } else {
        Ok(())
    })
}

async fn finish_request(
    client: &Client,
    r: &RequestResult,
) -> Result<Result<(), LedgerError>, LedgerError> {
    let st = client.prepare_cached(sql::FINISH_REQUEST).await?;
    let row = client
        .query_one(
            &st,
            &[
                &r.request_id,
                &r.outcome.as_str(),
                &r.error_code,
                &r.served_by,
                &ms(r.cost),
                &ms(r.charged),
            ],
        )
        .await?;
    let n: i64 = row.try_get(0)?;
    Ok(if n == 0 {
        Err(LedgerError::UnknownRequest(r.request_id.clone()))
    } else {
        Ok(())
    })
}

/// Operations that read before they decide, run one at a time after the pipeline.
async fn later_step(client: &Client, op: &Op) -> Result<Result<(), LedgerError>, LedgerError> {
    match op {
        Op::Settle { request_id, cost } => settle(client, request_id, *cost).await,
        Op::TopUp { request_id, extra } => top_up(client, request_id, *extra).await,
        Op::Interrupt { request_id, reason } => {
            let st = client.prepare_cached(sql::INTERRUPT_ONE).await?;
            client.query_one(&st, &[request_id, reason]).await?;
            Ok(Ok(()))
        }
        _ => Ok(Err(LedgerError::Corrupt(
            "an operation without a later step".into(),
        ))),
    }
}

/// Operator settlement of an interrupted request: `cost` is what its interrupted
/// attempt(s) really cost. The same rules as on SQLite (`sqlite::ops::settle`).
async fn settle(
    client: &Client,
    request_id: &str,
    cost: Money,
) -> Result<Result<(), LedgerError>, LedgerError> {
    let not_settleable = |why: String| {
        Ok(Err(LedgerError::NotSettleable {
            request_id: request_id.to_string(),
            why,
        }))
    };
    let row = client
        .query_opt(
            "SELECT outcome, reserved_periods IS NOT NULL FROM requests WHERE id = $1 FOR UPDATE",
            &[&request_id],
        )
        .await?;
    let Some(row) = row else {
        return Ok(Err(LedgerError::UnknownRequest(request_id.to_string())));
    };
    let outcome: String = row.try_get(0)?;
    let holds: bool = row.try_get(1)?;
    if outcome != "interrupted" {
        return not_settleable(format!(
            "it is `{outcome}`; only interrupted requests are settled by hand"
        ));
    }
    let open: Vec<i32> = client
        .query(
            "SELECT seq FROM attempts WHERE request_id = $1 AND state = 'interrupted' AND billing = 'maybe_billed' ORDER BY seq",
            &[&request_id],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    if open.is_empty() && !holds {
        return not_settleable("it is already settled".into());
    }
    if open.is_empty() && cost.is_positive() {
        return not_settleable(
            "no attempt of it may have been billed, so its cost can only be settled to 0".into(),
        );
    }
    for (i, s) in open.iter().enumerate() {
        let (amount, billing) = match (i, cost.is_positive()) {
            (0, true) => (cost, "billed"),
            _ => (Money::ZERO, "not_billed"),
        };
        client
            .execute(
                "UPDATE attempts SET billing = $3, cost = $4,
                 reason = COALESCE(reason, '') || '; settled by an operator to ' || $5
                 WHERE request_id = $1 AND seq = $2",
                &[&request_id, s, &billing, &ms(amount), &amount.to_string()],
            )
            .await?;
    }
    let total: Decimal = client
        .query_one(
            "SELECT COALESCE(sum(cost), 0) FROM attempts WHERE request_id = $1",
            &[&request_id],
        )
        .await?
        .try_get(0)?;
    let st = client.prepare_cached(sql::SETTLE_REQUEST).await?;
    client
        .query_one(&st, &[&request_id, &Money::new(total).decimal()])
        .await?;
    Ok(Ok(()))
}

/// Interrupt the given in-flight requests and their in-flight attempts: charged at
/// their worst case, their reservations moved to spent (recovery, and a live
/// process's sweep). Returns (attempts, requests) interrupted.
pub async fn interrupt(
    client: &Client,
    ids: &[String],
    reason: &str,
) -> Result<(u64, u64), LedgerError> {
    let a = client.prepare_cached(sql::INTERRUPT_ATTEMPTS).await?;
    let r = client.prepare_cached(sql::INTERRUPT_REQUESTS).await?;
    let attempts = client.execute(&a, &[&ids, &reason]).await?;
    let requests: i64 = client.query_one(&r, &[&ids]).await?.try_get(0)?;
    Ok((attempts, u64::try_from(requests).unwrap_or(0)))
}

/// Raise an in-flight request's reservation by `extra` in every window it holds, all
/// or none (`sql::TOP_UP`). `Ok(Err(BudgetExhausted))`: a window had no room; nothing
/// changed. A request that holds nothing, or is no longer in flight, has nothing to
/// raise (as on SQLite).
async fn top_up(
    client: &Client,
    request_id: &str,
    extra: Money,
) -> Result<Result<(), LedgerError>, LedgerError> {
    if !extra.is_positive() {
        return Ok(Ok(()));
    }
    let st = client.prepare_cached(sql::TOP_UP).await?;
    let row = client.query_one(&st, &[&request_id, &ms(extra)]).await?;
    let found: bool = row.try_get(0)?;
    if !found {
        return Ok(Ok(()));
    }
    let policy: String = row.try_get(1)?;
    let windows: i64 = row.try_get(2)?;
    let took: Vec<String> = row.try_get(3)?;
    let starts: Vec<OffsetDateTime> = row.try_get(4)?;
    let raised: i64 = row.try_get(5)?;
    if raised > 0 || windows == 0 {
        return Ok(Ok(()));
    }
    if !took.is_empty() {
        let st = client.prepare_cached(sql::UNRESERVE).await?;
        client
            .execute(&st, &[&policy, &took, &starts, &ms(extra)])
            .await?;
    }
    // The window that had no room: one the top-up did not take.
    let row = client
        .query_one(
            "SELECT w.period, w.limit_amount, w.spent, w.reserved
             FROM requests q, unnest(q.reserved_periods) AS x (period), budget_windows w
             WHERE q.id = $1 AND w.policy = q.policy AND w.period = x.period
               AND w.window_start = date_trunc(x.period, q.received_at, 'UTC')
               AND NOT (x.period = ANY ($2))
             ORDER BY w.period LIMIT 1",
            &[&request_id, &took],
        )
        .await?;
    let period: String = row.try_get(0)?;
    let limit = Money::new(row.try_get(1)?);
    let spent = Money::new(row.try_get(2)?);
    let reserved = Money::new(row.try_get(3)?);
    Ok(Err(LedgerError::BudgetExhausted {
        policy,
        period: if period == "month" { "month" } else { "day" },
        limit,
        spent,
        reserved,
        remaining: limit.saturating_sub(spent + reserved),
        needed: extra,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The instant PostgreSQL is given is the window SQLite names as text.
        #[test]
        fn window_starts_agree_with_the_sqlite_text(secs in 0i64..253_402_300_799) {
            let t = OffsetDateTime::from_unix_timestamp(secs)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for period in [Period::Day, Period::Month] {
                let at = window_start_at(period, t);
                let text = crate::ledger::rfc3339(at);
                prop_assert_eq!(format!("{}Z", &text[..19]), crate::ledger::window_start(period, t));
            }
        }
    }
}
