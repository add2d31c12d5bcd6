//! The OpenAI Responses ingress (`POST /v1/responses`), with the request Codex CLI
//! 0.169.0 really sends (`tests/fixtures/agents/`, 55 kB, recorded 2026-12-01) at full
//! size, through purser to a mock OpenAI vendor over loopback, on SQLite and
//! PostgreSQL: native pass-through with `max_output_tokens` added, the stream forwarded
//! byte for byte, usage from `response.completed` (cached and reasoning tokens), and
//! refusals in the Responses envelope with a status Codex does not retry.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::db::Engine;
use common::money::{assert_money_invariants_on, quiesce_on};
use common::vendors::Script;
use common::{Gateway, provider, sha};
use serde_json::{Value, json};

const KEY: &str = "sk-codex-client";
const MODEL: &str = "gpt-6.1-sol";
const UPSTREAM: &str = "gpt-6.1-sol-2026-11-01";
const PROVIDER: &str = "oai";

fn recorded() -> Value {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/agents/codex-0.169.0-say-hi.json"
    ))
    .unwrap();
    let v: Value = serde_json::from_str(&raw).unwrap();
    v["body"].clone()
}

fn docs(v: &common::vendors::Vendors, ceiling: &str, budget: Option<&str>) -> Vec<String> {
    let p = provider(v, PROVIDER, "openai", "us", &[]);
    let p = format!(
        "{p}  {MODEL}:\n    upstream: {UPSTREAM}\n    context_window: 400000\n    input_per_mtok: \"1.25\"\n    output_per_mtok: \"10\"\n    cached_input_per_mtok: \"0.125\"\n"
    );
    let budgets = budget
        .map(|b| format!("budgets:\n  - {{ period: day, limit: \"{b}\" }}\n"))
        .unwrap_or_default();
    vec![
        p,
        format!(
            "kind: policy\nid: agents\nclients:\n  - id: codex\n    key_sha256: \"{}\"\nmodels: [{MODEL}]\njurisdictions: [us]\nceiling:\n  per_request: \"{ceiling}\"\n  mode: hard\n  on_exceed: clamp\nmax_output_tokens: 32000\n{budgets}",
            sha(KEY)
        ),
    ]
}

async fn gateway(
    engine: Engine,
    test: &str,
    ceiling: &str,
    budget: Option<&str>,
) -> Option<Gateway> {
    let (c, b) = (ceiling.to_string(), budget.map(str::to_string));
    common::start_on(engine, test, move |v| docs(v, &c, b.as_deref())).await
}

async fn send(g: &Gateway, body: &Value) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/responses"))
        .bearer_auth(KEY)
        .header("accept", "text/event-stream")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let h = r.headers().clone();
    (status, h, r.bytes().await.unwrap().to_vec())
}

fn vendor_stream() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vendors/openai-responses.sse"
    ))
    .unwrap()
    .replace("{provider}", PROVIDER)
    .replace("{model}", UPSTREAM)
    .split("\n\n")
    .map(str::trim)
    .filter(|e| !e.is_empty())
    .map(|e| format!("{e}\n\n"))
    .collect()
}

