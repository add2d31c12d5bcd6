//! Bound every byte that is sent (issue #20, defects 1, 3 price half, 4): one test per
//! defect, real HTTP on loopback against the mock vendors, each ending with the
//! ledger's money invariants.
//!
//! - what is forwarded is counted (any part type, any message key, Gemini's media by
//!   type, Anthropic's tool-use system prompt) or refused;
//! - prices the table could not express (service tiers asked and served, long-context
//!   tiers, 1-hour cache writes, reasoning billed beyond the cap);
//! - the cap goes in the field each model reads, and Gemini gets a thinking budget.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::money::{assert_money_invariants, quiesce};
use common::vendors::{Script, Vendors};
use common::{Gateway, sha};
use purser::ledger::read::RequestRow;
use serde_json::{Value, json};

const HARD: &str = "key-bound-hard";
const BUDGET: &str = "key-bound-budget";
const LOOSE: &str = "key-bound-loose";
const TOOLS: &str = "key-bound-tools";
const PROVIDERS: [&str; 3] = ["oa", "an", "ge"];

/// A provider document with model entries written out in full (`models` is YAML).
fn provider(v: &Vendors, id: &str, api: &str, models: &str) -> String {
    format!(
        "kind: provider\nid: {id}\napi: {api}\nbase_url: {}\njurisdiction: us\ntimeout_ms: 3000\nmodels:\n{models}",
        v.base_url(id, api)
    )
}

fn policy(id: &str, key: &str, models: &str, ceiling: &str, extra: &str) -> String {
    format!(
        "kind: policy\nid: {id}\nclients:\n  - {{ id: {id}-bot, key_sha256: \"{}\" }}\nmodels: [{models}]\njurisdictions: [us]\nceiling: {ceiling}\nmax_output_tokens: 100\n{extra}",
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
    input_per_mtok: "0.15"
    output_per_mtok: "0.60"
  md:
    upstream: m
    context_window: 1000000
    input_per_mtok: "0.15"
    output_per_mtok: "0.60"
    media_tokens: { file: 100000, image: 1000 }
  o3:
    upstream: o3-mini
    context_window: 200000
    input_per_mtok: "1.10"
    output_per_mtok: "4.40"
  g4:
    upstream: gpt-4o-mini
    context_window: 128000
    input_per_mtok: "0.15"
    output_per_mtok: "0.60"
  cf:
    upstream: house-reasoner
    cap_field: max_completion_tokens
    context_window: 128000
    input_per_mtok: "0.15"
    output_per_mtok: "0.60"
  ds:
    upstream: deepseek-reasoner
    context_window: 128000
    input_per_mtok: "0.55"
    output_per_mtok: "2.19"
  d:
    context_window: 128000
    input_per_mtok: "1"
    output_per_mtok: "0"
  pt:
    context_window: 128000
    input_per_mtok: "1"
    output_per_mtok: "4"
    service_tiers:
      priority: { input_per_mtok: "2", output_per_mtok: "8" }
      flex: { input_per_mtok: "0.5", output_per_mtok: "2" }
"#,
        ),
        provider(
            v,
            "an",
            "anthropic",
            r#"  c:
    context_window: 200000
    input_per_mtok: "500"
    output_per_mtok: "0"
    cache_write_per_mtok: "625"
    cache_write_1h_per_mtok: "1000"
  d:
    context_window: 200000
    input_per_mtok: "0.45"
    output_per_mtok: "0"
    cache_write_1h_per_mtok: "0.9"
  c1h:
    upstream: claude-sonnet-4-6
    context_window: 200000
    input_per_mtok: "3"
    output_per_mtok: "15"
    cached_input_per_mtok: "0.30"
    cache_write_per_mtok: "3.75"
    cache_write_1h_per_mtok: "6"
"#,
        ),
        provider(
            v,
            "ge",
            "gemini",
            r#"  g:
    context_window: 1000000
    input_per_mtok: "0.10"
    output_per_mtok: "0.40"
    media_tokens: { image: 1600, video: 200000 }
  gp:
    upstream: gemini-2.5-pro
    context_window: 1000000
    input_per_mtok: "1.25"
    output_per_mtok: "10"
    long_context: { above_input_tokens: 10, input_per_mtok: "2.50", output_per_mtok: "15" }
  gl:
    upstream: gemini-2.5-flash-lite
    context_window: 1000000
    input_per_mtok: "0.10"
    output_per_mtok: "0.40"
"#,
        ),
        policy(
            "hard",
            HARD,
            "m, md, g, ds, pt, gp, c1h",
            "{ per_request: \"0.02\", mode: hard }",
            "",
        ),
        policy(
            "budget",
            BUDGET,
            "m",
            "{ per_request: \"5\", mode: soft }",
            "budgets: [ { period: day, limit: \"10\" } ]\n",
        ),
        policy(
            "loose",
            LOOSE,
            "m, o3, g4, cf, gp, gl, d",
            "{ per_request: \"5\", mode: soft }",
            "",
        ),
        policy(
            "tools",
            TOOLS,
            "c",
            "{ per_request: \"0.7\", mode: hard }",
            "",
        ),
    ]
}

