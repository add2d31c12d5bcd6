//! The classifier against real provider responses (tests/fixtures/error-corpus.jsonl:
//! the shared corpus plus the cases gathered for issue 15), the CLI that reads the same
//! format, and property tests over arbitrary answers.
//!
//! `cargo test --test classify -- --nocapture` prints the accuracy table per vendor
//! and per class.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use proptest::prelude::*;
use purser::decide::fails_over;
use purser::failure::{FailureClass, TransportFailure, classify, classify_transport, explain};
use purser::policy::plan::{Api, Mode};
use serde_json::Value;

const CORPUS: &str = include_str!("fixtures/error-corpus.jsonl");

fn cases() -> Vec<Value> {
    CORPUS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn api_of(v: &Value) -> Api {
    serde_json::from_value(v["api"].clone()).unwrap()
}

fn headers_of(v: &Value) -> Vec<(String, String)> {
    v["headers"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn got(c: &Value) -> (String, String) {
    let e = explain(
        api_of(c),
        c["status"].as_u64().unwrap() as u16,
        &headers_of(c),
        c["body"].as_str().unwrap(),
    );
    let class = e
        .outcome
        .class()
        .map(FailureClass::as_str)
        .unwrap_or("success");
    (class.to_string(), e.signal.to_string())
}

/// The vendor a case is reported under. Relays (proxies, aggregators, gateways in
/// front of a vendor) are their own group: their envelopes are the hard part.
fn vendor(provider: &str) -> &'static str {
    let p = provider.to_ascii_lowercase();
    const RELAYS: [&str; 12] = [
        "relay",
        "proxy",
        "litellm",
        "one-api",
        "new-api",
        "router",
        "truefoundry",
        "gemini-balance",
        "pollinations",
        "vercel",
        "gateway",
        "gptsapi",
    ];
    if p != "openrouter" && RELAYS.iter().any(|r| p.contains(r)) {
        return "relay";
    }
    const PREFIXES: [(&str, &str); 17] = [
        ("azure", "azure-openai"),
        ("openai", "openai"),
        ("anthropic", "anthropic"),
        ("google", "gemini/vertex"),
        ("aws-bedrock", "bedrock"),
        ("mistral", "mistral"),
        ("groq", "groq"),
        ("together", "together"),
        ("fireworks", "fireworks"),
        ("deepseek", "deepseek"),
        ("openrouter", "openrouter"),
        ("vllm", "vllm"),
        ("ollama", "ollama"),
        ("xai", "xai"),
        ("moonshot", "moonshot"),
        ("huggingface", "huggingface"),
        ("cloudflare", "cloudflare"),
    ];
    PREFIXES
        .iter()
        .find(|(prefix, _)| p.starts_with(prefix))
        .map(|(_, v)| *v)
        .unwrap_or("other")
}

/// Classes no HTTP body can carry: purser sets them from what the transport or the
/// breaker observed (`classify_transport`, the circuit), so the corpus of answers has
/// none. `timeout` is not here: 408/504/524 answers carry it and the corpus counts them.
const TRANSPORT_ONLY: [FailureClass; 3] = [
    FailureClass::Connect,
    FailureClass::Dropped,
    FailureClass::CircuitOpen,
];

#[derive(Default)]
struct Tally {
    right: usize,
    total: usize,
}

fn table(title: &str, rows: &BTreeMap<String, Tally>) -> String {
    let mut out = format!(
        "\n{title:<16} {:>5} {:>5} {:>8}\n",
        "right", "cases", "accuracy"
    );
    for (k, t) in rows {
        out.push_str(&format!(
            "{k:<16} {:>5} {:>5} {:>7.1}%\n",
            t.right,
            t.total,
            100.0 * t.right as f64 / t.total as f64
        ));
    }
    out
}

#[test]
fn the_corpus_is_classified_right_per_vendor_and_per_class() {
    let cases = cases();
    assert!(cases.len() >= 250, "{} cases", cases.len());
    let mut by_vendor: BTreeMap<String, Tally> = BTreeMap::new();
    let mut by_class: BTreeMap<String, Tally> = BTreeMap::new();
    let mut wrong = vec![];
    let mut right = 0;
    for c in &cases {
        let expected = c["expected_class"].as_str().unwrap();
        let (class, signal) = got(c);
        let ok = class == expected;
        right += usize::from(ok);
        for (map, key) in [
            (&mut by_vendor, vendor(c["provider"].as_str().unwrap())),
            (&mut by_class, expected),
        ] {
            let t = map.entry(key.to_string()).or_default();
            t.total += 1;
            t.right += usize::from(ok);
        }
        if !ok {
            wrong.push(format!(
                "{}: expected {expected}, got {class} (by {signal})",
                c["id"]
            ));
        }
    }
    let accuracy = 100.0 * right as f64 / cases.len() as f64;
    println!(
        "{}{}\noverall: {right} of {} ({accuracy:.1}%)",
        table("vendor", &by_vendor),
        table("class", &by_class),
        cases.len()
    );
    assert!(
        accuracy >= 98.0,
        "{accuracy:.1}% right; misclassified:\n{}",
        wrong.join("\n")
    );
    // Every class an answer can carry has at least ten real cases.
    for c in FailureClass::ALL {
        if TRANSPORT_ONLY.contains(&c) {
            assert!(!by_class.contains_key(c.as_str()), "{c} has HTTP cases");
            continue;
        }
        let n = by_class.get(c.as_str()).map_or(0, |t| t.total);
        assert!(n >= 10, "{c}: only {n} cases");
    }
    // The corpus is not a mirror of one vendor.
    assert!(by_vendor.len() >= 14, "{} vendors", by_vendor.len());
}

#[test]
fn every_refusal_is_a_refusal_and_none_could_fail_over() {
    let mut n = 0;
    for c in cases() {
        if c["expected_class"] != "content_refusal" {
            continue;
        }
        n += 1;
        let (class, signal) = got(&c);
        assert_eq!(class, "content_refusal", "{} (by {signal})", c["id"]);
        let class = FailureClass::parse(&class).unwrap();
        for mode in [Mode::Hard, Mode::Soft] {
            assert!(!fails_over(class, mode), "{}", c["id"]);
        }
    }
    assert!(n >= 10);
}

#[test]
fn the_misclassifications_named_in_issue_15_come_out_right() {
    let named = [
        ("anthropic-400-organization-disabled", "auth"),
        ("gemini-400-api-key-not-found-errorinfo", "auth"),
        ("azure-404-deployment-not-found", "model_not_found"),
        ("openai-400-invalid-prompt-flagged", "content_refusal"),
        ("openrouter-403-moderation-flagged", "content_refusal"),
        ("anthropic-400-specified-api-usage-limits", "rate_limited"),
        ("groq-498-flex-capacity-exceeded", "overloaded"),
        ("relay-429-wrapping-azure-content-filter", "content_refusal"),
        ("azure-responses-200-content-filters-not-blocked", "success"),
    ];
    let cases = cases();
    for (id, want) in named {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the corpus"));
        assert_eq!(c["expected_class"], want, "{id}");
        assert_eq!(got(c).0, want, "{id}");
    }
}

#[test]
fn every_case_records_where_it_came_from() {
    let mut ids = std::collections::HashSet::new();
    for c in cases() {
        assert!(
            ids.insert(c["id"].as_str().unwrap().to_string()),
            "{}",
            c["id"]
        );
        for k in ["provider", "source", "note", "source_api", "corpus_class"] {
            let v = c[k].as_str().unwrap_or("");
            assert!(!v.trim().is_empty(), "{}: no {k}", c["id"]);
        }
        assert!(c["reconstructed"].is_boolean(), "{}", c["id"]);
        let e = c["expected_class"].as_str().unwrap();
        assert!(
            e == "success" || FailureClass::parse(e).is_some(),
            "{}: {e}",
            c["id"]
        );
    }
}

#[test]
fn transport_failures_have_their_classes() {
    // The exemption above in one place: these classes come from the transport.
    for (t, c) in [
        (TransportFailure::Connect, FailureClass::Connect),
        (TransportFailure::ConnectTimeout, FailureClass::Connect),
        (TransportFailure::ResponseTimeout, FailureClass::Timeout),
        (TransportFailure::Dropped, FailureClass::Dropped),
    ] {
        assert_eq!(classify_transport(t).0, c);
    }
}

fn run_cli(args: &[&str], input: &str) -> Vec<Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn classify_cli_reads_the_corpus_format_as_it_is() {
    let lines = run_cli(&["classify", "--api", "openai"], CORPUS);
    let cases = cases();
    assert_eq!(lines.len(), cases.len());
    for (c, v) in cases.iter().zip(&lines) {
        assert_eq!(v["class"], got(c).0.as_str(), "{}", c["id"]);
        assert!(v["billing"].is_string() && v["reason"].is_string());
        assert!(v["fails_over"]["hard"].is_boolean() && v["fails_over"]["soft"].is_boolean());
        // The signal is printed only when asked for.
        assert!(v.get("signal").is_none());
    }
    // Spot checks of the derived fields.
    let by_id = |id: &str| &lines[cases.iter().position(|c| c["id"] == id).unwrap()];
    assert_eq!(
        by_id("openai-429-tpm-rate-limit")["fails_over"],
        serde_json::json!({"hard": true, "soft": true})
    );
    assert_eq!(
        by_id("openai-504-envoy-upstream-request-timeout")["fails_over"],
        serde_json::json!({"hard": false, "soft": true})
    );
    assert_eq!(
        by_id("azure-400-content-filter-profanity-hate-low")["fails_over"],
        serde_json::json!({"hard": false, "soft": false})
    );
    assert_eq!(
        by_id("azure-400-content-filter-profanity-hate-low")["billing"],
        "maybe_billed"
    );
}

#[test]
fn classify_cli_explain_names_the_deciding_signal() {
    let lines = run_cli(&["classify", "--explain"], CORPUS);
    let cases = cases();
    assert_eq!(lines.len(), cases.len());
    for (c, v) in cases.iter().zip(&lines) {
        // The same verdict as without --explain, plus the signal.
        assert_eq!(v["class"], got(c).0.as_str(), "{}", c["id"]);
        assert!(v["signal"]["source"].is_string(), "{}", c["id"]);
        assert!(v["signal"]["text"].is_string(), "{}", c["id"]);
        assert!(v["signal"]["depth"].is_u64(), "{}", c["id"]);
    }
    let by_id = |id: &str| &lines[cases.iter().position(|c| c["id"] == id).unwrap()];
    // A relayed refusal is decided one envelope down, by the vendor's own code.
    let relayed = &by_id("relay-429-wrapping-azure-content-filter")["signal"];
    assert_eq!(relayed["depth"], 1);
    assert_eq!(relayed["value"], "content_filter");
    // Gemini's ErrorInfo reason decides before the INVALID_ARGUMENT status name.
    assert_eq!(
        by_id("gemini-400-api-key-not-found-errorinfo")["signal"]["source"],
        "details[].reason (google)"
    );
    assert_eq!(
        by_id("openai-401-invalid-api-key")["signal"]["source"],
        "error.code (openai)"
    );
}

#[test]
fn classify_cli_line_api_overrides_flag() {
    let line = r#"{"api":"gemini","status":200,"headers":{},"body":"{\"promptFeedback\":{\"blockReason\":\"SAFETY\"}}"}"#;
    let v = run_cli(&["classify", "--api", "openai"], line);
    assert_eq!(v[0]["class"], "content_refusal");
}

fn arb_api() -> impl Strategy<Value = Api> {
    prop_oneof![Just(Api::Openai), Just(Api::Anthropic), Just(Api::Gemini)]
}

fn arb_headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![
        Just("content-type".to_string()),
        Just("x-amzn-errortype".to_string()),
        Just("retry-after".to_string()),
        "[a-zA-Z-]{1,20}",
    ];
    let value = prop_oneof![
        Just("text/event-stream".to_string()),
        Just("application/json".to_string()),
        Just("ThrottlingException:http://internal.amazon.com/coral/".to_string()),
        Just(":::".to_string()),
        ".{0,40}",
    ];
    proptest::collection::vec((name, value), 0..4)
}

/// The verdict must be one class (or success), the same twice, agree between
/// `classify` and `explain`, and never call a non-2xx a success.
fn check(api: Api, status: u16, headers: &[(String, String)], body: &str) {
    let a = classify(api, status, headers, body);
    let e = explain(api, status, headers, body);
    assert_eq!(a, e.outcome);
    assert_eq!(a, classify(api, status, headers, body));
    match a.class() {
        Some(c) => assert_eq!(FailureClass::parse(c.as_str()), Some(c)),
        None => assert!(
            (200..300).contains(&status),
            "HTTP {status} called a success"
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_arbitrary_bytes(api in arb_api(), status in 0u16..1000, body in proptest::collection::vec(any::<u8>(), 0..400), headers in arb_headers()) {
        let body = String::from_utf8_lossy(&body).into_owned();
        check(api, status, &headers, &body);
    }

    #[test]
    fn never_panics_on_json_shaped_bodies(api in arb_api(), status in 0u16..1000, body in json_ish(), headers in arb_headers()) {
        check(api, status, &headers, &body);
    }

    #[test]
    fn never_panics_on_relayed_errors(api in arb_api(), status in 0u16..1000, inner in json_ish(), wraps in 0usize..5, prefix in "[a-zA-Z :{']{0,12}", python in any::<bool>()) {
        // A vendor body quoted inside a relay's message, any number of times over,
        // sometimes as a Python dict repr.
        let mut body = inner;
        for _ in 0..wraps {
            let quoted = if python { body.replace('"', "'") } else { body.clone() };
            body = serde_json::json!({"error": {"message": format!("{prefix}{quoted}"), "metadata": {"raw": quoted}}}).to_string();
        }
        check(api, status, &[], &body);
    }
}

fn json_ish() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("\"content_filter\"".to_string()),
        Just("\"SAFETY\"".to_string()),
        Just("\"refusal\"".to_string()),
        Just("\"overloaded\"".to_string()),
        Just("\"API_KEY_INVALID\"".to_string()),
        Just("\"ThrottlingException\"".to_string()),
        Just("\"{\\\"error\\\":{\\\"code\\\":\\\"content_filter\\\"}}\"".to_string()),
        Just("\"upstream: {\\\"error\\\":{\\\"type\\\":\\\"rate_limit_error\\\"\"".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z {}:\"]{0,16}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("error"),
            Just("choices"),
            Just("candidates"),
            Just("finish_reason"),
            Just("finishReason"),
            Just("message"),
            Just("type"),
            Just("code"),
            Just("status"),
            Just("details"),
            Just("reason"),
            Just("metadata"),
            Just("reasons"),
            Just("raw"),
            Just("innererror"),
            Just("content_filter_result"),
            Just("filtered"),
            Just("__type"),
            Just("throttlingException"),
            Just("content"),
            Just("content_filters"),
            Just("object"),
            Just("output"),
            Just("promptFeedback"),
            Just("blockReason"),
            Just("stop_reason"),
            Just("delta")
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec((key, inner), 0..4).prop_map(|kv| format!(
                "{{{}}}",
                kv.iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        ]
    })
}
