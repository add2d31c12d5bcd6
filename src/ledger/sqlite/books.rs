//! The budget books: SQLite's writer keeps the windows it touches in memory between
//! commits (it is the file's only writer), so admission and settlement need not read
//! them back.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::ops::{Holding, money_col};
use crate::ledger::LedgerError;
use crate::money::Money;
use crate::policy::plan::Period;

/// Budget windows and what in-flight requests hold in them, kept in memory by the one
/// writer so that an admission and a settlement need not read them back: each window
/// touched by a group is written once, when the group commits. The copy is dropped whenever it may
/// be wrong: after a rollback, and when another connection (`purser settle`) has
/// written to the file since this one last looked.
#[derive(Default)]
pub(super) struct Books {
    pub(super) windows: HashMap<WindowKey, Window>,
    /// What requests still in flight hold, as admitted by this writer.
    pub(super) held: HashMap<String, Holding>,
    /// SQLite's `data_version` when the books were last known right.
    seen: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct WindowKey {
    pub(super) policy: String,
    pub(super) period: Period,
    pub(super) start: String,
}

#[derive(Debug)]
pub(super) struct Window {
    /// `None` while the stored limit is unknown (a window first read to settle).
    pub(super) limit: Option<Money>,
    pub(super) spent: Money,
    pub(super) reserved: Money,
    pub(super) dirty: bool,
}

/// A bound on what the books keep; past it they start over from the file.
const BOOKS_MAX: usize = 100_000;

impl Books {
    /// Start of a transaction (the write lock is held): forget everything if another
    /// connection has committed since.
    pub(super) fn check(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        let version: i64 = tx
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?;
        if self.seen != Some(version)
            || self.windows.len() > BOOKS_MAX
            || self.held.len() > BOOKS_MAX
        {
            self.forget();
            self.seen = Some(version);
        }
        Ok(())
    }

    pub(super) fn forget(&mut self) {
        self.windows.clear();
        self.held.clear();
        self.seen = None;
    }

    /// The window, read from the file the first time it is needed.
    pub(super) fn window(
        &mut self,
        tx: &Connection,
        key: &WindowKey,
    ) -> Result<&mut Window, LedgerError> {
        if !self.windows.contains_key(key) {
            let stored: Option<(String, String, String)> = tx
                .prepare_cached("SELECT spent, reserved, limit_amount FROM budget_windows WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
                .query_row(params![key.policy, key.period.as_str(), key.start], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let w = match stored {
                Some((spent, reserved, limit)) => Window {
                    limit: Some(money_col(limit)?),
                    spent: money_col(spent)?,
                    reserved: money_col(reserved)?,
                    dirty: false,
                },
                // A window seen for the first time starts from what the ledger already
                // charges the policy in that period (a budget added mid-period counts
                // the period), in the transaction that creates it.
                None => Window {
                    limit: None,
                    spent: charged_in_window(tx, key)?,
                    reserved: Money::ZERO,
                    dirty: true,
                },
            };
            self.windows.insert(key.clone(), w);
        }
        self.windows
            .get_mut(key)
            .ok_or_else(|| LedgerError::Corrupt("budget window vanished from memory".into()))
    }

    /// Write every window changed since the last commit, inside `tx`.
    pub(super) fn write(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        for (key, w) in self.windows.iter_mut().filter(|(_, w)| w.dirty) {
            let Some(limit) = w.limit else {
                // Settled against a window the file never had: nothing to record it under.
                continue;
            };
            tx.prepare_cached(
                "INSERT INTO budget_windows (policy, period, window_start, limit_amount, spent, reserved)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (policy, period, window_start)
                 DO UPDATE SET limit_amount = excluded.limit_amount, spent = excluded.spent, reserved = excluded.reserved",
            )?
            .execute(params![key.policy, key.period.as_str(), key.start, limit.to_string(), w.spent.to_string(), w.reserved.to_string()])?;
            w.dirty = false;
        }
        Ok(())
    }
}

/// What the ledger charges `key.policy` in the window `key` names: for each request
/// received in it, its attempts' billed costs plus the worst case of each attempt that
/// may have been billed (in-flight attempts count so), and for a request still in
/// flight at least what it holds (a failover top-up may have raised it past its
/// attempts so far). A request in flight that holds a reservation in this very window
/// (a window re-seeded by a reload) is left out: it is in `reserved`, and its
/// settlement moves its charge to `spent`, so nothing is counted twice.
///
/// Read through the attempts' start-time index (every attempt of a request received in
/// the window starts at or after the window's start), so it costs a scan of the
/// window's attempts up to now, once per new window.
pub(super) fn charged_in_window(tx: &Connection, key: &WindowKey) -> Result<Money, LedgerError> {
    let (from_ms, to_ms) = window_ms(key)?;
    // The window's date: every stored `started_at` in it sorts at or after it as text.
    let day = key.start.get(..10).unwrap_or(&key.start);
    let mut st = tx.prepare_cached(
        "SELECT r.id, r.outcome = 'in_flight', COALESCE(r.reserved_amount, r.worst_case),
                CASE a.billing WHEN 'billed' THEN a.cost WHEN 'maybe_billed' THEN a.worst_case ELSE '0' END
         FROM attempts a CROSS JOIN requests r
         WHERE a.started_at >= ?1 AND r.id = a.request_id AND r.policy = ?2
           AND r.received_ms >= ?3 AND r.received_ms < ?4
           AND NOT (r.outcome = 'in_flight' AND instr(' ' || COALESCE(r.reserved_in, ''), ' ' || ?5 || '@') > 0)",
    )?;
    let mut rows = st.query(params![
        day,
        key.policy,
        from_ms,
        to_ms,
        key.period.as_str()
    ])?;
    // Per request: (in flight, what it holds, its attempts' charges).
    let mut per: HashMap<String, (bool, Money, Money)> = HashMap::new();
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let in_flight: bool = r.get(1)?;
        let held = money_col(r.get(2)?)?;
        let charge = money_col(r.get(3)?)?;
        let e = per.entry(id).or_insert((in_flight, held, Money::ZERO));
        e.2 = e.2 + charge;
    }
    Ok(per
        .into_values()
        .fold(Money::ZERO, |sum, (in_flight, held, charged)| {
            sum + if in_flight {
                charged.max(held)
            } else {
                charged
            }
        }))
}

/// The window's bounds in Unix milliseconds, `[from, to)`.
fn window_ms(key: &WindowKey) -> Result<(i64, i64), LedgerError> {
    let corrupt = || LedgerError::Corrupt(format!("window start `{}`", key.start));
    let start =
        time::OffsetDateTime::parse(&key.start, &time::format_description::well_known::Rfc3339)
            .map_err(|_| corrupt())?;
    let end = match key.period {
        Period::Day => start.checked_add(time::Duration::days(1)),
        Period::Month => {
            let (y, m) = match start.month() {
                time::Month::December => (start.year() + 1, time::Month::January),
                m => (start.year(), m.next()),
            };
            time::Date::from_calendar_date(y, m, 1)
                .ok()
                .map(|d| d.midnight().assume_utc())
        }
    }
    .ok_or_else(corrupt)?;
    let ms = |t: time::OffsetDateTime| {
        i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
    };
    Ok((ms(start), ms(end)))
}
