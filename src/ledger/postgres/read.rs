//! Audit reads on PostgreSQL: the same answers as `sqlite::read` and `sqlite::audit`,
//! in the same shapes (times as purser's RFC 3339 text, money as exact decimals).

use std::collections::BTreeMap;

use deadpool_postgres::Client;
use futures_util::{StreamExt, pin_mut};
use rust_decimal::Decimal;
use time::OffsetDateTime;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::ledger::audit::{
    AttemptLine, BudgetState, Cursor, Filter, GroupBy, MAX_LIMIT, RequestPage, Source, SpendRow,
    attempts_rollup_filters, merge_spend, split,
};
use crate::ledger::read::{AttemptRow, BudgetRow, RequestRow};
use crate::ledger::{LedgerError, StoredTurn, rfc3339};
use crate::money::Money;

type Param = Box<dyn ToSql + Sync + Send>;

const REQUEST_COLUMNS: &str = "r.id, r.received_at, r.client, r.policy, r.plan_id, r.model, r.mode, r.ceiling, r.worst_case, \
     r.outcome, r.error_code, r.served_by, r.cost, r.ingress";

const ATTEMPT_COLUMNS: &str = "a.seq, a.provider, a.upstream_model, a.jurisdiction, a.started_at, a.finished_at, a.state, a.status, \
     a.class, a.billing, a.decision, a.reason, a.input_tokens, a.output_tokens, a.cost, a.worst_case, a.message, a.cost_basis, \
     a.cache_read_tokens, a.cache_write_tokens, a.cache_write_5m_tokens, a.cache_write_1h_tokens, a.response_id";

fn money(r: &Row, i: usize) -> Result<String, LedgerError> {
    let d: Decimal = r.try_get(i)?;
    Ok(Money::new(d).to_string())
}

fn when(r: &Row, i: usize) -> Result<String, LedgerError> {
    let t: OffsetDateTime = r.try_get(i)?;
    Ok(rfc3339(t))
}

/// A window start as `window_start` writes it (whole seconds).
fn window_text(t: OffsetDateTime) -> String {
    let mut s = rfc3339(t);
    s.truncate(19);
    s.push('Z');
    s
}

fn request_from_row(r: &Row) -> Result<RequestRow, LedgerError> {
    Ok(RequestRow {
        id: r.try_get(0)?,
        received_at: when(r, 1)?,
        client: r.try_get(2)?,
        policy: r.try_get(3)?,
        plan_id: r.try_get(4)?,
        model: r.try_get(5)?,
        mode: r.try_get(6)?,
        ceiling: money(r, 7)?,
        worst_case: money(r, 8)?,
        outcome: r.try_get(9)?,
        error_code: r.try_get(10)?,
        served_by: r.try_get(11)?,
        cost: money(r, 12)?,
        ingress: r.try_get(13)?,
        attempts: vec![],
    })
}

fn attempt_from_row(r: &Row, base: usize) -> Result<AttemptRow, LedgerError> {
    let seq: i32 = r.try_get(base)?;
    let finished: Option<OffsetDateTime> = r.try_get(base + 5)?;
    let status: Option<i32> = r.try_get(base + 7)?;
    Ok(AttemptRow {
        seq: u32::try_from(seq).map_err(|_| LedgerError::Corrupt(format!("seq {seq}")))?,
        provider: r.try_get(base + 1)?,
        upstream_model: r.try_get(base + 2)?,
        jurisdiction: r.try_get(base + 3)?,
        started_at: when(r, base + 4)?,
        finished_at: finished.map(rfc3339),
        state: r.try_get(base + 6)?,
        status: status.and_then(|s| u16::try_from(s).ok()),
        class: r.try_get(base + 8)?,
        billing: r.try_get(base + 9)?,
        decision: r.try_get(base + 10)?,
        reason: r.try_get(base + 11)?,
        input_tokens: r.try_get(base + 12)?,
        output_tokens: r.try_get(base + 13)?,
        cost: money(r, base + 14)?,
        worst_case: money(r, base + 15)?,
        message: r.try_get(base + 16)?,
        cost_basis: r.try_get(base + 17)?,
        cache_read_tokens: r.try_get(base + 18)?,
        cache_write_tokens: r.try_get(base + 19)?,
        cache_write_5m_tokens: r.try_get(base + 20)?,
        cache_write_1h_tokens: r.try_get(base + 21)?,
        response_id: r.try_get(base + 22)?,
    })
}

