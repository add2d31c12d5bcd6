//! The spend page's queries on an SQLite ledger: spend per time bucket and group, and
//! failures per provider and class. Same filters and bound parameters as `audit`.

use std::collections::BTreeMap;

use rusqlite::{Connection, params_from_iter};

use super::audit::{Clause, attempt_conditions, key_sql, request_conditions, text};
use crate::ledger::LedgerError;
use crate::ledger::audit::{
    Bucket, FailureRow, Failures, Filter, GroupBy, RequestCounts, SeriesRow, SpendRow, parse_money,
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
/// request outcomes (requests filtered as `requests` filters them). Requests served
/// after a failover are counted from the attempts (a success after the first), so
/// the request scan needs no per-request lookup.
pub fn failures(conn: &Connection, f: &Filter) -> Result<Failures, LedgerError> {
    let (c, join) = attempt_conditions(f);
    let sql = format!(
        "SELECT a.provider, COALESCE(a.class, 'in_flight'), a.seq > 1, count(*) FROM attempts a {join} {where_}
         GROUP BY 1, 2, 3 ORDER BY 1, 2",
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    let mut attempts: Vec<FailureRow> = Vec::new();
    let mut after_failover = 0u64;
    while let Some(r) = rows.next()? {
        let (provider, class) = (text(r, 0)?, text(r, 1)?);
        let later: bool = r.get(2)?;
        let n = u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
        if later && class == "success" {
            after_failover += n;
        }
        match attempts.last_mut() {
            Some(last) if last.provider == provider && last.class == class => last.attempts += n,
            _ => attempts.push(FailureRow {
                provider: provider.to_string(),
                class: class.to_string(),
                attempts: n,
            }),
        }
    }

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
    let mut requests = RequestCounts {
        served_after_failover: after_failover,
        ..RequestCounts::default()
    };
    while let Some(r) = rows.next()? {
        let n: i64 = r.get(1)?;
        requests.add(text(r, 0)?, n.try_into().unwrap_or(0))?;
    }
    Ok(Failures { attempts, requests })
}
