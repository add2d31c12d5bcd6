//! A PostgreSQL ledger under faults (`PURSER_TEST_POSTGRES`; skipped without it,
//! failed in CI without a server), through a fault-injecting TCP proxy
//! (`common/faultproxy.rs`) between purser and the server: the database cut while a
//! call is out, slowed down, or the answer to an admission's `COMMIT` lost; a replica
//! that cannot renew its lease; a replica frozen past its lease.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;
#[path = "common/faultproxy.rs"]
mod faultproxy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::vendors::{Script, Vendors};
use common::{ADMIN, serve_child, sha};
use faultproxy::FaultProxy;
use purser::clock::SystemClock;
use purser::gateway::Engine;
use purser::ledger::{BudgetLimit, Ledger, LedgerError, NewAttempt, NewRequest, Options, Target};
use purser::money::Money;
use purser::policy::plan::{Mode, Period};
use serde_json::{Value, json};

const KEY: &str = "key-pg-faults";

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

/// Provider `p` (and `alt`, the alternate) serving `m` at 1000 per million tokens each
/// way with a `timeout_ms` timeout; policy `team` (`mode`) with a 10.00 day budget.
fn policy_set(vendors: &Vendors, mode: &str, timeout_ms: u64) -> String {
    // `alt` dearer, so `p` is always the primary.
    let prov = |id: &str| {
        let price = if id == "p" { "1000" } else { "1100" };
        common::provider(vendors, id, "openai", "us", &[("m", price, price)])
            .replace("timeout_ms: 300", &format!("timeout_ms: {timeout_ms}"))
    };
    [
        "kind: gateway\ncurrency: USD\n".to_string(),
        prov("p"),
        prov("alt"),
        format!(
            "kind: policy\nid: team\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"1\", mode: {mode} }}\nmax_output_tokens: 20\nalternates:\n  m: alt/m\nbudgets:\n  - {{ period: day, limit: \"10\" }}\n",
            sha(KEY)
        ),
    ]
    .join("---\n")
}

struct Gw {
    addr: std::net::SocketAddr,
    engine: Arc<Engine>,
    vendors: Vendors,
    _dir: tempfile::TempDir,
}

