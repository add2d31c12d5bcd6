//! Every billed token class reaches the ledger at its rate, and a success whose usage
//! is missing is charged its worst case: the attempt rows after answers from the mock
//! vendors carrying cached input, cache writes, reasoning and thought tokens, or no
//! usage at all, plain and streamed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::time::Duration;

use common::vendors::{Script, Vendors};
use common::{Gateway, sha};
use purser::money::Money;
use serde_json::{Value, json};

const KEY: &str = "key-usage";

/// A provider document whose one model lists these rates (in, out, cached, write).
fn provider(v: &Vendors, id: &str, api: &str, model: &str, rates: [Option<&str>; 4]) -> String {
    let mut s = format!(
        "kind: provider\nid: {id}\napi: {api}\nbase_url: {}\njurisdiction: us\ntimeout_ms: 2000\nmodels:\n  {model}:\n    context_window: 100000\n",
        v.base_url(id, api)
    );
    let names = [
        "input_per_mtok",
        "output_per_mtok",
        "cached_input_per_mtok",
        "cache_write_per_mtok",
    ];
    for (name, rate) in names.iter().zip(rates) {
        if let Some(r) = rate {
            s.push_str(&format!("    {name}: \"{r}\"\n"));
        }
    }
    s
}

async fn gateway() -> Gateway {
    common::start(|v| {
        vec![
            provider(v, "oa", "openai", "o", [Some("2"), Some("10"), Some("0.5"), None]),
            // 1-hour cache writes listed too (Anthropic bills them at 2× input by
            // default; listed here below that so the two models' worst cases differ).
            provider(v, "an", "anthropic", "a", [Some("3"), Some("15"), Some("0.3"), Some("3.75")])
                + "    cache_write_1h_per_mtok: \"4.5\"\n",
            // No cache rates: cache reads and writes are priced by stand-ins.
            provider(v, "ax", "anthropic", "x", [Some("3"), Some("15"), None, None]),
            provider(v, "ge", "gemini", "g", [Some("1"), Some("4"), Some("0.25"), None]),
            format!(
                "kind: policy\nid: p\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [o, a, x, g]\njurisdictions: [us]\nceiling: {{ per_request: \"5\", mode: soft }}\nmax_output_tokens: 1000\n",
                sha(KEY)
            ),
        ]
    })
    .await
}

/// A prompt long enough that the fixtures' input counts (up to 4,012 tokens) sit
/// within the request's input bound, as a real vendor's would.
fn body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream,
           "messages": [{"role": "user", "content": "x".repeat(6000)}]})
}

/// Send one request; its id and the client's usage block (the stream's closing one).
async fn send(g: &Gateway, model: &str, stream: bool) -> (String, Value) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body(model, stream))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{model}");
    let id = r.headers()["x-purser-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let text = r.text().await.unwrap();
    let usage = if stream {
        text.lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
            .unwrap_or(Value::Null)
    } else {
        serde_json::from_str::<Value>(&text).unwrap()["usage"].clone()
    };
    (id, usage)
}

