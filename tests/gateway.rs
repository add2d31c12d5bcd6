//! The gateway over real HTTP on loopback against the mock vendors
//! (tests/common/vendors.rs): one test per DESIGN 5 rule, each checking what the
//! client got, how many calls each provider received, and the ledger rows.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use common::vendors::{Script, Vendors};
use purser::clock::SystemClock;
use purser::gateway::Engine;
use purser::ledger::{self, Ledger, Options};
use serde_json::{Value, json};

const KEY_HARD: &str = "key-hard";
const KEY_SOFT: &str = "key-soft";

fn sha(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

struct Harness {
    vendors: Vendors,
    addr: SocketAddr,
    db: PathBuf,
    keys: PathBuf,
    _dir: tempfile::TempDir,
}

async fn harness_with(opts: Options) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let vendors = Vendors::start().await;
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    for p in ["primary", "alt"] {
        std::fs::write(keys.join(p), format!("old-{p}")).unwrap();
    }
    let cfg = dir.path().join("policies");
    std::fs::create_dir_all(&cfg).unwrap();
    let provider = |id: &str, api: &str, model: &str, price_in: &str, price_out: &str| {
        format!(
            "kind: provider\nid: {id}\napi: {api}\nbase_url: {}\njurisdiction: us\ncredential: {{ file: {} }}\ntimeout_ms: 300\ncircuit: {{ failures: 3, window_s: 60, cooldown_s: 60 }}\nmodels:\n  {model}:\n    context_window: 100000\n    input_per_mtok: \"{price_in}\"\n    output_per_mtok: \"{price_out}\"\n",
            vendors.base_url(id, api),
            keys.join(id).display()
        )
    };
    let policy = |id: &str, key: &str, mode: &str| {
        format!(
            "kind: policy\nid: {id}\nclients:\n  - {{ id: {id}-bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: {mode} }}\nmax_output_tokens: 1000\nalternates:\n  m: alt/m2\n",
            sha(key)
        )
    };
    let text = [
        "kind: gateway\ncurrency: USD\n".to_string(),
        provider("primary", "openai", "m", "0.15", "0.60"),
        provider("alt", "anthropic", "m2", "1", "5"),
        policy("hard", KEY_HARD, "hard"),
        policy("soft", KEY_SOFT, "soft"),
    ]
    .join("---\n");
    std::fs::write(cfg.join("set.yaml"), text).unwrap();
    let plan = purser::policy::compile_dir(&cfg).unwrap();
    let db = dir.path().join("ledger.db");
    let (l, _) = Ledger::open(&db, opts).unwrap();
    let engine = Arc::new(Engine::new(plan, l, SystemClock::shared()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            purser::http::router(
                engine,
                purser::http::Options {
                    body_limit: 1024 * 1024,
                    ..purser::http::Options::default()
                },
            ),
        )
        .await
    });
    Harness {
        vendors,
        addr,
        db,
        keys,
        _dir: dir,
    }
}

async fn harness() -> Harness {
    harness_with(Options::default()).await
}

impl Harness {
    async fn post(
        &self,
        key: Option<&str>,
        body: Value,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut rb = reqwest::Client::new()
            .post(format!("http://{}/v1/chat/completions", self.addr))
            .json(&body);
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        let r = rb.send().await.unwrap();
        let status = r.status().as_u16();
        let h = r.headers().clone();
        let v = r.json().await.unwrap_or(Value::Null);
        (status, h, v)
    }

