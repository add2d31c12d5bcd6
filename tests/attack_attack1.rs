//! Attack review of issue #20 (reviewer attack1): the input and output bounds, what is
//! sent against what is counted, and usage readings. Each test tries one way to break a
//! promise (a hard ceiling is a proof; a budget is never passed; every billed call is in
//! the ledger at its true cost) through real HTTP against the mock vendors.
//!
//! Tests marked `#[ignore = "hole: …"]` demonstrate a real hole (they fail on this
//! branch); the others document attacks that failed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::money::{assert_money_invariants, quiesce};
use common::vendors::{Script, Vendors};
use common::{Gateway, sha};
use purser::ledger::read::RequestRow;
use serde_json::{Value, json};

const HARD: &str = "key-attack1-hard";
const LOOSE: &str = "key-attack1-loose";
const PROVIDERS: [&str; 3] = ["oa", "an", "ge"];

fn provider(v: &Vendors, id: &str, api: &str, models: &str) -> String {
    format!(
        "kind: provider\nid: {id}\napi: {api}\nbase_url: {}\njurisdiction: us\ntimeout_ms: 3000\nmodels:\n{models}",
        v.base_url(id, api)
    )
}

fn policy(id: &str, key: &str, models: &str, ceiling: &str) -> String {
    format!(
        "kind: policy\nid: {id}\nclients:\n  - {{ id: {id}-bot, key_sha256: \"{}\" }}\nmodels: [{models}]\njurisdictions: [us]\nceiling: {ceiling}\nmax_output_tokens: 100\n",
        sha(key)
    )
}

fn docs(v: &Vendors) -> Vec<String> {
    vec![
        provider(
            v,
            "oa",
            "openai",
            r#"  m:
    context_window: 1000000
    input_per_mtok: "1"
    output_per_mtok: "1"
  gem:
    upstream: google/gemini-2.5-pro
    context_window: 1000000
    input_per_mtok: "1.25"
    output_per_mtok: "10"
  claude:
    upstream: anthropic/claude-sonnet-4
    context_window: 200000
    input_per_mtok: "3"
    output_per_mtok: "15"
"#,
        ),
        provider(
            v,
            "an",
            "anthropic",
            r#"  c:
    context_window: 200000
    input_per_mtok: "3"
    output_per_mtok: "15"
"#,
        ),
        provider(
            v,
            "ge",
            "gemini",
            r#"  gfl:
    upstream: gemini-flash-latest
    context_window: 1000000
    input_per_mtok: "0.30"
    output_per_mtok: "2.50"
"#,
        ),
        policy(
            "hard",
            HARD,
            "m, gem, claude, c, gfl",
            "{ per_request: \"0.2\", mode: hard }",
        ),
        policy(
            "loose",
            LOOSE,
            "m, c, claude",
            "{ per_request: \"5\", mode: soft }",
        ),
    ]
}

async fn gateway() -> Gateway {
    common::start(docs).await
}

async fn post_raw(
    g: &Gateway,
    key: &str,
    body: String,
) -> (u16, String, reqwest::header::HeaderMap) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.text().await.unwrap_or_default(), headers)
}

async fn post(g: &Gateway, key: &str, body: Value) -> (u16, Value, reqwest::header::HeaderMap) {
    let (status, text, h) = post_raw(g, key, body.to_string()).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        h,
    )
}

fn ask(model: &str, content: Value, extra: Value) -> Value {
    let mut b = json!({"model": model, "messages": [{"role": "user", "content": content}]});
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

fn request(g: &Gateway, headers: &reqwest::header::HeaderMap) -> RequestRow {
    let id = headers["x-purser-request-id"].to_str().unwrap();
    let conn = purser::ledger::read::open_reader(&g.db).unwrap();
    purser::ledger::read::request(&conn, id).unwrap().unwrap()
}

fn dec(s: &str) -> rust_decimal::Decimal {
    s.parse().unwrap()
}

fn last_sent(g: &Gateway, provider: &str) -> Value {
    g.vendors.sent(provider).last().unwrap().body.clone()
}

async fn settle(g: &Gateway) {
    quiesce(&g.db, 10).await;
    assert_money_invariants(&g.db, &g.vendors, &PROVIDERS);
}

fn sse(events: &[String]) -> Vec<Vec<u8>> {
    events
        .iter()
        .map(|e| format!("{e}\n\n").into_bytes())
        .collect()
}

fn openai_chunk(delta: Value, finish: Option<&str>, usage: Value) -> String {
    format!(
        "data: {}",
        json!({"id": "chatcmpl-a1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": usage})
    )
}

fn openai_usage_chunk(prompt: u64, completion: u64) -> String {
    format!(
        "data: {}",
        json!({"id": "chatcmpl-a1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
               "total_tokens": prompt + completion}})
    )
}

