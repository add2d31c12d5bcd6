//! A real crash: `purser serve` runs as a child process with a request in flight to
//! a provider that never answers; the child is killed with SIGKILL; reopening the
//! ledger turns the in-flight rows into `interrupted` / `maybe_billed`, the budget
//! keeps the worst case as spent, and `purser settle` replaces it with the real cost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::vendors::{Script, Vendors};
use common::{provider, sha};
use purser::ledger::{self, Ledger, Options};
use purser::money::Money;

const KEY: &str = "key-crash";

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn in_flight(db: &std::path::Path) -> i64 {
    let Ok(c) = ledger::read::open_reader(db) else {
        return 0;
    };
    c.query_row(
        "SELECT count(*) FROM attempts WHERE state = 'in_flight'",
        [],
        |r| r.get(0),
    )
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_gateway_mid_call_leaves_an_interrupted_maybe_billed_row() {
    let dir = tempfile::tempdir().unwrap();
    let vendors = Vendors::start().await;
    // The provider holds the call far longer than the test lives.
    vendors.script("slow", vec![Script::Delay(600_000)]);
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    let slow = provider(&vendors, "slow", "openai", "us", &[("m", "1", "2")])
        .replace("timeout_ms: 300", "timeout_ms: 600000");
    std::fs::write(
        config.join("set.yaml"),
        [
            "kind: gateway\ncurrency: USD\n".to_string(),
            slow,
            format!(
                "kind: policy\nid: p\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 1000\nbudgets:\n  - {{ period: day, limit: \"1\" }}\n",
                sha(KEY)
            ),
        ]
        .join("---\n"),
    )
    .unwrap();
    let db = dir.path().join("ledger.db");
    let mut child = common::serve_child(&config, &db, &[], &[], false).await;
    let client = reqwest::Client::new();
    let base = child.base();

    let call = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
                .send()
                .await
        }
    });
    // The attempt is written before the call is sent: wait for the provider to have it.
    wait_until("the upstream call", || vendors.calls("slow") == 1).await;
    assert_eq!(
        in_flight(&db),
        1,
        "the attempt is recorded in flight before the call"
    );

    child.child.kill().unwrap(); // SIGKILL: no shutdown path runs
    child.child.wait().unwrap();
    assert!(
        call.await.unwrap().is_err(),
        "the client saw the connection die"
    );

    let (l, recovered) = Ledger::open(&db, Options::default()).unwrap();
    assert_eq!((recovered.attempts, recovered.requests), (1, 1));
    let conn = l.reader().unwrap();
    let id: String = conn
        .query_row("SELECT id FROM requests", [], |r| r.get(0))
        .unwrap();
    let row = ledger::read::request(&conn, &id).unwrap().unwrap();
    assert_eq!(row.outcome, "interrupted");
    let a = &row.attempts[0];
    assert_eq!(
        (a.state.as_str(), a.billing.as_str()),
        ("interrupted", "maybe_billed")
    );
    assert_eq!(a.provider, "slow");
    // Until settled, the budget counts the attempt's worst case as spent.
    let b = &ledger::read::budgets(&conn).unwrap()[0];
    assert_eq!(b.reserved, "0");
    assert_eq!(
        b.spent.parse::<Money>().unwrap(),
        row.worst_case.parse::<Money>().unwrap()
    );
    assert_ne!(b.spent, "0");
    drop(l);

    // The operator learns from the vendor that the call cost 0.0042.
    let settle = |id: &str, cost: &str| {
        Command::new(env!("CARGO_BIN_EXE_purser"))
            .args(["settle", id, &format!("--cost={cost}"), "--db"])
            .arg(&db)
            .output()
            .unwrap()
    };
    let out = settle(&id, "0.0042");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conn = ledger::read::open_reader(&db).unwrap();
    let row = ledger::read::request(&conn, &id).unwrap().unwrap();
    assert_eq!(row.cost, "0.0042");
    assert_eq!(
        (
            row.attempts[0].billing.as_str(),
            row.attempts[0].cost.as_str()
        ),
        ("billed", "0.0042")
    );
    let b = &ledger::read::budgets(&conn).unwrap()[0];
    assert_eq!((b.spent.as_str(), b.reserved.as_str()), ("0.0042", "0"));
    // Settling twice, or settling what was not interrupted, is refused and changes nothing.
    let again = settle(&id, "0.01");
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already settled"));
    assert_eq!(settle("nope", "0").status.code(), Some(1));
    assert_eq!(settle(&id, "-1").status.code(), Some(1));
    assert_eq!(ledger::read::budgets(&conn).unwrap()[0].spent, "0.0042");
}
