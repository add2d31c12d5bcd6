//! Ledger write throughput with 64 concurrent writers (`PURSER_BENCH_WRITERS`): committed attempts per second
//! (begin + complete each) in WAL with synchronous=NORMAL and FULL, and whole
//! requests per second as the gateway writes them (admission with its first attempt
//! and a daily budget reservation, then completion and settlement).
//! With `PURSER_BENCH_POSTGRES` (or `PURSER_TEST_POSTGRES`) set to a PostgreSQL URL, the
//! same scenarios run with the ledger on PostgreSQL too (one replica, a fresh schema
//! per run), after the SQLite figures of the same run.
//! `PURSER_BENCH_NO_ROLLUPS=1` drops the spend page's rollup triggers after opening
//! each ledger: what keeping the rollups costs the writer, by difference.
//! Run: cargo bench --bench ledger

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::sync::Arc;
use std::time::Instant;

use purser::failure::Billing;
use purser::ledger::{
    AttemptResult, BudgetLimit, Ledger, NewAttempt, NewRequest, Options, Outcome, RequestResult,
    Sync, Target,
};
use purser::money::Money;
use purser::policy::plan::{Mode, Period};

/// Concurrent writers; `PURSER_BENCH_WRITERS` changes it.
fn writers() -> usize {
    std::env::var("PURSER_BENCH_WRITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
}

fn request(id: &str, now: time::OffsetDateTime, cost: Money) -> NewRequest {
    NewRequest {
        id: id.into(),
        received_at: now,
        client: "bench".into(),
        policy: "bench".into(),
        plan_id: "bench".into(),
        model: "m".into(),
        mode: Mode::Hard,
        ceiling: "1".parse().unwrap(),
        worst_case: cost,
        ingress: Default::default(),
        shape: None,
    }
}

fn attempt(id: &str, seq: u32, now: time::OffsetDateTime, cost: Money) -> NewAttempt {
    NewAttempt {
        request_id: id.into(),
        seq,
        provider: "p".into(),
        upstream_model: "m".into(),
        jurisdiction: "us".into(),
        started_at: now,
        worst_case: cost,
    }
}

fn success(id: &str, seq: u32, now: time::OffsetDateTime, cost: Money) -> AttemptResult {
    AttemptResult {
        request_id: id.into(),
        seq,
        finished_at: now,
        status: Some(200),
        class: None,
        billing: Billing::Billed,
        decision: purser::ledger::Decision::Served,
        reason: "a complete answer".into(),
        input_tokens: Some(100),
        output_tokens: Some(50),
        cost,
        cost_basis: Some(purser::pricing::CostBasis::Usage),
        cache: Default::default(),
        stored: None,
        message: None,
    }
}

/// Where a run's ledger lives: a new SQLite file, or a new schema on PostgreSQL.
enum Engine {
    Sqlite(Sync),
    Postgres(String),
}

/// What a run leaves behind, removed when it is dropped.
enum Scratch {
    Dir(#[allow(dead_code)] tempfile::TempDir),
    Schema { base: String, name: String },
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Scratch::Schema { base, name } = self {
            // A blocking client in a thread of its own: this runs inside the runtime.
            let (base, name) = (base.clone(), name.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                    tokio::spawn(conn);
                    client
                        .batch_execute(&format!("DROP SCHEMA {name} CASCADE"))
                        .await
                        .unwrap();
                });
            })
            .join()
            .unwrap();
        }
    }
}

fn no_rollups() -> bool {
    std::env::var("PURSER_BENCH_NO_ROLLUPS").is_ok_and(|v| v == "1")
}

/// `DROP TRIGGER` for each rollup trigger; `on` names the table where PostgreSQL wants it.
/// On SQLite these are 0012's row triggers; the writer's own batched TEMP triggers stay
/// (they live on its connection), so there the difference measured is what the row
/// triggers' mere presence costs the writer (their WHEN is still evaluated per row).
fn drop_rollups(on: &str) -> String {
    [
        "attempts_hourly_insert",
        "attempts_hourly_update",
        "attempts_hourly_delete",
        "requests_hourly_insert",
        "requests_hourly_update",
        "requests_hourly_delete",
    ]
    .iter()
    .map(|t| format!("DROP TRIGGER {t}{on};"))
    .collect::<Vec<_>>()
    .join(" ")
}

