//! The money invariants, read from the ledger itself after a scenario has gone quiet,
//! on either engine. Every test that moves money ends by asserting them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use rust_decimal::Decimal;

use super::db::{Db, Engine, Row, sqlite_rows};
use super::vendors::Vendors;

fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap_or_else(|e| panic!("stored amount `{s}`: {e}"))
}

fn text(r: &Row, i: usize) -> &str {
    r[i].as_deref().unwrap_or("")
}

/// Wait until nothing is in flight (requests run detached from their clients), at most
/// `secs` seconds; panics naming what is still in flight. SQLite file.
pub async fn quiesce(db: &Path, secs: u64) {
    quiesce_on(&Db::Sqlite(db.to_path_buf()), secs).await
}

/// `quiesce` on either engine.
pub async fn quiesce_on(db: &Db, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let open = db
            .column("SELECT id FROM requests WHERE outcome = 'in_flight'")
            .await;
        if open.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still in flight after {secs} s: {open:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// What the invariants read: every request, attempt and budget window, as text.
struct Snapshot {
    /// id, policy, received_at (UTC), mode, outcome, holds a reservation (0/1), held.
    requests: Vec<Row>,
    /// request_id, seq, provider, state, status, billing, cost, worst_case.
    attempts: Vec<Row>,
    /// policy, period, window_start (UTC), limit, spent, reserved.
    windows: Vec<Row>,
    /// The rollups' raw sources and the rollups themselves (see `check_rollups`).
    rollups: [Vec<Row>; 6],
}

impl Snapshot {
    fn sql(db: &Db) -> [String; 3] {
        let holds = match db {
            Db::Sqlite(_) => "CASE WHEN reserved_in IS NULL THEN 0 ELSE 1 END",
            Db::Postgres(_) => "CASE WHEN reserved_periods IS NULL THEN 0 ELSE 1 END",
        };
        [
            format!(
                "SELECT id, policy, {}, mode, outcome, {holds}, CAST(COALESCE(reserved_amount, worst_case) AS TEXT) FROM requests",
                db.utc("received_at")
            ),
            "SELECT request_id, seq, provider, state, status, billing, CAST(cost AS TEXT), CAST(worst_case AS TEXT) FROM attempts".to_string(),
            format!(
                "SELECT policy, period, {}, CAST(limit_amount AS TEXT), CAST(spent AS TEXT), CAST(reserved AS TEXT) FROM budget_windows",
                db.utc("window_start")
            ),
        ]
    }

    /// Every attempt and request by the rollups' keys (the hour cut from the UTC
    /// instant in Rust, not by the ledger), then the two rollup tables.
    fn rollup_sql(db: &Db) -> [String; 6] {
        [
            format!(
                "SELECT {}, a.provider, r.policy, r.client, r.model, r.ingress, COALESCE(a.class, ''),
                        CASE WHEN a.seq > 1 THEN 'later' ELSE 'first' END, a.billing, '1',
                        CAST(a.cost AS TEXT), CAST(a.worst_case AS TEXT)
                 FROM attempts a JOIN requests r ON r.id = a.request_id",
                db.utc("a.started_at")
            ),
            format!(
                "SELECT {}, provider, policy, client, model, ingress, class,
                        CASE WHEN later THEN 'later' ELSE 'first' END, billing, CAST(attempts AS TEXT),
                        CAST(cost AS TEXT), CAST(worst_case AS TEXT)
                 FROM attempts_hourly",
                db.utc("hour")
            ),
            format!(
                "SELECT {}, a.provider, r.policy, r.model, r.ingress, COALESCE(a.class, ''),
                        CASE WHEN a.seq > 1 THEN 'later' ELSE 'first' END, a.billing, '1',
                        CAST(a.cost AS TEXT), CAST(a.worst_case AS TEXT)
                 FROM attempts a JOIN requests r ON r.id = a.request_id",
                db.utc("a.started_at")
            ),
            format!(
                "SELECT {}, provider, policy, model, ingress, class,
                        CASE WHEN later THEN 'later' ELSE 'first' END, billing, CAST(attempts AS TEXT),
                        CAST(cost AS TEXT), CAST(worst_case AS TEXT)
                 FROM attempts_hourly_lean",
                db.utc("hour")
            ),
            format!(
                "SELECT {}, policy, client, model, ingress, outcome, '1' FROM requests",
                db.utc("received_at")
            ),
            format!(
                "SELECT {}, policy, client, model, ingress, outcome, CAST(requests AS TEXT) FROM requests_hourly",
                db.utc("hour")
            ),
        ]
    }

    async fn read(db: &Db) -> Snapshot {
        let [r, a, w] = Snapshot::sql(db);
        let [ra, ha, la, hl, rr, hr] = Snapshot::rollup_sql(db);
        Snapshot {
            requests: db.rows(&r).await,
            attempts: db.rows(&a).await,
            windows: db.rows(&w).await,
            rollups: [
                db.rows(&ra).await,
                db.rows(&ha).await,
                db.rows(&la).await,
                db.rows(&hl).await,
                db.rows(&rr).await,
                db.rows(&hr).await,
            ],
        }
    }

    fn read_sqlite(path: &Path) -> Snapshot {
        let db = Db::Sqlite(path.to_path_buf());
        let [r, a, w] = Snapshot::sql(&db);
        let [ra, ha, la, hl, rr, hr] = Snapshot::rollup_sql(&db);
        Snapshot {
            requests: sqlite_rows(path, &r),
            attempts: sqlite_rows(path, &a),
            windows: sqlite_rows(path, &w),
            rollups: [
                sqlite_rows(path, &ra),
                sqlite_rows(path, &ha),
                sqlite_rows(path, &la),
                sqlite_rows(path, &hl),
                sqlite_rows(path, &rr),
                sqlite_rows(path, &hr),
            ],
        }
    }
}

/// Assert every money invariant of the SQLite ledger at `db`. `providers`: the mock
/// vendors' provider ids whose calls must each have exactly one attempt row.
pub fn assert_money_invariants(db: &Path, vendors: &Vendors, providers: &[&str]) {
    check(
        &Snapshot::read_sqlite(db),
        Engine::Sqlite,
        vendors,
        providers,
        Limits::Unchanged,
    )
}

/// `assert_money_invariants` on either engine.
pub async fn assert_money_invariants_on(db: &Db, vendors: &Vendors, providers: &[&str]) {
    check(
        &Snapshot::read(db).await,
        db.engine(),
        vendors,
        providers,
        Limits::Unchanged,
    )
}

/// The invariants after reloads that changed budgets mid-run: a window whose limit
/// was lowered below what it had spent (or that was created, seeded from the ledger,
/// over its new limit) may show spent above its limit; spent still covers every charge.
pub async fn assert_money_invariants_after_reloads_on(
    db: &Db,
    vendors: &Vendors,
    providers: &[&str],
) {
    check(
        &Snapshot::read(db).await,
        db.engine(),
        vendors,
        providers,
        Limits::Reloaded,
    )
}

/// Only "the rollups equal the raw rows", for a test that moved rows in time (which
/// the budget invariants, keyed by window, do not allow).
pub async fn assert_rollups_on(db: &Db) {
    check_rollups(&Snapshot::read(db).await, db.engine())
}

/// Whether budgets changed during the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limits {
    /// Spent is within the limit and equals the charges of its period.
    Unchanged,
    /// Spent is at least the charges of its period.
    Reloaded,
}

/// Sums per key: the key is every column but the last `sums`, which are added (the
/// first as a count, the rest as exact decimals), the hour cut to `YYYY-MM-DDTHH`.
fn sums(rows: &[Row], sums: usize) -> BTreeMap<Vec<String>, Vec<Decimal>> {
    let mut out: BTreeMap<Vec<String>, Vec<Decimal>> = BTreeMap::new();
    for r in rows {
        let cut = r.len() - sums;
        let mut key: Vec<String> = (0..cut).map(|i| text(r, i).to_string()).collect();
        key[0].truncate(13);
        let acc = out.entry(key).or_insert_with(|| vec![Decimal::ZERO; sums]);
        for (i, a) in acc.iter_mut().enumerate() {
            *a += dec(text(r, cut + i));
        }
    }
    for v in out.values_mut() {
        for d in v.iter_mut() {
            *d = d.normalize();
        }
    }
    out
}

/// The hourly rollups equal the raw rows they total, to the last decimal: every key
/// the rows have, with the same count and sums, and no other key (a key whose rows all
/// moved away is removed, not left at zero).
fn check_rollups(s: &Snapshot, engine: Engine) {
    let [raw, wide, raw_lean, lean, raw_requests, requests_hourly] = &s.rollups;
    for (table, raw, kept) in [
        ("attempts_hourly", raw, wide),
        ("attempts_hourly_lean", raw_lean, lean),
    ] {
        let (want, have) = (sums(raw, 3), sums(kept, 3));
        for (k, v) in &have {
            assert!(
                want.contains_key(k),
                "{engine:?}: {table} has {k:?} = {v:?}, which no attempt has"
            );
        }
        for (k, v) in &want {
            assert_eq!(
                have.get(k),
                Some(v),
                "{engine:?}: {table} {k:?} differs from its attempts (count, cost, worst case)"
            );
        }
    }
    let (want, have) = (sums(raw_requests, 1), sums(requests_hourly, 1));
    assert_eq!(
        have, want,
        "{engine:?}: requests_hourly differs from the requests it counts"
    );
}

fn check(s: &Snapshot, engine: Engine, vendors: &Vendors, providers: &[&str], limits: Limits) {
    check_rollups(s, engine);
    for a in &s.attempts {
        assert_ne!(
            text(a, 3),
            "in_flight",
            "{engine:?}: an attempt is left in flight: {a:?}"
        );
    }
    for r in &s.requests {
        assert_ne!(
            text(r, 4),
            "in_flight",
            "{engine:?}: a request is left in flight: {r:?}"
        );
        assert!(
            text(r, 5) == "0" || text(r, 4) == "interrupted",
            "{engine:?}: a finished request still holds a reservation: {r:?}"
        );
    }

    // What each attempt charges its request's budgets: its billed cost, or its worst
    // case when it may have been billed without a receipt.
    let mut attempts_of: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for a in &s.attempts {
        attempts_of.entry(text(a, 0)).or_default().push(a);
    }
    let charge = |a: &Row| match text(a, 5) {
        "billed" => dec(text(a, 6)),
        "maybe_billed" => dec(text(a, 7)),
        _ => Decimal::ZERO,
    };
    // policy, received_at, charged: of every request that reached the budgets.
    let charged: Vec<(&str, &str, Decimal)> = s
        .requests
        .iter()
        .filter(|r| text(r, 4) != "refused" || attempts_of.contains_key(text(r, 0)))
        .map(|r| {
            let own = attempts_of.get(text(r, 0)).cloned().unwrap_or_default();
            // A request recovered as interrupted still holds its reservation as spent.
            let c = if text(r, 4) == "interrupted" && text(r, 5) == "1" {
                dec(text(r, 6))
            } else {
                own.iter().map(|a| charge(a)).sum()
            };
            (text(r, 1), text(r, 2), c)
        })
        .collect();

    // Each window: nothing reserved, spent within the limit, and spent at least (here:
    // exactly) what the requests received in it were charged.
    for w in &s.windows {
        let (policy, period, start) = (text(w, 0), text(w, 1), text(w, 2));
        let (limit, spent, reserved) = (dec(text(w, 3)), dec(text(w, 4)), dec(text(w, 5)));
        assert_eq!(
            reserved,
            Decimal::ZERO,
            "{engine:?} {policy} {period} {start}: reserved {reserved} after quiescence"
        );
        assert!(
            spent <= limit || limits == Limits::Reloaded,
            "{engine:?} {policy} {period} {start}: spent {spent} passes the limit {limit}"
        );
        let prefix = match period {
            "day" => &start[..10],
            _ => &start[..7],
        };
        let sum: Decimal = charged
            .iter()
            .filter(|(p, received, _)| *p == policy && received.starts_with(prefix))
            .map(|(_, _, c)| *c)
            .sum();
        if spent < sum {
            // Name the requests, so the failure says which went uncounted.
            for r in s.requests.iter().filter(|r| text(r, 1) == policy) {
                let own = attempts_of.get(text(r, 0)).cloned().unwrap_or_default();
                eprintln!(
                    "  {} received {} outcome {} holds {} held {}: attempts {:?}",
                    text(r, 0),
                    text(r, 2),
                    text(r, 4),
                    text(r, 5),
                    text(r, 6),
                    own.iter()
                        .map(|a| format!(
                            "{}:{}:{}:{}",
                            text(a, 1),
                            text(a, 5),
                            text(a, 6),
                            text(a, 7)
                        ))
                        .collect::<Vec<_>>()
                );
            }
        }
        assert!(
            spent >= sum,
            "{engine:?} {policy} {period} {start}: the attempts charge {sum} but the window says spent {spent}"
        );
        if limits == Limits::Unchanged {
            assert_eq!(
                sum.normalize(),
                spent.normalize(),
                "{engine:?} {policy} {period} {start}: the attempts charge {sum} but the window says spent {spent}"
            );
        }
    }

    // Every call a mock vendor received is exactly one attempt row naming that
    // provider (purser names the row in `x-purser-attempt`); and every attempt the
    // vendor answered is one of those calls.
    let provider_of: BTreeMap<String, &str> = s
        .attempts
        .iter()
        .map(|a| (format!("{}/{}", text(a, 0), text(a, 1)), text(a, 2)))
        .collect();
    for p in providers {
        let mut seen = BTreeSet::new();
        for c in &vendors.sent(p) {
            assert!(
                seen.insert(c.attempt.clone()),
                "provider {p}: attempt {} made two calls",
                c.attempt
            );
            assert_eq!(
                provider_of.get(&c.attempt).copied(),
                Some(*p),
                "{engine:?} provider {p}: call {} has no attempt row naming it",
                c.attempt
            );
        }
        for a in s
            .attempts
            .iter()
            .filter(|a| text(a, 2) == *p && a[4].is_some())
        {
            let name = format!("{}/{}", text(a, 0), text(a, 1));
            assert!(
                seen.contains(&name),
                "{engine:?} provider {p}: attempt {name} has an answer but the vendor never saw its call"
            );
        }
    }

    // Billable once started: an attempt that received a 2xx (a streamed attempt's
    // status is its stream's) is billed or maybe billed.
    for a in &s.attempts {
        if text(a, 4).len() == 3 && text(a, 4).starts_with('2') {
            assert_ne!(
                text(a, 5),
                "not_billed",
                "{engine:?}: attempt {}/{} received a {} and is booked not billed",
                text(a, 0),
                text(a, 1),
                text(a, 4)
            );
        }
    }

    // A hard-ceiling request makes at most one attempt that may have been billed.
    for r in s.requests.iter().filter(|r| text(r, 3) == "hard") {
        let billable = attempts_of.get(text(r, 0)).map_or(0, |a| {
            a.iter().filter(|a| text(a, 5) != "not_billed").count()
        });
        assert!(
            billable <= 1,
            "{engine:?}: hard request {} has {billable} billable attempts",
            text(r, 0)
        );
    }
}