async fn gateway() -> Gateway {
    common::start(docs).await
}

async fn post(g: &Gateway, key: &str, body: Value) -> (u16, Value, reqwest::header::HeaderMap) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.json().await.unwrap_or(Value::Null), headers)
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

fn refused_naming(status: u16, v: &Value, param: &str) {
    assert_eq!(
        (
            status,
            v["error"]["code"].as_str(),
            v["error"]["param"].as_str()
        ),
        (400, Some("invalid_request"), Some(param)),
        "{v}"
    );
}

/// Defect 1: parts and fields that were forwarded but not counted.
#[tokio::test]
async fn what_is_sent_is_counted_or_refused() {
    let g = gateway().await;
    let file = json!([
        {"type": "text", "text": "summarise"},
        {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjcK"}}
    ]);

    // A file part has no bound from its bytes: refused under a hard ceiling and under a
    // policy with a budget, naming the part; sent only where nothing is held to a bound.
    let (status, v, _) = post(&g, HARD, ask("m", file.clone(), json!({}))).await;
    refused_naming(status, &v, "messages[0].content[1]");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("media_tokens.file"),
        "{v}"
    );
    let (status, v, _) = post(&g, BUDGET, ask("m", file.clone(), json!({}))).await;
    refused_naming(status, &v, "messages[0].content[1]");
    assert_eq!(g.vendors.calls("oa"), 0, "nothing unbounded was sent");
    let (status, v, _) = post(&g, LOOSE, ask("m", file.clone(), json!({}))).await;
    assert_eq!(status, 200, "soft with no budget: {v}");

    // Declared on the model entry, the file counts its bound: 100,000 tokens × 0.15/M.
    let (status, v, h) = post(&g, HARD, ask("md", file, json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert!(dec(&request(&g, &h).worst_case) >= dec("0.015"));

    // Any message key is sent, so it is counted: 400 kB of an assistant turn's
    // `reasoning_content` (vLLM renders it into the prompt) is 400k tokens × 0.15/M.
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "reasoning_content": "r".repeat(400_000)},
        {"role": "user", "content": "go on"}]});
    let calls = g.vendors.calls("oa");
    let (status, v, _) = post(&g, HARD, body).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (402, Some("ceiling_exceeded")),
        "{v}"
    );
    assert_eq!(g.vendors.calls("oa"), calls);

    // Gemini reads an image_url by its media type: a PNG is an image (1,600 tokens),
    // an MP4 a video, whose soundtrack Gemini bills as audio, at a rate this entry does
    // not list (refused, where an image would have been served), a URL of unknown type
    // needs every kind declared.
    let url = |u: &str| json!([{"type": "image_url", "image_url": {"url": u}}]);
    let (status, v, _) = post(&g, HARD, ask("g", url("https://x.test/cat.png"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        last_sent(&g, "ge")["contents"][0]["parts"][0]["fileData"]["mimeType"],
        "image/png"
    );
    let (status, v, _) = post(
        &g,
        HARD,
        ask("g", url("https://x.test/talk.mp4"), json!({})),
    )
    .await;
    refused_naming(status, &v, "messages[0].content[0]");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("audio_input_per_mtok")),
        "a video is not one image: {v}"
    );
    let (status, v, _) = post(&g, HARD, ask("g", url("https://x.test/blob"), json!({}))).await;
    refused_naming(status, &v, "messages[0].content[0]");
    assert_eq!(g.vendors.calls("ge"), 1);

    // Anthropic adds a tool-use system prompt (up to 530 tokens) when tools are sent.
    // At 1,000/M (the 1-hour cache-write rate) a 0.7 ceiling is 700 input tokens: the
    // request fits without tools and does not with one small tool.
    let (status, v, _) = post(&g, TOOLS, ask("c", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let tool = json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
    let (status, v, _) = post(&g, TOOLS, ask("c", json!("hi"), tool)).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (402, Some("ceiling_exceeded")),
        "the tool-use system prompt is counted: {v}"
    );
    assert_eq!(g.vendors.calls("an"), 1);
    settle(&g).await;
}

