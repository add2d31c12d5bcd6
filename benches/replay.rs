//! What-if replay over a large ledger (issue #24): `PURSER_BENCH_REQUESTS` recorded
//! requests (default 1,000,000, one month, every one with its shape and a billed
//! attempt) replayed through a changed policy set: a lower ceiling, a vendor gone for
//! a fifth of the traffic's clients' jurisdictions, and a day budget that runs out.
//! Prints the replay's wall time and its peak resident memory (VmHWM, reset after the
//! ledger is filled, so the figure is the replay's own). Aims: < 10 s, < 100 MB.
//! SQLite always; PostgreSQL too when `PURSER_TEST_POSTGRES` names a server (the same
//! rows in a schema of their own, dropped at the end).
//! Run: cargo bench --bench replay

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::time::{Duration, Instant};

use purser::ledger::recorded::Span;
use purser::ledger::{Ledger, Options};

const CLIENTS: u64 = 50;

fn requests_n() -> u64 {
    std::env::var("PURSER_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn sha(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// The ledger, written directly (a gateway would take hours to record a million
/// requests; the rows are those it writes, shape included).
fn fill(path: &std::path::Path, requests: u64) {
    drop(Ledger::open(path, Options::default()).unwrap());
    let mut c = purser::ledger::connect(path, &Options::default()).unwrap();
    let month_start = time::macros::datetime!(2026-11-01 00:00 UTC);
    let step_ms = (30 * 86_400_000) / requests as i64;
    let tx = c.transaction().unwrap();
    {
        let mut req = tx
            .prepare(
                "INSERT INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case,
                                       outcome, served_by, cost, ledger_seq, shape_input_tokens, shape_requested_output,
                                       shape_output_bound, shape_choices, shape_stream, shape_tools, shape_media, shape_unbounded)
                 VALUES (?1, ?2, ?3, ?4, 'team', 'plan', 'm', 'hard', '0.01', ?5, 'served', 'us1', ?6, ?7, ?8, ?9, ?10, 1, ?11, 0, 0, 0)",
            )
            .unwrap();
        let mut att = tx
            .prepare(
                "INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, finished_at, state, status,
                                       class, billing, decision, reason, input_tokens, output_tokens, cost, worst_case, cost_basis)
                 VALUES (?1, 1, 'us1', 'm', 'us', ?2, ?2, 'done', 200, 'success', 'billed', 'served', 'bench', ?3, ?4, ?5, ?6, 'usage')",
            )
            .unwrap();
        for i in 0..requests {
            let t = month_start + Duration::from_millis((i as i64 * step_ms) as u64);
            let at = purser::ledger::rfc3339(t);
            let ms = (t.unix_timestamp_nanos() / 1_000_000) as i64;
            let id = format!("R{i:025}");
            // Inputs of 200..2200 tokens; one request in five asks for 1000 output tokens.
            let input = 200 + (i * 7919) % 2000;
            let asked = (i % 5 == 0).then_some(1000i64);
            let out_bound = asked.unwrap_or(100);
            let (tin, tout) = (input / 2, out_bound / 3);
            let cost = purser::money::Money::new(rust_decimal::Decimal::new(
                (tin + 2 * tout as u64) as i64,
                6,
            ));
            let wc = purser::money::Money::new(rust_decimal::Decimal::new(
                (input + 2 * out_bound as u64) as i64,
                6,
            ));
            req.execute(rusqlite::params![
                id,
                at,
                ms,
                format!("client-{}", i % CLIENTS),
                wc.to_string(),
                cost.to_string(),
                i as i64 + 1,
                input as i64,
                asked,
                out_bound,
                i % 3 == 0,
            ])
            .unwrap();
            att.execute(rusqlite::params![
                id,
                at,
                tin as i64,
                tout,
                cost.to_string(),
                wc.to_string()
            ])
            .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// The proposed set: `us1` (where everything went) gone, `eu1` dearer, a ceiling the
/// 1000-token requests with long inputs no longer fit, and a day budget that runs out.
fn proposed(dir: &std::path::Path) -> purser::policy::Plan {
    let clients: Vec<String> = (0..CLIENTS)
        .map(|i| {
            format!(
                "  - {{ id: client-{i}, key_sha256: \"{}\" }}",
                sha(&format!("k{i}"))
            )
        })
        .collect();
    let set = format!(
        "kind: gateway\ncurrency: USD\n---\nkind: provider\nid: eu1\napi: openai\nbase_url: http://127.0.0.1:9/v1\njurisdiction: eu\nmodels:\n  m:\n    context_window: 100000\n    input_per_mtok: \"1.50\"\n    output_per_mtok: \"3.00\"\n---\nkind: provider\nid: eu2\napi: openai\nbase_url: http://127.0.0.1:9/v2\njurisdiction: eu\nmodels:\n  m:\n    context_window: 100000\n    input_per_mtok: \"3.00\"\n    output_per_mtok: \"6.00\"\n---\nkind: policy\nid: team\nclients:\n{}\nmodels: [m]\njurisdictions: [eu]\nceiling: {{ per_request: \"0.005\", mode: hard }}\nmax_output_tokens: 100\nbudgets: [ {{ period: day, limit: \"40\" }}, {{ period: month, limit: \"500\" }} ]\n",
        clients.join("\n")
    );
    std::fs::write(dir.join("set.yaml"), set).unwrap();
    purser::policy::compile_dir(dir).unwrap()
}

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The same rows as `fill`, made by PostgreSQL itself (generate_series), in a new
/// schema of the server at `base`; the URL on that schema and the schema.
async fn fill_postgres(base: &str, requests: u64) -> (String, String) {
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let schema = format!("purser_bench_replay_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
    drop(
        Ledger::open_at(
            &purser::ledger::Target::Postgres(url.clone()),
            Options::default(),
        )
        .await
        .unwrap(),
    );
    let step_ms = (30 * 86_400_000) / requests as i64;
    let n = requests as i64;
    let sql = format!(
        "SET search_path = {schema};
         SET synchronous_commit = off;
         INSERT INTO requests (id, received_at, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, served_by, cost, replica,
                               shape_input_tokens, shape_requested_output, shape_output_bound, shape_choices, shape_stream, shape_tools, shape_media, shape_unbounded)
           SELECT 'R' || lpad(i::text, 25, '0'),
                  timestamptz '2026-11-01 00:00:00+00' + make_interval(secs => (i * {step_ms})::double precision / 1000),
                  'client-' || (i % {CLIENTS}), 'team', 'plan', 'm', 'hard', 0.01,
                  (input + 2 * outb)::numeric / 1000000, 'served', 'us1',
                  (input / 2 + 2 * (outb / 3))::numeric / 1000000, 'bench',
                  input, CASE WHEN i % 5 = 0 THEN 1000 END, outb, 1, i % 3 = 0, false, false, false
           FROM (SELECT i, 200 + (i * 7919) % 2000 AS input, CASE WHEN i % 5 = 0 THEN 1000 ELSE 100 END AS outb
                 FROM generate_series(0::bigint, {n} - 1) i) s
           ORDER BY i;
         INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, finished_at, state, status, class,
                               billing, decision, reason, input_tokens, output_tokens, cost, worst_case, cost_basis, replica)
           SELECT id, 1, 'us1', 'm', 'us', received_at, received_at, 'done', 200, 'success', 'billed', 'served', 'bench',
                  shape_input_tokens / 2, shape_output_bound / 3, cost, worst_case, 'usage', 'bench'
           FROM requests;"
    );
    client.batch_execute(&sql).await.unwrap();
    for t in ["requests", "attempts"] {
        client
            .batch_execute(&format!("VACUUM ANALYZE {schema}.{t}"))
            .await
            .unwrap();
    }
    (url, schema)
}

/// Replay the ledger at `target` through `plan`, printing time and peak memory.
fn measure(engine: &str, target: purser::ledger::Target, plan: &purser::policy::Plan, n: u64) {
    // The peak so far was the fill's; from here it is the replay's (Linux: writing 5
    // to clear_refs resets VmHWM to the current RSS).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = status_kb("VmRSS:");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // The ledger read alone (every row fetched and folded, nothing replayed): how much
    // of the replay's time is the read.
    let t = Instant::now();
    let rows = rt.block_on(async {
        let ledger = Ledger::open_reader(&target).await.unwrap();
        let mut batches = ledger.recorded(Span::default());
        let mut rows = 0u64;
        while let Some(b) = batches.recv().await {
            rows += b.unwrap().len() as u64;
        }
        rows
    });
    assert_eq!(rows, n);
    println!("{engine}: read alone: {:.2} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let report = rt.block_on(async {
        let ledger = Ledger::open_reader(&target).await.unwrap();
        purser::replay::over(&ledger, plan, Span::default())
            .await
            .unwrap()
    });
    let took = t.elapsed();
    let hwm = status_kb("VmHWM:");
    assert_eq!(report.read, n);
    println!(
        "{engine}: replayed {n} requests in {:.2} s ({:.0} requests/s); peak RSS {:.1} MB (VmHWM; {:.1} MB before the replay)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        hwm as f64 / 1024.0,
        rss_before as f64 / 1024.0
    );
    println!(
        "{engine}: aims: < 10 s {}, < 100 MB {}",
        if took < Duration::from_secs(10) {
            "met"
        } else {
            "MISSED"
        },
        if hwm < 100 * 1024 { "met" } else { "MISSED" }
    );
    println!(
        "{engine}: report: {} changes; moved {:?}; refused {:?}; delta {}; budgets ran out in {} window(s)",
        report.changes(),
        report
            .moved
            .iter()
            .map(|m| (m.route.to.as_str(), m.requests))
            .collect::<Vec<_>>(),
        report
            .refused
            .iter()
            .map(|r| (r.code.as_str(), r.requests))
            .collect::<Vec<_>>(),
        report.spend.delta,
        report
            .budgets
            .iter()
            .map(|b| b.exhausted.len())
            .sum::<usize>()
    );
}

fn main() {
    let n = requests_n();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let t = Instant::now();
    fill(&path, n);
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "filled {n} requests in {:.1} s ({} MB ledger)",
        t.elapsed().as_secs_f64(),
        size / 1_000_000
    );
    let plan = proposed(dir.path());
    measure("sqlite", path.as_path().into(), &plan, n);
    if let Ok(base) = std::env::var("PURSER_TEST_POSTGRES") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let t = Instant::now();
        let (url, schema) = rt.block_on(fill_postgres(&base, n));
        println!(
            "postgres: filled {n} requests in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        measure("postgres", purser::ledger::Target::Postgres(url), &plan, n);
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await
                .unwrap();
        });
    }
}
