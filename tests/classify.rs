//! The classifier against real provider responses (the shared error corpus, copied
//! into tests/fixtures as it is), the decision table, and property tests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use std::io::Write;
use std::process::{Command, Stdio};

use proptest::prelude::*;
use purser::failure::{FailureClass, classify};
use purser::policy::plan::Api;
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

#[test]
fn every_corpus_case_gets_its_expected_class() {
    let cases = cases();
    assert!(cases.len() >= 80);
    let mut wrong = vec![];
    for c in &cases {
        let out = classify(
            api_of(c),
            c["status"].as_u64().unwrap() as u16,
            &headers_of(c),
            c["body"].as_str().unwrap(),
        );
        let got = out.class().map(FailureClass::as_str).unwrap_or("success");
        if got != c["expected_class"].as_str().unwrap() {
            wrong.push(format!(
                "{}: expected {}, got {got} ({})",
                c["id"],
                c["expected_class"],
                out.reason()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} misclassified:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn classify_cli_reads_the_corpus_format_as_it_is() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["classify", "--api", "openai"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(CORPUS.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cases = cases();
    assert_eq!(lines.len(), cases.len());
    for (c, v) in cases.iter().zip(&lines) {
        assert_eq!(v["class"], c["expected_class"], "{}", c["id"]);
        assert!(v["billing"].is_string() && v["reason"].is_string());
        assert!(v["fails_over"]["hard"].is_boolean() && v["fails_over"]["soft"].is_boolean());
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
fn classify_cli_line_api_overrides_flag() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["classify", "--api", "openai"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = r#"{"api":"gemini","status":200,"headers":{},"body":"{\"promptFeedback\":{\"blockReason\":\"SAFETY\"}}"}"#;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["class"], "content_refusal");
}

fn arb_api() -> impl Strategy<Value = Api> {
    prop_oneof![Just(Api::Openai), Just(Api::Anthropic), Just(Api::Gemini)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_arbitrary_bytes(api in arb_api(), status in 0u16..1000, body in proptest::collection::vec(any::<u8>(), 0..400), ct in "[a-z/;= -]{0,30}") {
        let body = String::from_utf8_lossy(&body).into_owned();
        let headers = vec![("content-type".to_string(), ct)];
        let a = classify(api, status, &headers, &body);
        let b = classify(api, status, &headers, &body);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn never_panics_on_json_shaped_bodies(api in arb_api(), status in 100u16..600, body in json_ish()) {
        let a = classify(api, status, &[], &body);
        prop_assert_eq!(a.clone(), classify(api, status, &[], &body));
        // A non-2xx is never a success.
        if !(200..300).contains(&status) {
            prop_assert!(a.class().is_some());
        }
    }
}

fn json_ish() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("\"content_filter\"".to_string()),
        Just("\"SAFETY\"".to_string()),
        Just("\"refusal\"".to_string()),
        Just("\"overloaded\"".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z ]{0,12}".prop_map(|s| format!("\"{s}\"")),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        let key = prop_oneof![
            Just("error"),
            Just("choices"),
            Just("candidates"),
            Just("finish_reason"),
            Just("finishReason"),
            Just("message"),
            Just("type"),
            Just("code"),
            Just("content"),
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