async fn served_natively_on(engine: Engine) {
    let Some(g) = gateway(engine, "responses_native", "5.00", None).await else {
        return;
    };
    let body = recorded();
    assert!(
        body.to_string().len() > 50_000,
        "the fixture is at full size"
    );
    let (status, h, bytes) = send(&g, &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(h["content-type"], "text/event-stream");
    assert_eq!(String::from_utf8(bytes).unwrap(), vendor_stream());

    // Whole body through; the model id mapped and the policy's cap added, as Codex
    // sends none.
    let sent = g.vendors.sent(PROVIDER);
    assert_eq!(sent.len(), 1);
    let mut expected = body.clone();
    expected["model"] = json!(UPSTREAM);
    expected["max_output_tokens"] = json!(32_000);
    assert_eq!(sent[0].body, expected);

    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("served", "responses")
    );
    let a = &row.attempts[0];
    assert_eq!((a.input_tokens, a.output_tokens), (Some(3000), Some(40)));
    // 952 uncached × 1.25 + 2048 cached × 0.125 + 40 output (30 reasoning) × 10, per M.
    assert_eq!(a.cost, "0.001846");
    assert_eq!(a.cost_basis.as_deref(), Some("usage"));
    assert_cache_tokens(a);
    // Codex sends `store: false`: nothing to continue from, so no id is written.
    assert_eq!(a.response_id, None);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

/// The cache tokens of the mock's Responses answer: 2048 of the 3000 input tokens read
/// from the cache; OpenAI bills no cache writes (0) and has no cache lifetimes (null).
fn assert_cache_tokens(a: &purser::ledger::read::AttemptRow) {
    assert_eq!(
        (
            a.cache_read_tokens,
            a.cache_write_tokens,
            a.cache_write_5m_tokens,
            a.cache_write_1h_tokens
        ),
        (Some(2048), Some(0), None, None),
        "{a:?}"
    );
}

#[tokio::test]
async fn codex_request_is_served_natively_sqlite() {
    served_natively_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn codex_request_is_served_natively_postgres() {
    served_natively_on(Engine::Postgres).await;
}

#[tokio::test]
async fn a_plain_answer_is_the_vendors_own_and_priced_from_its_usage() {
    let g = gateway(Engine::Sqlite, "responses_plain", "5.00", None)
        .await
        .unwrap();
    let (status, h, bytes) =
        send(&g, &json!({"model": MODEL, "input": "hi", "store": false})).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(h["x-purser-cost"], "0.001846");
    quiesce_on(&g.ledger_db, 5).await;
    let row = g.ledger_db.last_request().await;
    assert_eq!(row.attempts[0].response_id, None, "`store: false`");
    assert_cache_tokens(&row.attempts[0]);
    // The vendor did not store it, so purser has nothing to bound a continuation with.
    let (status, _, bytes) = send(
        &g,
        &json!({"model": MODEL, "input": "more", "previous_response_id": v["id"]}),
    )
    .await;
    let e: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "previous_response_id", "{e}");
    assert_eq!(g.vendors.calls(PROVIDER), 1);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

fn money(s: &str) -> rust_decimal::Decimal {
    s.parse().unwrap()
}

/// A two-turn conversation through purser under a hard ceiling, the second turn naming
/// the first by `previous_response_id`: admitted, because the ledger recorded turn 1's
/// stored response and its tokens, and bounded with them. An id the ledger does not
/// hold is refused naming the field, with no call.
async fn continued_on(engine: Engine) {
    let Some(g) = gateway(engine, "responses_chain", "5.00", None).await else {
        return;
    };
    // Turn 1, streamed, stored (the API's default).
    let (status, h1, bytes) =
        send(&g, &json!({"model": MODEL, "input": "hi", "stream": true})).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(String::from_utf8(bytes).unwrap(), vendor_stream());
    // Turn 2 at once: the stream's last event waited for the ledger's record of it.
    let turn2 = json!({"model": MODEL, "input": [{"role": "user", "content": "and again"}],
                       "previous_response_id": "resp_01JRESP", "stream": true});
    let (status, h2, bytes) = send(&g, &turn2).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(
        g.vendors.sent(PROVIDER)[1].body["previous_response_id"],
        "resp_01JRESP",
        "passed through"
    );
    // The same turn as a fresh conversation: no hidden history.
    let mut fresh = turn2.clone();
    fresh
        .as_object_mut()
        .unwrap()
        .remove("previous_response_id");
    let (status, h3, _) = send(&g, &fresh).await;
    assert_eq!(status, 200);

    quiesce_on(&g.ledger_db, 5).await;
    let id =
        |h: &reqwest::header::HeaderMap| h["x-purser-request-id"].to_str().unwrap().to_string();
    let t1 = g.ledger_db.request(&id(&h1)).await;
    let a1 = &t1.attempts[0];
    assert_eq!(a1.response_id.as_deref(), Some("resp_01JRESP"));
    assert_eq!((a1.input_tokens, a1.output_tokens), (Some(3000), Some(40)));
    let (t2, t3) = (
        g.ledger_db.request(&id(&h2)).await,
        g.ledger_db.request(&id(&h3)).await,
    );
    assert_eq!(t2.outcome, "served");
    // Turn 2's bound holds turn 1's 3000 input and 40 output tokens and its one output
    // item's framing (32), at the dearest input rate: a GPT-5.6-or-later model writes
    // its cache by itself, at 1.25 × 1.25 per M; the rest of the difference is the bytes
    // of the field itself.
    let rate = money("1.5625") / money("1000000");
    let history = money("3072") * rate;
    let extra = money(&t2.worst_case) - money(&t3.worst_case);
    assert!(
        extra >= history && extra <= history + money("64") * rate,
        "turn 2 bound {} vs fresh {}: {extra} more, history {history}",
        t2.worst_case,
        t3.worst_case
    );

    // An id the ledger does not hold for this policy: refused, naming the field.
    let mut unknown = turn2.clone();
    unknown["previous_response_id"] = json!("resp_elsewhere");
    let (status, _, bytes) = send(&g, &unknown).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "previous_response_id");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`previous_response_id` `resp_elsewhere` is not a response purser recorded"),
        "{msg}"
    );
    assert_eq!(g.vendors.calls(PROVIDER), 3);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn a_continued_conversation_is_bounded_by_its_earlier_turn_sqlite() {
    continued_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn a_continued_conversation_is_bounded_by_its_earlier_turn_postgres() {
    continued_on(Engine::Postgres).await;
}

async fn spent_on(engine: Engine) {
    let Some(g) = gateway(engine, "responses_spent", "5.00", Some("0.01")).await else {
        return;
    };
    let (status, _, bytes) = send(&g, &recorded()).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    // 400: the one status Codex never retries.
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "budget_exhausted");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("purser (budget_exhausted)"), "{msg}");
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn a_spent_budget_is_a_400_codex_does_not_retry_sqlite() {
    spent_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn a_spent_budget_is_a_400_codex_does_not_retry_postgres() {
    spent_on(Engine::Postgres).await;
}

#[tokio::test]
async fn server_side_state_and_hosted_tools_are_refused_under_a_hard_ceiling() {
    let g = gateway(Engine::Sqlite, "responses_state", "5.00", None)
        .await
        .unwrap();
    for (extra, field) in [
        (
            json!({"previous_response_id": "resp_0"}),
            "previous_response_id",
        ),
        (json!({"previous_response_id": 7}), "previous_response_id"),
        (json!({"conversation": "conv_1"}), "conversation"),
        (json!({"tools": [{"type": "web_search"}]}), "tools[0]"),
    ] {
        let mut body = json!({"model": MODEL, "input": "hi"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, _, bytes) = send(&g, &body).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
    assert_eq!(g.vendors.calls(PROVIDER), 0);
}

/// The attack review's bodies (issue #22's new paths): input OpenAI expands from its
/// store by id, a shell run in a vendor container, and a screenshot under a model entry
/// that declares no image bound. Each is a 400 naming the field under a hard ceiling,
/// with no vendor call, and the ledger's money invariants hold.
async fn by_reference_on(engine: Engine) {
    let Some(g) = gateway(engine, "responses_by_reference", "5.00", None).await else {
        return;
    };
    for (body, field) in [
        (
            json!({"model": MODEL, "store": false, "max_output_tokens": 16, "input": [
                {"type": "item_reference", "id": "msg_67f0aaaabbbbccccdddd"}]}),
            "input[0]",
        ),
        (
            json!({"model": MODEL, "max_output_tokens": 16, "input": [
                {"role": "user", "content": "hi"}, {"id": "msg_67f0eeeeffff00001111"}]}),
            "input[1]",
        ),
        (
            json!({"model": MODEL, "max_output_tokens": 16, "input": [
                {"type": "reasoning", "id": "rs_67f0aaaabbbb", "summary": []},
                {"role": "user", "content": "go on"}]}),
            "input[0]",
        ),
        (
            json!({"model": MODEL, "max_output_tokens": 16, "input": [
                {"role": "user", "content": "make it blue"},
                {"type": "image_generation_call", "id": "ig_67f0aaaabbbb"}]}),
            "input[1]",
        ),
        (
            json!({"model": MODEL, "max_output_tokens": 16, "input": "run the test suite",
                "tools": [{"type": "shell", "environment": {"type": "container_auto"}}]}),
            "tools[0]",
        ),
        (
            json!({"model": MODEL, "max_output_tokens": 16, "input": [
                {"type": "computer_call_output", "call_id": "call_1", "output":
                    {"type": "computer_screenshot", "image_url": "https://example.com/s.png"}}]}),
            "input[0].output",
        ),
    ] {
        let (status, _, bytes) = send(&g, &body).await;
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{body}: {v}");
    }
    assert_eq!(g.vendors.calls(PROVIDER), 0);
    // A local shell is the client's tool: admitted and served.
    let (status, _, bytes) = send(
        &g,
        &json!({"model": MODEL, "max_output_tokens": 16, "input": "hi",
            "tools": [{"type": "shell", "environment": {"type": "local"}}]}),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(g.vendors.calls(PROVIDER), 1);
    quiesce_on(&g.ledger_db, 5).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn input_by_reference_and_a_hosted_shell_are_refused_naming_the_field_sqlite() {
    by_reference_on(Engine::Sqlite).await;
}

#[tokio::test]
async fn input_by_reference_and_a_hosted_shell_are_refused_naming_the_field_postgres() {
    by_reference_on(Engine::Postgres).await;
}

#[tokio::test]
async fn an_error_event_before_content_is_classified_as_the_same_error() {
    let g = gateway(Engine::Sqlite, "responses_error", "5.00", None)
        .await
        .unwrap();
    let err = r#"{"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached","param":null}"#;
    g.vendors
        .script(PROVIDER, vec![Script::StreamErrorAfter(2, err.into())]);
    let mut body = recorded();
    body["stream"] = json!(true);
    let (status, _, bytes) = send(&g, &body).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited");
    quiesce_on(&g.ledger_db, 5).await;
    let row = g.ledger_db.last_request().await;
    assert_eq!(row.attempts[0].class.as_deref(), Some("rate_limited"));
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

/// The `codex` executable: `PURSER_CODEX`, else `codex` on the PATH. `None` skips the
/// real-client tests, except under `CI=true`, where `.ci/run` installs it.
fn codex() -> Option<String> {
    let exe = std::env::var("PURSER_CODEX").unwrap_or_else(|_| "codex".into());
    let found = std::process::Command::new(&exe)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var("CI").as_deref() == Ok("true") {
        panic!("CI=true but Codex CLI (`{exe}`) is not installed: .ci/run installs it");
    }
    found.then_some(exe)
}

/// One `codex exec` turn through purser: success, stdout, stderr, time taken.
async fn codex_turn(exe: &str, g: &Gateway) -> (bool, String, String, std::time::Duration) {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "model = \"{MODEL}\"\nmodel_provider = \"gw\"\n[model_providers.gw]\nname = \"gw\"\nbase_url = \"http://{}/v1\"\nenv_key = \"GW_KEY\"\nwire_api = \"responses\"\n",
            g.addr
        ),
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = tokio::process::Command::new(exe)
        .args(["exec", "--skip-git-repo-check", "say hi"])
        .current_dir(work.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("CODEX_HOME", home.path())
        .env("GW_KEY", KEY)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), out)
        .await
        .expect("Codex did not exit within 60 s")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test]
async fn real_codex_turn_is_served_and_booked() {
    let Some(exe) = codex() else { return };
    let g = gateway(Engine::Sqlite, "responses_real_codex", "5.00", None)
        .await
        .unwrap();
    let (ok, stdout, stderr, _) = codex_turn(&exe, &g).await;
    assert!(ok, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains(&format!("Hello from {PROVIDER}.")),
        "{stdout}\n{stderr}"
    );
    quiesce_on(&g.ledger_db, 5).await;
    let row = g.ledger_db.last_request().await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("served", "responses")
    );
    let a = &row.attempts[0];
    assert_eq!((a.input_tokens, a.output_tokens), (Some(3000), Some(40)));
    assert_eq!(a.cost, "0.001846");
    assert_cache_tokens(a);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[PROVIDER]).await;
}

#[tokio::test]
async fn real_codex_exits_promptly_with_purser_reason_on_a_spent_budget() {
    let Some(exe) = codex() else { return };
    let g = gateway(Engine::Sqlite, "responses_real_spent", "5.00", Some("0.01"))
        .await
        .unwrap();
    let (ok, stdout, stderr, took) = codex_turn(&exe, &g).await;
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

// ---- Responses translated to chat completions for `api: anthropic` and `api: gemini`.

/// A gateway whose model `m` is served only by one destination of `api` (provider id
/// `ant` or `gem`), under a hard ceiling.
async fn translated_gateway(engine: Engine, test: &str, api: &'static str) -> Option<Gateway> {
    common::start_on(engine, test, move |v| {
        vec![
            provider(v, vendor_of(api), api, "eu", &[("m", "1", "2")])
                + "    media_tokens: { image: 1600 }\n",
            format!(
                "kind: policy\nid: p\nclients:\n  - id: c\n    key_sha256: \"{}\"\nmodels: [m]\njurisdictions: [eu]\nceiling:\n  per_request: \"1.00\"\n  mode: hard\nmax_output_tokens: 100\n",
                sha(KEY)
            ),
        ]
    })
    .await
}

fn vendor_of(api: &str) -> &'static str {
    match api {
        "anthropic" => "ant",
        _ => "gem",
    }
}

/// A Responses conversation with what translates faithfully: instructions, a developer
/// message, a function tool, an earlier function call and its output, an image.
fn translatable(stream: bool) -> Value {
    json!({
        "model": "m", "max_output_tokens": 50, "stream": stream, "store": false,
        "instructions": "be brief",
        "tools": [{"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}}],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "house rules"}]},
            {"role": "user", "content": "list files"},
            {"type": "function_call", "call_id": "t1", "name": "ls", "arguments": "{\"dir\":\".\"}"},
            {"type": "function_call_output", "call_id": "t1", "output": "a.txt"},
            {"role": "user", "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                {"type": "input_text", "text": "and this?"}]},
        ],
    })
}

/// The exact body each vendor gets for `translatable`: the chat adapters' own forms.
fn expected_sent(api: &str, stream: bool) -> Value {
    let mut b = match api {
        "anthropic" => json!({
            "model": "m", "max_tokens": 50, "system": "be brief\n\nhouse rules",
            "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "."}}]},
                // Two user turns in a row, as the chat adapter writes them: Anthropic
                // reads consecutive turns of one role as one.
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "text", "text": "and this?"}]},
            ],
            "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
        }),
        _ => json!({
            "systemInstruction": {"parts": [{"text": "be brief"}, {"text": "house rules"}]},
            "contents": [
                {"role": "user", "parts": [{"text": "list files"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"dir": "."}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"content": "a.txt"}}}]},
                {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}, {"text": "and this?"}]},
            ],
            "generationConfig": {"maxOutputTokens": 50},
            "tools": [{"functionDeclarations": [{"name": "ls", "description": "list", "parameters": {"type": "object"}}]}],
        }),
    };
    if stream && api == "anthropic" {
        b["stream"] = json!(true);
    }
    b
}

