//! Several `purser serve` processes on one PostgreSQL ledger (`PURSER_TEST_POSTGRES`;
//! skipped without it, failed in CI without a server): one budget shared by all of
//! them, a killed replica's rows recovered by another, and each row naming the plan
//! of the replica that decided it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::vendors::{Script, Vendors};
use common::{ServeChild, provider, serve_child, sha};
use purser::money::Money;

const KEY: &str = "key-replicas";
/// Short, so a killed replica's rows are recovered quickly.
const LEASE_MS: &str = "1000";

fn policy_set(vendors: &Vendors, day_limit: &str, ceiling: &str) -> String {
    let p = provider(vendors, "p", "openai", "us", &[("m", "1", "2")])
        .replace("timeout_ms: 300", "timeout_ms: 600000");
    [
        "kind: gateway\ncurrency: USD\n".to_string(),
        p,
        format!(
            "kind: policy\nid: team\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"{ceiling}\", mode: hard }}\nmax_output_tokens: 1000\nbudgets:\n  - {{ period: day, limit: \"{day_limit}\" }}\n",
            sha(KEY)
        ),
    ]
    .join("---\n")
}

struct Cluster {
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    url: String,
    vendors: Vendors,
    replicas: Vec<ServeChild>,
}

async fn cluster(test: &str, n: usize, day_limit: &str) -> Option<Cluster> {
    let url = common::pg::fresh_schema(test).await?;
    let dir = tempfile::tempdir().unwrap();
    let vendors = Vendors::start().await;
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("set.yaml"),
        policy_set(&vendors, day_limit, "0.05"),
    )
    .unwrap();
    let mut replicas = Vec::new();
    for i in 0..n {
        let id = format!("replica-{i}");
        replicas.push(
            serve_child(
                &config,
                std::path::Path::new(&url),
                &[],
                &[
                    ("PURSER_REPLICA_ID", id.as_str()),
                    ("PURSER_REPLICA_LEASE_MS", LEASE_MS),
                    ("PURSER_ADMIN_TOKEN", common::ADMIN),
                ],
                false,
            )
            .await,
        );
    }
    Some(Cluster {
        _dir: dir,
        config,
        url,
        vendors,
        replicas,
    })
}

async fn chat(client: &reqwest::Client, base: &str) -> (u16, Option<String>) {
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(
            &serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}),
        )
        .send()
        .await
        .unwrap();
    let id = r
        .headers()
        .get("x-purser-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (r.status().as_u16(), id)
}

