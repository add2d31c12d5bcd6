//! What serializing a body to send costs: `serde_json::to_vec` against purser's writer
//! (`purser::upstream::json`), on the recorded coding-agent turns (Claude Code and
//! Codex CLI, 50-56 kB each, tests/fixtures/agents) and a 64 kB prompt of plain text.
//! Prints the median of several rounds for each, and the ratio.
//! Run: cargo bench --bench serialize

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::hint::black_box;
use std::time::Instant;

use serde_json::{Value, json};

fn body_of(recorded: &str) -> Value {
    let v: Value = serde_json::from_str(recorded).unwrap();
    v["body"].clone()
}

/// Median µs of one call of `f` over `rounds` rounds of `per` calls.
fn median_us(rounds: usize, per: u32, mut f: impl FnMut() -> usize) -> f64 {
    let mut t: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per {
                black_box(f());
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(per)
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let bodies = [
        (
            "Claude Code turn",
            body_of(include_str!(
                "../tests/fixtures/agents/claude-code-2.1.332-say-hi.json"
            )),
        ),
        (
            "Codex CLI turn",
            body_of(include_str!(
                "../tests/fixtures/agents/codex-0.169.0-say-hi.json"
            )),
        ),
        (
            "64 kB plain prompt",
            json!({"model": "gpt-4o-mini", "max_tokens": 1024,
                   "messages": [{"role": "user", "content": "lorem ipsum dolor sit amet ".repeat(2427)}]}),
        ),
    ];
    for (name, body) in &bodies {
        let ours = purser::upstream::json::to_vec(body);
        assert_eq!(
            ours,
            serde_json::to_vec(body).unwrap(),
            "{name}: bytes differ"
        );
        let serde = median_us(15, 200, || {
            serde_json::to_vec(black_box(body)).unwrap().len()
        });
        let purser = median_us(15, 200, || {
            purser::upstream::json::to_vec(black_box(body)).len()
        });
        println!(
            "serialize {name} ({} bytes): serde_json {serde:.1} µs, purser {purser:.1} µs ({:.2}×)",
            ours.len(),
            purser / serde
        );
    }
}
