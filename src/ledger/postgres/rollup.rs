//! The spend page's queries answered from the hourly rollups (`attempts_hourly`,
//! `requests_hourly`, kept by the triggers of migration 0005) for the whole hours of a
//! window, summed by PostgreSQL in NUMERIC (exact); `read` and `series` add the
//! ragged ends from the raw rows.

use std::collections::BTreeMap;

use deadpool_postgres::Client;

use super::read::Clause;
use crate::ledger::LedgerError;
use crate::ledger::audit::{Bucket, FailureTally, Filter, GroupBy, SeriesRow, SpendRow, Split};
use crate::money::Money;

/// The hour range of `s` and `f`'s filters on the attempts rollup `h`.
fn attempt_conditions(s: &Split, f: &Filter) -> Clause {
    let mut c = Clause::default();
    hours(&mut c, s);
    for (col, v) in [
        ("h.provider", &f.provider),
        ("h.class", &f.class),
        ("h.policy", &f.policy),
        ("h.client", &f.client),
        ("h.model", &f.model),
    ] {
        if let Some(v) = v {
            c.push(&format!("{col} = ?"), v.clone());
        }
    }
    if let Some(i) = f.ingress {
        c.push("h.ingress = ?", i.as_str());
    }
    c
}

fn hours(c: &mut Clause, s: &Split) {
    if let Some(a) = &s.from {
        c.push("h.hour >= ?", a.at);
    }
    if let Some(b) = &s.to {
        c.push("h.hour < ?", b.at);
    }
}

/// The rollup to read: the one without the client unless the client is asked for
/// (`attempts_hourly_lean` has a fifth of the rows when a policy has five clients).
fn table(f: &Filter, by: Option<GroupBy>) -> &'static str {
    if f.client.is_some() || by == Some(GroupBy::Client) {
        "attempts_hourly"
    } else {
        "attempts_hourly_lean"
    }
}

fn key_sql(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Provider => "h.provider",
        GroupBy::Policy => "h.policy",
        GroupBy::Client => "h.client",
        GroupBy::Model => "h.model",
        GroupBy::Ingress => "h.ingress",
        GroupBy::Day => "to_char(h.hour AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    }
}

fn unit(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Hour => "hour",
        Bucket::Day => "day",
        Bucket::Month => "month",
    }
}

/// Spend per group over the whole hours of `s`.
pub async fn spend(
    c: &Client,
    s: &Split,
    f: &Filter,
    by: GroupBy,
) -> Result<Vec<SpendRow>, LedgerError> {
    let w = attempt_conditions(s, f);
    let sql = format!(
        "SELECT {key} AS k, h.billing, sum(h.attempts)::bigint, sum(h.cost), sum(h.worst_case)
         FROM {table} h {where_} GROUP BY 1, 2",
        table = table(f, Some(by)),
        key = key_sql(by),
        where_ = w.render(),
    );
    let mut groups: BTreeMap<String, SpendRow> = BTreeMap::new();
    for r in c.query(&sql, &w.params()).await? {
        let key: String = r.try_get(0)?;
        let billing: String = r.try_get(1)?;
        let n = u64::try_from(r.try_get::<_, i64>(2)?).unwrap_or(0);
        groups
            .entry(key.clone())
            .or_insert_with(|| SpendRow::empty(key))
            .add(
                &billing,
                n,
                Money::new(r.try_get(3)?),
                Money::new(r.try_get(4)?),
            )?;
    }
    Ok(groups.into_values().collect())
}

/// Spend per (bucket, group) over the whole hours of `s`.
pub async fn series(
    c: &Client,
    s: &Split,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
) -> Result<Vec<SeriesRow>, LedgerError> {
    let w = attempt_conditions(s, f);
    let sql = format!(
        "SELECT to_char(s.b, 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), s.k, s.billing, s.n, s.c, s.w FROM (
           SELECT date_trunc('{unit}', h.hour AT TIME ZONE 'UTC') AS b, {key} AS k, h.billing,
                  sum(h.attempts)::bigint AS n, sum(h.cost) AS c, sum(h.worst_case) AS w
           FROM {table} h {where_} GROUP BY 1, 2, 3) s",
        table = table(f, Some(by)),
        unit = unit(bucket),
        key = key_sql(by),
        where_ = w.render(),
    );
    let mut cells: BTreeMap<(String, String), SpendRow> = BTreeMap::new();
    for r in c.query(&sql, &w.params()).await? {
        let b: String = r.try_get(0)?;
        let key: String = r.try_get(1)?;
        let billing: String = r.try_get(2)?;
        let n = u64::try_from(r.try_get::<_, i64>(3)?).unwrap_or(0);
        cells
            .entry((b, key.clone()))
            .or_insert_with(|| SpendRow::empty(key))
            .add(
                &billing,
                n,
                Money::new(r.try_get(4)?),
                Money::new(r.try_get(5)?),
            )?;
    }
    Ok(cells
        .into_iter()
        .map(|((bucket, _), spend)| SeriesRow { bucket, spend })
        .collect())
}

/// Attempts per (provider, class, after the first) over the whole hours of `s`.
pub async fn failed_attempts(
    c: &Client,
    s: &Split,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let w = attempt_conditions(s, f);
    let sql = format!(
        "SELECT h.provider, h.class, h.later, sum(h.attempts)::bigint FROM {} h {}
         GROUP BY 1, 2, 3",
        table(f, None),
        w.render()
    );
    for r in c.query(&sql, &w.params()).await? {
        let provider: String = r.try_get(0)?;
        let class: String = r.try_get(1)?;
        let class = if class.is_empty() {
            "in_flight"
        } else {
            &class
        };
        let n = u64::try_from(r.try_get::<_, i64>(3)?).unwrap_or(0);
        tally.attempts(&provider, class, r.try_get(2)?, n);
    }
    Ok(())
}

/// Requests per outcome over the whole hours of `s` (by when they were received).
pub async fn request_outcomes(
    c: &Client,
    s: &Split,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let mut w = Clause::default();
    hours(&mut w, s);
    for (col, v) in [
        ("h.policy", &f.policy),
        ("h.client", &f.client),
        ("h.model", &f.model),
    ] {
        if let Some(v) = v {
            w.push(&format!("{col} = ?"), v.clone());
        }
    }
    if let Some(i) = f.ingress {
        w.push("h.ingress = ?", i.as_str());
    }
    if let Some(o) = f.outcome {
        w.push("h.outcome = ?", o.as_str());
    }
    let sql = format!(
        "SELECT h.outcome, sum(h.requests)::bigint FROM requests_hourly h {} GROUP BY 1",
        w.render()
    );
    for r in c.query(&sql, &w.params()).await? {
        let outcome: String = r.try_get(0)?;
        let n = u64::try_from(r.try_get::<_, i64>(1)?).unwrap_or(0);
        tally.requests(&outcome, n)?;
    }
    Ok(())
}
