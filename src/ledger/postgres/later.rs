//! The operations that read before they decide (operator settlement, the failover
//! top-up, a live process giving up on a request), run one at a time after a group's
//! statements, in the same transaction.

use deadpool_postgres::Client;
use rust_decimal::Decimal;
use time::OffsetDateTime;

use super::sql;
use crate::ledger::{BudgetLimit, LedgerError, Op};
use crate::money::Money;

fn dec(m: Money) -> Decimal {
    m.decimal()
}

/// An operation that reads before it decides, run alone after the group's statements.
pub async fn apply(client: &Client, op: &Op) -> Result<Result<(), LedgerError>, LedgerError> {
    match op {
        Op::Settle { request_id, cost } => settle(client, request_id, *cost).await,
        Op::TopUp {
            request_id,
            extra,
            limits,
        } => top_up(client, request_id, *extra, limits).await,
        Op::Interrupt { request_id, reason } => {
            let st = client.prepare_cached(sql::INTERRUPT_ONE).await?;
            client.query_one(&st, &[request_id, reason]).await?;
            Ok(Ok(()))
        }
        Op::ReseedWindows { windows, at } => {
            // Counted again from the ledger, its open requests made its holders (see
            // `Op::ReseedWindows` and migration 0007's `purser_seed`).
            for (policy, period) in windows {
                let start = super::window::window_start_at(*period, *at);
                client
                    .execute(
                        "SELECT purser_seed($1, $2, $3, NULL::numeric)",
                        &[policy, &period.as_str(), &start],
                    )
                    .await?;
            }
            Ok(Ok(()))
        }
        Op::Admit { .. }
        | Op::Refusal { .. }
        | Op::BeginAttempt(_)
        | Op::FinishAttempt(_)
        | Op::FinishRequest(_)
        | Op::Finish(..)
        | Op::Probe => Ok(Err(LedgerError::Corrupt(
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
                &[&request_id, s, &billing, &dec(amount), &amount.to_string()],
            )
            .await?;
    }
    // Billed costs, and what the budgets are charged: those plus the worst case of
    // every other attempt still `maybe_billed` (as on SQLite).
    let row = client
        .query_one(
            "SELECT COALESCE(sum(CASE billing WHEN 'billed' THEN cost ELSE 0 END), 0),
                    COALESCE(sum(CASE billing WHEN 'billed' THEN cost WHEN 'maybe_billed' THEN worst_case ELSE 0 END), 0)
             FROM attempts WHERE request_id = $1",
            &[&request_id],
        )
        .await?;
    let total: Decimal = row.try_get(0)?;
    let charged: Decimal = row.try_get(1)?;
    let st = client.prepare_cached(sql::SETTLE_REQUEST).await?;
    client
        .query_one(&st, &[&request_id, &total, &charged])
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
/// or none, against the running plan's `limits` (`sql::TOP_UP`).
/// `Ok(Err(BudgetExhausted))`: a window had no room; nothing changed.
/// `Ok(Err(NotInFlight))`: the request is no longer in flight (another replica
/// recovered it while this one was stalled), so no further call may be made for it.
/// A request in flight that holds nothing has nothing to raise (as on SQLite).
async fn top_up(
    client: &Client,
    request_id: &str,
    extra: Money,
    limits: &[BudgetLimit],
) -> Result<Result<(), LedgerError>, LedgerError> {
    if !extra.is_positive() {
        let st = client.prepare_cached(sql::OUTCOME).await?;
        return Ok(match client.query_opt(&st, &[&request_id]).await? {
            None => Err(LedgerError::UnknownRequest(request_id.to_string())),
            Some(r) if r.try_get::<_, bool>(0)? => Ok(()),
            Some(_) => Err(LedgerError::NotInFlight(request_id.to_string())),
        });
    }
    // Budgets the running plan has that the request holds nothing in (added since its
    // admission): their window is created, or counted again, from the ledger, which
    // makes the request one of its holders, so the top-up below raises it there too
    // (see `sqlite::ops::top_up`).
    adopt_unheld(client, request_id, limits).await?;
    let periods: Vec<&str> = limits.iter().map(|b| b.period.as_str()).collect();
    let amounts: Vec<Decimal> = limits.iter().map(|b| b.limit.decimal()).collect();
    let st = client.prepare_cached(sql::TOP_UP).await?;
    let row = client
        .query_one(&st, &[&request_id, &dec(extra), &periods, &amounts])
        .await?;
    let found: bool = row.try_get(0)?;
    if !found {
        let st = client.prepare_cached(sql::OUTCOME).await?;
        return Ok(Err(match client.query_opt(&st, &[&request_id]).await? {
            None => LedgerError::UnknownRequest(request_id.to_string()),
            Some(_) => LedgerError::NotInFlight(request_id.to_string()),
        }));
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
            .execute(&st, &[&policy, &took, &starts, &dec(extra)])
            .await?;
    }
    // The window that had no room: one the top-up did not take.
    let row = client
        .query_one(
            "SELECT w.period, w.spent, w.reserved
             FROM requests q, unnest(q.reserved_periods) AS x (period), budget_windows w
             WHERE q.id = $1 AND w.policy = q.policy AND w.period = x.period
               AND w.window_start = date_trunc(x.period, q.received_at, 'UTC')
               AND NOT (x.period = ANY ($2))
             ORDER BY w.period LIMIT 1",
            &[&request_id, &took],
        )
        .await?;
    let period: String = row.try_get(0)?;
    let Some(culprit) = limits.iter().find(|b| b.period.as_str() == period) else {
        return Err(LedgerError::Corrupt(format!(
            "a top-up refused by period `{period}`, which the plan does not limit"
        )));
    };
    let limit = culprit.limit;
    let spent = Money::new(row.try_get(1)?);
    let reserved = Money::new(row.try_get(2)?);
    Ok(Err(LedgerError::BudgetExhausted {
        policy,
        period: culprit.period.as_str(),
        limit,
        spent,
        reserved,
        remaining: limit.saturating_sub(spent + reserved),
        needed: extra,
    }))
}

/// Create, or count again, the window of each period of `limits` the in-flight request
/// holds nothing in: that makes it a holder of each (`purser_seed`).
async fn adopt_unheld(
    client: &Client,
    request_id: &str,
    limits: &[BudgetLimit],
) -> Result<(), LedgerError> {
    let Some(row) = client
        .query_opt(
            "SELECT policy, received_at, COALESCE(reserved_periods, '{}') FROM requests WHERE id = $1 AND outcome = 'in_flight'",
            &[&request_id],
        )
        .await?
    else {
        // Unknown or no longer in flight: the top-up itself says which.
        return Ok(());
    };
    let policy: String = row.try_get(0)?;
    let received: OffsetDateTime = row.try_get(1)?;
    let held: Vec<String> = row.try_get(2)?;
    for b in limits
        .iter()
        .filter(|b| !held.iter().any(|p| p == b.period.as_str()))
    {
        let start = super::window::window_start_at(b.period, received);
        client
            .execute(
                "SELECT purser_seed($1, $2, $3, $4)",
                &[&policy, &b.period.as_str(), &start, &dec(b.limit)],
            )
            .await?;
    }
    Ok(())
}