fn dec(row: &tokio_postgres::Row, i: usize) -> Money {
    Money::new(row.get::<_, rust_decimal::Decimal>(i))
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_admissions_across_three_replicas_never_pass_the_day_cap() {
    let Some(c) = cluster("replicas::two_hundred_admissions", 3, "0.05").await else {
        return;
    };
    // Each answer takes a while, so reservations from all three replicas overlap.
    c.vendors.script("p", vec![Script::Delay(400); 200]);
    let db = Arc::new(common::pg::connect(&c.url).await);
    // Watch the window the whole time: spent + reserved may never pass the limit.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (db, stop) = (db.clone(), stop.clone());
        tokio::spawn(async move {
            let mut samples = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for row in db
                    .query(
                        "SELECT spent, reserved, limit_amount FROM budget_windows",
                        &[],
                    )
                    .await
                    .unwrap()
                {
                    let (spent, reserved, limit) = (dec(&row, 0), dec(&row, 1), dec(&row, 2));
                    assert!(
                        spent + reserved <= limit,
                        "spent {spent} + reserved {reserved} > limit {limit}"
                    );
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    let client = reqwest::Client::new();
    let bases: Vec<String> = c.replicas.iter().map(ServeChild::base).collect();
    let mut calls = Vec::new();
    for i in 0..200 {
        let (client, base) = (client.clone(), bases[i % 3].clone());
        calls.push(tokio::spawn(async move { chat(&client, &base).await }));
    }
    let (mut ok, mut refused) = (0, 0);
    for call in calls {
        match call.await.unwrap().0 {
            200 => ok += 1,
            402 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let samples = watcher.await.unwrap();
    assert!(samples > 0);
    assert!(refused > 0, "the cap was reached ({ok} served)");
    assert_eq!(ok + refused, 200);
    // Zero overrun, every reservation settled, and spent is exactly the attempts' cost.
    let w = db
        .query_one(
            "SELECT spent, reserved, limit_amount FROM budget_windows",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(dec(&w, 1), Money::ZERO);
    assert!(dec(&w, 0) <= dec(&w, 2));
    let cost = db
        .query_one("SELECT COALESCE(sum(cost), 0) FROM attempts", &[])
        .await
        .unwrap();
    assert_eq!(dec(&w, 0), dec(&cost, 0));
    let served: i64 = db
        .query_one(
            "SELECT count(*) FROM requests WHERE outcome = 'served'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(served, ok);
    // Requests reached all three replicas.
    let replicas: i64 = db
        .query_one("SELECT count(DISTINCT replica) FROM requests", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(replicas, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_call_is_recovered_by_another_within_the_lease() {
    let Some(mut c) = cluster("replicas::killed_replica", 3, "1").await else {
        return;
    };
    // The vendor holds the call longer than the test lives.
    c.vendors.script("p", vec![Script::Delay(600_000)]);
    let db = common::pg::connect(&c.url).await;
    let base = c.replicas[0].base();
    let call = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    wait_until("the upstream call", Duration::from_secs(20), || async {
        c.vendors.calls("p") == 1
    })
    .await;
    let in_flight: i64 = db
        .query_one(
            "SELECT count(*) FROM attempts WHERE state = 'in_flight' AND replica = 'replica-0'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        in_flight, 1,
        "the attempt is recorded, by its replica, before the call"
    );

    c.replicas[0].child.kill().unwrap(); // SIGKILL: no shutdown path runs
    c.replicas[0].child.wait().unwrap();
    let killed_at = Instant::now();
    assert!(
        call.await.unwrap().is_err(),
        "the client saw the connection die"
    );

    // Another replica recovers it once the lease (1 s) has expired: within the lease
    // plus one renewal period and some slack.
    wait_until(
        "recovery by a live replica",
        Duration::from_secs(15),
        || async {
            let n: i64 = db
                .query_one(
                    "SELECT count(*) FROM attempts WHERE state = 'interrupted'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            n == 1
        },
    )
    .await;
    eprintln!(
        "recovered {:?} after the kill (lease {LEASE_MS} ms)",
        killed_at.elapsed()
    );
    let r = db
        .query_one("SELECT outcome, worst_case FROM requests", &[])
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "interrupted");
    let a = db
        .query_one("SELECT billing, reason, cost_basis FROM attempts", &[])
        .await
        .unwrap();
    assert_eq!(a.get::<_, String>(0), "maybe_billed");
    assert!(
        a.get::<_, String>(1)
            .contains("recovered by another replica")
    );
    // Nothing was answered to price (as on SQLite): the worst case is what is charged.
    assert_eq!(a.get::<_, Option<String>>(2), None);
    // Charged at the worst case: the reservation moved to spent, nothing still held.
    let w = db
        .query_one("SELECT spent, reserved FROM budget_windows", &[])
        .await
        .unwrap();
    assert_eq!((dec(&w, 0), dec(&w, 1)), (dec(&r, 1), Money::ZERO));
    assert!(dec(&w, 0).is_positive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reload_on_one_replica_each_row_names_the_plan_that_decided_it() {
    let Some(c) = cluster("replicas::reload", 2, "5").await else {
        return;
    };
    let client = reqwest::Client::new();
    let plan_of = |base: String| {
        let client = client.clone();
        async move {
            let text = client
                .get(format!("{base}/readyz"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.rsplit(' ').next().unwrap().trim().to_string()
        }
    };
    let (a, b) = (c.replicas[0].base(), c.replicas[1].base());
    let old = plan_of(a.clone()).await;
    assert_eq!(old, plan_of(b.clone()).await, "both start on one plan");
    // A new ceiling, reloaded on replica 0 only.
    std::fs::write(
        c.config.join("set.yaml"),
        policy_set(&c.vendors, "5", "0.04"),
    )
    .unwrap();
    let r = client
        .post(format!("{a}/admin/v1/reload"))
        .bearer_auth(common::ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let new = plan_of(a.clone()).await;
    assert_ne!(new, old);
    assert_eq!(plan_of(b.clone()).await, old, "replica 1 did not reload");

    let mut expected = Vec::new();
    for i in 0..10 {
        let (base, plan) = if i % 2 == 0 { (&a, &new) } else { (&b, &old) };
        let (status, id) = chat(&client, base).await;
        assert_eq!(status, 200);
        expected.push((id.unwrap(), plan.clone()));
    }
    let db = common::pg::connect(&c.url).await;
    for (id, plan) in expected {
        let row = db
            .query_one("SELECT plan_id FROM requests WHERE id = $1", &[&id])
            .await
            .unwrap();
        assert_eq!(&row.get::<_, String>(0), &plan, "request {id}");
    }
}