async fn translated_plain_on(engine: Engine, api: &'static str) {
    let Some(g) = translated_gateway(engine, &format!("responses_to_{api}_plain"), api).await
    else {
        return;
    };
    let vendor = vendor_of(api);
    let (status, h, out) = send(&g, &translatable(false)).await;
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    let sent = &g.vendors.sent(vendor)[0].body;
    assert_eq!(sent, &expected_sent(api, false), "{sent}");
    // The answer in the Responses shape, under the client's model name.
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "m");
    assert_eq!(v["output"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(
        v["output"][0]["content"],
        json!([{"type": "output_text", "text": format!("Hello from {vendor}."), "annotations": []}])
    );
    assert_eq!(
        (
            &v["usage"]["input_tokens"],
            &v["usage"]["output_tokens"],
            &v["usage"]["total_tokens"]
        ),
        (&json!(12), &json!(8), &json!(20))
    );
    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("served", "responses")
    );
    // 12 × 1 + 8 × 2 per million.
    assert_eq!(row.attempts[0].cost, "0.000028");
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[vendor]).await;
}

/// The data of each event in an SSE body, parsed.
fn event_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .collect()
}

async fn translated_stream_on(engine: Engine, api: &'static str) {
    let Some(g) = translated_gateway(engine, &format!("responses_to_{api}_stream"), api).await
    else {
        return;
    };
    let vendor = vendor_of(api);
    let (status, h, out) = send(&g, &translatable(true)).await;
    let text = String::from_utf8(out).unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(h["content-type"], "text/event-stream");
    let sent = &g.vendors.sent(vendor)[0].body;
    assert_eq!(sent, &expected_sent(api, true), "{sent}");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ],
        "{text}"
    );
    let ev = event_data(&text);
    let said: String = ev
        .iter()
        .filter_map(|e| e["delta"].as_str().map(str::to_string))
        .collect();
    assert_eq!(said, format!("Hello from {vendor}."));
    assert!(
        !text.contains("[DONE]") && !text.contains("chat.completion"),
        "{text}"
    );
    let done = &ev.last().unwrap()["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(
        done["output"][0]["content"][0]["text"],
        format!("Hello from {vendor}.")
    );
    assert_eq!(
        (
            &done["usage"]["input_tokens"],
            &done["usage"]["output_tokens"]
        ),
        (&json!(12), &json!(8)),
        "{done}"
    );
    quiesce_on(&g.ledger_db, 5).await;
    let row = g
        .ledger_db
        .request(h["x-purser-request-id"].to_str().unwrap())
        .await;
    assert_eq!(
        (row.outcome.as_str(), row.ingress.as_str()),
        ("served", "responses")
    );
    assert_eq!(row.attempts[0].cost, "0.000028");
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &[vendor]).await;
}

