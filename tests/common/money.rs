//! The money invariants, read from the ledger file itself after a scenario has gone
//! quiet. Every test that moves money ends by asserting them.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use rust_decimal::Decimal;

use super::vendors::Vendors;

fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap_or_else(|e| panic!("stored amount `{s}`: {e}"))
}

/// What one attempt charges its request's budgets: its billed cost, or its worst case
/// when it may have been billed without a receipt.
const CHARGE: &str =
    "CASE a.billing WHEN 'billed' THEN a.cost WHEN 'maybe_billed' THEN a.worst_case ELSE '0' END";

/// Wait until nothing is in flight (requests run detached from their clients), at most
/// `secs` seconds; panics naming what is still in flight.
pub async fn quiesce(db: &Path, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let conn = purser::ledger::read::open_reader(db).unwrap();
        let open: Vec<String> = conn
            .prepare("SELECT id FROM requests WHERE outcome = 'in_flight'")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
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

/// Assert every money invariant of the ledger at `db`. `providers`: the mock vendors'
/// provider ids whose calls must each have exactly one attempt row.
pub fn assert_money_invariants(db: &Path, vendors: &Vendors, providers: &[&str]) {
    let conn = purser::ledger::read::open_reader(db).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };

    assert_eq!(
        count("SELECT COUNT(*) FROM attempts WHERE state = 'in_flight'"),
        0,
        "an attempt is left in flight"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM requests WHERE outcome = 'in_flight'"),
        0,
        "a request is left in flight"
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM requests WHERE reserved_in IS NOT NULL AND outcome <> 'interrupted'"
        ),
        0,
        "a finished request still holds a reservation"
    );

    // Each window: nothing reserved, spent within the limit, and spent equal to what
    // the requests received in it were charged.
    let windows: Vec<(String, String, String, String, String, String)> = conn
        .prepare("SELECT policy, period, window_start, limit_amount, spent, reserved FROM budget_windows")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let charged_by_request: BTreeMap<String, (String, String, Decimal)> = {
        let mut m = BTreeMap::new();
        let sql = format!(
            "SELECT r.id, r.policy, r.received_at, r.outcome, r.reserved_in, COALESCE(r.reserved_amount, r.worst_case),
                    (SELECT COALESCE(group_concat({CHARGE}, ' '), '') FROM attempts a WHERE a.request_id = r.id)
             FROM requests r WHERE r.outcome <> 'refused' OR EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id)"
        );
        let mut st = conn.prepare(&sql).unwrap();
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                ))
            })
            .unwrap();
        for row in rows {
            let (id, policy, received, outcome, reserved_in, held, charges) = row.unwrap();
            // A request recovered as interrupted still holds its reservation as spent.
            let charged = if outcome == "interrupted" && reserved_in.is_some() {
                dec(&held)
            } else {
                charges.split_whitespace().map(dec).sum()
            };
            m.insert(id, (policy, received, charged));
        }
        m
    };
    for (policy, period, start, limit, spent, reserved) in &windows {
        let (limit, spent, reserved) = (dec(limit), dec(spent), dec(reserved));
        assert_eq!(
            reserved,
            Decimal::ZERO,
            "{policy} {period} {start}: reserved {reserved} after quiescence"
        );
        assert!(
            spent <= limit,
            "{policy} {period} {start}: spent {spent} passes the limit {limit}"
        );
        let prefix = match period.as_str() {
            "day" => &start[..10],
            _ => &start[..7],
        };
        let sum: Decimal = charged_by_request
            .values()
            .filter(|(p, received, _)| p == policy && received.starts_with(prefix))
            .map(|(_, _, c)| *c)
            .sum();
        assert_eq!(
            sum.normalize(),
            spent.normalize(),
            "{policy} {period} {start}: the attempts charge {sum} but the window says spent {spent}"
        );
    }

    // Every call a mock vendor received is exactly one attempt row naming that
    // provider (purser names the row in `x-purser-attempt`); and every attempt the
    // vendor answered is one of those calls.
    for p in providers {
        let calls = vendors.sent(p);
        let mut seen = std::collections::BTreeSet::new();
        for c in &calls {
            assert!(
                seen.insert(c.attempt.clone()),
                "provider {p}: attempt {} made two calls",
                c.attempt
            );
            let (id, seq) = c
                .attempt
                .rsplit_once('/')
                .unwrap_or_else(|| panic!("call without x-purser-attempt: {:?}", c.attempt));
            let named: Option<String> = conn
                .query_row(
                    "SELECT provider FROM attempts WHERE request_id = ?1 AND seq = ?2",
                    rusqlite::params![id, seq.parse::<i64>().unwrap()],
                    |r| r.get(0),
                )
                .ok();
            assert_eq!(
                named.as_deref(),
                Some(*p),
                "provider {p}: call {} has no attempt row naming it",
                c.attempt
            );
        }
        let answered: Vec<String> = conn
            .prepare("SELECT request_id || '/' || seq FROM attempts WHERE provider = ?1 AND status IS NOT NULL")
            .unwrap()
            .query_map([p], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for a in answered {
            assert!(
                seen.contains(&a),
                "provider {p}: attempt {a} has an answer but the vendor never saw its call"
            );
        }
    }

    // A hard-ceiling request makes at most one attempt that may have been billed.
    let over: Vec<String> = conn
        .prepare(
            "SELECT r.id FROM requests r WHERE r.mode = 'hard'
             AND (SELECT COUNT(*) FROM attempts a WHERE a.request_id = r.id AND a.billing <> 'not_billed') > 1",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        over.is_empty(),
        "hard requests with more than one billable attempt: {over:?}"
    );
}