    async fn chat(&self, key: &str) -> (u16, reqwest::header::HeaderMap, Value) {
        self.post(
            Some(key),
            json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await
    }

    fn row(&self, id: &str) -> ledger::read::RequestRow {
        ledger::read::request(&ledger::read::open_reader(&self.db).unwrap(), id)
            .unwrap()
            .unwrap()
    }

    fn calls(&self) -> (usize, usize) {
        (self.vendors.calls("primary"), self.vendors.calls("alt"))
    }
}

fn id_of(h: &reqwest::header::HeaderMap, v: &Value) -> String {
    h.get("x-purser-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            v.pointer("/error/request_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap()
}

fn s(status: u16, body: &str) -> Script {
    Script::Status(status, body.to_string())
}

#[tokio::test]
async fn success_is_served_with_headers_and_an_exact_cost() {
    let h = harness().await;
    let (status, headers, v) = h.chat(KEY_HARD).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from primary.");
    assert_eq!(headers["x-purser-provider"], "primary");
    assert_eq!(headers["x-purser-attempts"], "1");
    assert_eq!(headers["x-purser-fallback"], "false");
    // 12 × 0.15/M + 8 × 0.60/M
    assert_eq!(headers["x-purser-cost"], "0.0000066");
    let row = h.row(&id_of(&headers, &v));
    assert_eq!(
        (
            row.outcome.as_str(),
            row.served_by.as_deref(),
            row.cost.as_str()
        ),
        ("served", Some("primary"), "0.0000066")
    );
    assert_eq!(row.attempts.len(), 1);
    assert_eq!(
        (
            row.attempts[0].class.as_deref(),
            row.attempts[0].billing.as_str()
        ),
        (Some("success"), "billed")
    );
    assert_eq!(h.calls(), (1, 0));
}

#[tokio::test]
async fn rate_limit_fails_over_once_even_under_hard() {
    let h = harness().await;
    h.vendors.script(
        "primary",
        vec![s(
            429,
            r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#,
        )],
    );
    let (status, headers, v) = h.chat(KEY_HARD).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["x-purser-provider"], "alt");
    assert_eq!(headers["x-purser-fallback"], "true");
    assert_eq!(h.calls(), (1, 1));
    let row = h.row(&id_of(&headers, &v));
    let classes: Vec<_> = row
        .attempts
        .iter()
        .map(|a| (a.class.clone().unwrap(), a.decision.clone().unwrap()))
        .collect();
    assert_eq!(
        classes,
        [
            ("rate_limited".to_string(), "failover".to_string()),
            ("success".to_string(), "served".to_string())
        ]
    );
}

#[tokio::test]
async fn timeout_stops_under_hard_and_fails_over_under_soft() {
    let h = harness().await;
    h.vendors.script("primary", vec![Script::Delay(1_000)]);
    let (status, headers, v) = h.chat(KEY_HARD).await;
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["code"], "timeout");
    assert_eq!(
        h.calls(),
        (1, 0),
        "hard: never a second potentially billable attempt"
    );
    let row = h.row(&id_of(&headers, &v));
    assert_eq!(row.outcome, "failed");
    assert_eq!(row.attempts[0].billing, "maybe_billed");
    assert!(
        row.attempts[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("at most one potentially billable attempt")
    );

    h.vendors.script("primary", vec![Script::Delay(1_000)]);
    let (status, headers, _) = h.chat(KEY_SOFT).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-purser-provider"], "alt");
    assert_eq!(h.calls(), (2, 1));
}

#[tokio::test]
async fn content_refusal_is_returned_and_never_fails_over() {
    let h = harness().await;
    h.vendors.script("primary", vec![s(400, r#"{"error":{"code":"content_policy_violation","message":"Your request was rejected by our safety system."}}"#)]);
    let (status, headers, v) = h.chat(KEY_SOFT).await;
    assert_eq!(status, 400);
    let e = &v["error"];
    assert_eq!(e["code"], "content_refusal");
    assert_eq!(e["provider"], "primary");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("Your request was rejected by our safety system.")
    );
    assert_eq!(e["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(e["attempts"][0]["class"], "content_refusal");
    assert_eq!(h.calls(), (1, 0));
    assert_eq!(h.row(&id_of(&headers, &v)).outcome, "refused");
}

#[tokio::test]
async fn auth_retries_the_same_destination_only_after_a_rotation() {
    let h = harness().await;
    // Unchanged key: refused after one call.
    h.vendors
        .script("primary", vec![Script::RequireKey("new-primary".into())]);
    let (status, _, v) = h.chat(KEY_HARD).await;
    assert_eq!((status, v["error"]["code"].as_str()), (401, Some("auth")));
    assert_eq!(h.calls(), (1, 0));
    // Rotated key file: one retry with the new key, served.
    std::fs::write(h.keys.join("primary"), "new-primary").unwrap();
    h.vendors
        .script("primary", vec![Script::RequireKey("new-primary".into())]);
    let (status, headers, v) = h.chat(KEY_HARD).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["x-purser-attempts"], "2");
    assert_eq!(
        h.vendors.keys_seen("primary"),
        ["old-primary", "old-primary", "new-primary"]
    );
    assert_eq!(h.calls(), (3, 0));
}

#[tokio::test]
async fn over_the_ceiling_is_refused_before_any_call() {
    let h = harness().await;
    let (status, headers, v) = h.post(Some(KEY_HARD), json!({"model": "m", "max_tokens": 90_000, "messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(status, 402);
    assert_eq!(v["error"]["code"], "ceiling_exceeded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("90000 out × 0.60/M")
    );
    assert_eq!(h.calls(), (0, 0));
    let row = h.row(&id_of(&headers, &v));
    assert_eq!(
        (row.outcome.as_str(), row.error_code.as_deref()),
        ("refused", Some("ceiling_exceeded"))
    );
}

#[tokio::test]
async fn circuit_opens_after_provider_faults_and_then_no_call_is_made() {
    let h = harness().await;
    h.vendors
        .script("primary", vec![s(500, "{}"), s(500, "{}"), s(500, "{}")]);
    for _ in 0..3 {
        h.chat(KEY_SOFT).await;
    }
    assert_eq!(h.calls(), (3, 3));
    let (status, headers, v) = h.chat(KEY_SOFT).await;
    assert_eq!(status, 200);
    assert_eq!(
        h.calls(),
        (3, 4),
        "the open circuit's destination got no call"
    );
    let row = h.row(&id_of(&headers, &v));
    assert_eq!(row.attempts[0].class.as_deref(), Some("circuit_open"));
    assert_eq!(row.attempts[0].billing, "not_billed");
}

#[tokio::test]
async fn ledger_unavailable_fails_closed_with_no_upstream_call() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe.db");
    drop(Ledger::open(&probe, Options::default()).unwrap());
    let pages: i64 = rusqlite::Connection::open(&probe)
        .unwrap()
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    let pages = pages as u64 + 2;
    let h = harness_with(Options {
        max_page_count: Some(pages),
        ..Options::default()
    })
    .await;
    // `user` is sent, so it is counted in the input bound (issue #20): large, within
    // the 0.05 ceiling.
    let big = "x".repeat(20_000);
    let (status, _, v) = h
        .post(
            Some(KEY_SOFT),
            json!({"model": "m", "user": big, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    // The first writes fit in the existing pages or not; either way no call is unrecorded.
    if status == 503 {
        assert_eq!(v["error"]["code"], "ledger_unavailable");
        assert_eq!(h.calls(), (0, 0));
    } else {
        assert_eq!(status, 200);
    }
    // Fill the ledger until it refuses: from then on, no upstream call is made.
    let mut refused = false;
    for _ in 0..200 {
        let before = h.calls();
        let (status, _, v) = h.chat(KEY_SOFT).await;
        if status == 503 {
            assert_eq!(v["error"]["code"], "ledger_unavailable");
            let after = h.calls();
            assert!(
                after.0 + after.1 <= before.0 + before.1 + 1,
                "at most the attempt whose begin was recorded"
            );
            refused = true;
            break;
        }
    }
    assert!(refused, "the full ledger never refused");
}

#[tokio::test]
async fn bad_input_is_a_clear_400_or_401() {
    let h = harness().await;
    let (status, _, v) = h.post(None, json!({"model": "m", "messages": []})).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _, v) = h
        .post(
            Some("wrong"),
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _, v) = h
        .post(
            Some(KEY_HARD),
            json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    assert!(v["error"]["message"].as_str().unwrap().contains("model"));
    let (status, _, v) = h
        .post(Some(KEY_HARD), json!({"model": "m", "messages": "hi"}))
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _, v) = h
        .post(
            Some(KEY_HARD),
            json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("model_not_allowed"))
    );
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", h.addr))
        .bearer_auth(KEY_HARD)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let big = "x".repeat(2 * 1024 * 1024);
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", h.addr))
        .bearer_auth(KEY_HARD)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
    assert_eq!(h.calls(), (0, 0));
}

#[tokio::test]
async fn upstream_garbage_is_unclassified_and_recorded() {
    let h = harness().await;
    h.vendors
        .script("primary", vec![s(200, "<html>not json</html>")]);
    let (status, headers, v) = h.chat(KEY_HARD).await;
    assert_eq!(status, 502);
    assert_eq!(v["error"]["code"], "unclassified");
    let row = h.row(&id_of(&headers, &v));
    assert_eq!(row.attempts[0].billing, "maybe_billed");
    assert_eq!(
        h.calls(),
        (1, 0),
        "hard: unclassified may have been billed, so no failover"
    );
}

/// An OpenAI-compatible answer reaches the client as the upstream wrote it: same key
/// order, same spacing, fields purser does not know kept; its usage is still costed.
#[tokio::test]
async fn an_openai_answer_is_passed_on_byte_for_byte() {
    let h = harness().await;
    let upstream = r#"{"object":"chat.completion", "id":"chatcmpl-verbatim","created":1,"model":"gpt-4o-mini",
 "choices":[{"index":0,"message":{"role":"assistant","content":"as sent"},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20},"vendor_extra":{"z":1,"a":2}}"#;
    h.vendors.script("primary", vec![s(200, upstream)]);
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", h.addr))
        .bearer_auth(KEY_HARD)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["x-purser-cost"], "0.0000066");
    assert_eq!(r.text().await.unwrap(), upstream);
}

/// A 2xx event stream to a request that did not ask for one has no answer purser can
/// hand on: it is `unclassified` and may have been billed, so a soft request fails
/// over and the client gets the alternate's answer, never an empty 200.
#[tokio::test]
async fn an_event_stream_to_a_plain_request_is_unclassified() {
    let h = harness().await;
    h.vendors.script(
        "primary",
        vec![s(
            200,
            "data: {\"id\":\"x\",\"choices\":[]}\n\ndata: [DONE]\n\n",
        )],
    );
    let (status, headers, v) = h.chat(KEY_SOFT).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["x-purser-provider"], "alt");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from alt.");
    let row = h.row(&id_of(&headers, &v));
    assert_eq!(
        (
            row.attempts[0].class.as_deref(),
            row.attempts[0].billing.as_str()
        ),
        (Some("unclassified"), "maybe_billed")
    );
    assert_eq!(h.calls(), (1, 1));
}

/// While a call runs the request's parsed body is dropped (`ChatRequest::park`) and only
/// its bytes kept; a second attempt parses them again. Every attempt after the first
/// must still send the whole request: the same destination again after a rotated key,
/// and the alternate (another API, so translated anew) after a rate limit.
#[tokio::test]
async fn every_later_attempt_sends_the_whole_request_the_client_sent() {
    let h = harness().await;
    let body = json!({"model": "m", "temperature": 0.25, "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "x".repeat(5000)}]});
    // A rotated key: the retry to the same destination (the old key is in use until a
    // call is refused with it and the file says otherwise).
    h.vendors
        .script("primary", vec![Script::RequireKey("new-primary".into())]);
    assert_eq!(h.chat(KEY_HARD).await.0, 401);
    std::fs::write(h.keys.join("primary"), "new-primary").unwrap();
    h.vendors.reset();
    h.vendors
        .script("primary", vec![Script::RequireKey("new-primary".into())]);
    let (status, headers, v) = h.post(Some(KEY_HARD), body.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["x-purser-attempts"], "2");
    let sent = h.vendors.sent("primary");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].body, sent[1].body, "the retry sent another body");
    assert_eq!(sent[1].body["messages"], body["messages"]);
    assert_eq!(sent[1].body["temperature"], 0.25);
    // A rate limit: the alternate, on Anthropic's API.
    h.vendors.reset();
    h.vendors.script(
        "primary",
        vec![s(
            429,
            r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#,
        )],
    );
    let (status, headers, v) = h.post(Some(KEY_SOFT), body.clone()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(headers["x-purser-provider"], "alt");
    let alt = h.vendors.sent("alt");
    assert_eq!(alt.len(), 1);
    let a = &alt[0].body;
    assert_eq!(a["model"], "m2");
    assert_eq!(a["system"], "be brief", "{a}");
    assert_eq!(a["temperature"], 0.25);
    let turns = a["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{a}");
    assert_eq!(turns[2]["role"], "user");
    assert!(a.to_string().contains(&"x".repeat(5000)));
    assert!(a.to_string().contains("first answer"));
}