#[tokio::test]
async fn responses_to_an_anthropic_destination_are_answered_as_a_response_sqlite() {
    translated_plain_on(Engine::Sqlite, "anthropic").await;
}

#[tokio::test]
async fn responses_to_an_anthropic_destination_are_answered_as_a_response_postgres() {
    translated_plain_on(Engine::Postgres, "anthropic").await;
}

#[tokio::test]
async fn responses_streamed_to_an_anthropic_destination_come_back_as_responses_events_sqlite() {
    translated_stream_on(Engine::Sqlite, "anthropic").await;
}

#[tokio::test]
async fn responses_streamed_to_an_anthropic_destination_come_back_as_responses_events_postgres() {
    translated_stream_on(Engine::Postgres, "anthropic").await;
}

#[tokio::test]
async fn responses_to_a_gemini_destination_are_answered_as_a_response_sqlite() {
    translated_plain_on(Engine::Sqlite, "gemini").await;
}

#[tokio::test]
async fn responses_to_a_gemini_destination_are_answered_as_a_response_postgres() {
    translated_plain_on(Engine::Postgres, "gemini").await;
}

#[tokio::test]
async fn responses_streamed_to_a_gemini_destination_come_back_as_responses_events_sqlite() {
    translated_stream_on(Engine::Sqlite, "gemini").await;
}