/// An in-process gateway whose ledger is at `url` (through a proxy or not).
async fn gateway(url: &str, replica: &str, lease: Duration, timeout_ms: u64) -> Gw {
    let dir = tempfile::tempdir().unwrap();
    let vendors = Vendors::start().await;
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("set.yaml"),
        policy_set(&vendors, "hard", timeout_ms),
    )
    .unwrap();
    let plan = purser::policy::compile_dir(&config).unwrap();
    let opts = Options {
        replica: Some(replica.into()),
        lease,
        ..Options::default()
    };
    let (ledger, _) = Ledger::open_at(&Target::Postgres(url.into()), opts)
        .await
        .unwrap();
    let engine = Arc::new(Engine::new(plan, ledger, SystemClock::shared()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = purser::http::Options {
        admin_token: purser::http::AdminToken::new(ADMIN),
        ..purser::http::Options::default()
    };
    let app = purser::http::router(engine.clone(), opts);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Gw {
        addr,
        engine,
        vendors,
        _dir: dir,
    }
}

async fn chat(base: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

impl Gw {
    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// (requests in flight, sum reserved) read straight from the server.
async fn open_rows(db: &tokio_postgres::Client) -> (i64, Money) {
    let n: i64 = db
        .query_one(
            "SELECT count(*) FROM requests WHERE outcome = 'in_flight'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let r: rust_decimal::Decimal = db
        .query_one("SELECT COALESCE(sum(reserved), 0) FROM budget_windows", &[])
        .await
        .unwrap()
        .get(0);
    (n, Money::new(r))
}

async fn wait_until_settled(db: &tokio_postgres::Client, limit: Duration, what: &str) {
    let start = Instant::now();
    loop {
        let (n, reserved) = open_rows(db).await;
        if n == 0 && !reserved.is_positive() {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: after {limit:?}, {n} request(s) still in flight and {reserved} reserved"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The database is cut for 5 s while a budgeted call is out: the vendor answers during
/// the cut, so the request's end cannot be written. Once the database is back, the
/// in-process sweeper interrupts it: nothing stays in flight or reserved. (On main the
/// sweeper retried only SQLite's errors and gave up at once on PostgreSQL's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_cut_while_a_call_is_out_leaves_nothing_in_flight_once_it_returns() {
    let Some(url) = common::pg::fresh_schema("pg_cut").await else {
        return;
    };
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let gw = gateway(&proxy.url(&url), "cut", Duration::from_secs(3), 10_000).await;
    let db = common::pg::connect(&url).await;
    gw.vendors.script("p", vec![Script::Delay(1500)]);
    let base = gw.base();
    let call = tokio::spawn(async move { chat(&base).await });
    let start = Instant::now();
    while open_rows(&db).await.0 == 0 {
        assert!(start.elapsed() < Duration::from_secs(5), "never admitted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The vendor answered meanwhile; its end could not be written.
    assert_eq!(gw.vendors.calls("p"), 1);
    assert_eq!(
        open_rows(&db).await.0,
        1,
        "the cut did not catch the request"
    );
    proxy.restore();
    let _ = call.await.unwrap();
    wait_until_settled(&db, Duration::from_secs(20), "after the database came back").await;
    let sent = gw.vendors.sent("p");
    let id = sent[0].attempt.rsplit_once('/').unwrap().0;
    let row = gw.engine.ledger.request(id).await.unwrap().unwrap();
    assert_eq!(row.outcome, "interrupted", "{row:?}");
    assert_eq!(gw.vendors.calls("alt"), 0);
    common::money::assert_money_invariants_on(
        &common::db::Db::Postgres(url.clone()),
        &gw.vendors,
        &["p", "alt"],
    )
    .await;
}

/// A slow database (every piece of traffic held 100 ms each way) makes requests slow,
/// not wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_still_ends_every_request() {
    let Some(url) = common::pg::fresh_schema("pg_slow").await else {
        return;
    };
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let gw = gateway(&proxy.url(&url), "slow", Duration::from_secs(5), 5_000).await;
    proxy.delay(Duration::from_millis(100));
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let base = gw.base();
            tokio::spawn(async move { chat(&base).await })
        })
        .collect();
    for c in calls {
        let (status, body) = c.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    proxy.delay(Duration::ZERO);
    let db = common::pg::connect(&url).await;
    wait_until_settled(&db, Duration::from_secs(10), "after slow requests").await;
    common::money::assert_money_invariants_on(
        &common::db::Db::Postgres(url.clone()),
        &gw.vendors,
        &["p", "alt"],
    )
    .await;
}

/// Proved: the server commits an admission and its answer is lost with the connection.
/// The gateway is told the ledger is unavailable and calls no one; on main the request
/// then stayed `in_flight` with its reservation while the process lived. Now the
/// writer ends it (`failed` / `ledger_unavailable`, nothing billed) once the database
/// answers, and its reservation is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_an_admission_commit_strands_no_reservation() {
    let Some(url) = common::pg::fresh_schema("pg_lost_commit").await else {
        return;
    };
    let proxy = FaultProxy::start("127.0.0.1:5432").await;
    let gw = gateway(&proxy.url(&url), "lost", Duration::from_secs(5), 5_000).await;
    let db = common::pg::connect(&url).await;
    proxy.drop_commit_replies(1);
    let (status, body) = chat(&gw.base()).await;
    assert_eq!(
        proxy.commit_replies_dropped(),
        1,
        "no COMMIT answer was dropped"
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    assert_eq!(
        gw.vendors.calls("p"),
        0,
        "a call was made without a confirmed admission"
    );
    // The admission did commit: the scenario is real.
    let committed: i64 = db
        .query_one("SELECT count(*) FROM requests", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        committed, 1,
        "the admission's COMMIT did not reach the server"
    );
    wait_until_settled(&db, Duration::from_secs(10), "after a lost COMMIT answer").await;
    let row = db
        .query_one("SELECT outcome, error_code, cost FROM requests", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "failed");
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some("ledger_unavailable")
    );
    // Later requests are served as usual.
    assert_eq!(chat(&gw.base()).await.0, 200);
    wait_until_settled(&db, Duration::from_secs(10), "after a served request").await;
    common::money::assert_money_invariants_on(
        &common::db::Db::Postgres(url.clone()),
        &gw.vendors,
        &["p", "alt"],
    )
    .await;
}

/// The lease row is held locked by another session, so the replica cannot renew its
/// lease while its writer still reaches the database: once the lease has run out it
/// refuses admissions (503 `ledger_unavailable`, no call), and admits again once it
/// has renewed. (On main it kept admitting.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_renew_its_lease_admits_nothing_until_it_does() {
    let Some(url) = common::pg::fresh_schema("pg_lease").await else {
        return;
    };
    let gw = gateway(&url, "stuck", Duration::from_millis(900), 5_000).await;
    assert_eq!(chat(&gw.base()).await.0, 200);
    let mut blocker = common::pg::connect(&url).await;
    let tx = blocker.transaction().await.unwrap();
    tx.query("SELECT 1 FROM replicas WHERE id = 'stuck' FOR UPDATE", &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, body) = chat(&gw.base()).await;
    assert_eq!(status, 503, "admitted without a lease: {body}");
    assert_eq!(body["error"]["code"], "ledger_unavailable", "{body}");
    assert_eq!(gw.vendors.calls("p"), 1);
    tx.commit().await.unwrap();
    let start = Instant::now();
    loop {
        let (status, _) = chat(&gw.base()).await;
        if status == 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still refusing after the lease could be renewed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let db = common::pg::connect(&url).await;
    wait_until_settled(&db, Duration::from_secs(10), "after the lease came back").await;
    common::money::assert_money_invariants_on(
        &common::db::Db::Postgres(url.clone()),
        &gw.vendors,
        &["p", "alt"],
    )
    .await;
}

/// Another replica recovered a request (as it does once the admitting replica's lease
/// has expired); the admitting replica's failover top-up for it is refused with
/// `NotInFlight`, whatever it asks for. (On main it returned Ok having reserved
/// nothing, and the alternate was called.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_up_for_a_recovered_request_is_refused() {
    let Some(url) = common::pg::fresh_schema("pg_top_up_recovered").await else {
        return;
    };
    let target = Target::Postgres(url.clone());
    let opts = |id: &str| Options {
        replica: Some(id.into()),
        lease: Duration::from_secs(5),
        ..Options::default()
    };
    let (a, _) = Ledger::open_at(&target, opts("a")).await.unwrap();
    let (b, _) = Ledger::open_at(&target, opts("b")).await.unwrap();
    let limits = vec![BudgetLimit {
        period: Period::Day,
        limit: m("1"),
    }];
    let now = time::OffsetDateTime::now_utc();
    a.admit_with_attempt(
        NewRequest {
            id: "r".into(),
            received_at: now,
            client: "bot".into(),
            policy: "team".into(),
            plan_id: "p1".into(),
            model: "m".into(),
            mode: Mode::Soft,
            ceiling: m("1"),
            worst_case: m("0.1"),
            ingress: Default::default(),
            shape: None,
        },
        limits.clone(),
        NewAttempt {
            request_id: "r".into(),
            seq: 1,
            provider: "p".into(),
            upstream_model: "m".into(),
            jurisdiction: "us".into(),
            started_at: now,
            worst_case: m("0.1"),
        },
    )
    .await
    .unwrap();
    b.interrupt("r", "recovered by replica b").await.unwrap();
    for extra in ["0.1", "0"] {
        match a.top_up("r", m(extra), limits.clone()).await {
            Err(LedgerError::NotInFlight(id)) => assert_eq!(id, "r"),
            other => panic!("a recovered request was topped up by {extra}: {other:?}"),
        }
    }
    let w = &a.stored_budgets().await.unwrap()[0];
    assert_eq!((w.spent, w.reserved), (m("0.1"), Money::ZERO));
}

/// Two `purser serve` replicas; the first is frozen (SIGSTOP) while its soft request's
/// primary is out, past its lease, so the second recovers the request. When it thaws,
/// the primary has timed out and the decision is to fail over: the top-up is refused
/// (lease lost, or the request no longer in flight) and the alternate is never called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_frozen_past_its_lease_calls_no_alternate_when_it_thaws() {
    let Some(url) = common::pg::fresh_schema("pg_frozen").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let vendors = Vendors::start().await;
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("set.yaml"), policy_set(&vendors, "soft", 1_000)).unwrap();
    let mut replicas = Vec::new();
    for id in ["frozen", "live"] {
        replicas.push(
            serve_child(
                &config,
                std::path::Path::new(&url),
                &[],
                &[
                    ("PURSER_REPLICA_ID", id),
                    ("PURSER_REPLICA_LEASE_MS", "600"),
                    ("PURSER_ADMIN_TOKEN", ADMIN),
                ],
                false,
            )
            .await,
        );
    }
    // The primary answers after its 1 s timeout: a timeout, which a soft request fails over.
    vendors.script("p", vec![Script::Delay(3000)]);
    let base = replicas[0].base();
    let call = tokio::spawn(async move { chat(&base).await });
    let db = common::pg::connect(&url).await;
    let start = Instant::now();
    while vendors.calls("p") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the primary was never called"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = replicas[0].child.id().to_string();
    let signal = |s: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([s, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    // The live replica recovers the frozen one's request once its lease has expired.
    let start = Instant::now();
    loop {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM requests WHERE outcome = 'interrupted'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the live replica did not recover the frozen one's request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal("-CONT");
    let (status, body) = call.await.unwrap();
    assert_eq!(
        vendors.calls("alt"),
        0,
        "the thawed replica called the alternate for a recovered request: {status} {body}"
    );
    assert_eq!(status, 503, "{body}");
    drop(replicas);
}

/// Eight CSV exports whose clients stop reading hold every read connection (their
/// queries stream as the client reads). The lease is renewed all the same, on its own
/// connection, and the replica keeps admitting. (On main the renewal waited for a read
/// connection, failed, and the lease expired under a healthy database: another replica
/// would have recovered this one's requests in flight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_exports_that_hold_every_read_connection_do_not_stop_the_lease() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(url) = common::pg::fresh_schema("pg_lease_csv").await else {
        return;
    };
    let gw = gateway(&url, "exports", Duration::from_millis(900), 5_000).await;
    let db = common::pg::connect(&url).await;
    // 40,000 attempts: megabytes of CSV, more than the sockets and buffers hold.
    db.batch_execute(
        "INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, replica)
         SELECT 'r' || g, now(), 'bot', 'other', 'p1', 'm', 'hard', 1, 0.01, 'served', 'exports' FROM generate_series(1, 40000) g;
         INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, state, billing, worst_case, cost, replica, reason)
         SELECT 'r' || g, 1, 'p', 'm', 'us', now(), 'done', 'billed', 0.01, 0.01, 'exports', repeat('x', 100) FROM generate_series(1, 40000) g;",
    )
    .await
    .unwrap();
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut conn = socket.connect(gw.addr).await.unwrap();
        conn.write_all(
            format!("GET /audit/v1/attempts.csv HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut first = [0u8; 512];
        let n = conn.read(&mut first).await.unwrap();
        assert!(
            String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&first[..n])
        );
        stalled.push(conn); // read no more, keep it open
    }
    // Three leases later, the lease is still held and renewed.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    let live: bool = db
        .query_one(
            "SELECT expires_at > now() FROM replicas WHERE id = 'exports'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        live,
        "the lease expired while CSV exports held the read connections"
    );
    let (status, body) = chat(&gw.base()).await;
    assert_eq!(status, 200, "{body}");
    drop(stalled);
}
