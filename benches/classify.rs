//! Classifier cost per response over the error corpus (tests/fixtures/error-corpus.jsonl):
//! each response is classified many times and the per-response median is reported.
//! Run: cargo bench --bench classify

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::hint::black_box;
use std::time::Instant;

use purser::failure::classify;
use purser::policy::plan::Api;
use serde_json::Value;

#[path = "../tests/common/answers.rs"]
mod answers;

const CORPUS: &str = include_str!("../tests/fixtures/error-corpus.jsonl");

/// One corpus response: adapter, status, headers, body.
type Case = (Api, u16, Vec<(String, String)>, String);

fn main() {
    let cases: Vec<Case> = answers::json_lines(CORPUS)
        .iter()
        .map(|v| {
            (
                answers::api_of(v),
                v["status"].as_u64().unwrap() as u16,
                answers::headers_of(v),
                v["body"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    const ROUNDS: u32 = 200;
    let mut per_case: Vec<f64> = Vec::with_capacity(cases.len());
    for (api, status, headers, body) in &cases {
        // Warm-up, then the mean of ROUNDS for this response.
        black_box(classify(*api, *status, headers, body));
        let t = Instant::now();
        for _ in 0..ROUNDS {
            black_box(classify(*api, *status, black_box(headers), black_box(body)));
        }
        per_case.push(t.elapsed().as_nanos() as f64 / f64::from(ROUNDS));
    }
    per_case.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| per_case[((per_case.len() - 1) as f64 * q).round() as usize] / 1000.0;
    println!(
        "classify: {} responses; per response median {:.2} µs, p90 {:.2} µs, p99 {:.2} µs, max {:.2} µs",
        per_case.len(),
        pick(0.5),
        pick(0.9),
        pick(0.99),
        pick(1.0)
    );
    hostile();
}

/// What hostile error bodies cost: before the reader's bound (`READ_BOUND`) each of
/// these took 10–27 s in release. The body is parsed once outside the timing, as the
/// gateway parses an answer once; what is timed is the classification.
fn hostile() {
    let bodies = answers::hostile_bodies();
    for (what, body) in bodies {
        let text = body.to_string();
        let parse = Instant::now();
        black_box(serde_json::from_str::<Value>(&text).unwrap());
        let parse = parse.elapsed();
        const ROUNDS: u32 = 5;
        let t = Instant::now();
        for _ in 0..ROUNDS {
            black_box(classify(Api::Openai, 500, &[], black_box(&text)));
        }
        let each = t.elapsed() / ROUNDS;
        println!(
            "hostile body, {what} ({} kB): {:.2} ms each, of which parsing the JSON {:.2} ms",
            text.len() / 1024,
            each.as_secs_f64() * 1000.0,
            parse.as_secs_f64() * 1000.0
        );
    }
}
