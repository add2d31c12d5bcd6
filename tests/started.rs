//! Billable once started (issue #20, defects 2 and 3): an attempt the vendor started —
//! a 2xx answer, a streamed byte of content, reasoning or tool call — is at least
//! `maybe_billed` whatever class follows, and usage found anywhere in it is priced at
//! its largest reading. A vendor's own finish reason after content (`content_filter`,
//! a refusal, a Gemini block) reaches the client as sent, and the attempt is billed at
//! its usage. Each test ends with the ledger's money invariants.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::time::Duration;

use common::money::{assert_money_invariants, quiesce};
use common::vendors::Script;
use common::{Gateway, provider, sha};
use purser::ledger::read::RequestRow;
use serde_json::{Value, json};

const SOFT: &str = "key-started-soft";
const HARD: &str = "key-started-hard";
const PROVIDERS: [&str; 3] = ["oa", "an", "ge"];

/// One vendor per API; a hard policy on OpenAI `m` failing over to Anthropic, and a
/// soft one with the same alternate that also reaches Anthropic `c` and Gemini `g`.
async fn gateway() -> Gateway {
    common::start(|vendors| {
        let slow = |s: String| s.replace("timeout_ms: 300", "timeout_ms: 3000");
        vec![
            slow(provider(vendors, "oa", "openai", "us", &[("m", "0.15", "0.60")])),
            slow(provider(
                vendors,
                "an",
                "anthropic",
                "us",
                &[("m", "0.25", "1.25"), ("c", "0.25", "1.25")],
            )),
            slow(provider(vendors, "ge", "gemini", "us", &[("g", "0.10", "0.40")])),
            format!(
                "kind: policy\nid: soft\nclients:\n  - {{ id: s, key_sha256: \"{}\" }}\nmodels: [m, c, g]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: soft }}\nmax_output_tokens: 100\nbudgets: [ {{ period: day, limit: \"1\" }} ]\nalternates:\n  m: an/m\n",
                sha(SOFT)
            ),
            format!(
                "kind: policy\nid: hard\nclients:\n  - {{ id: h, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\nbudgets: [ {{ period: day, limit: \"1\" }} ]\nalternates:\n  m: an/m\n",
                sha(HARD)
            ),
        ]
    })
    .await
}

/// The request row once it has left `in_flight`.
async fn settled(g: &Gateway, id: &str) -> RequestRow {
    for _ in 0..300 {
        let conn = purser::ledger::read::open_reader(&g.db).unwrap();
        if let Some(r) = purser::ledger::read::request(&conn, id).unwrap()
            && r.outcome != "in_flight"
        {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request {id} never left in_flight");
}

async fn invariants(g: &Gateway) {
    quiesce(&g.db, 10).await;
    assert_money_invariants(&g.db, &g.vendors, &PROVIDERS);
}

/// A streaming request: status, request id, the SSE data payloads (or the error body).
async fn stream(g: &Gateway, key: &str, model: &str) -> (u16, String, Vec<String>) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let id = r
        .headers()
        .get("x-purser-request-id")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    let data: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    let id = id.unwrap_or_else(|| {
        let v: Value = serde_json::from_str(&text).unwrap();
        v["error"]["request_id"].as_str().unwrap().to_string()
    });
    (status, id, data)
}

/// An SSE body of these JSON events (each `data:` only, as OpenAI and Gemini send).
fn sse(events: &[Value], done: bool) -> Vec<Vec<u8>> {
    let mut pieces: Vec<Vec<u8>> = events
        .iter()
        .map(|e| format!("data: {e}\n\n").into_bytes())
        .collect();
    if done {
        pieces.push(b"data: [DONE]\n\n".to_vec());
    }
    pieces
}

/// An Anthropic SSE body: (event name, data) pairs.
fn named_sse(events: &[(&str, Value)]) -> Vec<Vec<u8>> {
    events
        .iter()
        .map(|(name, e)| format!("event: {name}\ndata: {e}\n\n").into_bytes())
        .collect()
}

fn openai_chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-started", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn money(s: &str) -> rust_decimal::Decimal {
    s.parse::<purser::money::Money>().unwrap().decimal()
}

