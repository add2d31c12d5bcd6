//! The spend page's queries on an SQLite ledger: spend per time bucket and group, and
//! failures per provider and class. Same filters and bound parameters as `audit`.

use std::collections::BTreeMap;

use rusqlite::{Connection, params_from_iter};

use super::audit::{Clause, attempt_conditions, key_sql, request_conditions, text};
use super::rollup;
use crate::ledger::LedgerError;
use crate::ledger::audit::{
    Bucket, FailureTally, Failures, Filter, GroupBy, SeriesRow, Source, SpendRow,
    attempts_rollup_filters, merge_series, parse_money, requests_rollup_filters, split,
};

/// Spend per (bucket, group), from the rollups where they answer (`series_from`).
pub fn series(
    conn: &Connection,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
) -> Result<Vec<SeriesRow>, LedgerError> {
    series_from(conn, f, bucket, by, Source::Rollups)
}

/// Spend per (bucket, group), buckets oldest first: the whole hours of the window
/// from the rollups, the ragged ends (and filters the rollup lacks) from the rows;
/// only the rows with `Source::Rows`.
pub fn series_from(
    conn: &Connection,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
    source: Source,
) -> Result<Vec<SeriesRow>, LedgerError> {
    match split(f, source, attempts_rollup_filters(f)) {
        None => series_rows(conn, f, bucket, by),
        Some(s) => {
            let mut parts = vec![rollup::series(conn, &s, f, bucket, by)?];
            for r in &s.ragged {
                parts.push(series_rows(conn, r, bucket, by)?);
            }
            merge_series(parts)
        }
    }
}

/// Spend per (bucket, group) from the attempts themselves. Rows stream from the
/// covering index `attempts_by_start` (provider grouping needs no join) and are
/// totalled here in exact decimals, as `audit::spend` does.
fn series_rows(
    conn: &Connection,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
) -> Result<Vec<SeriesRow>, LedgerError> {
    let (c, mut join) = attempt_conditions(f);
    join |= matches!(by, GroupBy::Policy | GroupBy::Client | GroupBy::Model);
    let (width, suffix) = bucket.prefix();
    let sql = format!(
        "SELECT substr(a.started_at, 1, {width}), {key}, a.billing, a.cost, a.worst_case
         FROM attempts a {join} {where_}",
        key = key_sql(by),
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    // Bucket, then group: both looked up by borrowed text, so a row allocates only
    // when it opens a new cell.
    let mut cells: BTreeMap<String, BTreeMap<String, SpendRow>> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let (b, key) = (text(r, 0)?, text(r, 1)?);
        let groups = match cells.get_mut(b) {
            Some(g) => g,
            None => cells.entry(b.to_string()).or_default(),
        };
        let row = match groups.get_mut(key) {
            Some(row) => row,
            None => groups
                .entry(key.to_string())
                .or_insert_with(|| SpendRow::empty(key.to_string())),
        };
        let billing = text(r, 2)?;
        let worst = if billing == "maybe_billed" {
            parse_money(text(r, 4)?)?
        } else {
            crate::money::Money::ZERO
        };
        row.add(billing, 1, parse_money(text(r, 3)?)?, worst)?;
    }
    Ok(cells
        .into_iter()
        .flat_map(|(b, groups)| {
            let bucket = format!("{b}{suffix}");
            groups.into_values().map(move |spend| SeriesRow {
                bucket: bucket.clone(),
                spend,
            })
        })
        .collect())
}

/// Failures, from the rollups where they answer (`failures_from`).
pub fn failures(conn: &Connection, f: &Filter) -> Result<Failures, LedgerError> {
    failures_from(conn, f, Source::Rollups)
}

/// Attempts per provider and class (attempts filtered as `spend` filters them), and
/// request outcomes (requests filtered as `requests` filters them), each from the
/// rollups for the whole hours of the window and from the rows for the rest. Requests
/// served after a failover are counted from the attempts (a success after the first),
/// so the request scan needs no per-request lookup.
pub fn failures_from(
    conn: &Connection,
    f: &Filter,
    source: Source,
) -> Result<Failures, LedgerError> {
    let mut tally = FailureTally::default();
    match split(f, source, attempts_rollup_filters(f)) {
        None => failed_attempt_rows(conn, f, &mut tally)?,
        Some(s) => {
            rollup::failed_attempts(conn, &s, f, &mut tally)?;
            for r in &s.ragged {
                failed_attempt_rows(conn, r, &mut tally)?;
            }
        }
    }
    match split(f, source, requests_rollup_filters(f)) {
        None => request_outcome_rows(conn, f, &mut tally)?,
        Some(s) => {
            rollup::request_outcomes(conn, &s, f, &mut tally)?;
            for r in &s.ragged {
                request_outcome_rows(conn, r, &mut tally)?;
            }
        }
    }
    Ok(tally.done())
}

fn failed_attempt_rows(
    conn: &Connection,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let (c, join) = attempt_conditions(f);
    let sql = format!(
        "SELECT a.provider, COALESCE(a.class, 'in_flight'), a.seq > 1, count(*) FROM attempts a {join} {where_}
         GROUP BY 1, 2, 3",
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    while let Some(r) = rows.next()? {
        let n = u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
        tally.attempts(text(r, 0)?, text(r, 1)?, r.get(2)?, n);
    }
    Ok(())
}

fn request_outcome_rows(
    conn: &Connection,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let mut w = Clause::new();
    if let Some(s) = &f.since {
        w.push("r.received_ms >= ?", s.ms);
    }
    if let Some(u) = &f.until {
        w.push("r.received_ms < ?", u.ms);
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
    let sql = format!(
        "SELECT r.outcome, count(*) FROM requests r {} GROUP BY 1",
        w.render()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(w.args.iter()))?;
    while let Some(r) = rows.next()? {
        let n: i64 = r.get(1)?;
        tally.requests(text(r, 0)?, n.try_into().unwrap_or(0))?;
    }
    Ok(())
}