/// The request's one attempt from the audit API, once its end is recorded.
async fn attempt(g: &Gateway, id: &str) -> Value {
    for _ in 0..300 {
        let r = g.admin_json(&format!("/audit/v1/requests/{id}")).await;
        if r["outcome"] != "in_flight" {
            let attempts = r["attempts"].as_array().unwrap();
            assert_eq!(attempts.len(), 1, "{r}");
            return attempts[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request {id} never left in_flight");
}

fn money(v: &Value) -> Money {
    v.as_str().unwrap().parse().unwrap()
}

/// Σ tokens × rate per million.
fn cost(parts: &[(u64, &str)]) -> Money {
    let total: rust_decimal::Decimal = parts
        .iter()
        .map(|(n, rate)| rust_decimal::Decimal::from(*n) * rate.parse::<Money>().unwrap().decimal())
        .sum();
    Money::new(total / rust_decimal::Decimal::from(1_000_000))
}

async fn check(g: &Gateway, model: &str, provider: &str, fixture: &'static str, want: Want) {
    for stream in [false, true] {
        g.vendors.script(provider, vec![Script::Fixture(fixture)]);
        let (id, usage) = send(g, model, stream).await;
        let a = attempt(g, &id).await;
        let what = format!("{fixture} (stream: {stream}): {a}");
        assert_eq!(a["billing"], "billed", "{what}");
        assert_eq!(money(&a["cost"]), want.cost, "{what}");
        assert_eq!(a["cost_basis"], want.basis, "{what}");
        assert_eq!(
            (a["input_tokens"].as_u64(), a["output_tokens"].as_u64()),
            (Some(want.tokens.0), Some(want.tokens.1)),
            "{what}"
        );
        // The ledger keeps the cache parts apart: read, written, and the writes by
        // cache lifetime where the vendor split them.
        let cache = [
            "cache_read_tokens",
            "cache_write_tokens",
            "cache_write_5m_tokens",
            "cache_write_1h_tokens",
        ]
        .map(|k| a[k].as_u64());
        assert_eq!(cache, want.ledger_cache, "{what}");
        // The client is told the same totals, with the parts OpenAI's shape names.
        assert_eq!(usage["prompt_tokens"], want.tokens.0, "{what}: {usage}");
        assert_eq!(usage["completion_tokens"], want.tokens.1, "{what}: {usage}");
        if let Some(n) = want.cached {
            assert_eq!(
                usage["prompt_tokens_details"]["cached_tokens"], n,
                "{what}: {usage}"
            );
        }
        if let Some(n) = want.reasoning {
            assert_eq!(
                usage["completion_tokens_details"]["reasoning_tokens"], n,
                "{what}: {usage}"
            );
        }
    }
}

struct Want {
    cost: Money,
    basis: &'static str,
    tokens: (u64, u64),
    cached: Option<u64>,
    reasoning: Option<u64>,
    /// The ledger's cache columns: read, written, written for 5 minutes, for 1 hour.
    ledger_cache: [Option<u64>; 4],
}

#[tokio::test]
async fn openai_cached_tokens_are_charged_at_the_cached_rate() {
    let g = gateway().await;
    // 2000 prompt tokens, 1536 of them cached; 300 completion, 256 of them reasoning.
    let want = Want {
        cost: cost(&[(464, "2"), (1536, "0.5"), (300, "10")]),
        basis: "usage",
        tokens: (2000, 300),
        cached: Some(1536),
        reasoning: Some(256),
        // OpenAI bills no cache writes and has no cache lifetimes.
        ledger_cache: [Some(1536), Some(0), None, None],
    };
    check(&g, "o", "oa", "openai-usage-detail", want).await;
}

#[tokio::test]
async fn anthropic_cache_reads_and_writes_are_charged_at_their_rates() {
    let g = gateway().await;
    // 12 uncached input, 3000 read from the cache, 1000 written to it; 8 output.
    let want = Want {
        cost: cost(&[(12, "3"), (3000, "0.3"), (1000, "3.75"), (8, "15")]),
        basis: "usage",
        tokens: (4012, 8),
        cached: Some(3000),
        reasoning: None,
        ledger_cache: [Some(3000), Some(1000), Some(1000), Some(0)],
    };
    check(&g, "a", "an", "anthropic-cache", want).await;
}

#[tokio::test]
async fn cache_tokens_without_rates_are_charged_conservatively_and_marked_estimated() {
    let g = gateway().await;
    // Reads at the input rate, writes at twice it.
    let want = Want {
        cost: cost(&[(12, "3"), (3000, "3"), (1000, "6"), (8, "15")]),
        basis: "estimated",
        tokens: (4012, 8),
        cached: Some(3000),
        reasoning: None,
        ledger_cache: [Some(3000), Some(1000), Some(1000), Some(0)],
    };
    check(&g, "x", "ax", "anthropic-cache", want).await;
}

#[tokio::test]
async fn gemini_thoughts_are_charged_as_output() {
    let g = gateway().await;
    // 1200 prompt tokens, 1024 cached; 8 candidate and 120 thought tokens.
    let want = Want {
        cost: cost(&[(176, "1"), (1024, "0.25"), (128, "4")]),
        basis: "usage",
        tokens: (1200, 128),
        cached: Some(1024),
        reasoning: Some(120),
        // Gemini bills cache storage by the hour, outside the call: no writes in it.
        ledger_cache: [Some(1024), Some(0), None, None],
    };
    check(&g, "g", "ge", "gemini-thoughts", want).await;
}

#[tokio::test]
async fn a_success_without_usage_is_charged_its_worst_case() {
    let g = gateway().await;
    let cases = [
        ("o", "oa", "openai-no-usage", false),
        ("o", "oa", "openai-no-usage", true),
        ("a", "an", "anthropic-no-usage", false),
        ("g", "ge", "gemini-no-usage", false),
    ];
    for (model, provider, fixture, stream) in cases {
        g.vendors.script(provider, vec![Script::Fixture(fixture)]);
        let (id, _) = send(&g, model, stream).await;
        let a = attempt(&g, &id).await;
        let what = format!("{fixture} (stream: {stream}): {a}");
        assert_eq!(a["billing"], "billed", "{what}");
        assert_eq!(a["cost_basis"], "worst_case", "{what}");
        assert!(money(&a["worst_case"]).is_positive(), "{what}");
        assert_eq!(money(&a["cost"]), money(&a["worst_case"]), "{what}");
    }
}

#[tokio::test]
async fn an_anthropic_worst_case_prices_input_at_the_dearest_input_rate() {
    // The same request to `a` (cache writes listed at 3.75, 1-hour ones at 4.5) and to
    // `x` (no rate: 2 × 3): their worst cases differ by the input bound × (6 − 4.5),
    // which pins the bound, and each prices it at its dearest cache-write rate, not at
    // the input rate of 3. Their ids (`a`, `x`) may be aliases of a Claude that a
    // workspace keeps in one region, so every rate carries the 1.1× premium
    // (`policy::family::may_bill_regional_premium`).
    let g = gateway().await;
    let mut worst = Vec::new();
    for (model, provider) in [("a", "an"), ("x", "ax")] {
        g.vendors
            .script(provider, vec![Script::Fixture("anthropic-no-usage")]);
        let (id, _) = send(&g, model, false).await;
        let a = attempt(&g, &id).await;
        let r = g.admin_json(&format!("/audit/v1/requests/{id}")).await;
        assert_eq!(money(&r["worst_case"]), money(&a["worst_case"]));
        worst.push(money(&a["worst_case"]));
    }
    let per_token = (worst[1].decimal() - worst[0].decimal())
        / "1.65".parse::<rust_decimal::Decimal>().unwrap();
    let input = u64::try_from(per_token * rust_decimal::Decimal::from(1_000_000)).unwrap();
    assert!(
        input >= 6000,
        "the input bound covers the 6000 bytes sent: {input}"
    );
    assert_eq!(worst[0], cost(&[(input, "4.95"), (1000, "16.5")]));
    assert_eq!(worst[1], cost(&[(input, "6.6"), (1000, "16.5")]));
}

#[test]
fn cache_rates_compile_and_a_malformed_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rates: &str| {
        let doc = format!(
            "kind: gateway\ncurrency: USD\n---\nkind: provider\nid: an\napi: anthropic\nbase_url: http://127.0.0.1:1/v1\njurisdiction: us\nmodels:\n  a:\n    context_window: 1000\n    input_per_mtok: \"3\"\n    output_per_mtok: \"15\"\n{rates}---\nkind: policy\nid: p\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [a]\njurisdictions: [us]\nceiling: {{ per_request: \"1\", mode: hard }}\nmax_output_tokens: 10\n",
            sha(KEY)
        );
        std::fs::write(dir.path().join("set.yaml"), doc).unwrap();
        purser::policy::compile_dir(dir.path())
    };
    let plain = write("").unwrap();
    let listed =
        write("    cached_input_per_mtok: \"0.3\"\n    cache_write_per_mtok: \"3.75\"\n").unwrap();
    assert_ne!(
        plain.id(),
        listed.id(),
        "a rate decides costs, so it is in the plan id"
    );
    for bad in [
        "    cached_input_per_mtok: \"1e3\"\n",
        "    cache_write_per_mtok: 3.75\n",
    ] {
        let err = write(bad).unwrap_err();
        let text = format!("{err:?}");
        assert!(
            text.contains("cached_input_per_mtok") || text.contains("cache_write_per_mtok"),
            "{bad}: {text}"
        );
    }
}

/// A policy `p` over `models`, held to a hard ceiling of 1 a request.
fn hard_policy(models: &str) -> String {
    format!(
        "kind: policy\nid: p\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [{models}]\njurisdictions: [us]\nceiling: {{ per_request: \"1\", mode: hard }}\nmax_output_tokens: 100\n",
        sha(KEY)
    )
}

/// One user message with `content` to `model`: the status, the request id and the body.
async fn chat(g: &Gateway, model: &str, content: Value) -> (u16, String, Value) {
    let (status, id, v) = g.chat_with(KEY, model, content).await;
    (status, id.unwrap_or_default(), v)
}

/// Two classes vendors bill above plain input, over HTTP to the ledger: GPT-5.6's cache
/// writes, which it makes by itself (no mark, no listed rate: at 1.25× input), and
/// audio input at the entry's audio rate. An audio part to an entry without that rate
/// is refused under a hard ceiling, naming the part.
#[tokio::test]
async fn self_made_cache_writes_and_audio_reach_the_ledger_at_their_rates() {
    let g = common::start(|v| {
        vec![
            provider(
                v,
                "o56",
                "openai",
                "gpt-5.6-sol",
                [Some("2"), Some("10"), None, None],
            ),
            provider(
                v,
                "au",
                "openai",
                "gpt-audio",
                [Some("2"), Some("10"), None, None],
            ) + "    audio_input_per_mtok: \"40\"\n    media_tokens: { audio: 1000 }\n",
            provider(
                v,
                "an",
                "openai",
                "gpt-audio-unpriced",
                [Some("2"), Some("10"), None, None],
            ) + "    media_tokens: { audio: 1000 }\n",
            hard_policy("gpt-5.6-sol, gpt-audio, gpt-audio-unpriced"),
        ]
    })
    .await;
    let answer = |details: Value, prompt: u64| {
        Script::Status(
            200,
            json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 100, "total_tokens": prompt + 100,
                          "prompt_tokens_details": details}})
            .to_string(),
        )
    };
    g.vendors.script(
        "o56",
        vec![answer(
            json!({"cached_tokens": 0, "cache_write_tokens": 2000}),
            3000,
        )],
    );
    let (status, id, _) = chat(&g, "gpt-5.6-sol", json!("x".repeat(6000))).await;
    assert_eq!(status, 200);
    let a = attempt(&g, &id).await;
    // 1,000 plain × 2 + 2,000 written × 2.5 + 100 out × 10, per M; the proof priced
    // every input token at the write rate.
    assert_eq!(
        money(&a["cost"]),
        cost(&[(1000, "2"), (2000, "2.5"), (100, "10")]),
        "{a}"
    );
    assert_eq!(a["cost_basis"], "usage", "{a}");
    assert_eq!(a["cache_write_tokens"], 2000, "{a}");

    let audio = json!([{"type": "text", "text": "transcribe"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]);
    g.vendors.script(
        "au",
        vec![answer(
            json!({"cached_tokens": 0, "audio_tokens": 1000}),
            1200,
        )],
    );
    let (status, id, _) = chat(&g, "gpt-audio", audio.clone()).await;
    assert_eq!(status, 200);
    let a = attempt(&g, &id).await;
    assert_eq!(
        money(&a["cost"]),
        cost(&[(200, "2"), (1000, "40"), (100, "10")]),
        "{a}"
    );
    assert_eq!(a["cost_basis"], "usage", "{a}");
    // The worst case prices every input token at the audio rate.
    assert!(
        money(&a["worst_case"]) >= cost(&[(1000, "40"), (100, "10")]),
        "{a}"
    );

    let (status, _, v) = chat(&g, "gpt-audio-unpriced", audio).await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "messages[0].content[1]", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("audio_input_per_mtok"),
        "{v}"
    );
    assert!(g.vendors.sent("an").is_empty());
    common::money::quiesce_on(&g.ledger_db, 5).await;
    common::money::assert_money_invariants_on(&g.ledger_db, &g.vendors, &["o56", "au", "an"]).await;
}

