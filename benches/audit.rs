//! Audit query latency over one month of ledger: p50 / p95 of the audit API's queries
//! and of the spend page's (`/audit/`: totals, spend series, failures, budgets, the
//! first page of requests), measured over HTTP against the real router.
//!
//! The ledger holds `PURSER_BENCH_REQUESTS` requests (default 9,000,000; every ninth
//! fails over, so 10,000,000 attempts). SQLite always; PostgreSQL too when
//! `PURSER_TEST_POSTGRES` names a server (the same rows, in a schema of their own,
//! dropped at the end). `PURSER_BENCH_ENGINES=sqlite|postgres` runs one.
//!
//! The rows are written as the ledger stood before the hourly rollups (SQLite
//! migration 0009, PostgreSQL 0005), then the ledger is opened, which migrates it and
//! back-fills the rollups from them: the upgrade an existing ledger goes through, timed.
//! The SQLite file is kept as `/tmp/purser-audit-bench-<requests>.db` and reused by the
//! next run (delete it to fill again). Each page query is answered once from the raw
//! rows (`Source::Rows`, the "rows ms" column: what it cost before the rollups) and
//! the two answers must be equal; p50 / p95 are from the rollups.
//! Run: cargo bench --bench audit

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use purser::clock::SystemClock;
use purser::gateway::Engine;
use purser::ledger::audit::Source;
use purser::ledger::{Ledger, Options};

/// The first schema version with the rollups, on each engine.
const SQLITE_ROLLUPS: u32 = 9;
const POSTGRES_ROLLUPS: u32 = 5;

/// The version a ledger had just before the rollups.
fn before(versions: impl Iterator<Item = u32>, rollups: u32) -> u32 {
    versions.filter(|v| *v < rollups).max().unwrap()
}

/// Every ninth request fails over: 9,000,000 requests make 10,000,000 attempts.
const SECOND_EVERY: u64 = 9;

fn requests_n() -> u64 {
    std::env::var("PURSER_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9_000_000)
}
const PROVIDERS: [&str; 4] = ["openai-us", "anthropic-eu", "gemini-eu", "pool-vllm"];
const ADMIN: &str = "bench-admin";

fn fill(path: &std::path::Path, requests: u64) -> u64 {
    #[allow(non_snake_case)]
    let REQUESTS = requests;
    let mut c = purser::ledger::connect(path, &Options::default()).unwrap();
    let version = before(
        purser::ledger::MIGRATIONS.iter().map(|m| m.0),
        SQLITE_ROLLUPS,
    );
    purser::ledger::migrate_to(&mut c, version).unwrap();
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

/// The same rows as `fill`, made by PostgreSQL itself (generate_series), in a new
/// schema of the server at `base`; returns the URL on that schema.
async fn fill_postgres(base: &str, requests: u64) -> (String, String) {
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let schema = format!("purser_bench_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    // Migrate to the version before the rollups; opening the ledger back-fills them.
    let version = before(
        purser::ledger::postgres::MIGRATIONS.iter().map(|m| m.0),
        POSTGRES_ROLLUPS,
    );
    purser::ledger::migrate_at_to(&purser::ledger::Target::Postgres(url.clone()), version)
        .await
        .unwrap();
    let step_ms = (30 * 86_400_000) / requests as i64;
    let n = requests as i64;
    let providers = "ARRAY['openai-us','anthropic-eu','gemini-eu','pool-vllm']";
    let first =
        format!("CASE WHEN i % 200 = 0 THEN 'rare-provider' ELSE ({providers})[i % 4 + 1] END");
    let server = format!(
        "CASE WHEN i % {SECOND_EVERY} = 0 THEN ({providers})[(i + 1) % 4 + 1] ELSE {first} END"
    );
    let at = format!(
        "timestamptz '2026-11-01 00:00:00+00' + make_interval(secs => (i * {step_ms})::double precision / 1000)"
    );
    let sql = format!(
        "SET search_path = {schema};
         SET synchronous_commit = off;
         INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, served_by, cost, replica)
           SELECT 'R' || lpad(i::text, 25, '0'), {at}, 'client-' || (i % 50), 'policy-' || (i % 10), 'plan', 'gpt-4o-mini', 'soft', 0.5, 0.01, 'served', {server}, 0.000075, 'bench'
           FROM generate_series(0::bigint, {n} - 1) i;
         INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, finished_at, state, status, class, billing, decision, reason, input_tokens, output_tokens, cost, worst_case, replica)
           SELECT 'R' || lpad(i::text, 25, '0'), 1, {first}, 'm', 'us', {at}, {at}, 'done', 429, 'rate_limited', 'not_billed', 'failover', 'bench', 100, 50, 0, 0.01, 'bench'
           FROM generate_series(0::bigint, {n} - 1) i WHERE i % {SECOND_EVERY} = 0;
         INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, finished_at, state, status, class, billing, decision, reason, input_tokens, output_tokens, cost, worst_case, replica)
           SELECT 'R' || lpad(i::text, 25, '0'), CASE WHEN i % {SECOND_EVERY} = 0 THEN 2 ELSE 1 END, {server}, 'm', 'us', {at}, {at}, 'done', 200, 'success', 'billed', 'served', 'bench', 100, 50, 0.000075, 0.01, 'bench'
           FROM generate_series(0::bigint, {n} - 1) i;"
    );
    client.batch_execute(&sql).await.unwrap();
    // VACUUM runs outside the batch's implicit transaction.
    for t in ["requests", "attempts"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {schema}.{t}"))
            .await
            .unwrap();
    }
    (url, schema)
}