async fn open(engine: &Engine) -> (Ledger, Scratch) {
    match engine {
        Engine::Sqlite(sync) => {
            let dir = tempfile::tempdir().unwrap();
            let opts = Options {
                sync: *sync,
                ..Options::default()
            };
            let (l, _) = Ledger::open(&dir.path().join("bench.db"), opts).unwrap();
            if no_rollups() {
                purser::ledger::connect(&dir.path().join("bench.db"), &Options::default())
                    .unwrap()
                    .execute_batch(&drop_rollups(""))
                    .unwrap();
            }
            (l, Scratch::Dir(dir))
        }
        Engine::Postgres(base) => {
            let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let schema = format!(
                "purser_bench_{}",
                ulid::Ulid::generate().to_string().to_lowercase()
            );
            client
                .batch_execute(&format!("CREATE SCHEMA {schema}"))
                .await
                .unwrap();
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
            let opts = Options {
                replica: Some("bench".into()),
                ..Options::default()
            };
            let (l, _) = Ledger::open_at(&Target::Postgres(url), opts).await.unwrap();
            if no_rollups() {
                client
                    .batch_execute(&format!(
                        "SET search_path = {schema}; {}",
                        drop_rollups(" ON attempts")
                            .replace(
                                "requests_hourly_insert ON attempts",
                                "requests_hourly_insert ON requests"
                            )
                            .replace(
                                "requests_hourly_update ON attempts",
                                "requests_hourly_update ON requests"
                            )
                            .replace(
                                "requests_hourly_delete ON attempts",
                                "requests_hourly_delete ON requests"
                            )
                    ))
                    .await
                    .unwrap();
            }
            (
                l,
                Scratch::Schema {
                    base: base.clone(),
                    name: schema,
                },
            )
        }
    }
}

async fn run(engine: &Engine, per_writer: u32) -> f64 {
    let (l, _dir) = open(engine).await;
    let l = Arc::new(l);
    let cost: Money = "0.000123".parse().unwrap();
    for w in 0..writers() {
        let r = request(&format!("req-{w}"), time::OffsetDateTime::now_utc(), cost);
        l.admit(r, vec![]).await.unwrap();
    }
    let start = Instant::now();
    let mut tasks = vec![];
    for w in 0..writers() {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("req-{w}");
            for seq in 1..=per_writer {
                let now = time::OffsetDateTime::now_utc();
                l.begin_attempt(attempt(&id, seq, now, cost)).await.unwrap();
                l.finish_attempt(success(&id, seq, now, cost))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = writers() as f64 * f64::from(per_writer);
    n / start.elapsed().as_secs_f64()
}

/// Requests per second through the gateway's two commits per request.
async fn requests(engine: &Engine, per_writer: u32) -> f64 {
    let (l, _dir) = open(engine).await;
    let l = Arc::new(l);
    let cost: Money = "0.000123".parse().unwrap();
    let start = Instant::now();
    let mut tasks = vec![];
    for _ in 0..writers() {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_writer {
                let id = ulid::Ulid::generate().to_string();
                let now = time::OffsetDateTime::now_utc();
                let day = BudgetLimit {
                    period: Period::Day,
                    limit: "1000000".parse().unwrap(),
                };
                l.admit_with_attempt(
                    request(&id, now, cost),
                    vec![day],
                    attempt(&id, 1, now, cost),
                )
                .await
                .unwrap();
                let done = RequestResult {
                    request_id: id.clone(),
                    outcome: Outcome::Served,
                    error_code: None,
                    served_by: Some("p".into()),
                    cost,
                    charged: cost,
                };
                l.finish(success(&id, 1, now, cost), done).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    writers() as f64 * f64::from(per_writer) / start.elapsed().as_secs_f64()
}

fn report(what: &str, mut rates: Vec<f64>) {
    rates.sort_by(f64::total_cmp);
    let n = rates.len();
    println!(
        "  {what:<36} median {:>7.0}/s  (min {:.0}, max {:.0}, {n} runs)",
        rates[n / 2],
        rates[0],
        rates[n - 1]
    );
}

// One thread, as `serve` runs on two cores: the figures are the ledger's own cost.
// `cargo bench --bench ledger -- requests` runs only the scenarios whose name holds
// "requests".
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let per_writer: u32 = std::env::var("PURSER_BENCH_ATTEMPTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let wanted = |name: &str| name.contains(filter.as_str());
    println!(
        "ledger write benchmark: {} concurrent writers × {per_writer} attempts (begin + complete each)",
        writers()
    );
    // This machine's disk and scheduler are noisy: report the median of several runs
    // with the range beside it.
    const RUNS: usize = 5;
    let pg = std::env::var("PURSER_BENCH_POSTGRES")
        .or_else(|_| std::env::var("PURSER_TEST_POSTGRES"))
        .ok();
    let mut engines = vec![
        ("SQLite NORMAL", Engine::Sqlite(Sync::Normal)),
        ("SQLite FULL", Engine::Sqlite(Sync::Full)),
    ];
    match pg {
        Some(url) => engines.push(("PostgreSQL", Engine::Postgres(url))),
        None => println!("  (PostgreSQL skipped: set PURSER_BENCH_POSTGRES to a URL to compare)"),
    }
    for (label, engine) in &engines {
        let name = format!("attempts, {label}");
        if !wanted(&name) {
            continue;
        }
        let mut rates = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            rates.push(run(engine, per_writer).await);
        }
        report(&name, rates);
    }
    for (label, engine) in &engines {
        // FULL only changes the fsync per commit, measured above.
        if matches!(engine, Engine::Sqlite(Sync::Full)) {
            continue;
        }
        let name = format!("requests with a budget, {label}");
        if !wanted(&name) {
            continue;
        }
        let mut rates = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            rates.push(requests(engine, per_writer).await);
        }
        report(&name, rates);
    }
}
