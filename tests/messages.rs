//! The Anthropic Messages ingress (`POST /v1/messages`), with the request Claude Code
//! 2.1.332 really sends (`tests/fixtures/agents/`, 49 kB, recorded 2026-12-01) at full
//! size, through purser to a mock Anthropic vendor over loopback, on SQLite and
//! PostgreSQL: native pass-through, the stream forwarded byte for byte, the ledger's
//! tokens and cost, the ceiling's clamp and refusal, a spent budget in Anthropic's
//! envelope with a status Claude Code does not retry.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::db::Engine;
use common::money::{assert_money_invariants_on, quiesce_on};
use common::vendors::Script;
use common::{Gateway, provider, sha};
use serde_json::{Value, json};

const KEY: &str = "sk-claude-code-client";
const MODEL: &str = "claude-opus-5-5";
const UPSTREAM: &str = "claude-opus-5-5-20261201";
const PROVIDER: &str = "anth";

/// The recorded Claude Code request: its body, and the headers a client sends.
fn recorded() -> (Value, Vec<(String, String)>) {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/agents/claude-code-2.1.332-say-hi.json"
    ))
    .unwrap();
    let v: Value = serde_json::from_str(&raw).unwrap();
    let headers = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().to_string(),
                h[1].as_str().unwrap().to_string(),
            )
        })
        // Transport headers are the HTTP client's to write; the key is this test's.
        .filter(|(k, _)| {
            !matches!(
                k.to_ascii_lowercase().as_str(),
                "host" | "content-length" | "connection" | "accept-encoding" | "authorization"
            )
        })
        .collect();
    (v["body"].clone(), headers)
}

/// An Anthropic provider serving `MODEL` under its own id, at Opus-like rates with
/// cache rates, and a policy with a hard ceiling.
fn docs(
    v: &common::vendors::Vendors,
    ceiling: &str,
    on_exceed: &str,
    budget: Option<&str>,
) -> Vec<String> {
    let p = provider(v, PROVIDER, "anthropic", "eu", &[]);
    let p = format!(
        "{p}  {MODEL}:\n    upstream: {UPSTREAM}\n    context_window: 1000000\n    input_per_mtok: \"5\"\n    output_per_mtok: \"25\"\n    cached_input_per_mtok: \"0.5\"\n    cache_write_per_mtok: \"6.25\"\n    cache_write_1h_per_mtok: \"10\"\n"
    );
    let budgets = budget
        .map(|b| format!("budgets:\n  - {{ period: day, limit: \"{b}\" }}\n"))
        .unwrap_or_default();
    vec![
        p,
        format!(
            "kind: policy\nid: agents\nclients:\n  - id: claude-code\n    key_sha256: \"{}\"\nmodels: [{MODEL}]\njurisdictions: [eu]\nceiling:\n  per_request: \"{ceiling}\"\n  mode: hard\n  on_exceed: {on_exceed}\nmax_output_tokens: 4096\n{budgets}",
            sha(KEY)
        ),
    ]
}

async fn gateway(
    engine: Engine,
    test: &str,
    ceiling: &str,
    on_exceed: &str,
    budget: Option<&str>,
) -> Option<Gateway> {
    let (c, o, b) = (
        ceiling.to_string(),
        on_exceed.to_string(),
        budget.map(str::to_string),
    );
    common::start_on(engine, test, move |v| docs(v, &c, &o, b.as_deref())).await
}

/// POST the body to `/v1/messages?beta=true` as Claude Code does (bearer key, its
/// headers); status, headers and the raw body bytes.
async fn send(
    g: &Gateway,
    body: &Value,
    headers: &[(String, String)],
    path: &str,
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut rb = reqwest::Client::new()
        .post(g.url(path))
        .bearer_auth(KEY)
        .body(body.to_string());
    for (k, v) in headers {
        rb = rb.header(k, v);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let h = r.headers().clone();
    (status, h, r.bytes().await.unwrap().to_vec())
}

/// The mock vendor's stream for the cache fixture, exactly as it writes it.
fn vendor_stream() -> Vec<u8> {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vendors/anthropic-cache.sse"
    ))
    .unwrap()
    .replace("{provider}", PROVIDER)
    .replace("{model}", UPSTREAM);
    raw.split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| format!("{e}\n\n"))
        .collect::<String>()
        .into_bytes()
}