async fn attempts_of(c: &Client, id: &str) -> Result<Vec<AttemptRow>, LedgerError> {
    let st = c
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts a WHERE a.request_id = $1 ORDER BY a.seq"
        ))
        .await?;
    c.query(&st, &[&id])
        .await?
        .iter()
        .map(|r| attempt_from_row(r, 0))
        .collect()
}

pub async fn request(c: &Client, id: &str) -> Result<Option<RequestRow>, LedgerError> {
    let st = c
        .prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS} FROM requests r WHERE r.id = $1"
        ))
        .await?;
    let Some(row) = c.query_opt(&st, &[&id]).await? else {
        return Ok(None);
    };
    let mut row = request_from_row(&row)?;
    row.attempts = attempts_of(c, id).await?;
    Ok(Some(row))
}

/// A `WHERE` clause with its bound values.
#[derive(Default)]
pub(super) struct Clause {
    pub(super) sql: Vec<String>,
    pub(super) args: Vec<Param>,
}

impl Clause {
    /// `sql` holds one `?`, which becomes the next numbered parameter bound to `arg`.
    pub(super) fn push(&mut self, sql: &str, arg: impl ToSql + Sync + Send + 'static) {
        self.args.push(Box::new(arg));
        self.sql
            .push(sql.replacen('?', &format!("${}", self.args.len()), 1));
    }

    pub(super) fn render(&self) -> String {
        if self.sql.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.sql.join(" AND "))
        }
    }

    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

pub(super) fn request_conditions(c: &mut Clause, f: &Filter) {
    for (col, v) in [
        ("r.policy", &f.policy),
        ("r.client", &f.client),
        ("r.model", &f.model),
    ] {
        if let Some(v) = v {
            c.push(&format!("{col} = ?"), v.clone());
        }
    }
    if let Some(i) = f.ingress {
        c.push("r.ingress = ?", i.as_str());
    }
    if let Some(o) = f.outcome {
        c.push("r.outcome = ?", o.as_str());
    }
}

pub async fn requests(
    c: &Client,
    f: &Filter,
    limit: u32,
    cursor: Option<Cursor>,
) -> Result<RequestPage, LedgerError> {
    let limit = limit.clamp(1, MAX_LIMIT);
    let mut w = Clause::default();
    if let Some(s) = &f.since {
        w.push("r.received_at >= ?", s.at);
    }
    if let Some(u) = &f.until {
        w.push("r.received_at < ?", u.at);
    }
    request_conditions(&mut w, f);
    if let Some(p) = &f.provider {
        w.push(
            "EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id AND a.provider = ?)",
            p.clone(),
        );
    }
    if let Some(k) = &f.class {
        w.push(
            "EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id AND a.class = ?)",
            k.clone(),
        );
    }
    if let Some(cur) = cursor {
        w.push("r.ledger_seq < ?", cur.0);
    }
    let sql = format!(
        "SELECT {REQUEST_COLUMNS}, r.ledger_seq FROM requests r {} ORDER BY r.ledger_seq DESC LIMIT {}",
        w.render(),
        limit + 1
    );
    let rows = c.query(&sql, &w.params()).await?;
    let mut page = Vec::with_capacity(rows.len());
    for r in &rows {
        let seq: i64 = r.try_get(14)?;
        page.push((request_from_row(r)?, seq));
    }
    let more = page.len() > limit as usize;
    page.truncate(limit as usize);
    let next_cursor = if more {
        page.last().map(|(_, seq)| Cursor(*seq).encode())
    } else {
        None
    };
    let mut requests = Vec::with_capacity(page.len());
    for (mut r, _) in page {
        r.attempts = attempts_of(c, &r.id).await?;
        requests.push(r);
    }
    Ok(RequestPage {
        requests,
        next_cursor,
    })
}

pub(super) fn attempt_conditions(f: &Filter) -> (Clause, bool) {
    let mut c = Clause::default();
    if let Some(s) = &f.since {
        c.push("a.started_at >= ?", s.at);
    }
    if let Some(u) = &f.until {
        c.push("a.started_at < ?", u.at);
    }
    if let Some(p) = &f.provider {
        c.push("a.provider = ?", p.clone());
    }
    if let Some(k) = &f.class {
        c.push("a.class = ?", k.clone());
    }
    let before = c.sql.len();
    request_conditions(&mut c, f);
    let needs_request = c.sql.len() > before;
    (c, needs_request)
}