/// Defect 2a. A relay answers 200 with an error in the body (OpenRouter: a 200 means
/// the model started). The embedded code classes it, but the attempt may have been
/// billed: a hard request must not call its alternate, and the attempt is charged at
/// its worst case. With usage in the error body it is billed at that usage.
#[tokio::test]
async fn a_2xx_error_body_is_billable_and_a_hard_request_does_not_fail_over() {
    let g = gateway().await;
    let relay_error = r#"{"error":{"message":"Rate limit exceeded upstream","code":429,"metadata":{"provider_name":"Example"}},"user_id":"user_1"}"#;
    g.vendors
        .script("oa", vec![Script::Status(200, relay_error.into())]);
    let (status, id, v) = g.chat(HARD, "m").await;
    assert_ne!(status, 200, "{v}");
    assert_eq!(
        (g.vendors.calls("oa"), g.vendors.calls("an")),
        (1, 0),
        "hard: the 2xx may have been billed, so the alternate is never called"
    );
    let r = settled(&g, &id.unwrap()).await;
    assert_eq!(r.attempts.len(), 1);
    let a = &r.attempts[0];
    assert_eq!(a.status, Some(200));
    assert_eq!(
        (a.billing.as_str(), a.decision.as_deref()),
        ("maybe_billed", Some("stop")),
        "{a:?}"
    );

    // Soft may fail over; the first attempt, whose error body carries usage, is
    // billed at it: 21 in × 0.15/M + 5 out × 0.60/M.
    g.vendors.script(
        "oa",
        vec![Script::Status(
            200,
            r#"{"error":{"message":"Upstream provider failed mid-generation","code":502},"usage":{"prompt_tokens":21,"completion_tokens":5,"total_tokens":26}}"#.into(),
        )],
    );
    let (status, id, v) = g.chat(SOFT, "m").await;
    assert_eq!(status, 200, "{v}");
    let r = settled(&g, &id.unwrap()).await;
    let a = &r.attempts[0];
    assert_eq!(
        (a.billing.as_str(), a.input_tokens, a.output_tokens),
        ("billed", Some(21), Some(5)),
        "{a:?}"
    );
    assert_eq!(money(&a.cost), money("0.00000615"));
    assert_eq!(r.attempts[1].billing, "billed");
    invariants(&g).await;
}