/// (label, path, runs, also answered from the raw rows).
const QUERIES: [(&str, &str, usize, bool); 11] = [
    (
        "requests?provider=openai-us&limit=100",
        "/requests?provider=openai-us&limit=100",
        30,
        false,
    ),
    (
        "requests?provider=rare-provider&limit=100 (0.5%)",
        "/requests?provider=rare-provider&limit=100",
        30,
        false,
    ),
    (
        "requests?policy=policy-3&limit=100",
        "/requests?policy=policy-3&limit=100",
        30,
        false,
    ),
    (
        "page: requests?limit=50 (first page)",
        "/requests?limit=50",
        30,
        false,
    ),
    ("page: budgets", "/budgets", 30, false),
    (
        "page: spend?group_by=provider, month (totals)",
        "/spend?group_by=provider&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
        5,
        true,
    ),
    (
        "spend?group_by=day, month",
        "/spend?group_by=day&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
        5,
        true,
    ),
    (
        "page: spend/series?bucket=day&group_by=provider",
        "/spend/series?bucket=day&group_by=provider&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
        5,
        true,
    ),
    (
        "page: spend/series?bucket=day&group_by=policy",
        "/spend/series?bucket=day&group_by=policy&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
        5,
        true,
    ),
    (
        "page: failures, month",
        "/failures?since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
        5,
        true,
    ),
    (
        "page: spend?group_by=provider, month cut mid-hour",
        "/spend?group_by=provider&since=2026-11-01T00:30:00Z&until=2026-11-30T23:30:00Z",
        5,
        true,
    ),
];

async fn serve(
    plan: purser::policy::Plan,
    ledger: Ledger,
) -> (String, tokio::task::JoinHandle<()>) {
    let engine_ = Arc::new(Engine::new(plan, ledger, SystemClock::shared()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = purser::http::router(
        engine_,
        purser::http::Options {
            admin_token: purser::http::AdminToken::new(ADMIN),
            ..purser::http::Options::default()
        },
    );
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/audit/v1"), server)
}

async fn measure(engine: &str, ledger: Ledger) {
    let plan = purser::policy::compile_dir(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("policies")
            .as_path(),
    )
    .unwrap();
    let (base, server) = serve(plan.clone(), ledger.reading(Source::Rollups)).await;
    let (rows_base, rows_server) = serve(plan, ledger.reading(Source::Rows)).await;
    let client = reqwest::Client::new();
    println!(
        "{:<10} {:<52} {:>9} {:>9} {:>9} {:>9}",
        "engine", "query", "rows ms", "p50 ms", "p95 ms", "bytes"
    );
    for (label, path, runs, rows) in QUERIES {
        let (p50, p95, bytes) = time_get(&client, &format!("{base}{path}"), runs).await;
        let before = if rows {
            let t = Instant::now();
            let from_rows = get(&client, &format!("{rows_base}{path}")).await;
            let took = t.elapsed();
            let from_rollups = get(&client, &format!("{base}{path}")).await;
            assert_eq!(from_rollups, from_rows, "{path}: rollups and rows differ");
            format!("{:.0}", took.as_secs_f64() * 1e3)
        } else {
            "-".to_string()
        };
        println!(
            "{engine:<10} {label:<52} {before:>9} {:>9.2} {:>9.2} {bytes:>9}",
            p50.as_secs_f64() * 1e3,
            p95.as_secs_f64() * 1e3
        );
    }
    server.abort();
    rows_server.abort();
}

async fn get(client: &reqwest::Client, url: &str) -> bytes::Bytes {
    let r = client.get(url).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    r.bytes().await.unwrap()
}

#[tokio::main]
async fn main() {
    let requests = requests_n();
    let engines =
        std::env::var("PURSER_BENCH_ENGINES").unwrap_or_else(|_| "sqlite,postgres".into());
    if engines.contains("sqlite") {
        let db = std::env::temp_dir().join(format!("purser-audit-bench-{requests}.db"));
        if db.exists() {
            println!("sqlite: reusing {}", db.display());
        } else {
            let partial = db.with_extension("partial");
            let _ = std::fs::remove_file(&partial);
            let t = Instant::now();
            let attempts = fill(&partial, requests);
            println!(
                "sqlite: filled {attempts} attempts ({requests} requests) in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            let t = Instant::now();
            drop(Ledger::open(&partial, Options::default()).unwrap());
            println!(
                "sqlite: migrated, rollups back-filled, in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            std::fs::rename(&partial, &db).unwrap();
        }
        let (ledger, _) = Ledger::open(&db, Options::default()).unwrap();
        measure("sqlite", ledger).await;
    }
    if engines.contains("postgres") {
        match std::env::var("PURSER_TEST_POSTGRES") {
            Ok(base) => {
                let t = Instant::now();
                let (url, schema) = fill_postgres(&base, requests).await;
                println!(
                    "postgres: filled {requests} requests in {:.1} s",
                    t.elapsed().as_secs_f64()
                );
                let t = Instant::now();
                let (ledger, _) =
                    Ledger::open_at(&purser::ledger::Target::Postgres(url), Options::default())
                        .await
                        .unwrap();
                println!(
                    "postgres: migrated, rollups back-filled, in {:.1} s",
                    t.elapsed().as_secs_f64()
                );
                measure("postgres", ledger).await;
                let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                client
                    .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                    .await
                    .unwrap();
            }
            Err(_) => println!("postgres: skipped (set PURSER_TEST_POSTGRES to a server URL)"),
        }
    }
}