async fn served_natively_on(engine: Engine) {
    let Some(g) = gateway(engine, "messages_native", "10.00", "reject", None).await else {
        return;
    };
    let (body, headers) = recorded();
    assert!(
        body.to_string().len() > 45_000,
        "the fixture is at full size"
    );
    g.vendors
        .script(PROVIDER, vec![Script::Fixture("anthropic-cache")]);
    let (status, h, bytes) = send(&g, &body, &headers, "/v1/messages?beta=true").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(h["content-type"], "text/event-stream");
    // Event for event, byte for byte: the vendor's stream is the client's.
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        String::from_utf8(vendor_stream()).unwrap()
    );

    // The vendor got the client's body whole: only the model id and the proved cap
    // (here the client's own 128000, which fits) are purser's.
    let sent = g.vendors.sent(PROVIDER);
    assert_eq!(sent.len(), 1);
    let mut expected = body.clone();
    expected["model"] = json!(UPSTREAM);
    expected["max_tokens"] = json!(128_000);
    assert_eq!(sent[0].body, expected);
    let seen = &g.vendors.headers_seen(PROVIDER)[0];
    let get = |name: &str| {
        seen.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let (_, betas) = headers.iter().find(|(k, _)| k == "anthropic-beta").unwrap();
    assert_eq!(get("anthropic-beta"), Some(betas.as_str()));
    assert_eq!(get("anthropic-version"), Some("2023-06-01"));
    assert!(
        !seen.iter().any(|(_, v)| v.contains(KEY)),
        "the client's key must not reach the vendor: {seen:?}"
    );

    quiesce_on(&g.ledger_db, 5).await;
    let id = h["x-purser-request-id"].to_str().unwrap();
    let row = g.ledger_db.request(id).await;
    assert_eq!(row.ingress, "messages");
    assert_eq!(row.outcome, "served");
    let a = &row.attempts[0];
    // 12 uncached + 3000 cache reads + 1000 cache writes; 8 output.
    assert_eq!((a.input_tokens, a.output_tokens), (Some(4012), Some(8)));
    // 12×5 + 3000×0.5 + 1000×6.25 + 8×25, per million: every class at its own rate.
    assert_eq!(a.cost, "0.00801");
    assert_eq!(a.cost_basis.as_deref(), Some("usage"));
    assert_cache_tokens(a);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

/// The cache tokens of `anthropic-cache`, as the ledger records them: 3000 read, 1000
/// written, all to the 5-minute cache (its `message_start` splits them, the
/// `message_delta` repeats the totals without the split).
fn assert_cache_tokens(a: &purser::ledger::read::AttemptRow) {
    assert_eq!(
        (
            a.cache_read_tokens,
            a.cache_write_tokens,
            a.cache_write_5m_tokens,
            a.cache_write_1h_tokens
        ),
        (Some(3000), Some(1000), Some(1000), Some(0)),
        "{a:?}"
    );
    assert_eq!(
        a.response_id, None,
        "only a stored Responses answer has one"
    );
}

#[tokio::test]
async fn claude_code_request_is_served_natively_sqlite() {
    served_natively_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn claude_code_request_is_served_natively_postgres() {
    served_natively_on(Engine::Postgres).await;
}

async fn clamped_on(engine: Engine) {
    let Some(g) = gateway(engine, "messages_clamp", "1.00", "clamp", None).await else {
        return;
    };
    let (body, headers) = recorded();
    g.vendors
        .script(PROVIDER, vec![Script::Fixture("anthropic-cache")]);
    let (status, h, bytes) = send(&g, &body, &headers, "/v1/messages?beta=true").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let clamped: u64 = h["x-purser-clamped-max-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let sent = g.vendors.sent(PROVIDER);
    assert_eq!(sent[0].body["max_tokens"], json!(clamped));
    assert!(clamped < 128_000 && clamped > 1_000, "{clamped}");
    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    let worst: f64 = row.worst_case.parse().unwrap();
    assert!(
        worst <= 1.0,
        "the proved worst case {worst} fits the ceiling"
    );
    // The bound is over what is sent: at least one token per 4 bytes of the body.
    let input_floor = body.to_string().len() as f64 / 4.0 * 5e-6;
    assert!(worst >= clamped as f64 * 25e-6 + input_floor, "{worst}");
    // `purser explain` shows the same clamp, with its arithmetic, for the same file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .arg("explain")
        .arg(&g.config)
        .args(["--policy", "agents", "--model", MODEL, "--body"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/agents/claude-code-2.1.332-say-hi.json"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "clamp lowered max_tokens from 128000 to {clamped}"
        )),
        "{text}"
    );
    // Claude Opus 5.5 may run where its workspace keeps it, at Anthropic's 1.1×
    // regional premium on every rate, which the proof carries.
    assert!(
        text.contains(&format!("{clamped} out × 27.50/M")) && text.contains("in × 11.00/M"),
        "the arithmetic, input at the dearest (1-hour cache write) rate, with the regional premium: {text}"
    );
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn a_128k_cap_is_clamped_under_a_hard_ceiling_sqlite() {
    clamped_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn a_128k_cap_is_clamped_under_a_hard_ceiling_postgres() {
    clamped_on(Engine::Postgres).await;
}

async fn rejected_on(engine: Engine) {
    let Some(g) = gateway(engine, "messages_reject", "1.00", "reject", None).await else {
        return;
    };
    let (body, headers) = recorded();
    let (status, _, bytes) = send(&g, &body, &headers, "/v1/messages?beta=true").await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    // Not 400 (Claude Code retries it with fewer betas), 401, 429 or 5xx.
    assert_eq!(status, 402, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "billing_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("purser (ceiling_exceeded)"), "{msg}");
    assert!(
        msg.contains("128000"),
        "the arithmetic names the cap: {msg}"
    );
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    let row = g.ledger_db.last_request().await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("refused", "messages")
    );
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn a_128k_cap_is_refused_with_the_arithmetic_sqlite() {
    rejected_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn a_128k_cap_is_refused_with_the_arithmetic_postgres() {
    rejected_on(Engine::Postgres).await;
}

async fn spent_on(engine: Engine) {
    let Some(g) = gateway(engine, "messages_spent", "10.00", "reject", Some("0.01")).await else {
        return;
    };
    let (body, headers) = recorded();
    let (status, _, bytes) = send(&g, &body, &headers, "/v1/messages").await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 402, "{v}");
    assert_eq!(v["error"]["type"], "billing_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("purser (budget_exhausted)"), "{msg}");
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn a_spent_budget_is_a_billing_error_claude_code_does_not_retry_sqlite() {
    spent_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn a_spent_budget_is_a_billing_error_claude_code_does_not_retry_postgres() {
    spent_on(Engine::Postgres).await;
}

#[tokio::test]
async fn x_api_key_authenticates_and_a_plain_answer_is_the_vendors_own() {
    let g = gateway(Engine::Sqlite, "messages_plain", "10.00", "reject", None)
        .await
        .unwrap();
    let body =
        json!({"model": MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    let r = reqwest::Client::new()
        .post(g.url("/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["model"], UPSTREAM);
    assert_eq!(v["content"][0]["text"], format!("Hello from {PROVIDER}."));
    // A wrong key: Anthropic's envelope, authentication_error.
    let r = reqwest::Client::new()
        .post(g.url("/v1/messages"))
        .header("x-api-key", "sk-wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn count_tokens_answers_the_bound_and_charges_nothing() {
    let g = gateway(Engine::Sqlite, "messages_count", "10.00", "reject", None)
        .await
        .unwrap();
    let (mut body, headers) = recorded();
    let bytes = body.to_string().len() as u64;
    body.as_object_mut().unwrap().remove("max_tokens");
    let (status, _, out) = send(&g, &body, &headers, "/v1/messages/count_tokens?beta=true").await;
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    let n = v["input_tokens"].as_u64().unwrap();
    // At least the bytes sent; above them by the overheads, the escapes a template may
    // render the tool schemas with (quotes, `<`, `>`, `&`, `'`, non-ASCII), and the
    // indentation `tojson(indent=4)` gives them (Claude Code's 12 tools: about 1.3×
    // their compact bytes).
    assert!(
        n >= bytes - 100 && n < bytes + bytes * 4 / 10,
        "{n} vs {bytes} bytes"
    );
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    assert_eq!(g.ledger_db.count("SELECT count(*) FROM requests").await, 0);
}

/// A gateway whose model `m` is served only by an OpenAI chat destination.
async fn openai_gateway() -> Gateway {
    openai_gateway_on(Engine::Sqlite, "messages_translated")
        .await
        .unwrap()
}

/// As `openai_gateway`, with the ledger on `engine` (`None`: PostgreSQL skipped here).
async fn openai_gateway_on(engine: Engine, test: &str) -> Option<Gateway> {
    common::start_on(engine, test, |v| {
        vec![
            // Images are counted at a declared bound: their tokens are not their bytes.
            provider(v, "oai", "openai", "eu", &[("m", "1", "2")])
                + "    media_tokens: { image: 1600 }\n",
            format!(
                "kind: policy\nid: p\nclients:\n  - id: c\n    key_sha256: \"{}\"\nmodels: [m]\njurisdictions: [eu]\nceiling:\n  per_request: \"1.00\"\n  mode: hard\nmax_output_tokens: 100\n",
                sha(KEY)
            ),
        ]
    })
    .await
}

/// A Messages conversation with what translates faithfully: system blocks (with a
/// cache mark, dropped), a tool, an earlier tool call and its result, an image.
fn translatable(stream: bool) -> Value {
    json!({
        "model": "m", "max_tokens": 50, "stream": stream,
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "."}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "text", "text": "and this?"}]},
        ],
    })
}

/// `translatable`'s messages as chat completions: the system first, the call, its
/// result as a tool message right after it, then the rest of the user turn; the mark
/// dropped.
fn translatable_as_chat() -> Value {
    json!([
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "ls", "arguments": "{\"dir\":\".\"}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "and this?"}]},
    ])
}

async fn translated_on(engine: Engine) {
    let Some(g) = openai_gateway_on(engine, "messages_translated_plain").await else {
        return;
    };
    let (status, h, out) = send(&g, &translatable(false), &[], "/v1/messages").await;
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    // The vendor got chat completions: the system first, the call, its result as a
    // tool message right after it, then the rest of the user turn; the mark dropped.
    let sent = &g.vendors.sent("oai")[0].body;
    assert_eq!(sent["messages"], translatable_as_chat(), "{sent}");
    assert_eq!(
        sent["tools"],
        json!([{"type": "function", "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}}}])
    );
    // The answer in the Messages shape, under the client's model name.
    assert_eq!(v["type"], "message");
    assert_eq!(v["model"], "m");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "Hello from oai."}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["input_tokens"], 12);
    assert_eq!(v["usage"]["output_tokens"], 8);
    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("served", "messages")
    );
    // 12 × 1 + 8 × 2 per million.
    assert_eq!(row.attempts[0].cost, "0.000028");
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["oai"]).await;
}

#[tokio::test]
async fn messages_to_an_openai_destination_are_translated_and_answered_as_messages_sqlite() {
    translated_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn messages_to_an_openai_destination_are_translated_and_answered_as_messages_postgres() {
    translated_on(Engine::Postgres).await;
}

async fn translated_stream_on(engine: Engine) {
    let Some(g) = openai_gateway_on(engine, "messages_translated_stream").await else {
        return;
    };
    let (status, _, out) = send(&g, &translatable(true), &[], "/v1/messages").await;
    let text = String::from_utf8(out).unwrap();
    assert_eq!(status, 200, "{text}");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    let said: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/delta/text")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    assert_eq!(said, "Hello from oai.");
    assert!(
        !text.contains("[DONE]") && !text.contains("chat.completion"),
        "{text}"
    );
    let end: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "message_delta")
        .unwrap();
    assert_eq!(end["delta"]["stop_reason"], "end_turn");
    assert_eq!(end["usage"]["output_tokens"], 8, "{end}");
    quiesce_on(&g.ledger_db, 5).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["oai"]).await;
}

#[tokio::test]
async fn a_translated_stream_comes_back_as_anthropic_events_sqlite() {
    translated_stream_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn a_translated_stream_comes_back_as_anthropic_events_postgres() {
    translated_stream_on(Engine::Postgres).await;
}

/// The data of each event in an SSE body, parsed.
fn event_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .collect()
}

#[tokio::test]
async fn a_translated_tool_call_comes_back_as_tool_use_plain_and_streamed() {
    let g = openai_gateway().await;
    let plain = r#"{"id":"chatcmpl-t","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"ls","arguments":"{\"dir\":\".\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":30,"completion_tokens":9,"total_tokens":39}}"#;
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
        .into_bytes()
    };
    let streamed = vec![
        chunk(json!({"role": "assistant", "content": "Listing."}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"dir\":\".\"}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        format!(
            "data: {}\n\ndata: [DONE]\n\n",
            json!({"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                   "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}})
        )
        .into_bytes(),
    ];
    g.vendors.script(
        "oai",
        vec![
            Script::Status(200, plain.into()),
            Script::StreamPieces(streamed),
        ],
    );
    let (status, _, out) = send(&g, &translatable(false), &[], "/v1/messages").await;
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"],
        json!([{"type": "tool_use", "id": "call_1", "name": "ls", "input": {"dir": "."}}])
    );
    assert_eq!(
        (&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]),
        (&json!(30), &json!(9))
    );

    let (status, _, out) = send(&g, &translatable(true), &[], "/v1/messages").await;
    let text = String::from_utf8(out).unwrap();
    assert_eq!(status, 200, "{text}");
    let ev = event_data(&text);
    let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    assert_eq!(
        ev[4]["content_block"],
        json!({"type": "tool_use", "id": "call_1", "name": "ls", "input": {}})
    );
    assert_eq!(ev[5]["delta"]["partial_json"], "{\"dir\":\".\"}");
    assert_eq!(ev[7]["delta"]["stop_reason"], "tool_use");
    assert_eq!(ev[7]["usage"]["output_tokens"], 9);
    quiesce_on(&g.ledger_db, 5).await;
    // 30 × 1 + 9 × 2 per million, each answer.
    let rows = g
        .ledger_db
        .column("SELECT cost FROM attempts ORDER BY started_at")
        .await;
    assert_eq!(rows, ["0.000048", "0.000048"]);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["oai"]).await;
}

#[tokio::test]
async fn what_chat_completions_cannot_carry_is_refused_naming_the_field() {
    let g = openai_gateway().await;
    let think = json!({"model": "m", "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 5},
                       "messages": [{"role": "user", "content": "hi"}]});
    let signed = json!({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "…", "signature": "sig"}]},
        {"role": "user", "content": "go on"}]});
    let server_tool = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
                             "tools": [{"type": "bash_20250124", "name": "bash"}]});
    for (body, param) in [
        (think, "thinking"),
        (signed, "messages[1].content[0]"),
        (server_tool, "tools[0]"),
    ] {
        let (status, _, out) = send(&g, &body, &[], "/v1/messages").await;
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["type"], "error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("`{param}`")) && msg.contains("openai"),
            "{msg}"
        );
    }
    // The Claude Code request as recorded (adaptive thinking, effort, context
    // management) has no faithful chat form.
    let (body, headers) = recorded();
    let mut body = body;
    body["model"] = json!("m");
    let (status, _, out) = send(&g, &body, &headers, "/v1/messages?beta=true").await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&out));
    assert_eq!(g.vendors.calls("oai"), 0);
}

