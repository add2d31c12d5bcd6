//! SIGTERM on a real `purser serve`: new connections are refused at once, the request
//! in flight finishes and its ledger rows are completed, and the process exits 0; a
//! request that outlives the grace period is cut and recovered at the next start.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::time::Duration;

use common::vendors::{Script, Vendors};
use common::{provider, sha};
use purser::ledger::{self, Ledger, Options};

const KEY: &str = "key-shutdown";

async fn setup(
    delay_ms: u64,
) -> (
    tempfile::TempDir,
    Vendors,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let vendors = Vendors::start().await;
    vendors.script("p", vec![Script::Delay(delay_ms)]);
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("set.yaml"),
        [
            "kind: gateway\ncurrency: USD\n".to_string(),
            provider(&vendors, "p", "openai", "us", &[("m", "0.15", "0.60")])
                .replace("timeout_ms: 300", "timeout_ms: 60000"),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\n",
                sha(KEY)
            ),
        ]
        .join("---\n"),
    )
    .unwrap();
    let db = dir.path().join("l.db");
    (dir, vendors, config, db)
}

fn post(base: &str) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>> {
    let url = format!("{base}/v1/chat/completions");
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(KEY)
            .json(
                &serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .send()
            .await
    })
}

async fn wait_for_call(vendors: &Vendors) {
    for _ in 0..500 {
        if vendors.calls("p") == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the upstream call never arrived");
}

fn term(pid: u32) {
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_flight_and_records_it() {
    let (_dir, vendors, config, db) = setup(800).await;
    let mut served = common::serve_child(&config, &db, &[], &[], false).await;
    let base = served.base();
    let call = post(&base);
    wait_for_call(&vendors).await;
    term(served.child.id());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let late = reqwest::Client::new()
        .get(format!("{base}/healthz"))
        .send()
        .await;
    assert!(late.is_err(), "no new connections after SIGTERM");

    let r = call.await.unwrap().unwrap();
    assert_eq!(r.status(), 200, "the request in flight is answered");
    let status = served.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let conn = ledger::read::open_reader(&db).unwrap();
    let outcome: String = conn
        .query_row("SELECT outcome FROM requests", [], |r| r.get(0))
        .unwrap();
    assert_eq!(outcome, "served", "the rows were completed before exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_beyond_the_grace_period_is_recovered_at_the_next_start() {
    let (_dir, vendors, config, db) = setup(30_000).await;
    let mut served =
        common::serve_child(&config, &db, &["--shutdown-grace-s", "0"], &[], false).await;
    let call = post(&served.base());
    wait_for_call(&vendors).await;
    term(served.child.id());
    let status = served.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        call.await.unwrap().is_err(),
        "the client saw the connection close"
    );
    let (_, recovered) = Ledger::open(&db, Options::default()).unwrap();
    assert_eq!((recovered.requests, recovered.attempts), (1, 1));
}