#[tokio::test]
async fn responses_streamed_to_a_gemini_destination_come_back_as_responses_events_postgres() {
    translated_stream_on(Engine::Postgres, "gemini").await;
}

/// Anthropic's stream of one `tool_use` call of `ls` with `{"dir":"."}`, its input in
/// two deltas (30 input and 9 output tokens).
fn anthropic_tool_stream() -> Vec<Vec<u8>> {
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n").into_bytes();
    vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_t", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": null, "usage": {"input_tokens": 30, "output_tokens": 1}}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"dir\":"}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "\".\"}"}}),
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 9}}),
        ),
        ev("message_stop", json!({"type": "message_stop"})),
    ]
}

/// A function call round trip through an anthropic destination: the vendor's
/// `tool_use` comes back as a `function_call` item (plain and streamed), and the
/// client's next turn, the call and its output appended to the input, reaches the
/// vendor as the same `tool_use` and its `tool_result`.
#[tokio::test]
async fn a_function_call_round_trips_through_an_anthropic_destination() {
    let g = translated_gateway(Engine::Sqlite, "responses_to_anthropic_calls", "anthropic")
        .await
        .unwrap();
    let plain = r#"{"id":"msg_t","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Listing."},{"type":"tool_use","id":"toolu_1","name":"ls","input":{"dir":"."}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":9}}"#;
    let streamed = anthropic_tool_stream();
    g.vendors.script(
        "ant",
        vec![
            Script::Status(200, plain.into()),
            Script::StreamPieces(streamed),
        ],
    );
    let first = json!({"model": "m", "store": false, "input": "list files",
        "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]});
    let (status, _, out) = send(&g, &first).await;
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(status, 200, "{v}");
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0]["content"][0]["text"], "Listing.");
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["call_id"], "toolu_1");
    assert_eq!(output[1]["name"], "ls");
    assert_eq!(output[1]["arguments"], "{\"dir\":\".\"}");
    assert_eq!(v["usage"]["total_tokens"], 39);

    let mut streamed_req = first.clone();
    streamed_req["stream"] = json!(true);
    let (status, _, out) = send(&g, &streamed_req).await;
    let text = String::from_utf8(out).unwrap();
    assert_eq!(status, 200, "{text}");
    let ev = event_data(&text);
    let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ],
        "{text}"
    );
    assert_eq!(ev[2]["item"]["call_id"], "toolu_1");
    assert_eq!(ev[5]["arguments"], "{\"dir\":\".\"}");
    let done = &ev[7]["response"];
    assert_eq!(done["output"][0]["type"], "function_call");
    assert_eq!(done["usage"]["output_tokens"], 9);

    // The next turn: the call as the answer gave it, and its output.
    let mut next = first.clone();
    next["input"] = json!([
        {"role": "user", "content": "list files"},
        output[0],
        output[1],
        {"type": "function_call_output", "call_id": "toolu_1", "output": "a.txt"},
    ]);
    let (status, _, out) = send(&g, &next).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    let sent = &g.vendors.sent("ant")[2].body;
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"dir": "."}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]},
        ]),
        "{sent}"
    );
    quiesce_on(&g.ledger_db, 5).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["ant"]).await;
}

