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
                // the period), in the transaction that creates it; the requests of that
                // period still open become its holders.
                None => {
                    let seed = self.seed(tx, key)?;
                    Window {
                        limit: None,
                        spent: seed.spent,
                        reserved: seed.reserved,
                        dirty: true,
                    }
                }
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

impl Books {
    /// Count the window `key` again from the ledger (`Op::ReseedWindows`), if it
    /// exists: `spent` becomes what `seed` counts, and the requests it makes holders
    /// add what they hold to `reserved` (its old holders are in it already).
    pub(super) fn reseed(&mut self, tx: &Connection, key: &WindowKey) -> Result<(), LedgerError> {
        let exists = self.windows.contains_key(key)
            || tx
                .prepare_cached("SELECT 1 FROM budget_windows WHERE policy = ?1 AND period = ?2 AND window_start = ?3")?
                .exists(params![key.policy, key.period.as_str(), key.start])?;
        if !exists {
            return Ok(());
        }
        // Read before `seed` writes any holder: its old `reserved` is what it had.
        self.window(tx, key)?;
        let seed = self.seed(tx, key)?;
        let w = self.window(tx, key)?;
        w.spent = seed.spent;
        w.reserved = w.reserved + seed.reserved;
        w.dirty = true;
        Ok(())
    }

    /// What the ledger charges `key.policy` in the window `key` names, for a window
    /// created now or counted again after a reload.
    ///
    /// Every request received in it that is still open (in flight, or interrupted and
    /// not yet settled) and does not hold this window is made one of its holders: the
    /// window is added to its `reserved_in` and it is counted at what it holds,
    /// exactly as if it had been admitted under the budget. So its settlement, a
    /// top-up, an interrupt, recovery and an operator's settle all reach this window
    /// too, and whatever it finally costs (above or below what it held) is what the
    /// window is charged. (Counting it once at a guess, as `spent`, lost the
    /// difference: a soft request whose vendor reported more than the bound settled
    /// above it, and nothing told the window.)
    ///
    /// Holders in flight are in `reserved`; interrupted holders are in `spent` at what
    /// they hold (recovery moved it there); every other request is in `spent` at its
    /// attempts' billed costs plus the worst case of each that may have been billed.
    ///
    /// Read through the attempts' start-time index (every attempt of a request received
    /// in the window starts at or after the window's start), so it costs a scan of the
    /// window's attempts up to now, once per new window.
    pub(super) fn seed(&mut self, tx: &Connection, key: &WindowKey) -> Result<Seed, LedgerError> {
        let (seed, adopted) = count_window(tx, key)?;
        for a in adopted {
            tx.prepare_cached(
                "UPDATE requests SET reserved_in = ?2, reserved_amount = ?3 WHERE id = ?1",
            )?
            .execute(params![a.id, a.reserved_in, a.held.to_string()])?;
            // Its copy in memory no longer names all it holds: read it again.
            self.held.remove(&a.id);
        }
        Ok(seed)
    }
}

/// A request `count_window` makes a holder of the window: its new `reserved_in` and
/// what it holds.
pub(super) struct Adopted {
    id: String,
    reserved_in: String,
    held: Money,
}

/// The counting of `Books::seed`, without writing: what the window starts from, and
/// the requests that become its holders. Read alone, it is what the window would
/// start from if it were created now (the budgets page of a window not created yet).
pub(super) fn count_window(
    tx: &Connection,
    key: &WindowKey,
) -> Result<(Seed, Vec<Adopted>), LedgerError> {
    let (from_ms, to_ms) = window_ms(key)?;
    // The window's date: every stored `started_at` in it sorts at or after it as text.
    let day = key.start.get(..10).unwrap_or(&key.start);
    let token = format!("{}@{}", key.period.as_str(), key.start);
    let mut per: HashMap<String, Open> = HashMap::new();
    {
        let mut st = tx.prepare_cached(
                "SELECT r.id, r.outcome, r.reserved_in, COALESCE(r.reserved_amount, r.worst_case),
                        CASE a.billing WHEN 'billed' THEN a.cost WHEN 'maybe_billed' THEN a.worst_case ELSE '0' END,
                        a.state = 'interrupted' AND a.billing = 'maybe_billed'
                 FROM attempts a CROSS JOIN requests r
                 WHERE a.started_at >= ?1 AND r.id = a.request_id AND r.policy = ?2
                   AND r.received_ms >= ?3 AND r.received_ms < ?4",
            )?;
        let mut rows = st.query(params![day, key.policy, from_ms, to_ms])?;
        while let Some(r) = rows.next()? {
            let id: String = r.get(0)?;
            let charge = money_col(r.get(4)?)?;
            let open: bool = r.get(5)?;
            let e = match per.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let outcome: String = r.get(1)?;
                    let reserved_in: Option<String> = r.get(2)?;
                    v.insert(Open {
                        in_flight: outcome == "in_flight",
                        interrupted: outcome == "interrupted",
                        holds_this: reserved_in
                            .as_deref()
                            .is_some_and(|s| s.split(' ').any(|w| w == token)),
                        reserved_in,
                        held: money_col(r.get(3)?)?,
                        charged: Money::ZERO,
                        open_attempt: false,
                    })
                }
            };
            e.charged = e.charged + charge;
            e.open_attempt |= open;
        }
    }
    let mut seed = Seed {
        spent: Money::ZERO,
        reserved: Money::ZERO,
    };
    let mut adopted = Vec::new();
    for (id, r) in per {
        // Interrupted and unsettled: it still holds (moved to spent), or an
        // operator may yet settle an attempt of it.
        let unsettled = r.interrupted && (r.reserved_in.is_some() || r.open_attempt);
        if !r.holds_this && (r.in_flight || unsettled) {
            // One holding amount per request, across all its windows; a request
            // that holds none yet holds, once interrupted, what it was charged
            // (as `Op::Interrupt` leaves it).
            let held = match (&r.reserved_in, r.in_flight) {
                (None, false) => r.charged,
                _ => r.held,
            };
            let reserved_in = match &r.reserved_in {
                Some(s) => format!("{s} {token}"),
                None => token.clone(),
            };
            if r.in_flight {
                seed.reserved = seed.reserved + held;
            } else {
                seed.spent = seed.spent + held;
            }
            adopted.push(Adopted {
                id,
                reserved_in,
                held,
            });
            continue;
        }
        seed.spent = seed.spent
            + match (r.holds_this, r.in_flight, r.interrupted) {
                // In `reserved` already; its settlement moves its charge to spent.
                (true, true, _) => Money::ZERO,
                // Moved to spent by recovery or an interrupt, at what it holds.
                (true, false, true) => r.held,
                (true, false, false) | (false, _, _) => r.charged,
            };
    }
    Ok((seed, adopted))
}

/// What a window starts from: see `Books::seed`.
pub(super) struct Seed {
    pub(super) spent: Money,
    /// What the requests made its holders while in flight hold.
    pub(super) reserved: Money,
}

/// One request received in a window being seeded.
struct Open {
    in_flight: bool,
    interrupted: bool,
    /// Its `reserved_in` names this window.
    holds_this: bool,
    reserved_in: Option<String>,
    /// What it holds in each window it names (its topped-up reservation, else its
    /// worst case).
    held: Money,
    /// Its attempts' billed costs plus the worst case of each maybe-billed one.
    charged: Money,
    /// An attempt of it is interrupted and not yet settled.
    open_attempt: bool,
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
