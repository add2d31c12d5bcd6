//! What only the PostgreSQL ledger does: several replicas on one database, leases and
//! recovery by a live replica, and failing closed (then recovering by itself) when
//! PostgreSQL cannot be reached. Skipped without `PURSER_TEST_POSTGRES`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use purser::ledger::{BudgetLimit, Ledger, LedgerError, NewAttempt, NewRequest, Options, Target};
use purser::money::Money;
use purser::policy::plan::{Mode, Period};

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

fn req(id: &str, worst: &str) -> NewRequest {
    NewRequest {
        id: id.into(),
        received_at: time::OffsetDateTime::now_utc(),
        client: "bot".into(),
        policy: "team".into(),
        plan_id: "p1".into(),
        model: "m".into(),
        mode: Mode::Hard,
        ceiling: m("1"),
        worst_case: m(worst),
        ingress: Default::default(),
        shape: None,
    }
}

fn attempt(id: &str) -> NewAttempt {
    NewAttempt {
        request_id: id.into(),
        seq: 1,
        provider: "p".into(),
        upstream_model: "m".into(),
        jurisdiction: "us".into(),
        started_at: time::OffsetDateTime::now_utc(),
        worst_case: m("0.3"),
    }
}

fn replica(id: &str, lease_ms: u64) -> Options {
    Options {
        replica: Some(id.into()),
        lease: Duration::from_millis(lease_ms),
        ..Options::default()
    }
}

fn day(limit: &str) -> Vec<BudgetLimit> {
    vec![BudgetLimit {
        period: Period::Day,
        limit: m(limit),
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_admitting_together_never_pass_the_cap() {
    let Some(url) = common::pg::fresh_schema("ledger_postgres::two_replicas").await else {
        return;
    };
    let target = Target::Postgres(url);
    let (a, _) = Ledger::open_at(&target, replica("a", 2000)).await.unwrap();
    let (b, _) = Ledger::open_at(&target, replica("b", 2000)).await.unwrap();
    let mut tasks = vec![];
    for i in 0..200 {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            l.admit(req(&format!("r{i}"), "0.02"), day("1.00")).await
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => admitted += 1,
            Err(LedgerError::BudgetExhausted { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(admitted, 50);
    let w = &a.budgets().await.unwrap()[0];
    assert_eq!((w.spent.as_str(), w.reserved.as_str()), ("0", "1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_rows_are_recovered_by_a_live_one_after_its_lease() {
    let Some(url) = common::pg::fresh_schema("ledger_postgres::dead_replica").await else {
        return;
    };
    let target = Target::Postgres(url);
    let (live, _) = Ledger::open_at(&target, replica("live", 300))
        .await
        .unwrap();
    {
        let (dead, _) = Ledger::open_at(&target, replica("dead", 300))
            .await
            .unwrap();
        dead.admit_with_attempt(req("r1", "0.3"), day("1"), attempt("r1"))
            .await
            .unwrap();
        // "dead" stops renewing its lease here and never comes back.
    }
    let start = Instant::now();
    loop {
        let row = live.request("r1").await.unwrap().unwrap();
        if row.outcome == "interrupted" {
            assert_eq!(row.attempts[0].billing, "maybe_billed");
            assert!(
                row.attempts[0]
                    .reason
                    .as_deref()
                    .unwrap_or("")
                    .contains("another replica")
            );
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "not recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w = &live.budgets().await.unwrap()[0];
    assert_eq!((w.spent.as_str(), w.reserved.as_str()), ("0.3", "0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_id_held_by_a_live_process_is_refused() {
    let Some(url) = common::pg::fresh_schema("ledger_postgres::id_in_use").await else {
        return;
    };
    let target = Target::Postgres(url);
    // A lease long enough that the first holder renews it however loaded the machine:
    // at 300 ms its lease ran out once (four copies of this file at once), and the
    // second process then rightly took the id over.
    let (_first, _) = Ledger::open_at(&target, replica("same", 3000))
        .await
        .unwrap();
    match Ledger::open_at(&target, replica("same", 3000)).await {
        Err(e @ LedgerError::ReplicaInUse(_)) => assert!(e.to_string().contains("--replica-id")),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("two live processes share a replica id"),
    }
}

/// A TCP relay to PostgreSQL that can be cut (every connection dropped, new ones
/// refused) and restored, standing in for a database that goes away.
struct Relay {
    port: u16,
    up: Arc<AtomicBool>,
}

async fn relay(to: (String, u16)) -> Relay {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let up = Arc::new(AtomicBool::new(true));
    let flag = up.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            if !flag.load(Ordering::SeqCst) {
                continue; // dropped: refused
            }
            let flag = flag.clone();
            let to = to.clone();
            tokio::spawn(async move {
                let Ok(mut out) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let copy = tokio::io::copy_bidirectional(&mut inbound, &mut out);
                let cut = async {
                    while flag.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                tokio::select! { _ = copy => {}, () = cut => {} }
            });
        }
    });
    Relay { port, up }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_fails_closed_and_recovers_by_itself() {
    let Some(url) = common::pg::fresh_schema("ledger_postgres::unreachable").await else {
        return;
    };
    let cfg: tokio_postgres::Config = url.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".to_string(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let r = relay((host.clone(), port)).await;
    let via = url.replacen(
        &format!("{host}:{port}"),
        &format!("127.0.0.1:{}", r.port),
        1,
    );
    assert_ne!(via, url, "the test URL names host:port explicitly");
    let (l, _) = Ledger::open_at(&Target::Postgres(via), replica("r", 5000))
        .await
        .unwrap();
    l.admit(req("before", "0.1"), day("1")).await.unwrap();
    assert!(l.writable());

    r.up.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = l.admit(req("during", "0.1"), day("1")).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::Unavailable(_) | LedgerError::Postgres(_)),
        "{err}"
    );
    assert!(!l.writable(), "not ready while the ledger cannot write");
    assert!(l.probe().await.is_err());

    r.up.store(true, Ordering::SeqCst);
    // No write needed: the probe alone turns the ledger ready again.
    let start = Instant::now();
    while l.probe().await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(l.writable());
    l.admit(req("after", "0.1"), day("1")).await.unwrap();
    assert!(
        l.request("during").await.unwrap().is_none(),
        "nothing half-written"
    );
    assert_eq!(
        l.request("after").await.unwrap().unwrap().outcome,
        "in_flight"
    );
}