/// What has no faithful chat form is refused before any call, in the Responses
/// envelope, naming the field: the recorded Codex request (its `additional_tools` item
/// with namespaced tools and a custom tool), a hosted tool, encrypted reasoning, a
/// stored conversation, and a setting the chat table refuses for Anthropic. (A hosted
/// tool or a stored conversation is named by the bound first under a hard ceiling.)
#[tokio::test]
async fn untranslatable_responses_are_refused_naming_the_field() {
    let g = translated_gateway(
        Engine::Sqlite,
        "responses_to_anthropic_refused",
        "anthropic",
    )
    .await
    .unwrap();
    let mut codex = recorded();
    codex["model"] = json!("m");
    let hi = |extra: Value| {
        let mut b = json!({"model": "m", "input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (body, param, says) in [
        (codex, "input[0]", "additional_tools"),
        (
            hi(json!({"tools": [{"type": "web_search"}]})),
            "tools[0]",
            // Under a hard ceiling the bound names it first.
            "hosted tool",
        ),
        (
            hi(
                json!({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]}),
            ),
            "input[0].encrypted_content",
            "encrypted reasoning",
        ),
        (
            hi(json!({"previous_response_id": "resp_1"})),
            "previous_response_id",
            "not a response purser recorded",
        ),
        (hi(json!({"store": true})), "store", "keeps nothing"),
        (
            hi(
                json!({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}]}),
            ),
            "tools[0].strict",
            "strict",
        ),
    ] {
        let (status, _, out) = send(&g, &body).await;
        let e: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(status, 400, "{e}");
        assert_eq!(e["error"]["param"], param, "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(g.vendors.calls("ant"), 0);
    // Each refusal is booked as refused, with no attempt and nothing charged.
    assert_eq!(
        g.ledger_db
            .count("SELECT count(*) FROM requests WHERE outcome <> 'refused'")
            .await,
        0
    );
    assert_eq!(g.ledger_db.count("SELECT count(*) FROM attempts").await, 0);
    quiesce_on(&g.ledger_db, 5).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["ant"]).await;
}

