//! The spend page's queries answered from the hourly rollups (`attempts_hourly`,
//! `requests_hourly`, kept by the triggers of migration 0009) for the whole hours of a
//! window; `audit` and `series` add the ragged ends from the raw rows.

use std::collections::BTreeMap;

use rusqlite::{Connection, params_from_iter};

use super::audit::{Clause, text};
use crate::ledger::LedgerError;
use crate::ledger::audit::{
    Bucket, FailureTally, Filter, GroupBy, SeriesRow, SpendRow, Split, parse_money,
};

/// The rollup's hour (`YYYY-MM-DDTHH`) of an instant's text.
fn hour(text: &str) -> String {
    text.get(..13).unwrap_or(text).to_string()
}

/// The hour range of `s` and `f`'s filters on the attempts rollup `h`.
fn attempt_conditions(s: &Split, f: &Filter) -> Clause {
    let mut c = Clause::new();
    if let Some(a) = &s.from {
        c.push("h.hour >= ?", hour(&a.text));
    }
    if let Some(b) = &s.to {
        c.push("h.hour < ?", hour(&b.text));
    }
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
        GroupBy::Day => "substr(h.hour, 1, 10)",
    }
}

/// Spend per group over the whole hours of `s`. The rollup rows stream in key order
/// and are totalled here in exact decimals, as the raw scan totals attempts.
pub fn spend(
    conn: &Connection,
    s: &Split,
    f: &Filter,
    by: GroupBy,
) -> Result<Vec<SpendRow>, LedgerError> {
    let c = attempt_conditions(s, f);
    let sql = format!(
        "SELECT {key}, h.billing, h.attempts, h.cost, h.worst_case FROM {table} h {where_}",
        table = table(f, Some(by)),
        key = key_sql(by),
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    let mut groups: BTreeMap<String, SpendRow> = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let key = text(r, 0)?;
        let row = match groups.get_mut(key) {
            Some(row) => row,
            None => groups
                .entry(key.to_string())
                .or_insert_with(|| SpendRow::empty(key.to_string())),
        };
        add(row, r)?;
    }
    Ok(groups.into_values().collect())
}

/// Add one rollup row (columns 1..=4: billing, attempts, cost, worst case) to `row`.
fn add(row: &mut SpendRow, r: &rusqlite::Row<'_>) -> Result<(), LedgerError> {
    let n = u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0);
    row.add(
        text(r, 1)?,
        n,
        parse_money(text(r, 3)?)?,
        parse_money(text(r, 4)?)?,
    )
}

/// Spend per (bucket, group) over the whole hours of `s`: a bucket is a prefix of the
/// rollup's hour, as it is of an attempt's start.
pub fn series(
    conn: &Connection,
    s: &Split,
    f: &Filter,
    bucket: Bucket,
    by: GroupBy,
) -> Result<Vec<SeriesRow>, LedgerError> {
    let c = attempt_conditions(s, f);
    let (width, suffix) = bucket.prefix();
    let sql = format!(
        "SELECT substr(h.hour, 1, {width}), {key}, h.billing, h.attempts, h.cost, h.worst_case
         FROM {table} h {where_}",
        table = table(f, Some(by)),
        key = key_sql(by),
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
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
        let n = u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
        row.add(
            text(r, 2)?,
            n,
            parse_money(text(r, 4)?)?,
            parse_money(text(r, 5)?)?,
        )?;
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

/// Attempts per (provider, class, after the first) over the whole hours of `s`.
pub fn failed_attempts(
    conn: &Connection,
    s: &Split,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let c = attempt_conditions(s, f);
    let sql = format!(
        "SELECT h.provider, h.class, h.later, sum(h.attempts) FROM {} h {}
         GROUP BY 1, 2, 3",
        table(f, None),
        c.render()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    while let Some(r) = rows.next()? {
        let class = match text(r, 1)? {
            "" => "in_flight",
            class => class,
        };
        let n = u64::try_from(r.get::<_, i64>(3)?).unwrap_or(0);
        tally.attempts(text(r, 0)?, class, r.get(2)?, n);
    }
    Ok(())
}

/// Requests per outcome over the whole hours of `s` (by when they were received).
pub fn request_outcomes(
    conn: &Connection,
    s: &Split,
    f: &Filter,
    tally: &mut FailureTally,
) -> Result<(), LedgerError> {
    let mut c = Clause::new();
    if let Some(a) = &s.from {
        c.push("h.hour >= ?", hour(&a.text));
    }
    if let Some(b) = &s.to {
        c.push("h.hour < ?", hour(&b.text));
    }
    for (col, v) in [
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
    if let Some(o) = f.outcome {
        c.push("h.outcome = ?", o.as_str());
    }
    let sql = format!(
        "SELECT h.outcome, sum(h.requests) FROM requests_hourly h {} GROUP BY 1",
        c.render()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    while let Some(r) = rows.next()? {
        let n = u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0);
        tally.requests(text(r, 0)?, n)?;
    }
    Ok(())
}