/// Defect 4: the cap goes in the field each model reads, exactly one of them; Gemini
/// thinking models get a thinking budget; reasoning billed beyond the cap is bounded.
#[tokio::test]
async fn the_cap_goes_in_the_field_each_model_reads() {
    let g = gateway().await;
    let caps = |b: &Value| {
        (
            b.get("max_tokens").cloned(),
            b.get("max_completion_tokens").cloned(),
        )
    };
    // An OpenAI reasoning model, no cap from the client: the policy's, in
    // max_completion_tokens.
    let (status, v, _) = post(&g, LOOSE, ask("o3", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(caps(&last_sent(&g, "oa")), (None, Some(json!(100))));
    // The client sent max_tokens: moved to the field the model reads.
    let (status, v, _) = post(&g, LOOSE, ask("o3", json!("hi"), json!({"max_tokens": 50}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(caps(&last_sent(&g, "oa")), (None, Some(json!(50))));
    // Any other model reads max_tokens, whichever field the client used.
    let (status, v, _) = post(
        &g,
        LOOSE,
        ask("g4", json!("hi"), json!({"max_completion_tokens": 40})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(caps(&last_sent(&g, "oa")), (Some(json!(40)), None));
    // The model entry says so: its field.
    let (status, v, _) = post(&g, LOOSE, ask("cf", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(caps(&last_sent(&g, "oa")), (None, Some(json!(100))));

    // Gemini 2.5 Pro thinks: held to a budget. Flash-Lite does not unless asked.
    let (status, v, _) = post(&g, LOOSE, ask("gp", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let config = &last_sent(&g, "ge")["generationConfig"];
    assert_eq!(config["thinkingConfig"]["thinkingBudget"], 8192, "{config}");
    assert_eq!(config["maxOutputTokens"], 100);
    let (status, v, _) = post(&g, LOOSE, ask("gl", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        last_sent(&g, "ge")["generationConfig"]
            .get("thinkingConfig")
            .is_none()
    );

    // DeepSeek's reasoner bills up to 32K of reasoning beyond max_tokens: 100 output
    // tokens fit a 0.02 ceiling, 32,868 at 2.19/M do not.
    let calls = g.vendors.calls("oa");
    let (status, v, _) = post(&g, HARD, ask("ds", json!("hi"), json!({}))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (402, Some("ceiling_exceeded")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reasoning"),
        "{v}"
    );
    assert_eq!(g.vendors.calls("oa"), calls);
    settle(&g).await;
}

fn openai_answer(tier: &str, prompt: u64, completion: u64) -> Script {
    Script::Status(
        200,
        json!({"id": "chatcmpl-t", "object": "chat.completion", "created": 1, "model": "pt",
            "service_tier": tier,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
        .to_string(),
    )
}

fn attempt_cost(g: &Gateway, h: &reqwest::header::HeaderMap) -> (String, Option<String>) {
    let r = request(g, h);
    let a = r.attempts.last().unwrap();
    (a.cost.clone(), a.cost_basis.clone())
}

/// Defect 3, the price half: prices the vendor bills that the table could not express.
#[tokio::test]
async fn prices_the_vendor_bills_are_charged() {
    let g = gateway().await;

    // A service tier with declared rates is bounded (worst case at its rates) and the
    // tier the answer says was served is charged.
    g.vendors.script(
        "oa",
        vec![
            openai_answer("priority", 1_000, 100),
            openai_answer("priority", 1_000, 100),
            openai_answer("default", 1_000, 100),
            openai_answer("scale", 1_000, 100),
        ],
    );
    let (status, v, h) = post(
        &g,
        HARD,
        ask("pt", json!("hi"), json!({"service_tier": "priority"})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    // 1,000 × 2/M + 100 × 8/M
    assert_eq!(
        attempt_cost(&g, &h),
        ("0.0028".into(), Some("usage".into()))
    );
    // Not asked for, but served at priority (a project's default tier): priority.
    let (status, v, h) = post(&g, HARD, ask("pt", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        attempt_cost(&g, &h),
        ("0.0028".into(), Some("usage".into()))
    );
    // Served at the standard tier: standard rates, 1,000 × 1/M + 100 × 4/M.
    let (status, v, h) = post(&g, HARD, ask("pt", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        attempt_cost(&g, &h),
        ("0.0014".into(), Some("usage".into()))
    );
    // A tier the table cannot name: the dearest declared rates, marked estimated.
    let (status, v, h) = post(&g, HARD, ask("pt", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        attempt_cost(&g, &h),
        ("0.0028".into(), Some("estimated".into()))
    );
    // A tier the model entry has no rates for is not bounded: refused.
    let (status, v, _) = post(
        &g,
        HARD,
        ask("m", json!("hi"), json!({"service_tier": "priority"})),
    )
    .await;
    refused_naming(status, &v, "service_tier");

    // Gemini 2.5 Pro's long-context rates (here above 10 input tokens): the mock bills
    // 12 prompt and 8 output tokens, 12 × 2.50/M + 8 × 15/M.
    let (status, v, h) = post(&g, LOOSE, ask("gp", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(attempt_cost(&g, &h).0, "0.00015");

    // Anthropic's 1-hour cache writes at their rate: 10 × 3 + 1,000 × 6 + 5 × 15, per M,
    // where the answer says the inference ran anywhere (`global`); kept in one region
    // (the workspace's default, which the request did not name), 1.1× that; not said,
    // the premium too (the model may run where its workspace says), marked estimated.
    let answer = |geo: Option<&str>| {
        let mut usage = json!({"input_tokens": 10, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 1000,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 1000},
            "output_tokens": 5});
        if let Some(geo) = geo {
            usage["inference_geo"] = json!(geo);
        }
        Script::Status(
            200,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "c1h",
                "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": usage})
            .to_string(),
        )
    };
    g.vendors.script(
        "an",
        vec![answer(Some("global")), answer(Some("us")), answer(None)],
    );
    for want in [
        ("0.006105", "usage"),
        ("0.0067155", "usage"),
        ("0.0067155", "estimated"),
    ] {
        let (status, v, h) = post(&g, HARD, ask("c1h", json!("hi"), json!({}))).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(attempt_cost(&g, &h), (want.0.into(), Some(want.1.into())));
    }
    settle(&g).await;
}

/// The new model-entry fields are optional (a plan without them keeps its id) and
/// checked: a malformed tier price is an error at its path, a cap field on an API that
/// has one cap a warning.
#[test]
fn model_entry_fields_are_optional_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let write = |models: &str| {
        std::fs::write(
            dir.path().join("set.yaml"),
            format!(
                "kind: gateway\ncurrency: USD\n---\nkind: provider\nid: an\napi: anthropic\nbase_url: https://api.anthropic.com/v1\njurisdiction: us\nmodels:\n  c:\n    context_window: 1000\n    input_per_mtok: \"1\"\n    output_per_mtok: \"2\"\n{models}"
            ),
        )
        .unwrap();
    };
    write("");
    let plain = purser::policy::compile_dir(dir.path()).unwrap();
    assert!(plain.warnings().is_empty());
    write("    cap_field: max_completion_tokens\n");
    let warned = purser::policy::compile_dir(dir.path()).unwrap();
    assert_eq!(
        warned.warnings().iter().map(|d| d.code).collect::<Vec<_>>(),
        ["cap-field-unused"]
    );
    write("    service_tiers: { priority: { input_per_mtok: \"two\", output_per_mtok: \"4\" } }\n");
    let e = purser::policy::compile_dir(dir.path()).unwrap_err();
    assert!(
        e.0.iter()
            .any(|d| d.message.contains("service_tiers")
                || d.at.to_string().contains("service_tiers")),
        "{e:?}"
    );
    // A plan written before these fields keeps its id when none is set.
    write("    media_tokens: {}\n");
    assert_eq!(
        purser::policy::compile_dir(dir.path()).unwrap().id(),
        plain.id()
    );
}

/// `explain` shows what a soft policy with a budget reserves (a real bound), and that a
/// part with no declared bound is refused there, not counted as a guess.
#[test]
fn explain_shows_the_soft_reservation_and_refuses_an_undeclared_part() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("set.yaml"),
        format!(
            "kind: gateway\ncurrency: USD\n---\nkind: provider\nid: oa\napi: openai\nbase_url: https://api.openai.com/v1\njurisdiction: us\nmodels:\n  m:\n    context_window: 100000\n    input_per_mtok: \"1\"\n    output_per_mtok: \"2\"\n    media_tokens: {{ image: 1000 }}\n---\n{}",
            policy(
                "soft",
                BUDGET,
                "m",
                "{ per_request: \"5\", mode: soft }",
                "budgets: [ { period: day, limit: \"10\" } ]\n"
            )
        ),
    )
    .unwrap();
    let explain = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
            .args([
                "explain",
                dir.path().to_str().unwrap(),
                "--policy",
                "soft",
                "--model",
                "m",
            ])
            .args(extra)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    // 1000 bytes + 32 + 64 + one image at 1000 tokens, × 1/M; 100 out × 2/M.
    let s = explain(&["--part", "image"]);
    assert!(s.contains("2096 in × 1.00/M + 100 out × 2.00/M"), "{s}");
    assert!(
        s.contains("reserved in every budget before the call: 0.002296 USD (mode soft"),
        "{s}"
    );
    let s = explain(&["--part", "video"]);
    assert!(s.contains("refused: invalid_request (400)"), "{s}");
    assert!(s.contains("media_tokens.video"), "{s}");
}

/// Selection bounds the request per destination: the same request is a different body
/// at each API. Without tools Anthropic (0.90/M at its dearest input class) is the
/// cheaper home for `d`; with one tool its 530-token tool-use prompt makes OpenAI
/// (1/M, 256 for a tool preamble) the cheaper one.
#[tokio::test]
async fn each_destination_is_bounded_on_what_it_receives() {
    let g = gateway().await;
    let (status, v, h) = post(&g, LOOSE, ask("d", json!("hi"), json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(h["x-purser-provider"], "an");
    let tool = json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
    let (status, v, h) = post(&g, LOOSE, ask("d", json!("hi"), tool)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(h["x-purser-provider"], "oa");
    settle(&g).await;
}
