//! The spend page's queries on an SQLite ledger: spend per time bucket and group, and
//! failures per provider and class. Same filters and bound parameters as `audit`.

use std::collections::BTreeMap;

use rusqlite::{Connection, params_from_iter};

use super::audit::{Clause, attempt_conditions, key_sql, request_conditions, text};
use crate::ledger::LedgerError;
use crate::ledger::audit::{
    Bucket, FailureRow, Failures, Filter, GroupBy, RequestCounts, SeriesRow, SpendRow,
    parse_money,
};

/// Spend per (bucket, group), buckets oldest first. Rows stream from the covering
/// index `attempts_by_start` (provider grouping needs no join) and are totalled here in
/// exact decimals, as `audit::spend` does.
pub fn series(
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

/// Attempts per provider and class (attempts filtered as `spend` filters them), and
/// request outcomes (requests filtered as `requests` filters them).
pub fn failures(conn: &Connection, f: &Filter) -> Result<Failures, LedgerError> {
    let (c, join) = attempt_conditions(f);
    let sql = format!(
        "SELECT a.provider, COALESCE(a.class, 'in_flight'), count(*) FROM attempts a {join} {where_}
         GROUP BY 1, 2 ORDER BY 1, 2",
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let attempts = stmt
        .query_map(params_from_iter(c.args.iter()), |r| {
            Ok(FailureRow {
                provider: r.get(0)?,
                class: r.get(1)?,
                attempts: r.get::<_, i64>(2)?.try_into().unwrap_or(0),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;

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
        "SELECT r.outcome, count(*),
                sum(CASE WHEN r.outcome = 'served' AND EXISTS (SELECT 1 FROM attempts a
                    WHERE a.request_id = r.id AND a.seq > 1 AND a.class = 'success') THEN 1 ELSE 0 END)
         FROM requests r {} GROUP BY 1",
        w.render()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(w.args.iter()))?;
    let mut requests = RequestCounts::default();
    while let Some(r) = rows.next()? {
        let n: i64 = r.get(1)?;
        let alt: i64 = r.get(2)?;
        requests.add(text(r, 0)?, n.try_into().unwrap_or(0))?;
        requests.served_after_failover += u64::try_from(alt).unwrap_or(0);
    }
    Ok(Failures { attempts, requests })
}