/// The money invariants read through the `Ledger` interface, so they hold on either
/// engine: nothing in flight or reserved once quiet, each window's `spent` at least
/// what the requests received in it were charged (more only where a window was
/// created while a request of its period was in flight, and counted what that request
/// held), and every call a mock vendor received is one attempt row naming it.
pub async fn assert_ledger_invariants(
    ledger: &purser::ledger::Ledger,
    vendors: &Vendors,
    providers: &[&str],
) {
    use purser::ledger::audit::Filter;
    let page = ledger
        .requests(Filter::default(), 10_000, None)
        .await
        .unwrap();
    assert!(page.next_cursor.is_none(), "more requests than one page");
    let mut charged: Vec<(String, String, Decimal)> = Vec::new();
    for r in &page.requests {
        assert_ne!(r.outcome, "in_flight", "request {} is left in flight", r.id);
        let mut c = Decimal::ZERO;
        for a in &r.attempts {
            assert_ne!(
                a.state, "in_flight",
                "attempt {}#{} is left in flight",
                r.id, a.seq
            );
            c += match a.billing.as_str() {
                "billed" => dec(&a.cost),
                "maybe_billed" => dec(&a.worst_case),
                _ => Decimal::ZERO,
            };
        }
        charged.push((r.policy.clone(), r.received_at.clone(), c));
    }
    for w in ledger.stored_budgets().await.unwrap() {
        assert_eq!(
            w.reserved.decimal(),
            Decimal::ZERO,
            "{} {} {}: reserved {} after quiescence",
            w.policy,
            w.period,
            w.window_start,
            w.reserved
        );
        let prefix = match w.period.as_str() {
            "day" => &w.window_start[..10],
            _ => &w.window_start[..7],
        };
        let sum: Decimal = charged
            .iter()
            .filter(|(p, received, _)| *p == w.policy && received.starts_with(prefix))
            .map(|(_, _, c)| *c)
            .sum();
        assert!(
            w.spent.decimal() >= sum,
            "{} {} {}: the attempts charge {sum} but the window says spent {}",
            w.policy,
            w.period,
            w.window_start,
            w.spent
        );
    }
    for p in providers {
        for call in vendors.sent(p) {
            let (id, seq) = call
                .attempt
                .rsplit_once('/')
                .unwrap_or_else(|| panic!("call without x-purser-attempt: {:?}", call.attempt));
            let row = ledger.request(id).await.unwrap().unwrap_or_else(|| {
                panic!("provider {p}: call {} has no request row", call.attempt)
            });
            assert!(
                row.attempts
                    .iter()
                    .any(|a| a.seq.to_string() == seq && a.provider == *p),
                "provider {p}: call {} has no attempt row naming it",
                call.attempt
            );
        }
    }
}
