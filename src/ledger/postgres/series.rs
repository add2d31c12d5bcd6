//! The spend page's queries on PostgreSQL: the same answers as `sqlite::series`,
//! summed by PostgreSQL in NUMERIC (exact).

use std::collections::BTreeMap;

use deadpool_postgres::Client;

use super::read::{Clause, attempt_conditions, key_sql, request_conditions};
use super::rollup;
use crate::ledger::LedgerError;
use crate::ledger::audit::{
    Bucket, FailureTally, Failures, Filter, GroupBy, SeriesRow, Source, SpendRow,
    attempts_rollup_filters, merge_series, requests_rollup_filters, split,
};
use crate::money::Money;

fn unit(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Hour => "hour",
        Bucket::Day => "day",
        Bucket::Month => "month",
    }
}

/// Spend per (bucket, group), from the rollups where they answer (`series_from`).
pub async fn series(
    c: &Client,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
) -> Result<Vec<SeriesRow>, LedgerError> {
    series_from(c, f, bucket, by, Source::Rollups).await
}

/// Spend per (bucket, group), buckets oldest first: the whole hours of the window
/// from the rollups, the ragged ends (and filters the rollup lacks) from the rows;
/// only the rows with `Source::Rows`.
pub async fn series_from(
    c: &Client,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
    source: Source,
) -> Result<Vec<SeriesRow>, LedgerError> {
    match split(f, source, attempts_rollup_filters(f)) {
        None => series_rows(c, f, bucket, by).await,
        Some(s) => {
            let mut parts = vec![rollup::series(c, &s, f, bucket, by).await?];
            for r in &s.ragged {
                parts.push(series_rows(c, r, bucket, by).await?);
            }
            merge_series(parts)
        }
    }
}

async fn series_rows(
    c: &Client,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
) -> Result<Vec<SeriesRow>, LedgerError> {
    let (w, mut join) = attempt_conditions(f);
    join |= matches!(by, GroupBy::Policy | GroupBy::Client | GroupBy::Model);
    // Group on the truncated instant and format only the groups: formatting every
    // row (to_char per attempt) cost more than the sums.
    let sql = format!(
        "SELECT to_char(s.b, 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), s.k, s.billing, s.n, s.c, s.w FROM (
           SELECT date_trunc('{unit}', a.started_at AT TIME ZONE 'UTC') AS b, {key} AS k, a.billing,
                  count(*) AS n, COALESCE(sum(a.cost), 0) AS c, COALESCE(sum(a.worst_case), 0) AS w
           FROM attempts a {join} {where_} GROUP BY 1, 2, 3) s",
        unit = unit(bucket),
        key = key_sql(by),
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = w.render(),
    );
    let mut cells: BTreeMap<(String, String), SpendRow> = BTreeMap::new();
    for r in c.query(&sql, &w.params()).await? {
        let b: String = r.try_get(0)?;
        let key: String = r.try_get(1)?;
        let billing: String = r.try_get(2)?;
        let n = u64::try_from(r.try_get::<_, i64>(3)?).unwrap_or(0);
        let row = cells
            .entry((b, key.clone()))
            .or_insert_with(|| SpendRow::empty(key));
        row.add(
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

/// As `sqlite::series::failures`: the whole hours of the window from the rollups, the
/// rest from the rows; requests served after a failover are counted from the attempts
/// (a success after the first).
pub async fn failures(c: &Client, f: &Filter) -> Result<Failures, LedgerError> {
    failures_from(c, f, Source::Rollups).await
}

/// `failures`, from `source`.
pub async fn failures_from(
    c: &Client,
    f: &Filter,
    source: Source,
) -> Result<Failures, LedgerError> {
    let mut tally = FailureTally::default();
    match split(f, source, attempts_rollup_filters(f)) {
        None => failed_attempt_rows(c, f, &mut tally).await?,
        Some(s) => {
            rollup::failed_attempts(c, &s, f, &mut tally).await?;
            for r in &s.ragged {
                failed_attempt_rows(c, r, &mut tally).await?;
            }
        }
    }
    match split(f, source, requests_rollup_filters(f)) {
        None => request_outcome_rows(c, f, &mut tally).await?,
        Some(s) => {
            rollup::request_outcomes(c, &s, f, &mut tally).await?;
            for r in &s.ragged {
                request_outcome_rows(c, r, &mut tally).await?;
            }
        }
    }
    Ok(tally.done())
}

async fn failed_attempt_rows(
    c: &Client,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let (w, join) = attempt_conditions(f);
    let sql = format!(
        "SELECT a.provider, COALESCE(a.class, 'in_flight'), a.seq > 1, count(*) FROM attempts a {join} {where_}
         GROUP BY 1, 2, 3",
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = w.render(),
    );
    for r in c.query(&sql, &w.params()).await? {
        let provider: String = r.try_get(0)?;
        let class: String = r.try_get(1)?;
        let n = u64::try_from(r.try_get::<_, i64>(3)?).unwrap_or(0);
        tally.attempts(&provider, &class, r.try_get(2)?, n);
    }
    Ok(())
}

async fn request_outcome_rows(
    c: &Client,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let mut q = Clause::default();
    if let Some(s) = &f.since {
        q.push("r.received_at >= ?", s.at);
    }
    if let Some(u) = &f.until {
        q.push("r.received_at < ?", u.at);
    }
    request_conditions(&mut q, f);
    if let Some(p) = &f.provider {
        q.push(
            "EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id AND a.provider = ?)",
            p.clone(),
        );
    }
    if let Some(k) = &f.class {
        q.push(
            "EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id AND a.class = ?)",
            k.clone(),
        );
    }
    let sql = format!(
        "SELECT r.outcome, count(*) FROM requests r {} GROUP BY 1",
        q.render()
    );
    for r in c.query(&sql, &q.params()).await? {
        let outcome: String = r.try_get(0)?;
        tally.requests(
            &outcome,
            u64::try_from(r.try_get::<_, i64>(1)?).unwrap_or(0),
        )?;
    }
    Ok(())
}