/// A model that searches the web on every call bills a fee per call beyond its tokens:
/// under a hard ceiling it is refused (naming the model, no call made) until its entry
/// lists `fee_per_call`, and then every call is bounded and charged with the fee.
#[tokio::test]
async fn a_model_that_searches_on_every_call_is_charged_its_fee() {
    let g = common::start(|v| {
        vec![
            provider(
                v,
                "px",
                "openai",
                "sonar",
                [Some("1"), Some("1"), None, None],
            ),
            provider(
                v,
                "pf",
                "openai",
                "sonar-pro",
                [Some("3"), Some("15"), None, None],
            ) + "    fee_per_call: \"0.014\"\n",
            hard_policy("sonar, sonar-pro"),
        ]
    })
    .await;
    let (status, _, v) = chat(&g, "sonar", json!("news?")).await;
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "model", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fee_per_call"),
        "{v}"
    );
    assert!(g.vendors.sent("px").is_empty());

    g.vendors.script("pf", vec![Script::Fixture("openai")]);
    let (status, id, _) = chat(&g, "sonar-pro", json!("news?")).await;
    assert_eq!(status, 200);
    let a = attempt(&g, &id).await;
    // The fixture's 12 in × 3 + 8 out × 15, per M, and the fee.
    let fee: Money = "0.014".parse().unwrap();
    assert_eq!(
        money(&a["cost"]),
        cost(&[(12, "3"), (8, "15")]) + fee,
        "{a}"
    );
    // (That the worst case holds the fee exactly once is `pricing`'s unit test.)
    assert!(money(&a["worst_case"]) >= cost(&[(100, "15")]) + fee, "{a}");
    common::money::quiesce_on(&g.ledger_db, 5).await;
    common::money::assert_money_invariants_on(&g.ledger_db, &g.vendors, &["px", "pf"]).await;
}
