//! Streams read to their end: the official `openai` client reads 50 streams through
//! purser for each vendor API while the vendor batches its events (several SSE events
//! in one write, as real links coalesce them), and every text and usage figure the
//! client saw is compared with what the vendor sent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::{provider, sdk, sha};
use serde_json::Value;

const KEY: &str = "key-sdk-streams";
const MODEL: &str = "m";
const STREAMS: usize = 50;

/// What the vendor's stream says, read from the fixture it sends: the text, the finish
/// reason (OpenAI's name) and the usage figures (prompt, completion, total).
fn vendor_sent(api: &str) -> (String, String, [u64; 3]) {
    let path = format!(
        "{}/tests/fixtures/vendors/{api}.sse",
        env!("CARGO_MANIFEST_DIR")
    );
    let raw = std::fs::read_to_string(path)
        .unwrap()
        .replace("{provider}", "vendor")
        .replace("{model}", MODEL);
    let events: Vec<Value> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let (mut text, mut finish, mut prompt, mut completion) = (String::new(), String::new(), 0, 0);
    for e in &events {
        let s = |p: &str| e.pointer(p).and_then(Value::as_str);
        let n = |p: &str| e.pointer(p).and_then(Value::as_u64);
        match api {
            "openai" => {
                text.push_str(s("/choices/0/delta/content").unwrap_or(""));
                if let Some(f) = s("/choices/0/finish_reason") {
                    finish = f.into();
                }
                prompt = n("/usage/prompt_tokens").unwrap_or(prompt);
                completion = n("/usage/completion_tokens").unwrap_or(completion);
            }
            "anthropic" => {
                text.push_str(s("/delta/text").unwrap_or(""));
                if let Some(f) = s("/delta/stop_reason") {
                    finish = if f == "end_turn" { "stop" } else { f }.into();
                }
                prompt = n("/message/usage/input_tokens").unwrap_or(prompt);
                completion = n("/usage/output_tokens").unwrap_or(completion);
            }
            _ => {
                text.push_str(s("/candidates/0/content/parts/0/text").unwrap_or(""));
                if let Some(f) = s("/candidates/0/finishReason") {
                    finish = if f == "STOP" { "stop" } else { f }.into();
                }
                prompt = n("/usageMetadata/promptTokenCount").unwrap_or(prompt);
                completion = n("/usageMetadata/candidatesTokenCount").unwrap_or(completion);
            }
        }
    }
    (text, finish, [prompt, completion, prompt + completion])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_streams_read_to_the_end_match_what_the_vendor_sent_for_every_api() {
    if !sdk::prerequisite(
        sdk::python_has(&[]).map_err(|e| println!("{e}")).is_ok(),
        "the openai client is not importable",
    ) {
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/sdk_streams.py");
    let (mut failures, mut counts) = (Vec::new(), Vec::new());
    for api in ["openai", "anthropic", "gemini"] {
        let g = common::start(|vendors| {
            vec![
                provider(vendors, "vendor", api, "us", &[(MODEL, "0.15", "0.60")]),
                format!(
                    "kind: policy\nid: pol\nclients:\n  - {{ id: py, key_sha256: \"{}\" }}\nmodels: [{MODEL}]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 256\n",
                    sha(KEY)
                ),
            ]
        })
        .await;
        // The whole stream in one write, then two and three events a write, in turn.
        g.vendors.batch_events("vendor", vec![usize::MAX, 2, 3]);
        let (base, script) = (g.url("/v1"), script.clone());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(sdk::python())
                .arg(script)
                .env("PURSER_BASE_URL", base)
                .env("PURSER_KEY", KEY)
                .env("PURSER_MODEL", MODEL)
                .env("PURSER_STREAMS", STREAMS.to_string())
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{api}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (text, finish, usage) = vendor_sent(api);
        let mut whole = 0;
        for line in stdout.lines() {
            let seen: Value = serde_json::from_str(line).unwrap();
            let got_usage: Option<Vec<u64>> = serde_json::from_value(seen["usage"].clone()).ok();
            if seen["text"] == text.as_str()
                && seen["finish"] == finish.as_str()
                && got_usage.as_deref() == Some(&usage[..])
                && seen["error"].is_null()
            {
                whole += 1;
            } else {
                failures.push(format!(
                    "{api} stream {}: saw {seen}, the vendor sent text {text:?}, finish {finish:?}, usage {usage:?}",
                    seen["stream"]
                ));
            }
        }
        println!("{api}: {whole}/{STREAMS} streams read to the end match what the vendor sent");
        let calls = g.vendors.calls("vendor");
        if calls != STREAMS {
            // A stream that fails counts against the breaker, which then stops calls.
            failures.push(format!(
                "{api}: the vendor was called {calls} times for {STREAMS} streams"
            ));
        }
        counts.push(format!("{api}: {whole}/{STREAMS}"));
    }
    assert!(
        failures.is_empty(),
        "{}\nfirst differences:\n{}",
        counts.join(", "),
        failures[..failures.len().min(6)].join("\n")
    );
}
