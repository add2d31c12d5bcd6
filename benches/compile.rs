//! Policy compile time: a generated set of 1,000 policies over 100 providers.
//! Run: cargo bench --bench compile

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::fmt::Write;
use std::time::Instant;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("kind: gateway\ncurrency: USD\n");
    for p in 0..100 {
        let j = if p % 2 == 0 { "us" } else { "eu" };
        let _ = write!(
            text,
            "---\nkind: provider\nid: p{p}\napi: openai\nbase_url: https://p{p}.example/v1\njurisdiction: {j}\ncredential: {{ env: KEY_{p} }}\nmodels:\n"
        );
        for m in 0..10 {
            let _ = write!(
                text,
                "  m{m}:\n    context_window: 128000\n    input_per_mtok: \"0.{p:02}{m}\"\n    output_per_mtok: \"1.{m}\"\n"
            );
        }
    }
    std::fs::write(dir.path().join("providers.yaml"), &text).unwrap();
    let mut pol = String::new();
    for i in 0..1000 {
        let hash = format!("{:064x}", i + 1);
        let _ = write!(
            pol,
            "---\nkind: policy\nid: team{i}\nclients:\n  - {{ id: c{i}, key_sha256: \"{hash}\" }}\nmodels: [m0, m1, m2, m3]\njurisdictions: [us, eu]\nceiling: {{ per_request: \"0.50\", mode: hard }}\nmax_output_tokens: 2048\nbudgets:\n  - {{ period: day, limit: \"10\" }}\nalternates:\n  m0: p{}/m1\n",
            (i % 99) + 1
        );
    }
    std::fs::write(dir.path().join("policies.yaml"), &pol).unwrap();
    // One warm-up, then the median of five.
    purser::policy::compile_dir(dir.path()).unwrap();
    let mut times = vec![];
    for _ in 0..5 {
        let t = Instant::now();
        let plan = purser::policy::compile_dir(dir.path()).unwrap();
        times.push(t.elapsed());
        assert_eq!(plan.policies().count(), 1000);
    }
    times.sort();
    println!(
        "policy compile: 1,000 policies × 4 models over 100 providers (1,000 priced models): median {:.1} ms (min {:.1} ms)",
        times[2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3
    );
}