/// HOLE (promise 3, usage at its largest reading). An OpenAI-shaped stream that carries
/// two usage chunks (a relay that re-emits usage, vLLM's continuous usage stats with a
/// closing reset) is read at the last one, not the largest: a trailing all-zero usage
/// chunk books a 100-token answer at 0.
#[tokio::test]
async fn openai_stream_a_later_usage_chunk_cannot_lower_the_reading() {
    let g = gateway().await;
    g.vendors.script(
        "oa",
        vec![Script::StreamPieces(sse(&[
            openai_chunk(
                json!({"role": "assistant", "content": "x".repeat(300)}),
                None,
                Value::Null,
            ),
            openai_chunk(json!({}), Some("length"), Value::Null),
            openai_usage_chunk(20, 100),
            openai_usage_chunk(0, 0),
            "data: [DONE]".into(),
        ]))],
    );
    let (status, text, h) = post(&g, HARD, ask("m", json!("hi"), json!({"stream": true}))).await;
    assert_eq!(status, 200, "{text}");
    quiesce(&g.db, 10).await;
    let a = request(&g, &h).attempts[0].clone();
    assert!(
        a.output_tokens.unwrap_or(0) >= 100 && a.input_tokens.unwrap_or(0) >= 20,
        "the vendor reported 20 in / 100 out, then zeros: booked {:?} in / {:?} out at {}",
        a.input_tokens,
        a.output_tokens,
        a.cost
    );
    settle(&g).await;
}