pub(super) fn key_sql(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Provider => "a.provider",
        GroupBy::Policy => "r.policy",
        GroupBy::Client => "r.client",
        GroupBy::Model => "r.model",
        GroupBy::Ingress => "r.ingress",
        GroupBy::Day => "to_char(a.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    }
}

/// Spend per group, from the rollups where they answer (`spend_from`).
pub async fn spend(c: &Client, f: &Filter, by: GroupBy) -> Result<Vec<SpendRow>, LedgerError> {
    spend_from(c, f, by, Source::Rollups).await
}

/// Spend per group: the whole hours of the window from the rollups, the ragged ends
/// (and filters the rollup lacks) from the attempts; only the attempts with
/// `Source::Rows`.
pub async fn spend_from(
    c: &Client,
    f: &Filter,
    by: GroupBy,
    source: Source,
) -> Result<Vec<SpendRow>, LedgerError> {
    match split(f, source, attempts_rollup_filters(f)) {
        None => spend_rows(c, f, by).await,
        Some(s) => {
            let mut parts = vec![super::rollup::spend(c, &s, f, by).await?];
            for r in &s.ragged {
                parts.push(spend_rows(c, r, by).await?);
            }
            merge_spend(parts)
        }
    }
}

/// Spend per group from the attempts, summed by PostgreSQL in NUMERIC (exact).
async fn spend_rows(c: &Client, f: &Filter, by: GroupBy) -> Result<Vec<SpendRow>, LedgerError> {
    let (w, mut join) = attempt_conditions(f);
    join |= matches!(
        by,
        GroupBy::Policy | GroupBy::Client | GroupBy::Model | GroupBy::Ingress
    );
    let sql = format!(
        "SELECT {key} AS k, a.billing, count(*), COALESCE(sum(a.cost), 0), COALESCE(sum(a.worst_case), 0)
         FROM attempts a {join} {where_} GROUP BY 1, 2",
        key = key_sql(by),
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = w.render(),
    );
    let mut groups: BTreeMap<String, SpendRow> = BTreeMap::new();
    for r in c.query(&sql, &w.params()).await? {
        let key: String = r.try_get(0)?;
        let billing: String = r.try_get(1)?;
        let n = u64::try_from(r.try_get::<_, i64>(2)?).unwrap_or(0);
        let cost = Money::new(r.try_get(3)?);
        let worst = Money::new(r.try_get(4)?);
        let row = groups.entry(key.clone()).or_insert(SpendRow {
            key,
            cost: Money::ZERO,
            maybe_billed_cost: Money::ZERO,
            attempts: 0,
            billed: 0,
            maybe_billed: 0,
            not_billed: 0,
        });
        let overflow = || LedgerError::Corrupt("spend total overflows a decimal".into());
        row.attempts += n;
        row.cost = row.cost.checked_add(cost).ok_or_else(overflow)?;
        match billing.as_str() {
            "billed" => row.billed += n,
            "maybe_billed" => {
                row.maybe_billed += n;
                row.maybe_billed_cost = row
                    .maybe_billed_cost
                    .checked_add(worst)
                    .ok_or_else(overflow)?;
            }
            "not_billed" => row.not_billed += n,
            other => return Err(LedgerError::Corrupt(format!("billing state `{other}`"))),
        }
    }
    Ok(groups.into_values().collect())
}

/// Every attempt matching `f`, oldest first, sent row by row as PostgreSQL yields
/// them; stops when the receiver is gone.
pub async fn attempt_lines(
    c: &Client,
    f: &Filter,
    tx: &tokio::sync::mpsc::Sender<Result<AttemptLine, LedgerError>>,
) -> Result<(), LedgerError> {
    let (w, _) = attempt_conditions(f);
    let sql = format!(
        "SELECT r.id, r.received_at, r.policy, r.client, r.model, r.plan_id, r.ingress, {ATTEMPT_COLUMNS}
         FROM attempts a JOIN requests r ON r.id = a.request_id {where_}
         ORDER BY a.started_at, a.request_id, a.seq",
        where_ = w.render(),
    );
    let params = w.params();
    let rows = c.query_raw(&sql, params).await?;
    pin_mut!(rows);
    while let Some(r) = rows.next().await {
        let r = r?;
        let line = AttemptLine {
            request_id: r.try_get(0)?,
            received_at: when(&r, 1)?,
            policy: r.try_get(2)?,
            client: r.try_get(3)?,
            model: r.try_get(4)?,
            plan_id: r.try_get(5)?,
            ingress: r.try_get(6)?,
            attempt: attempt_from_row(&r, 7)?,
        };
        if tx.send(Ok(line)).await.is_err() {
            break;
        }
    }
    Ok(())
}

