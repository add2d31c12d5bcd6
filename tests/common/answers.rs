//! Upstream answers as the classifier's tests and bench read them: JSON Lines of
//! `{api, status, headers, body, …}` (the error corpus, the vendors' code tables), and
//! the hostile bodies the reader's bound is checked and timed on. Included by path
//! (`#[path]`) so that tests/classify*.rs, tests/vocabulary.rs and benches/classify.rs
//! read them the same way without pulling in the gateway harness of `common`.

#![allow(dead_code)] // each includer uses part of it

use purser::policy::plan::Api;
use serde_json::{Value, json};

/// One JSON value per non-empty line.
pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The adapter a line names.
pub fn api_of(v: &Value) -> Api {
    serde_json::from_value(v["api"].clone()).unwrap()
}

/// A line's `headers` object as (name, value) pairs.
pub fn headers_of(v: &Value) -> Vec<(String, String)> {
    v["headers"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Error bodies built to make the classifier's reader work: 20,000 `errors[]`,
/// reasons, exception keys or fields of every name, 300 messages of 64 KB, a 10 MB
/// message. Before the reader's bound each cost 10–27 s in release.
pub fn hostile_bodies() -> Vec<(&'static str, Value)> {
    let n = 20_000;
    vec![
        (
            "20,000 errors[]",
            json!({"errors": (0..n).map(|i| json!({"message": format!("internal error {i} happened")})).collect::<Vec<_>>()}),
        ),
        (
            "20,000 details[].reason",
            json!({"error": {"details": (0..n).map(|i| json!({"reason": format!("R{i}")})).collect::<Vec<_>>()}}),
        ),
        (
            "20,000 exception keys",
            Value::Object(
                (0..n)
                    .map(|i| {
                        (
                            format!("e{i}Exception"),
                            json!({"message": format!("m {i} x")}),
                        )
                    })
                    .collect(),
            ),
        ),
        (
            "20,000 fields of every name",
            json!({"x": (0..n).map(|i| format!("a b {i}")).collect::<Vec<_>>(), "errors": (0..n).map(|i| json!({"message": format!("m {i} x")})).collect::<Vec<_>>()}),
        ),
        (
            "300 messages of 64 KB",
            json!({"errors": (0..300).map(|i| json!({"message": format!("m{i} {}", "a b ".repeat(16_000))})).collect::<Vec<_>>()}),
        ),
        (
            "a 10 MB message",
            json!({"error": {"message": "a b ".repeat(2_500_000)}}),
        ),
    ]
}