/// The official `openai` SDK reads a translated answer with its own types: a plain
/// `responses.create` (its `output_text` and usage) and `responses.stream`, whose
/// accumulator checks every event against the items it has seen and builds the final
/// response from them, through an anthropic and a gemini destination; and a streamed
/// function call through the accumulator (anthropic).
#[tokio::test]
async fn the_openai_sdk_reads_translated_responses_plain_and_streamed() {
    if !common::sdk::prerequisite(
        common::sdk::python_has(&[]).is_ok(),
        "the openai Python SDK",
    ) {
        return;
    }
    for api in ["anthropic", "gemini"] {
        let g = translated_gateway(Engine::Sqlite, &format!("responses_sdk_{api}"), api)
            .await
            .unwrap();
        let script = r#"
import os, openai
c = openai.OpenAI(base_url=os.environ["BASE"], api_key=os.environ["KEY"], max_retries=0)
r = c.responses.create(model="m", input="hi", store=False)
print(r.output_text, r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens)
with c.responses.stream(model="m", input="hi", store=False) as s:
    for _ in s:
        pass
    f = s.get_final_response()
print(f.output_text, f.usage.input_tokens, f.usage.output_tokens, f.status)
"#;
        let out = tokio::process::Command::new(common::sdk::python())
            .arg("-c")
            .arg(script)
            .env("BASE", g.url("/v1"))
            .env("KEY", KEY)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{api}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let vendor = vendor_of(api);
        assert_eq!(
            stdout,
            format!("Hello from {vendor}. 12 8 20\nHello from {vendor}. 12 8 completed\n"),
            "{api}"
        );
        if api == "anthropic" {
            // A streamed function call, through the SDK's accumulator.
            g.vendors
                .script("ant", vec![Script::StreamPieces(anthropic_tool_stream())]);
            let script = r#"
import os, openai
c = openai.OpenAI(base_url=os.environ["BASE"], api_key=os.environ["KEY"], max_retries=0)
tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}, "strict": False}]
with c.responses.stream(model="m", input="list", tools=tools, store=False) as s:
    for _ in s:
        pass
    f = s.get_final_response()
o = f.output[0]
print(o.type, o.call_id, o.name, o.arguments, f.usage.output_tokens)
"#;
            let out = tokio::process::Command::new(common::sdk::python())
                .arg("-c")
                .arg(script)
                .env("BASE", g.url("/v1"))
                .env("KEY", KEY)
                .output()
                .await
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(stdout, "function_call toolu_1 ls {\"dir\":\".\"} 9\n");
        }
        quiesce_on(&g.ledger_db, 5).await;
        assert_money_invariants_on(&g.ledger_db, &g.vendors, &[vendor]).await;
    }
}
