//! Audit query latency on a ledger holding 1,000,000 attempts over one month:
//! p50 / p95 of `requests?provider=X&limit=100` (a common and a rare provider) and of
//! `spend?group_by=provider` for the month, measured over HTTP against the real router.
//! Run: cargo bench --bench audit

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use purser::clock::SystemClock;
use purser::gateway::Engine;
use purser::ledger::{Ledger, Options};

const REQUESTS: u64 = 900_000;
/// Every ninth request fails over: 900,000 + 100,000 = 1,000,000 attempts.
const SECOND_EVERY: u64 = 9;
const PROVIDERS: [&str; 4] = ["openai-us", "anthropic-eu", "gemini-eu", "pool-vllm"];
const ADMIN: &str = "bench-admin";

fn fill(path: &std::path::Path) -> u64 {
    drop(Ledger::open(path, Options::default()).unwrap());
    let mut c = purser::ledger::connect(path, &Options::default()).unwrap();
    let month_start = time::macros::datetime!(2026-11-01 00:00 UTC);
    let step_ms = (30 * 86_400_000) / REQUESTS as i64;
    let tx = c.transaction().unwrap();
    let mut attempts = 0;
    {
        let mut req = tx
            .prepare(
                "INSERT INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, served_by, cost, ledger_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'plan', 'gpt-4o-mini', 'soft', '0.5', '0.01', 'served', ?6, ?7, ?8)",
            )
            .unwrap();
        let mut att = tx
            .prepare(
                "INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, finished_at, state, status, class, billing, decision, reason, input_tokens, output_tokens, cost, worst_case)
                 VALUES (?1, ?2, ?3, 'm', 'us', ?4, ?4, 'done', ?5, ?6, ?7, ?8, 'bench', 100, 50, ?9, '0.01')",
            )
            .unwrap();
        for i in 0..REQUESTS {
            let t = month_start + Duration::from_millis((i as i64 * step_ms) as u64);
            let at = purser::ledger::rfc3339(t);
            let ms = (t.unix_timestamp_nanos() / 1_000_000) as i64;
            let id = format!("R{i:025}");
            // The rare provider serves 1 request in 200.
            let first = if i % 200 == 0 {
                "rare-provider"
            } else {
                PROVIDERS[(i % 4) as usize]
            };
            let fails = i % SECOND_EVERY == 0;
            let server = if fails {
                PROVIDERS[((i + 1) % 4) as usize]
            } else {
                first
            };
            req.execute(rusqlite::params![
                id,
                at,
                ms,
                format!("client-{}", i % 50),
                format!("policy-{}", i % 10),
                server,
                "0.000075",
                i as i64 + 1
            ])
            .unwrap();
            if fails {
                att.execute(rusqlite::params![
                    id,
                    1,
                    first,
                    at,
                    429,
                    "rate_limited",
                    "not_billed",
                    "failover",
                    "0"
                ])
                .unwrap();
                attempts += 1;
            }
            att.execute(rusqlite::params![
                id,
                if fails { 2 } else { 1 },
                server,
                at,
                200,
                "success",
                "billed",
                "served",
                "0.000075"
            ])
            .unwrap();
            attempts += 1;
        }
    }
    tx.commit().unwrap();
    c.execute_batch("ANALYZE").unwrap();
    attempts
}

async fn time_get(client: &reqwest::Client, url: &str, runs: usize) -> (Duration, Duration, usize) {
    let mut times = Vec::with_capacity(runs);
    let mut bytes = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let r = client.get(url).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
        bytes = r.bytes().await.unwrap().len();
        times.push(t.elapsed());
    }
    times.sort();
    (times[runs / 2], times[runs * 95 / 100], bytes)
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit-bench.db");
    let t = Instant::now();
    let attempts = fill(&db);
    println!(
        "filled {attempts} attempts ({REQUESTS} requests) in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let plan = purser::policy::compile_dir(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("policies")
            .as_path(),
    )
    .unwrap();
    let (ledger, _) = Ledger::open(&db, Options::default()).unwrap();
    let engine = Arc::new(Engine::new(plan, ledger, SystemClock::shared()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = purser::http::router(
        engine,
        purser::http::Options {
            admin_token: purser::http::AdminToken::new(ADMIN),
            ..purser::http::Options::default()
        },
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let base = format!("http://{addr}/audit/v1");
    println!(
        "{:<62} {:>9} {:>9} {:>9}",
        "query", "p50 ms", "p95 ms", "bytes"
    );
    for (label, path, runs) in [
        (
            "requests?provider=openai-us&limit=100",
            "/requests?provider=openai-us&limit=100",
            50,
        ),
        (
            "requests?provider=rare-provider&limit=100 (0.5% of requests)",
            "/requests?provider=rare-provider&limit=100",
            50,
        ),
        (
            "requests?policy=policy-3&limit=100",
            "/requests?policy=policy-3&limit=100",
            50,
        ),
        (
            "spend?group_by=provider, one month (1M attempts)",
            "/spend?group_by=provider&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
            7,
        ),
        (
            "spend?group_by=day, one month",
            "/spend?group_by=day&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
            7,
        ),
    ] {
        let (p50, p95, bytes) = time_get(&client, &format!("{base}{path}"), runs).await;
        println!(
            "{label:<62} {:>9.2} {:>9.2} {bytes:>9}",
            p50.as_secs_f64() * 1e3,
            p95.as_secs_f64() * 1e3
        );
    }
}
