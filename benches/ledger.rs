//! Ledger write throughput: committed attempts per second (begin + complete each)
//! with 64 concurrent writers, in WAL with synchronous=NORMAL and FULL.
//! Run: cargo bench --bench ledger

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::sync::Arc;
use std::time::Instant;

use purser::failure::Billing;
use purser::ledger::{AttemptResult, Ledger, NewAttempt, NewRequest, Options, Sync};
use purser::money::Money;
use purser::policy::plan::Mode;

const WRITERS: usize = 64;

async fn run(sync: Sync, per_writer: u32) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (l, _) = Ledger::open(
        &dir.path().join("bench.db"),
        Options {
            sync,
            max_page_count: None,
        },
    )
    .unwrap();
    let l = Arc::new(l);
    let cost: Money = "0.000123".parse().unwrap();
    for w in 0..WRITERS {
        l.admit(
            NewRequest {
                id: format!("req-{w}"),
                received_at: time::OffsetDateTime::now_utc(),
                client: "bench".into(),
                policy: "bench".into(),
                plan_id: "bench".into(),
                model: "m".into(),
                mode: Mode::Soft,
                ceiling: "1".parse().unwrap(),
                worst_case: cost,
            },
            vec![],
        )
        .await
        .unwrap();
    }
    let start = Instant::now();
    let mut tasks = vec![];
    for w in 0..WRITERS {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("req-{w}");
            for seq in 1..=per_writer {
                let now = time::OffsetDateTime::now_utc();
                l.begin_attempt(NewAttempt {
                    request_id: id.clone(),
                    seq,
                    provider: "p".into(),
                    upstream_model: "m".into(),
                    jurisdiction: "us".into(),
                    started_at: now,
                    worst_case: cost,
                })
                .await
                .unwrap();
                l.finish_attempt(AttemptResult {
                    request_id: id.clone(),
                    seq,
                    finished_at: now,
                    status: Some(200),
                    class: "success".into(),
                    billing: Billing::Billed,
                    decision: "served".into(),
                    reason: "a complete answer".into(),
                    input_tokens: Some(100),
                    output_tokens: Some(50),
                    cost,
                    message: None,
                })
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = WRITERS as f64 * f64::from(per_writer);
    n / start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let per_writer: u32 = std::env::var("PURSER_BENCH_ATTEMPTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    println!(
        "ledger write benchmark: {WRITERS} concurrent writers × {per_writer} attempts (begin + complete each)"
    );
    // This machine's disk and scheduler are noisy: report the median of several runs
    // with the range beside it.
    const RUNS: usize = 5;
    for (name, sync) in [("NORMAL", Sync::Normal), ("FULL", Sync::Full)] {
        let mut rates = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            rates.push(run(sync, per_writer).await);
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "  WAL synchronous={name:<6}  median {:>7.0} committed attempts/s  (min {:.0}, max {:.0}, {RUNS} runs)",
            rates[RUNS / 2],
            rates[0],
            rates[RUNS - 1]
        );
    }
}
