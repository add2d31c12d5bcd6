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

#[path = "common/answers.rs"]
mod answers;
use answers::{api_of, headers_of};

const CORPUS: &str = include_str!("fixtures/error-corpus.jsonl");

fn cases() -> Vec<Value> {
    answers::json_lines(CORPUS)
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

/// Issue 21: at least 450 real responses, at most a fifth of them reconstructed (those
/// are marked, and `every_case_records_where_it_came_from` holds each to a note).
#[test]
fn the_corpus_is_large_and_at_most_a_fifth_reconstructed() {
    let cases = cases();
    let rebuilt: Vec<&Value> = cases
        .iter()
        .filter(|c| c["reconstructed"] == true)
        .collect();
    assert!(cases.len() >= 450, "{} cases", cases.len());
    assert!(
        rebuilt.len() * 5 <= cases.len(),
        "{} of {} reconstructed",
        rebuilt.len(),
        cases.len()
    );
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
    // Write from another thread: the corpus's verdicts outgrow a pipe's buffer, and a
    // child blocked on a full stdout stops reading its stdin.
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
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

// ---------------------------------------------------------------- issue 21: the long tail

/// The cases gathered for issue 21 (every vendor and relay `api: openai` points at).
fn issue21() -> Vec<Value> {
    cases().into_iter().filter(|c| c["issue"] == 21).collect()
}

/// The held-out fifth: chosen by the first byte of the id's SHA-256 before any rule
/// was written from the cases, so the choice cannot follow the results.
fn held_out_by_hash(id: &str) -> bool {
    use sha2::{Digest, Sha256};
    Sha256::digest(id.as_bytes())[0] % 5 == 0
}

#[test]
fn the_held_out_fifth_is_chosen_by_hash_and_classified_right() {
    let cases = issue21();
    assert!(cases.len() >= 140, "{} cases", cases.len());
    let (mut right, mut total, mut refusals) = (0, 0, 0);
    let mut wrong = vec![];
    for c in &cases {
        let id = c["id"].as_str().unwrap();
        // The label in the fixture is the hash's verdict, not a hand-picked split.
        assert_eq!(c["held_out"], held_out_by_hash(id), "{id}");
        if !held_out_by_hash(id) {
            continue;
        }
        total += 1;
        let (class, signal) = got(c);
        if class == c["expected_class"] {
            right += 1;
        } else {
            wrong.push(format!("{id}: {class} by {signal}"));
        }
        if c["expected_class"] == "content_refusal" {
            refusals += 1;
            assert_eq!(
                class, "content_refusal",
                "held-out refusal {id} by {signal}"
            );
        }
    }
    let accuracy = 100.0 * right as f64 / total as f64;
    println!("held out: {right} of {total} ({accuracy:.1}%), {refusals} refusals");
    assert!(
        total >= 25 && refusals >= 2,
        "{total} held out, {refusals} refusals"
    );
    assert!(accuracy >= 97.0, "{accuracy:.1}%:\n{}", wrong.join("\n"));
}

/// A later round of issue 21 (`"round": n`): cases added after the first held-out
/// fifth had been seen and fixed, so the first fifth is no longer a clean measure. The
/// same hash rule picked each round's held-out cases before any of them was classified;
/// only the rest were looked at while tuning. Each round is reported apart. The figure
/// each round's held-out cases gave when first measured, before any fix, is in the
/// commit that added the round and in `error-corpus.README.md`.
fn round_held_out(round: u64) -> (usize, usize, usize, usize, Vec<String>) {
    let cases: Vec<Value> = issue21()
        .into_iter()
        .filter(|c| c["round"] == round)
        .collect();
    let (mut right, mut total, mut refusals, mut refusals_right) = (0, 0, 0, 0);
    let mut wrong = vec![];
    for c in &cases {
        let id = c["id"].as_str().unwrap();
        assert_eq!(c["held_out"], held_out_by_hash(id), "{id}");
        // A later-round case is only ever a verbatim body: that is why it was added.
        assert_eq!(c["reconstructed"], false, "{id}");
        if !held_out_by_hash(id) {
            continue;
        }
        total += 1;
        let (class, signal) = got(c);
        if class == c["expected_class"] {
            right += 1;
        } else {
            wrong.push(format!("{id}: {class} by {signal}"));
        }
        if c["expected_class"] == "content_refusal" {
            refusals += 1;
            refusals_right += usize::from(class == "content_refusal");
        }
    }
    println!(
        "round {round} held out: {right} of {total}, refusals {refusals_right} of {refusals}; {} cases in the round",
        cases.len()
    );
    (right, total, refusals, refusals_right, wrong)
}

fn assert_round_held_out(round: u64) {
    let (right, total, refusals, refusals_right, wrong) = round_held_out(round);
    assert!(total >= 1, "no round-{round} case is held out");
    assert_eq!(refusals_right, refusals, "{}", wrong.join("\n"));
    assert!(
        100.0 * right as f64 / total as f64 >= 97.0,
        "{right} of {total}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_second_round_held_out_is_reported_apart() {
    assert_round_held_out(2);
}

#[test]
fn the_third_round_held_out_is_reported_apart() {
    assert_round_held_out(3);
}

#[test]
fn the_fourth_round_held_out_is_reported_apart() {
    assert_round_held_out(4);
}

/// Round 5 (E3's 55 verbatim cases, labelled without running the classifier): measured
/// once with the rules as round 4 left them, before any changed, **7 of 7 held out
/// right, no refusal among them**; over all 55, 47 right (85%) and 3 of 5 refusals.
/// The 8 misses were all tuning cases (see the next test), so this held-out figure is
/// still a clean one.
#[test]
fn the_fifth_round_held_out_is_reported_apart() {
    assert_round_held_out(5);
    let (right, total, refusals, _, wrong) = round_held_out(5);
    // The clean measure was 7 of 7 with no refusal: the round's held-out set is the
    // one the hash picked then, and nothing was fixed from it.
    assert_eq!((right, total, refusals), (7, 7, 0), "{}", wrong.join("\n"));
}

/// The fifth round's tuning cases the rules missed before it (8 of 48; the held-out
/// ones were not looked at), each now read by a rule of meaning written for the kind,
/// not for the one body, and none decided by the bare status.
#[test]
fn the_fifth_round_tuning_misses_come_out_right() {
    let named = [
        // "inspection" and "content security" are moderation words of any vendor.
        (
            "modelscope-555-output-content-security-inspection-failed",
            "content_refusal",
        ),
        (
            "modelscope-555-output-content-security-inspection-failed-2",
            "content_refusal",
        ),
        // A 2xx that is no answer but carries error_code/error_msg is read for its cause.
        (
            "baidu-qianfan-200-error-code-110-access-token-invalid",
            "auth",
        ),
        // Explicit key/token prose outranks a bare 5xx.
        ("pollinations-500-invalid-unrecognized-token", "auth"),
        // A code naming a key outranks the 402 family.
        ("hacktigerlabs-gateway-402-provider-key-missing", "auth"),
        // "prompt … longer than the maximum model length" is context prose.
        (
            "vllm-400-decoder-prompt-longer-than-max-model-len",
            "context_length",
        ),
        // "No models loaded" and "Model disabled." are model prose, before 404 and 403.
        ("lmstudio-404-no-models-loaded-jit", "model_not_found"),
        (
            "siliconflow-403-model-disabled-bare-string",
            "model_not_found",
        ),
    ];
    assert_tuning_cases_right(5, &named);
}

/// Round 6 (242 verbatim cases from eight gatherers, labelled without running the
/// classifier; 44 held out by the hash, 3 of them refusals). The held-out cases were
/// measured three times, each time without looking at which ones missed: with the
/// rules as round 5 left them, 41 of 44 (refusals 2 of 3); with the vocabulary read
/// from the vendors' own error tables (tests/vocabulary.rs), 41 of 44 (2 of 3); then,
/// after the rules written from the 198 tuning cases, **43 of 44 (97.7%), refusals 3 of
/// 3**. The one miss (OpenAI's "organization must be verified to stream" with code
/// `unsupported_value`, labelled auth) is left as it is: the vendor's structured code
/// decides before its prose (DESIGN 4).
#[test]
fn the_sixth_round_held_out_is_reported_apart() {
    assert_round_held_out(6);
    let (right, total, refusals, refusals_right, wrong) = round_held_out(6);
    assert_eq!(
        (right, total, refusals, refusals_right),
        (43, 44, 3, 3),
        "{}",
        wrong.join("\n")
    );
}

/// The sixth round's tuning cases the rules missed before it (42 of 198), one per kind,
/// each read now by a rule about the kind: a field no table named, a guardrail's
/// verdict words, a relayed status, a stream's `response.failed`, a 2xx that is no
/// answer, a 3xx, a 404 naming its model, prose in other words and languages.
#[test]
fn the_sixth_round_tuning_misses_come_out_right() {
    let named = [
        // Guardrail products' verdicts under 403 and 400: never auth, never malformed.
        ("lakera-guard-403-prompt-attack-via-kong", "content_refusal"),
        (
            "lakera-guard-403-pii-credit-card-via-kong",
            "content_refusal",
        ),
        (
            "prisma-airs-kong-403-blocked-by-security-policy",
            "content_refusal",
        ),
        (
            "azure-content-safety-400-reason-hidden-via-kong",
            "content_refusal",
        ),
        (
            "apisix-400-aws-comprehend-toxicity-threshold-plain-text-docs",
            "content_refusal",
        ),
        (
            "openai-codex-200-stream-error-cyber-policy",
            "content_refusal",
        ),
        // Words in fields no vendor table names: `reason`, `description`, a 4xx shaped
        // like an answer, a relay's string quoting a camel-cased block reason.
        (
            "opensearch-ml-400-guardrails-triggered-user-input",
            "content_refusal",
        ),
        (
            "wso2-ai-gateway-446-guardrail-violation-detected",
            "content_refusal",
        ),
        (
            "apisix-400-aliyun-moderation-chat-completion-shaped-refusal-docs",
            "content_refusal",
        ),
        (
            "relay-429-wrapping-one-api-gemini-blocked-prohibited-content",
            "content_refusal",
        ),
        // A 2xx that is no answer: its own status, or a guardrail's canned text.
        ("gigachat-200-status-429-too-many-requests", "rate_limited"),
        (
            "infor-genai-200-bedrock-guardrail-blocked-content",
            "content_refusal",
        ),
        // A relayed status, and a failed Responses stream.
        (
            "zed-cloud-500-upstream-http-error-anthropic-503-envoy-reset",
            "overloaded",
        ),
        (
            "sub2api-200-sse-response-failed-server-error-overloaded",
            "overloaded",
        ),
        ("tgi-200-stream-generation-error-event", "server_error"),
        // A 404 that names the model is the model.
        ("cohere-404-model-command-r-removed", "model_not_found"),
        // Context, model and account prose in other words, Russian included.
        (
            "github-copilot-400-prompt-token-count-empty-code-fields",
            "context_length",
        ),
        (
            "paragonapi-400-ru-context-exceed-capital-error-key",
            "context_length",
        ),
        (
            "snowflake-cortex-400-model-unavailable-in-region",
            "model_not_found",
        ),
        (
            "gemini-400-free-tier-not-available-in-country-nextchat",
            "auth",
        ),
        (
            "nvidia-nim-500-axum-missing-authorization-extension-plain",
            "auth",
        ),
        // A token id outside the vocabulary is no credential.
        ("openai-400-invalid-token-in-prompt-range", "malformed"),
    ];
    assert_tuning_cases_right(6, &named);
    let cases = cases();
    // A 3xx is no answer, whatever family tag its body restates.
    let c = cases
        .iter()
        .find(|c| c["id"] == "gemini-302-files-download-unknown-error")
        .expect("the 302 case");
    assert_eq!(got(c).0, "unclassified");
}

/// Each named tuning case of a round (never a held-out one) is labelled `want`, comes
/// out `want`, and is decided by a word or code, never by the bare status.
fn assert_tuning_cases_right(round: u64, named: &[(&str, &str)]) {
    let cases = cases();
    for &(id, want) in named {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the corpus"));
        assert_eq!(c["held_out"], false, "{id} is held out: not a tuning case");
        assert_eq!(c["round"], round, "{id}");
        assert_eq!(c["expected_class"], want, "{id}");
        let (class, signal) = got(c);
        assert_eq!(class, want, "{id} by {signal}");
        assert!(!signal.starts_with("status"), "{id} by {signal}");
    }
}

/// The two round-2 held-out cases the measure found wrong (2 of 4 right, before any
/// fix): fixed afterwards, so round 2's held-out figure is no longer clean. Google's
/// NOT_FOUND on a generate call and NVIDIA's NVCF "Not found for account".
#[test]
fn the_second_round_held_out_misses_are_fixed_after_the_measure() {
    let named = [
        (
            "gemini-cli-404-requested-entity-not-found-invalid-model",
            "model_not_found",
        ),
        (
            "nvidia-nim-404-function-not-found-for-account",
            "model_not_found",
        ),
    ];
    let cases = cases();
    for (id, want) in named {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the corpus"));
        assert_eq!(c["held_out"], true, "{id}");
        assert_eq!(c["round"], 2, "{id}");
        assert_eq!(got(c).0, want, "{id}");
    }
}

/// The third round's tuning cases the rules missed before it (the held-out ones were
/// not looked at): Copilot's `model_not_supported`, OpenRouter's "no allowed providers",
/// cloudcode's "model name is invalid" under INVALID_ARGUMENT, and a tokenizer's
/// over-length sentence in a body that is not even JSON.
#[test]
fn the_third_round_tuning_misses_come_out_right() {
    let named = [
        (
            "github-copilot-400-requested-model-not-supported",
            "model_not_found",
        ),
        (
            "openrouter-404-no-allowed-providers-for-model",
            "model_not_found",
        ),
        (
            "cloudcode-400-no-access-to-model-antigravity2api",
            "model_not_found",
        ),
        (
            "envoy-400-token-indices-longer-than-max-sequence",
            "context_length",
        ),
    ];
    let cases = cases();
    for (id, want) in named {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the corpus"));
        assert_eq!(c["held_out"], false, "{id} is held out: not a tuning case");
        assert_eq!(c["expected_class"], want, "{id}");
        assert_eq!(got(c).0, want, "{id}");
    }
}

/// Round 4 (E2's 82 verbatim cases and 10 more, all added in one session): measured
/// once before any rule changed, 15 of 18 held out right and 1 of 2 refusals. Tuning
/// on the other 74 brought it to 16 of 18 (the z.ai web stream's refusal came right by
/// the rule written from OPEA's `b'…'` event). These two were then fixed after being
/// seen, so round 4's 18 of 18 is not a held-out figure: Ark's `AccountOverdueError`
/// inside Coze's `$error` string under a 403, and a Gemini candidate stopped for
/// `OTHER` with no content.
#[test]
fn the_fourth_round_held_out_misses_are_fixed_after_the_measure() {
    let named = [
        (
            "coze-workflow-403-ark-account-overdue-string-wrapped",
            "rate_limited",
        ),
        ("gemini-200-finish-other-no-content", "unclassified"),
    ];
    let cases = cases();
    for (id, want) in named {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the corpus"));
        assert_eq!(c["held_out"], true, "{id}");
        assert_eq!(c["round"], 4, "{id}");
        assert_eq!(got(c).0, want, "{id}");
    }
}

/// The fourth round's tuning cases the rules missed before it (the held-out ones were
/// not looked at), each now read by a rule that is not about that one body.
#[test]
fn the_fourth_round_tuning_misses_come_out_right() {
    let named = [
        // A model named OpenGuardrails echoed back in vLLM's validation error: a
        // moderation word must start a word to count.
        (
            "openguardrails-vllm-400-field-required-messages",
            "malformed",
        ),
        // A Python relay wrote the bytes' repr into an SSE event: the quoted error is read.
        (
            "opea-chatqna-200-sse-python-bytes-tgi-validation",
            "context_length",
        ),
        // rate_limit_error is a family tag that "the engine is currently overloaded" refines.
        (
            "kimi-code-anthropic-429-rate-limit-error-engine-overloaded-pretty",
            "overloaded",
        ),
        (
            "dashscope-native-400-range-of-input-length-6000",
            "context_length",
        ),
        ("cody-gateway-400-model-not-allowed", "model_not_found"),
        (
            "chatgpt-codex-400-usage-limit-reached-status-field",
            "rate_limited",
        ),
        (
            "continue-proxy-404-json-string-missing-secret-mistral-key",
            "auth",
        ),
        ("opencode-go-400-missing-session-id", "malformed"),
    ];
    let cases = cases();
    for (id, want) in named {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the corpus"));
        assert_eq!(c["held_out"], false, "{id} is held out: not a tuning case");
        assert_eq!(c["expected_class"], want, "{id}");
        let (class, signal) = got(c);
        assert_eq!(class, want, "{id} by {signal}");
        // Each is decided by a word or code, never the bare status.
        assert!(!signal.starts_with("status="), "{id} by {signal}");
    }
}

#[test]
fn the_issue_21_corpus_is_real_sourced_and_broad() {
    let cases = issue21();
    let mut vendors = std::collections::BTreeSet::new();
    for c in &cases {
        let source = c["source"].as_str().unwrap();
        assert!(source.starts_with("https://"), "{}: {source}", c["id"]);
        assert!(c["note"].as_str().unwrap().len() > 10, "{}", c["id"]);
        let p = c["provider"].as_str().unwrap().to_lowercase();
        vendors.insert(p.split(" (").next().unwrap().to_string());
    }
    assert!(
        vendors.len() >= 40,
        "{} vendors: {vendors:?}",
        vendors.len()
    );
}

/// A response of each kind issue 21 names, each from a vendor whose words were not the
/// source of the row that decides it (the row's `basis` names another vendor).
#[test]
fn every_kind_issue_21_names_is_classified_right() {
    let kinds: [(&str, &str, &str); 21] = [
        // Round 5: ModelScope's output moderation, decided by the word "inspection" (a
        // row written from DashScope's docs).
        (
            "modelscope-555-output-content-security-inspection-failed",
            "content_refusal",
            "aliyun",
        ),
        // Round 4: z.ai's web stream warns "inappropriate content" in an event whose JSON
        // is cut short (a row written from DashScope's docs), and Cody Gateway blocks by
        // its acceptable use policy (a row written from OpenAI's).
        (
            "zai-web-200-sse-content-security-warning",
            "content_refusal",
            "aliyun",
        ),
        (
            "cody-gateway-400-blocked-acceptable-use-policy",
            "content_refusal",
            "openai",
        ),
        // Round 4: a bad key relayed by Dify as a 400.
        (
            "dify-400-completion-request-error-incorrect-key",
            "auth",
            "",
        ),
        // Refusals in other vocabularies: a Google ErrorInfo reason read by the word
        // `unsafe` (a row written from Zhipu's docs).
        (
            "google-flow-400-public-error-unsafe-generation",
            "content_refusal",
            "bigmodel",
        ),
        // DashScope's verdict relayed by another vendor's API.
        (
            "commandcode-400-dashscope-datainspection-algo",
            "content_refusal",
            "",
        ),
        // new-api's blocklist behind LiteLLM, as a 500.
        (
            "litellm-500-new-api-sensitive-words-relayed",
            "content_refusal",
            "",
        ),
        // A guardrail block relayed as a 500.
        (
            "litellm-500-custom-guardrail-raised-exception",
            "content_refusal",
            "",
        ),
        // A sensitive image as a 500 from xAI (the row was written from new-api).
        (
            "xai-500-new-sensitive-image-is-sensitive",
            "content_refusal",
            "new-api",
        ),
        // Balance and quota under 403/401: a relay's INSUFFICIENT_BALANCE (row from
        // SiliconFlow's docs) and a relay's balance prose under 401.
        (
            "sub2api-403-insufficient-balance",
            "rate_limited",
            "siliconflow",
        ),
        (
            "opencode2api-401-insufficient-balance-credits-error",
            "rate_limited",
            "",
        ),
        (
            "moonshot-403-exceeded-current-quota-error",
            "rate_limited",
            "",
        ),
        // A bad key and unknown models as 400 from vendors the rows were not written from.
        ("xai-400-incorrect-api-key-string-body", "auth", ""),
        (
            "kiro-via-9router-400-invalid-model-id-reason",
            "model_not_found",
            "perplexity",
        ),
        (
            "publicai-litellm-400-invalid-model-name-passed",
            "model_not_found",
            "",
        ),
        // Context overflow as a 500 from a local server.
        (
            "llamacpp-500-context-size-exceeded-server-error",
            "context_length",
            "",
        ),
        // A relay's 422 around a vendor's validation error.
        (
            "one-api-422-mistral-bad-response-status-code",
            "malformed",
            "",
        ),
        // unsupported_parameter with param max_tokens: the code beats the prose.
        (
            "ccr-400-new-api-unsupported-parameter-max-tokens",
            "malformed",
            "",
        ),
        (
            "copilot-api-400-unsupported-max-tokens-invalid-request-body",
            "malformed",
            "",
        ),
        // A string `error` with a prefix and then the vendor's JSON.
        (
            "anthropic-proxy-400-openrouter-not-valid-model-id",
            "model_not_found",
            "",
        ),
        (
            "9router-relay-deepseek-unknown-variant-developer",
            "malformed",
            "",
        ),
    ];
    let cases = cases();
    for (id, want, row_from) in kinds {
        let c = cases
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing"));
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
        assert_eq!(class, want, "{id} by {}", e.signal);
        if !row_from.is_empty() {
            assert!(
                e.signal.basis.contains(row_from),
                "{id}: decided by a row from {}",
                e.signal.basis
            );
            let vendor = c["provider"].as_str().unwrap().to_lowercase();
            assert!(!vendor.contains(row_from), "{id} is from {row_from} itself");
        }
        for mode in [Mode::Hard, Mode::Soft] {
            if want == "content_refusal" {
                assert!(!fails_over(FailureClass::ContentRefusal, mode), "{id}");
            }
        }
    }
}

/// A 5xx or an unknown 4xx that carries moderation words and no structured signal is
/// never a failover class, in English or Chinese, however deep it is relayed.
#[test]
fn moderation_words_never_fail_over() {
    let words = [
        "input contains sensitive words",
        "The guardrail checks defined in the config failed",
        "Request blocked by moderation",
        "Output data may contain inappropriate content.",
        "policy violation detected",
        "unsafe content detected",
        "系统检测到输入或生成内容可能包含不安全或敏感内容",
        "输入内容审核不通过，涉嫌违规",
        "output content security inspection failed",
        "input inspection failed",
    ];
    for w in words {
        for status in [500, 502, 503, 446, 499, 520] {
            let plain = serde_json::json!({"error": {"message": w}}).to_string();
            let relayed = serde_json::json!({"error": {"message": format!("upstream error: {plain}"), "type": "upstream_error"}}).to_string();
            for body in [plain, relayed] {
                let e = explain(Api::Openai, status, &[], &body);
                let class = e.outcome.class().unwrap();
                assert_eq!(
                    class,
                    FailureClass::ContentRefusal,
                    "{status} {body} by {}",
                    e.signal
                );
                assert!(!fails_over(class, Mode::Soft), "{status} {body}");
            }
        }
    }
    // Not every word near "sensitive" is moderation, and a moderation word inside a
    // name is not one.
    for case in [
        r#"{"error":{"message":"model names are case-sensitive"}}"#,
        r#"{"error":{"message":"model OpenGuardrails is loading, try again"}}"#,
        r#"{"error":{"message":"the insensitive matcher crashed"}}"#,
        r#"{"error":{"message":"TLS inspection failed at the proxy, upstream overloaded"}}"#,
    ] {
        assert_eq!(
            explain(Api::Openai, 503, &[], case).outcome.class(),
            Some(FailureClass::Overloaded),
            "{case}"
        );
    }
}

/// The vendor's code or type in the body, when it carries one that says more than the
/// envelope (`error`) or the status number.
fn structured_code(v: &Value) -> Option<String> {
    let v = match v {
        Value::Array(items) => items.first()?,
        other => other,
    };
    let mut objs = vec![v];
    if let Some(e) = v.get("error").filter(|e| e.is_object()) {
        objs.push(e);
    }
    for o in objs {
        for k in ["code", "type", "status"] {
            if let Some(s) = o.get(k).and_then(Value::as_str) {
                let l = s.to_lowercase();
                // `error`, a relay's own envelope name, and a relay's "upstream answered
                // with an error" tag say only who answered, not why.
                let envelope = [
                    "error",
                    "none",
                    "null",
                    "",
                    "new_api_error",
                    "one_api_error",
                    "upstream_error",
                    "bad_response_status_code",
                    "internal_error_proxy",
                    "provider_response_error",
                    "http_error",
                    // Portkey's top-level `status: failure` says only that it failed.
                    "failure",
                    // one-api names its type after the channel it relayed.
                    "baidu_error",
                ]
                .contains(&l.as_str());
                if !envelope && !l.chars().all(|ch| ch.is_ascii_digit()) {
                    return Some(s.to_string());
                }
            }
        }
    }
    None
}

#[test]
fn no_case_with_a_structured_code_is_decided_by_the_bare_status() {
    let mut decided_by_status = vec![];
    let mut with_code = 0;
    for c in cases() {
        let status = c["status"].as_u64().unwrap() as u16;
        if (200..300).contains(&status) {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(c["body"].as_str().unwrap()) else {
            continue;
        };
        let Some(code) = structured_code(&v) else {
            continue;
        };
        with_code += 1;
        let e = explain(
            api_of(&c),
            status,
            &headers_of(&c),
            c["body"].as_str().unwrap(),
        );
        if e.signal.source == "status" {
            decided_by_status.push(format!("{} (code {code})", c["id"]));
        }
    }
    assert!(with_code >= 200, "{with_code} cases carry a code");
    assert!(
        decided_by_status.is_empty(),
        "decided by the bare status although the body carries a code:\n{}",
        decided_by_status.join("\n")
    );
}

#[test]
fn explain_names_the_word_and_the_relay_depth() {
    let lines = run_cli(&["classify", "--explain"], CORPUS);
    let cases = cases();
    for (c, v) in cases.iter().zip(&lines) {
        let s = &v["signal"];
        assert!(!s["value"].as_str().unwrap().is_empty(), "{}", c["id"]);
        assert!(s["basis"].is_string(), "{}", c["id"]);
        let text = s["text"].as_str().unwrap();
        let depth = s["depth"].as_u64().unwrap();
        assert_eq!(
            text.contains("relayed (depth"),
            depth > 0,
            "{}: {text}",
            c["id"]
        );
    }
    let by_id = |id: &str| &lines[cases.iter().position(|c| c["id"] == id).unwrap()]["signal"];
    // A code read by its words names the word.
    let s = by_id("commandcode-400-dashscope-datainspection-algo");
    assert_eq!(
        s["value"], "data_inspection_failed ~ data_inspection",
        "{s}"
    );
    // Prose names the phrase, not the whole message.
    let s = by_id("zhipu-429-1113-insufficient-balance-zh");
    assert_eq!(s["value"], "1113");
    let s = by_id("minimax-anthropic-500-image-is-sensitive-1026");
    assert_eq!(s["value"], "sensitive");
    // Relays of every shape report their depth: JSON in a string after a prefix, in
    // metadata.raw, in a Python dict, in a string `error`.
    for (id, depth) in [
        ("9router-relay-deepseek-unknown-variant-developer", 1),
        ("openrouter-400-provider-error-raw-openai-json-object", 1),
        ("litellm-400-bedrock-guardrail-violated", 1),
        ("anthropic-proxy-400-openrouter-not-valid-model-id", 1),
        ("continue-gemini-openai-compat-api-key-invalid-relayed", 1),
        ("litellm-429-azure-token-rate-limit-throttling-python", 1),
    ] {
        assert_eq!(by_id(id)["depth"], depth, "{id}: {}", by_id(id));
    }
}