/// HOLE (promise 3). Anthropic's `message_delta.usage` may repeat the input counts
/// (cumulative usage, as the API has sent since 2025, and as Anthropic-compatible
/// servers send with `input_tokens: 0`). The translator lays each count over the last,
/// so a 0 in the closing delta erases the 5,000 input tokens of `message_start`.
#[tokio::test]
async fn anthropic_stream_a_closing_delta_cannot_erase_the_input_count() {
    let g = gateway().await;
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}");
    g.vendors.script(
        "an",
        vec![Script::StreamPieces(sse(&[
            ev("message_start", json!({"type": "message_start", "message": {"id": "msg_a1", "type": "message", "role": "assistant", "model": "c", "content": [],
                "usage": {"input_tokens": 5000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}}})),
            ev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello"}})),
            ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"input_tokens": 0, "output_tokens": 8}})),
            ev("message_stop", json!({"type": "message_stop"})),
        ]))],
    );
    // A 6,000-byte prompt: 5,000 input tokens are within its bound.
    let (status, text, h) = post(
        &g,
        HARD,
        ask("c", json!("p".repeat(6000)), json!({"stream": true})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    quiesce(&g.db, 10).await;
    let a = request(&g, &h).attempts[0].clone();
    assert!(
        a.input_tokens.unwrap_or(0) >= 5000,
        "message_start said 5,000 input tokens; booked {:?} at {}",
        a.input_tokens,
        a.cost
    );
    settle(&g).await;
}

/// Suspected hole (promise 1), found not to be one. `reasoning_budget()` counts 8,192
/// thinking tokens beyond the cap for a Gemini 2.5 model whatever API reaches it, but
/// only the Gemini adapter sends that budget (`thinkingConfig.thinkingBudget`); reached
/// through an OpenAI-compatible API, with `reasoning_effort: high` (24,576 on Gemini's
/// own mapping), nothing sent names a thinking budget. Gemini bills thought tokens
/// against the output cap, though (`maxOutputTokens`, which its OpenAI-compatible API
/// fills from `max_tokens`): measured on 2.5 and 3.x, thoughts plus answer land on the
/// cap with `MAX_TOKENS` (googleapis/python-genai#811 and #2062, vectorize-io/hindsight
/// #3365). So the cap purser forwards, one field, the one it proved with, bounds the
/// thinking, and the 8,192 beyond it are margin. What must hold is that the cap is
/// sent and the worst case covers it and the margin.
#[tokio::test]
async fn gemini_family_behind_an_openai_api_is_held_by_the_cap_it_is_sent() {
    let g = gateway().await;
    let (status, v, h) = post(
        &g,
        HARD,
        ask("gem", json!("hi"), json!({"reasoning_effort": "high"})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let r = request(&g, &h);
    let sent = last_sent(&g, "oa");
    assert_eq!(sent["max_tokens"], 100, "{sent}");
    assert!(sent.get("max_completion_tokens").is_none(), "{sent}");
    // (100 + 8,192) output tokens at 10/M, plus the input.
    assert!(dec(&r.worst_case) >= dec("0.08292"), "{}", r.worst_case);
    settle(&g).await;
}

/// HOLE (promise 1, by purser's own model of Gemini thinking). The family defaults are
/// matched by name prefix: `gemini-flash-latest` (Google's alias of the current Flash,
/// a thinking model) is taken for a model that does not think, so it is sent no
/// thinking budget and its worst case counts no reasoning beyond the cap.
#[tokio::test]
async fn a_gemini_alias_is_held_to_a_thinking_budget() {
    let g = gateway().await;
    let (status, v, h) = post(&g, HARD, ask("gfl", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let config = last_sent(&g, "ge")["generationConfig"].clone();
    let r = request(&g, &h);
    assert!(
        config.pointer("/thinkingConfig/thinkingBudget").is_some(),
        "gemini-flash-latest thinks by default; sent {config}, worst case {}",
        r.worst_case
    );
    settle(&g).await;
}

/// HOLE (promise 1 and 3). OpenAI-compatible relays (OpenRouter, LiteLLM) pass a
/// text part's `cache_control` on to Anthropic, which bills the marked prefix as a
/// cache write at 1.25× (5 minutes) or 2× (`ttl: 1h`) the input rate. A nested key is
/// never looked at (the field table is top-level only, and an OpenAI destination
/// refuses nothing), `bills_cache_writes()` is false for an OpenAI API without a listed
/// write rate, and `usage_block` books writes as a structural 0: the worst case is
/// proved at the base input rate and the writes are never charged.
///
/// Closed: a `cache_control` mark anywhere in what is sent asks for a write, which the
/// bound counts at the dearest write rate (`Applied::marked`; 2× input with no listed
/// rate), so this request no longer fits the 0.2 ceiling; a relay's reported writes
/// are read (`cache_write_tokens`, `cache_creation_input_tokens`) and charged at the
/// write rate, and unreported ones are charged as a bound.
#[tokio::test]
async fn cache_writes_asked_through_a_relay_are_bounded_or_refused() {
    let g = gateway().await;
    let text = "c".repeat(35_000);
    let body = ask(
        "claude",
        json!([{"type": "text", "text": text, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]),
        json!({}),
    );
    g.vendors.script(
        "oa",
        vec![Script::Status(
            200,
            json!({"id": "chatcmpl-r", "object": "chat.completion", "created": 1, "model": "anthropic/claude-sonnet-4",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 35000, "completion_tokens": 10, "total_tokens": 35010,
                          "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 35000}}})
            .to_string(),
        )],
    );
    let (status, v, h) = post(&g, HARD, body).await;
    if status == 400 || (status == 402 && v["error"]["code"] == "ceiling_exceeded") {
        settle(&g).await;
        return; // refused: the attack failed
    }
    assert_eq!(status, 200, "{v}");
    let r = request(&g, &h);
    // 35,000 tokens written to the 1-hour cache at 2 × 3/M = 0.21, over the 0.2
    // ceiling; the proof used 3/M.
    assert!(
        dec(&r.worst_case) >= dec("0.21"),
        "a 1-hour cache write of ~35k tokens was proved at the base input rate: worst case {}, cost {}",
        r.worst_case,
        r.cost
    );
    settle(&g).await;
}

/// A request that marks a part with `cache_control` asks for a cache write, which the
/// vendor behind an OpenAI-compatible API may bill (Anthropic through OpenRouter or
/// LiteLLM; Alibaba's explicit cache). Its writes are charged at the write rate as
/// reported, in OpenRouter's shape (`prompt_tokens_details.cache_write_tokens`) and
/// LiteLLM's (`cache_creation_input_tokens`), within the worst case; not reported,
/// they are unknown and the input is charged at the write rate (basis `worst_case`).
/// Without a mark, writes a server reports are plain input (OpenAI's are free).
#[tokio::test]
async fn cache_writes_are_charged_where_the_request_asked_for_them() {
    let g = gateway().await;
    let answer = |model: &str, usage: Value| {
        Script::Status(
            200,
            json!({"id": "chatcmpl-w", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": usage})
            .to_string(),
        )
    };
    let marked = json!([{"type": "text", "text": "c".repeat(4_000), "cache_control": {"type": "ephemeral"}}]);
    let plain = json!([{"type": "text", "text": "c".repeat(4_000)}]);
    let claude = "anthropic/claude-sonnet-4";
    g.vendors.script(
        "oa",
        vec![
            answer(
                claude,
                json!({"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
                       "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 1000}}),
            ),
            answer(
                claude,
                json!({"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
                       "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 0}),
            ),
            answer(
                claude,
                json!({"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
                       "prompt_tokens_details": {"cached_tokens": 0}}),
            ),
            answer(
                "m",
                json!({"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
                       "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 1000}}),
            ),
        ],
    );
    // 1,000 written at 2 × 3/M (no listed write rate: the stand-in) + 10 out at 15/M,
    // reported in either shape, or not reported at all (then a bound).
    for (shape, basis) in [
        ("openrouter", "estimated"),
        ("litellm", "estimated"),
        ("unreported", "worst_case"),
    ] {
        let (status, v, h) = post(&g, LOOSE, ask("claude", marked.clone(), json!({}))).await;
        assert_eq!(status, 200, "{shape}: {v}");
        let r = request(&g, &h);
        let a = &r.attempts[0];
        assert_eq!(dec(&a.cost), dec("0.00615"), "{shape}: {a:?}");
        assert_eq!(a.cost_basis.as_deref(), Some(basis), "{shape}: {a:?}");
        assert!(dec(&a.cost) <= dec(&r.worst_case), "{shape}: {r:?}");
    }
    // No mark: 1,010 tokens at 1/M, the reported writes plain input.
    let (status, v, h) = post(&g, LOOSE, ask("m", plain, json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let a = request(&g, &h).attempts[0].clone();
    assert_eq!(dec(&a.cost), dec("0.00101"), "{a:?}");
    settle(&g).await;
}

/// HOLE (promise 1). `tools` is `Bearing::Input`: its bytes are counted, and an OpenAI
/// destination refuses nothing. Built-in tools of OpenAI-compatible vendors
/// (`{"type": "browser_search"}` and `code_interpreter` on Groq, `web_search` on
/// others) run server side and bill per call or per hour beyond tokens: a hard request
/// carrying one is served.
#[tokio::test]
async fn built_in_tools_are_refused_under_a_hard_ceiling() {
    let g = gateway().await;
    let (status, v, _) = post(
        &g,
        HARD,
        ask(
            "m",
            json!("what is the news"),
            json!({"tools": [{"type": "browser_search"}]}),
        ),
    )
    .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("tools[0]")),
        "a per-call-billed built-in tool was forwarded: {v}; sent {:?}",
        g.vendors.sent("oa").last().map(|c| c.body.clone())
    );
    settle(&g).await;
}

/// Attacks on the caps and the request parsing that FAILED (kept as documentation):
/// caps of the wrong type or sign, `max_tokens: 0`, `n` as a string or out of range, both
/// caps (the tighter one is sent, in one field), duplicated JSON keys (the last one is
/// both counted and sent, since the body is parsed and re-serialised), a cap beyond any
/// ceiling, `stream_options.include_usage: false`, and unicode escapes (counted at
/// their UTF-8 bytes, no fewer than their tokens).
#[tokio::test]
async fn caps_counts_and_parsing_tricks_are_bounded() {
    let g = gateway().await;
    for (field, value) in [
        ("max_tokens", json!(0)),
        ("max_tokens", json!(-5)),
        ("max_tokens", json!("100")),
        ("max_tokens", json!(1.5)),
        ("max_tokens", json!(100.0)),
        ("max_completion_tokens", json!([100])),
        ("n", json!("2")),
        ("n", json!(0)),
        ("n", json!(129)),
    ] {
        let mut extra = serde_json::Map::new();
        extra.insert(field.into(), value.clone());
        let (status, v, _) = post(&g, HARD, ask("m", json!("hi"), Value::Object(extra))).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some(field)),
            "{field}: {value}: {v}"
        );
    }
    assert_eq!(g.vendors.calls("oa"), 0);

    // Both caps and n: the tighter cap, in exactly one field, and the worst case counts
    // it n times.
    let (status, v, h) = post(
        &g,
        HARD,
        ask(
            "m",
            json!("hi"),
            json!({"max_tokens": 90, "max_completion_tokens": 70, "n": 3}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let sent = last_sent(&g, "oa");
    assert_eq!(
        (sent.get("max_tokens"), sent.get("max_completion_tokens")),
        (Some(&json!(70)), None)
    );
    assert!(dec(&request(&g, &h).worst_case) >= dec("0.00021"));

    // Duplicated keys: the vendor receives the value the bound was computed with.
    let raw = r#"{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"max_tokens":90}"#;
    let (status, text, _) = post_raw(&g, HARD, raw.into()).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(last_sent(&g, "oa")["max_tokens"], 90);

    // A cap no ceiling can hold is refused, not wrapped.
    let (status, v, _) = post(
        &g,
        HARD,
        ask("m", json!("hi"), json!({"max_tokens": u64::MAX})),
    )
    .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (402, Some("ceiling_exceeded")),
        "{v}"
    );

    // The client cannot turn the usage chunk off.
    let (status, _, _) = post(
        &g,
        HARD,
        ask(
            "m",
            json!("hi"),
            json!({"stream": true, "stream_options": {"include_usage": false}}),
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(last_sent(&g, "oa")["stream_options"]["include_usage"], true);

    // 100k `\u00e9` escapes: 6 bytes each on the wire, 2 in UTF-8, counted at 2 each
    // and more: 200k tokens at 1/M + overheads is over 0.2 → refused.
    let raw = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "\\u00e9".repeat(100_000)
    );
    let (status, text, _) = post_raw(&g, HARD, raw).await;
    assert_eq!(status, 402, "{text}");
    settle(&g).await;
}

/// Attacks on what is counted that FAILED: a message key the tables do not list, a part
/// without a `type`, a `text` part with a media key beside it, tool-call arguments that
/// expand when parsed for Anthropic (the bound is over the translated body) and a
/// large `stop` array; each is counted or refused.
#[tokio::test]
async fn what_is_sent_is_counted_whatever_its_shape() {
    let g = gateway().await;
    // 300k bytes in an unlisted message key: counted → over the 0.2 ceiling at 1/M.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi", "x_context": "k".repeat(300_000)}]});
    let (status, v, _) = post(&g, HARD, body).await;
    assert_eq!(status, 402, "{v}");
    // A part with no type is media of unknown kind: refused under a hard ceiling.
    let (status, v, _) = post(
        &g,
        HARD,
        ask(
            "m",
            json!([{"image_url": {"url": "https://x.test/a.png"}}]),
            json!({}),
        ),
    )
    .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("messages[0].content[0]")),
        "{v}"
    );
    // A 300k `stop` array is counted.
    let (status, v, _) = post(
        &g,
        HARD,
        ask(
            "m",
            json!("hi"),
            json!({"stop": ["s".repeat(150_000), "t".repeat(150_000)]}),
        ),
    )
    .await;
    assert_eq!(status, 402, "{v}");
    // Anthropic: tool-call arguments of `[1,1,…]` are parsed to JSON for `input`; the
    // bound walks the translated body, so whatever parsing does is counted.
    let args = format!("[{}]", vec!["1"; 40_000].join(","));
    let body = json!({"model": "c", "tools": [{"type": "function", "function": {"name": "f"}}], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "done"}]});
    let (status, v, h) = post(&g, HARD, body).await;
    if status == 200 {
        let r = request(&g, &h);
        let sent = serde_json::to_string(&last_sent(&g, "an")).unwrap().len() as u64;
        // The worst case covers the sent bytes at the input rate.
        let floor = rust_decimal::Decimal::from(sent) * dec("3") / dec("1000000");
        assert!(dec(&r.worst_case) >= floor, "{} < {floor}", r.worst_case);
    } else {
        assert_eq!(status, 402, "{v}");
    }
    let _ = LOOSE;
    settle(&g).await;
}

/// HOLE (promise 1). The bound counts a string at its UTF-8 bytes ("escapes would only
/// add"), but where the vendor renders a structure as JSON text (a tool's schema and
/// description through a chat template's `tojson`, Anthropic's and OpenAI's tool
/// rendering, Gemini's function declarations, `response_format` schemas), the escapes
/// ARE the text it tokenises. JSON must escape U+0000–U+001F: each such character is
/// one byte counted and six bytes (`\u0001`) rendered, two or three tokens. 150,000 of
/// them in a tool description are counted as ~150k tokens and rendered as 900 kB;
/// the body purser itself sends is 900 kB, so its own check "the bound is at least the
/// serialised body" (`bound::tests::the_bound_covers_the_prepared_body`) fails.
#[tokio::test]
async fn escaped_control_characters_are_counted_as_sent() {
    let g = gateway().await;
    let description: String = "\u{1}".repeat(150_000);
    let body = ask(
        "m",
        json!("call f"),
        json!({"tools": [{"type": "function", "function": {"name": "f", "description": description,
            "parameters": {"type": "object", "properties": {}}}}]}),
    );
    let (status, _, h) = post(&g, HARD, body).await;
    if status != 200 {
        return; // refused: the attack failed
    }
    let r = request(&g, &h);
    let sent = serde_json::to_string(&last_sent(&g, "oa")).unwrap().len() as u64;
    // Input and output both at 1/M: the worst case in tokens is 1e6 × worst_case; the
    // output side is the 100-token cap.
    let counted = dec(&r.worst_case) * dec("1000000") - dec("100");
    assert!(
        counted >= rust_decimal::Decimal::from(sent),
        "the body sent is {sent} bytes of JSON; the bound counted {counted} tokens (worst case {} under a 0.2 ceiling)",
        r.worst_case
    );
    settle(&g).await;
}

/// HOLE (promise 1, found by reading; the token count depends on the vendor's template
/// and tokenizer). The bound counts a tool schema at its compact JSON bytes. Chat
/// templates of OpenAI-compatible servers render tools with `tojson(indent=4)`
/// (Llama 3.1 and 3.3's template does), which adds a newline and 4 × depth spaces per
/// nested value: indentation grows with the square of the depth. A 110-deep array in a
/// schema's `examples` is ~330 bytes compact and ~48 kB rendered; 250 of them fit a
/// 0.2 ceiling counted compact and render to ~12 MB (≥ 750k tokens even at one token
/// per 16 spaces). Purser accepts any depth serde_json parses (128).
///
/// Closed: `bound::json_len` counts every structure as `tojson(indent=4)` renders it.
#[tokio::test]
async fn deeply_nested_schemas_are_bounded_as_rendered() {
    let g = gateway().await;
    let mut deep = json!(1);
    for _ in 0..110 {
        deep = json!([deep]);
    }
    let properties: serde_json::Map<String, Value> = (0..250)
        .map(|i| {
            (
                format!("p{i}"),
                json!({"type": "array", "examples": deep.clone()}),
            )
        })
        .collect();
    let tools = json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": properties}}}]);
    let (status, _, h) = post(&g, HARD, ask("m", json!("call f"), json!({"tools": tools}))).await;
    if status != 200 {
        return; // refused: the attack failed
    }
    let r = request(&g, &h);
    let sent = last_sent(&g, "oa")["tools"].clone();
    // The tools as Llama 3.1's template renders them: `tojson(indent=4)`.
    let mut rendered = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut rendered,
        serde_json::ser::PrettyFormatter::with_indent(b"    "),
    );
    serde::Serialize::serialize(&sent, &mut ser).unwrap();
    let counted = dec(&r.worst_case) * dec("1000000") - dec("100");
    assert!(
        counted >= rust_decimal::Decimal::from(rendered.len() as u64 / 16),
        "tools rendered with indent 4 are {} bytes; the bound counted {counted} tokens for the whole request (worst case {})",
        rendered.len(),
        r.worst_case
    );
    settle(&g).await;
}

/// HOLE (promise 3). "A stream cut before its closing usage leaves the output `None`, to
/// be charged at its bound, never at a running count" holds for Gemini (its running
/// `usageMetadata` is read as final only with the finish) but not for OpenAI-shaped
/// streams. The client's `stream_options` are forwarded with `include_usage` added, so
/// `continuous_usage_stats: true` (vLLM) makes every chunk carry a running usage; a
/// stream that the vendor cuts mid-answer is then booked at the last running count
/// (2 tokens here) instead of its bound, although generation went on past it.
#[tokio::test]
async fn a_cut_stream_is_not_booked_at_a_running_usage_count() {
    let g = gateway().await;
    g.vendors.script(
        "oa",
        vec![Script::StreamPieces(sse(&[
            openai_chunk(
                json!({"role": "assistant", "content": "Hel"}),
                None,
                json!({"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}),
            ),
            openai_chunk(
                json!({"content": "lo"}),
                None,
                json!({"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}),
            ),
            // The connection ends here: no finish reason, no closing usage, no [DONE].
        ]))],
    );
    let (_, _, h) = post(
        &g,
        HARD,
        ask(
            "m",
            json!("hi"),
            json!({"stream": true, "stream_options": {"continuous_usage_stats": true}}),
        ),
    )
    .await;
    quiesce(&g.db, 10).await;
    assert_eq!(
        last_sent(&g, "oa")["stream_options"]["continuous_usage_stats"],
        true,
        "the client's stream options are forwarded"
    );
    let a = request(&g, &h).attempts[0].clone();
    assert!(
        a.output_tokens.is_none_or(|o| o >= 100)
            && (a.cost_basis.as_deref() == Some("worst_case") || a.billing == "maybe_billed"),
        "a cut stream was booked at its running count: {:?} out, {} ({:?})",
        a.output_tokens,
        a.cost,
        a.cost_basis
    );
    settle(&g).await;
}

/// HOLE (promise 1, found by reading). OpenAI: "If `service_tier` is not set or `auto`,
/// the request is processed with the service tier configured in the Project settings"
/// (which may be priority, at about twice the rates). Purser forwarded a request without
/// `service_tier` as it was; at an entry that declares no tiers the worst case is proved
/// at the standard rates, so nothing sent pinned the tier the proof assumed.
///
/// Closed on OpenAI's platform, the only one where a project picks the tier: a request
/// naming none, for an entry declaring none, is sent `service_tier: "default"`
/// (`openai::pinned_tier`; the unit test `openai_pins_an_unset_tier_only_where_the_
/// project_would_pick_it` prepares it for `https://api.openai.com/v1`). This vendor is a
/// compatible server, where nothing is added (Groq names its tiers otherwise, and
/// stricter servers refuse unknown fields): an answer that still says it was served at
/// priority with no declared rates is booked at twice the standard rates, `estimated`,
/// never passed off as exact at the standard ones.
#[tokio::test]
async fn an_unset_service_tier_is_pinned_only_where_the_project_picks_it() {
    let g = gateway().await;
    g.vendors.script(
        "oa",
        vec![Script::Status(
            200,
            json!({"id": "chatcmpl-p", "object": "chat.completion", "created": 1, "model": "m",
                "service_tier": "priority",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 100, "total_tokens": 120}})
            .to_string(),
        )],
    );
    let (status, v, h) = post(&g, HARD, ask("m", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let sent = last_sent(&g, "oa");
    assert_eq!(sent.get("service_tier"), None, "{sent}");
    let a = request(&g, &h).attempts[0].clone();
    assert_eq!(a.cost_basis.as_deref(), Some("estimated"), "{a:?}");
    // 20 in and 100 out at twice 1/M.
    assert_eq!(dec(&a.cost), dec("0.00024"), "{a:?}");
    settle(&g).await;
}

/// Attacks on usage readings that FAILED: a completion count that is negative, a
/// string, a float or missing is not read as a count, so the output is charged at its
/// bound (cost basis `worst_case`), never at 0; a total above prompt + completion is
/// read as output.
#[tokio::test]
async fn usage_figures_of_the_wrong_type_are_charged_at_the_bound() {
    let g = gateway().await;
    let answer = |usage: Value| {
        Script::Status(
            200,
            json!({"id": "chatcmpl-u", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": usage})
            .to_string(),
        )
    };
    let odd = [
        json!({"prompt_tokens": 20, "completion_tokens": -5}),
        json!({"prompt_tokens": 20, "completion_tokens": "100"}),
        json!({"prompt_tokens": 20, "completion_tokens": 1.5}),
        json!({"prompt_tokens": 20}),
    ];
    g.vendors
        .script("oa", odd.iter().cloned().map(answer).collect());
    for u in &odd {
        let (status, v, h) = post(&g, HARD, ask("m", json!("hi"), json!({}))).await;
        assert_eq!(status, 200, "{v}");
        let a = request(&g, &h).attempts[0].clone();
        assert_eq!(a.cost_basis.as_deref(), Some("worst_case"), "{u}: {a:?}");
        assert!(dec(&a.cost) >= dec("0.0001"), "{u}: {}", a.cost);
    }
    g.vendors.script(
        "oa",
        vec![answer(
            json!({"prompt_tokens": 20, "completion_tokens": 0, "total_tokens": 90}),
        )],
    );
    let (_, _, h) = post(&g, HARD, ask("m", json!("hi"), json!({}))).await;
    assert_eq!(request(&g, &h).attempts[0].output_tokens, Some(70));
    settle(&g).await;
}

/// HOLE (promise 3, a vendor inconsistency read at the smaller figure). Anthropic's
/// `cache_creation.ephemeral_1h_input_tokens` is a part of `cache_creation_input_tokens`;
/// a part larger than its total implies the total is at least the part. `charge` keeps
/// the part as reported but subtracts it from an input total that never included it
/// (`plain = total − (reads + short + long)`, saturating), so the 1,000 uncached input
/// tokens vanish: the input is read at 1,000 although the figures imply 6,000.
#[tokio::test]
async fn a_cache_write_part_larger_than_its_total_does_not_erase_plain_input() {
    let g = gateway().await;
    g.vendors.script(
        "an",
        vec![Script::Status(
            200,
            json!({"id": "msg_w", "type": "message", "role": "assistant", "model": "c",
                "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 1000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                          "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 5000},
                          "output_tokens": 10}})
            .to_string(),
        )],
    );
    let (status, v, h) = post(&g, HARD, ask("c", json!("p".repeat(7000)), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let a = request(&g, &h).attempts[0].clone();
    // 1,000 plain at 3/M, 5,000 1-hour writes at the 2 × input stand-in (no write rate
    // is listed), 10 out at 15/M: 0.003 + 0.03 + 0.00015.
    assert!(
        a.input_tokens.unwrap_or(0) >= 6000 && dec(&a.cost) >= dec("0.03315"),
        "booked {:?} input tokens at {} ({:?})",
        a.input_tokens,
        a.cost,
        a.cost_basis
    );
    settle(&g).await;
}

/// HOLE (promise 3), Gemini's form of the OpenAI one: the translator keeps only the
/// latest `usageMetadata`; a closing chunk whose metadata is smaller than an earlier
/// one (a relay that re-sends a partial block after the finish) lowers the reading.
#[tokio::test]
async fn gemini_stream_a_later_usage_block_cannot_lower_the_reading() {
    let g = gateway().await;
    let chunk = |v: Value| format!("data: {v}");
    g.vendors.script(
        "ge",
        vec![Script::StreamPieces(sse(&[
            chunk(json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "hello"}]}, "index": 0}],
                "usageMetadata": {"promptTokenCount": 4000, "candidatesTokenCount": 1, "totalTokenCount": 4001}})),
            chunk(json!({"candidates": [{"content": {"role": "model", "parts": [{"text": " there"}]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 4000, "candidatesTokenCount": 90, "totalTokenCount": 4090}})),
            chunk(json!({"usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0}})),
        ]))],
    );
    let (status, text, h) = post(
        &g,
        HARD,
        ask("gfl", json!("p".repeat(5000)), json!({"stream": true})),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    quiesce(&g.db, 10).await;
    let a = request(&g, &h).attempts[0].clone();
    assert!(
        a.input_tokens.unwrap_or(0) >= 4000 && a.output_tokens.unwrap_or(0) >= 90,
        "the vendor reported 4,000 in / 90 out, then zeros: booked {:?} / {:?} at {}",
        a.input_tokens,
        a.output_tokens,
        a.cost
    );
    settle(&g).await;
}