#[tokio::test]
async fn a_stream_cut_after_content_ends_with_anthropics_error_event() {
    let g = gateway(Engine::Sqlite, "messages_cut", "10.00", "reject", None)
        .await
        .unwrap();
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    g.vendors.script(
        PROVIDER,
        vec![Script::StreamErrorAfter(4, overloaded.into())],
    );
    let body = json!({"model": MODEL, "max_tokens": 100, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, h, bytes) = send(&g, &body, &[], "/v1/messages").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(bytes).unwrap();
    // The vendor's events up to the cut, as sent, then one Anthropic error event.
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{text}");
    let v: Value = serde_json::from_str(last.split_once("data: ").unwrap().1).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(!text.contains("chat.completion.chunk") && !text.contains("[DONE]"));
    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("failed", "messages")
    );
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn the_audit_api_csv_and_metrics_tell_the_ingress_apart() {
    let g = gateway(Engine::Sqlite, "messages_audit", "10.00", "reject", None)
        .await
        .unwrap();
    let body =
        json!({"model": MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(send(&g, &body, &[], "/v1/messages").await.0, 200);
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    quiesce_on(&g.ledger_db, 5).await;
    for (ingress, n) in [("messages", 1), ("chat", 1), ("responses", 0)] {
        let v = g
            .admin_json(&format!("/audit/v1/requests?ingress={ingress}"))
            .await;
        let rows = v["requests"].as_array().unwrap();
        assert_eq!(rows.len(), n, "{ingress}: {v}");
        assert!(rows.iter().all(|r| r["ingress"] == ingress), "{v}");
    }
    let (status, _) = g.admin_get("/audit/v1/requests?ingress=grpc").await;
    assert_eq!(status, 400);
    let spend = g.admin_json("/audit/v1/spend?group_by=ingress").await;
    let mut keys: Vec<&str> = spend["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["chat", "messages"], "{spend}");
    let (_, csv) = g.admin_get("/audit/v1/attempts.csv?ingress=messages").await;
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "{csv}");
    assert!(
        lines[0].contains(",ingress,") && lines[1].contains(",messages,"),
        "{csv}"
    );
    // The mock's plain Anthropic answer reports no cache use: 0 read, 0 written, and no
    // split of writes by lifetime (empty cells, not zeros).
    let cell = |name: &str| {
        let i = lines[0].split(',').position(|h| h == name).unwrap();
        lines[1].split(',').nth(i).unwrap().to_string()
    };
    assert_eq!(
        [
            "cache_read_tokens",
            "cache_write_tokens",
            "cache_write_5m_tokens",
            "cache_write_1h_tokens"
        ]
        .map(cell),
        ["0", "0", "", ""],
        "{csv}"
    );
    let v = g.admin_json("/audit/v1/requests?ingress=messages").await;
    let a = &v["requests"][0]["attempts"][0];
    assert_eq!(
        (
            &a["cache_read_tokens"],
            &a["cache_write_tokens"],
            &a["cache_write_1h_tokens"]
        ),
        (&json!(0), &json!(0), &Value::Null),
        "{v}"
    );
    let (_, metrics) = g.get_as("/metrics", None).await;
    assert!(
        metrics.contains(
            r#"purser_requests_total{ingress="messages",outcome="served",policy="agents"} 1"#
        ),
        "{metrics}"
    );
}

/// The `claude` executable: `PURSER_CLAUDE`, else `claude` on the PATH. `None` skips
/// the real-client tests, except under `CI=true`, where `.ci/run` installs it.
fn claude() -> Option<String> {
    let exe = std::env::var("PURSER_CLAUDE").unwrap_or_else(|_| "claude".into());
    let found = std::process::Command::new(&exe)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true but Claude Code (`{exe}`) is not installed: .ci/run installs it");
    }
    found.then_some(exe)
}

/// One non-interactive Claude Code turn through purser; exit status, stdout, stderr
/// and how long it took.
async fn claude_turn(exe: &str, g: &Gateway) -> (bool, String, String, std::time::Duration) {
    let home = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = tokio::process::Command::new(exe)
        .args(["-p", "say hi", "--output-format", "json"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", format!("http://{}", g.addr))
        .env("ANTHROPIC_AUTH_TOKEN", KEY)
        .env("ANTHROPIC_MODEL", MODEL)
        .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", MODEL)
        .env("ANTHROPIC_SMALL_FAST_MODEL", MODEL)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), out)
        .await
        .expect("Claude Code did not exit within 60 s")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test]
async fn real_claude_code_turn_is_served_and_booked() {
    let Some(exe) = claude() else { return };
    let g = gateway(
        Engine::Sqlite,
        "messages_real_claude",
        "10.00",
        "clamp",
        None,
    )
    .await
    .unwrap();
    g.vendors
        .script(PROVIDER, vec![Script::Fixture("anthropic-cache")]);
    let (ok, stdout, stderr, _) = claude_turn(&exe, &g).await;
    assert!(ok, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains(&format!("Hello from {PROVIDER}.")),
        "{stdout}"
    );
    quiesce_on(&g.ledger_db, 5).await;
    let row = g.ledger_db.last_request().await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("served", "messages")
    );
    let a = &row.attempts[0];
    assert_eq!((a.input_tokens, a.output_tokens), (Some(4012), Some(8)));
    assert_eq!(a.cost, "0.00801");
    assert_cache_tokens(a);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn real_claude_code_exits_promptly_with_purser_reason_on_a_spent_budget() {
    let Some(exe) = claude() else { return };
    let g = gateway(
        Engine::Sqlite,
        "messages_real_spent",
        "10.00",
        "clamp",
        Some("0.01"),
    )
    .await
    .unwrap();
    let (ok, stdout, stderr, took) = claude_turn(&exe, &g).await;
    assert!(!ok, "a spent budget must fail the run: {stdout}");
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    let shown = format!("{stdout}{stderr}");
    assert!(
        shown.contains("budget_exhausted"),
        "purser's reason on screen: {shown}"
    );
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

/// Server-side compaction (`context_management` edit `compact_…`) runs an extra pass
/// over the whole input, billed beyond what the bound sees: a hard ceiling refuses it,
/// naming the edit, before any vendor call. A clearing edit, as Claude Code sends, stays
/// admitted (`claude_code_request_is_served_natively_*`).
async fn compaction_refused_on(engine: Engine) {
    let Some(g) = gateway(engine, "messages_compact", "10.00", "reject", None).await else {
        return;
    };
    let body = json!({"model": MODEL, "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": [
            {"type": "clear_thinking_20251015", "keep": "all"},
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}}]}});
    let (status, _, bytes) = send(&g, &body, &[], "/v1/messages").await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("`context_management.edits[1]`"), "{msg}");
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    // `purser explain` names the same edit, with the reason the reading gave.
    let file = std::env::temp_dir().join(format!("purser-compact-{}.json", std::process::id()));
    std::fs::write(&file, body.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .arg("explain")
        .arg(&g.config)
        .args([
            "--policy",
            "agents",
            "--model",
            MODEL,
            "--ingress",
            "messages",
            "--body",
        ])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("field `context_management.edits[1]`: cannot be bounded (a context edit"),
        "{text}"
    );
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn server_side_compaction_is_refused_under_a_hard_ceiling_sqlite() {
    compaction_refused_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn server_side_compaction_is_refused_under_a_hard_ceiling_postgres() {
    compaction_refused_on(Engine::Postgres).await;
}

/// `anthropic-beta: context-1m-…` lets the vendor take (and bill at long-context rates)
/// more input than the entry's declared window. Whatever the beta, an input bound over
/// the window is not bounded at that destination: refused with the arithmetic, no call.
async fn over_the_window_refused_on(engine: Engine) {
    let Some(g) = common::start_on(engine, "messages_1m", |v| {
        docs(v, "10.00", "reject", None)
            .into_iter()
            .map(|d| d.replace("context_window: 1000000", "context_window: 2000"))
            .collect()
    })
    .await
    else {
        return;
    };
    let beta = [(
        "anthropic-beta".to_string(),
        "context-1m-2025-08-07".to_string(),
    )];
    let body = json!({"model": MODEL, "max_tokens": 16,
        "messages": [{"role": "user", "content": "word ".repeat(4000)}]});
    let (status, _, bytes) = send(&g, &body, &beta, "/v1/messages").await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 402, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("purser (ceiling_exceeded)"), "{msg}");
    assert!(msg.contains("window 2000"), "the arithmetic: {msg}");
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    // Within the window the same beta is served: the entry's rates cover it.
    let small = json!({"model": MODEL, "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, bytes) = send(&g, &small, &beta, "/v1/messages").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(g.vendors.calls(PROVIDER), 1);
    quiesce_on(&g.ledger_db, 5).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn input_over_the_declared_window_is_refused_whatever_the_beta_sqlite() {
    over_the_window_refused_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn input_over_the_declared_window_is_refused_whatever_the_beta_postgres() {
    over_the_window_refused_on(Engine::Postgres).await;
}

/// Where no proof is needed (a soft ceiling, no budget) compaction is admitted, and the
/// ledger books what it bills: the compaction passes in `usage.iterations`, summed,
/// not the top-level figures that count only the last pass.
async fn compaction_booked_on(engine: Engine) {
    let Some(g) = common::start_on(engine, "messages_compact_booked", |v| {
        docs(v, "10.00", "reject", None)
            .into_iter()
            .map(|d| d.replace("mode: hard", "mode: soft"))
            .collect()
    })
    .await
    else {
        return;
    };
    let answer = json!({"id": "msg_c", "type": "message", "role": "assistant", "model": UPSTREAM,
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 100, "output_tokens": 20, "inference_geo": "global",
            "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "iterations": [
            {"type": "compaction", "input_tokens": 180000, "output_tokens": 3000,
             "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
            {"type": "message", "input_tokens": 100, "output_tokens": 20,
             "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}]}});
    g.vendors
        .script(PROVIDER, vec![Script::Status(200, answer.to_string())]);
    let body = json!({"model": MODEL, "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": [{"type": "compact_20260112"}]}});
    let (status, h, bytes) = send(&g, &body, &[], "/v1/messages").await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    let a = &row.attempts[0];
    assert_eq!(
        (a.input_tokens, a.output_tokens),
        (Some(180_100), Some(3020))
    );
    // 180100×5 + 3020×25, per million (no cache: every input token at the input rate).
    assert_eq!(a.cost, "0.976", "{a:?}");
    assert_eq!(a.cost_basis.as_deref(), Some("usage"));
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn compaction_passes_are_booked_summed_sqlite() {
    compaction_booked_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn compaction_passes_are_booked_summed_postgres() {
    compaction_booked_on(Engine::Postgres).await;
}

/// A Messages request whose Anthropic primary is rate-limited fails over to an OpenAI
/// alternate: the body, parked while the primary's call ran (`ChatRequest::park`, its
/// translation dropped with it), is read and translated again, whole, for the alternate.
#[tokio::test]
async fn a_messages_request_failing_over_to_an_openai_alternate_is_translated_whole() {
    let g = common::start(|v| {
        vec![
            provider(v, "an", "anthropic", "eu", &[("m", "1", "2")])
                + "    media_tokens: { image: 1600 }\n",
            provider(v, "oai", "openai", "eu", &[("m2", "1", "2")])
                + "    media_tokens: { image: 1600 }\n",
            format!(
                "kind: policy\nid: p\nclients:\n  - id: c\n    key_sha256: \"{}\"\nmodels: [m]\njurisdictions: [eu]\nceiling:\n  per_request: \"1.00\"\n  mode: soft\nmax_output_tokens: 100\nalternates:\n  m: oai/m2\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    g.vendors.script(
        "an",
        vec![Script::Status(
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#.into(),
        )],
    );
    let (status, h, out) = send(&g, &translatable(false), &[], "/v1/messages").await;
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(h["x-purser-provider"], "oai");
    // The primary got the Messages body as it was sent.
    assert_eq!(
        g.vendors.sent("an")[0].body["messages"],
        translatable(false)["messages"]
    );
    let sent = &g.vendors.sent("oai")[0].body;
    assert_eq!(sent["messages"], translatable_as_chat(), "{sent}");
    assert_eq!(sent["tools"][0]["function"]["name"], "ls");
}