/// Defect 2b. A stream that sends reasoning deltas (`reasoning_content`, and
/// `reasoning` as OpenRouter names them) and then an error event has started: under a
/// hard ceiling it does not fail over, and the attempt is charged at its worst case,
/// not 0. Anthropic's thinking deltas count the same.
#[tokio::test]
async fn reasoning_then_an_error_event_is_started_and_stops_a_hard_request() {
    let g = gateway().await;
    let overloaded = json!({"error": {"message": "The server is overloaded", "type": "server_error", "code": "overloaded"}});
    for (n, key) in ["reasoning_content", "reasoning"].into_iter().enumerate() {
        let think = openai_chunk(
            json!({"role": "assistant", "content": null, key: "Let me think"}),
            None,
        );
        g.vendors.script(
            "oa",
            vec![Script::StreamPieces(sse(
                &[think, overloaded.clone()],
                false,
            ))],
        );
        let (status, id, _) = stream(&g, HARD, "m").await;
        assert_ne!(status, 200, "{key}");
        assert_eq!(
            (g.vendors.calls("oa"), g.vendors.calls("an")),
            (n + 1, 0),
            "{key}: the reasoning was generated, so hard stops"
        );
        let r = settled(&g, &id).await;
        let a = &r.attempts[0];
        assert_eq!(
            (a.class.as_deref(), a.billing.as_str()),
            (Some("overloaded"), "maybe_billed"),
            "{key}: {a:?}"
        );
        assert!(money(&a.worst_case) > money("0"));
    }

    // Anthropic: thinking, then an error event, before any text.
    g.vendors.script(
        "an",
        vec![Script::StreamPieces(named_sse(&[
            ("message_start", json!({"type": "message_start", "message": {"id": "msg_t", "type": "message", "role": "assistant", "model": "c", "content": [], "usage": {"input_tokens": 12, "output_tokens": 1, "inference_geo": "global"}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Considering"}})),
            ("error", json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        ]))],
    );
    let (_, id, _) = stream(&g, SOFT, "c").await;
    let r = settled(&g, &id).await;
    assert_eq!(
        (
            r.attempts[0].class.as_deref(),
            r.attempts[0].billing.as_str()
        ),
        (Some("overloaded"), "maybe_billed")
    );
    invariants(&g).await;
}

/// Model, provider, the stream's pieces, the tokens and cost the ledger must show.
type Case = (
    &'static str,
    &'static str,
    Vec<Vec<u8>>,
    (i64, i64),
    &'static str,
);

/// Defect 2c. A filter's finish after content has streamed is the vendor's own finish:
/// forwarded as OpenAI `finish_reason: content_filter`, the stream read to its end (the
/// usage chunk after it included), the attempt billed at its usage. For each API.
#[tokio::test]
async fn a_content_filter_after_content_is_forwarded_and_billed_at_usage() {
    let g = gateway().await;
    let cases: [Case; 3] = [
        (
            "m",
            "oa",
            sse(
                &[
                    openai_chunk(json!({"role": "assistant", "content": "Hello"}), None),
                    openai_chunk(json!({}), Some("content_filter")),
                    json!({"id": "chatcmpl-started", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                           "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}),
                ],
                true,
            ),
            (12, 3),
            // 12 × 0.15/M + 3 × 0.60/M
            "0.0000036",
        ),
        (
            "c",
            "an",
            named_sse(&[
                (
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_f", "type": "message", "role": "assistant", "model": "c", "content": [], "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1, "inference_geo": "global"}}}),
                ),
                (
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                (
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
                ),
                (
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                (
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": "refusal", "stop_sequence": null}, "usage": {"output_tokens": 3}}),
                ),
                ("message_stop", json!({"type": "message_stop"})),
            ]),
            (12, 3),
            // 12 × 0.25/M + 3 × 1.25/M
            "0.00000675",
        ),
        (
            "g",
            "ge",
            sse(
                &[
                    json!({"candidates": [{"content": {"parts": [{"text": "Hello"}], "role": "model"}}], "usageMetadata": {"promptTokenCount": 12, "totalTokenCount": 12}}),
                    json!({"candidates": [{"content": {"parts": [], "role": "model"}, "finishReason": "SAFETY"}], "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 3, "totalTokenCount": 15}}),
                ],
                false,
            ),
            (12, 3),
            // 12 × 0.10/M + 3 × 0.40/M
            "0.0000024",
        ),
    ];
    for (model, p, pieces, tokens, cost) in cases {
        g.vendors.script(p, vec![Script::StreamPieces(pieces)]);
        let (status, id, data) = stream(&g, SOFT, model).await;
        assert_eq!(status, 200, "{p}");
        assert!(
            !data.iter().any(|d| d.contains("\"error\"")),
            "{p}: no error event: {data:?}"
        );
        let finishes: Vec<String> = data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect();
        assert_eq!(finishes, ["content_filter"], "{p}: {data:?}");
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{p}");
        let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(
            money(usage["purser_cost"].as_str().unwrap()),
            money(cost),
            "{p}"
        );
        let r = settled(&g, &id).await;
        let a = &r.attempts[0];
        assert_eq!(
            (r.outcome.as_str(), a.class.as_deref(), a.billing.as_str()),
            ("served", Some("success"), "billed"),
            "{p}: {a:?}"
        );
        assert_eq!(
            (a.input_tokens, a.output_tokens),
            (Some(tokens.0), Some(tokens.1)),
            "{p}"
        );
        assert_eq!(money(&a.cost), money(cost), "{p}");
    }
    invariants(&g).await;
}

/// A filter's finish before any content (after reasoning) is a refusal, but the usage
/// chunk that follows it is still read: the attempt is billed at it, not guessed.
#[tokio::test]
async fn a_refusal_finish_before_content_is_billed_at_the_usage_after_it() {
    let g = gateway().await;
    g.vendors.script(
        "oa",
        vec![Script::StreamPieces(sse(
            &[
                openai_chunk(json!({"role": "assistant", "reasoning_content": "Hmm"}), None),
                openai_chunk(json!({}), Some("content_filter")),
                json!({"id": "chatcmpl-started", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}),
            ],
            true,
        ))],
    );
    let (status, id, _) = stream(&g, SOFT, "m").await;
    assert_eq!(status, 400);
    let r = settled(&g, &id).await;
    let a = &r.attempts[0];
    assert_eq!(
        (a.class.as_deref(), a.billing.as_str(), a.output_tokens),
        (Some("content_refusal"), "billed", Some(2)),
        "{a:?}"
    );
    // 12 × 0.15/M + 2 × 0.60/M
    assert_eq!(money(&a.cost), money("0.000003"));
    assert_eq!(g.vendors.calls("an"), 0);
    invariants(&g).await;
}

/// Defect 3 (usage half). `completion_tokens: 0` beside `total_tokens` 81,
/// `prompt_tokens` 21 and `reasoning_tokens` 60 is 60 output tokens at least: the
/// largest reading is charged, not the smallest.
#[tokio::test]
async fn usage_is_charged_at_its_largest_reading() {
    let g = gateway().await;
    let answer = json!({"id": "chatcmpl-r", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 0, "total_tokens": 81,
                  "completion_tokens_details": {"reasoning_tokens": 60}}});
    g.vendors
        .script("oa", vec![Script::Status(200, answer.to_string())]);
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(SOFT)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // 21 × 0.15/M + 60 × 0.60/M
    let want = money("0.00003915");
    assert_eq!(money(r.headers()["x-purser-cost"].to_str().unwrap()), want);
    let id = r.headers()["x-purser-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let row = settled(&g, &id).await;
    let a = &row.attempts[0];
    assert_eq!((a.input_tokens, a.output_tokens), (Some(21), Some(60)));
    assert_eq!(money(&a.cost), want);
    invariants(&g).await;
}

/// A stream that generated only reasoning and then finished, from a compatible server
/// that sends no `[DONE]`, is a complete, empty answer: served and billed at the usage
/// it closed with, not a cut charged at its worst case.
#[tokio::test]
async fn a_stream_of_reasoning_only_is_billed_at_its_usage() {
    let g = gateway().await;
    g.vendors.script(
        "oa",
        vec![Script::StreamPieces(sse(
            &[
                openai_chunk(json!({"role": "assistant", "reasoning_content": "Considering"}), None),
                openai_chunk(json!({}), Some("stop")),
                json!({"id": "chatcmpl-started", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                                 "completion_tokens_details": {"reasoning_tokens": 5}}}),
            ],
            false,
        ))],
    );
    let (status, id, data) = stream(&g, SOFT, "m").await;
    assert_eq!(status, 200, "{data:?}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let r = settled(&g, &id).await;
    let a = &r.attempts[0];
    assert_eq!(
        (
            r.outcome.as_str(),
            a.billing.as_str(),
            a.input_tokens,
            a.output_tokens
        ),
        ("served", "billed", Some(12), Some(5)),
        "{a:?}"
    );
    // 12 × 0.15/M + 5 × 0.60/M
    assert_eq!(money(&a.cost), money("0.0000048"));
    assert_eq!(g.vendors.calls("an"), 0);
    invariants(&g).await;
}

/// Reading on for the usage after a refusal finish is bounded by the provider's
/// timeout in total, not per read: an upstream that trickles keep-alive comments after
/// its finish cannot hold the refusal (and its reservation) open.
#[tokio::test]
async fn the_read_for_usage_after_a_refusal_finish_is_bounded() {
    let g = gateway().await;
    let mut pieces = sse(
        &[
            openai_chunk(
                json!({"role": "assistant", "reasoning_content": "Hmm"}),
                None,
            ),
            openai_chunk(json!({}), Some("content_filter")),
        ],
        false,
    );
    // At least 2 ms apart each: over 6 s of keep-alives, against a 3 s timeout.
    pieces.extend(std::iter::repeat_n(b": keep-alive\n\n".to_vec(), 3000));
    g.vendors.script("oa", vec![Script::StreamPieces(pieces)]);
    let t = std::time::Instant::now();
    let (status, id, _) = stream(&g, SOFT, "m").await;
    let took = t.elapsed();
    assert_eq!(status, 400);
    assert!(took < Duration::from_millis(4500), "took {took:?}");
    let r = settled(&g, &id).await;
    assert_eq!(
        (
            r.attempts[0].class.as_deref(),
            r.attempts[0].billing.as_str()
        ),
        (Some("content_refusal"), "maybe_billed")
    );
    invariants(&g).await;
}