pub async fn budgets(c: &Client) -> Result<Vec<BudgetRow>, LedgerError> {
    c.query(
        "SELECT policy, period, window_start, limit_amount, spent, reserved FROM budget_windows
         ORDER BY policy, period, window_start DESC",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(BudgetRow {
            policy: r.try_get(0)?,
            period: r.try_get(1)?,
            window_start: window_text(r.try_get(2)?),
            limit: money(r, 3)?,
            spent: money(r, 4)?,
            reserved: money(r, 5)?,
        })
    })
    .collect()
}

pub async fn current_budgets(
    c: &Client,
    configured: &[(String, crate::policy::plan::Budget)],
    now: OffsetDateTime,
) -> Result<Vec<BudgetState>, LedgerError> {
    let st = c
        .prepare_cached(
            "SELECT spent, reserved FROM budget_windows WHERE policy = $1 AND period = $2 AND window_start = $3",
        )
        .await?;
    let mut out = Vec::with_capacity(configured.len());
    for (policy, b) in configured {
        let start = super::window_start_at(b.period, now);
        let (spent, reserved) = match c
            .query_opt(&st, &[policy, &b.period.as_str(), &start])
            .await?
        {
            Some(r) => (Money::new(r.try_get(0)?), Money::new(r.try_get(1)?)),
            // Not created yet: it will start from what the ledger already charges.
            None => {
                let seed = c
                    .query_one(
                        "SELECT purser_charged($1, $2, $3),
                                (SELECT COALESCE(sum(amount) FILTER (WHERE in_flight), 0)
                                 FROM purser_adoptable($1, $2, $3))",
                        &[policy, &b.period.as_str(), &start],
                    )
                    .await?;
                (
                    Money::new(seed.try_get::<_, Decimal>(0)?),
                    Money::new(seed.try_get::<_, Decimal>(1)?),
                )
            }
        };
        out.push(BudgetState {
            policy: policy.clone(),
            period: b.period.as_str().to_string(),
            window_start: window_text(start),
            limit: b.limit,
            spent,
            reserved,
            remaining: b.limit.saturating_sub(spent + reserved),
        });
    }
    Ok(out)
}

pub async fn total_cost(c: &Client) -> Result<String, LedgerError> {
    let d: Decimal = c
        .query_one("SELECT COALESCE(sum(cost), 0) FROM attempts", &[])
        .await?
        .try_get(0)?;
    Ok(Money::new(d).to_string())
}

/// The attempt of `policy` that recorded the stored response `response_id`, if any
/// (served by the partial index on `response_id`).
pub async fn stored_turn(
    c: &Client,
    response_id: &str,
    policy: &str,
) -> Result<Option<StoredTurn>, LedgerError> {
    let st = c
        .prepare_cached(
            "SELECT a.request_id, a.provider, a.upstream_model, a.input_tokens, a.output_tokens,
                    a.response_items
             FROM attempts a JOIN requests r ON r.id = a.request_id
             WHERE a.response_id = $1 AND r.policy = $2
             ORDER BY a.finished_at DESC LIMIT 1",
        )
        .await?;
    let Some(r) = c.query_opt(&st, &[&response_id, &policy]).await? else {
        return Ok(None);
    };
    let count = |i: usize| -> Result<Option<u64>, LedgerError> {
        let n: Option<i64> = r.try_get(i)?;
        Ok(n.and_then(|n| u64::try_from(n).ok()))
    };
    Ok(Some(StoredTurn {
        request_id: r.try_get(0)?,
        provider: r.try_get(1)?,
        upstream_model: r.try_get(2)?,
        input_tokens: count(3)?,
        output_tokens: count(4)?,
        output_items: count(5)?.unwrap_or(0),
    }))
}
