//! Each failure class's vocabulary, checked against the vendors' own error tables
//! (tests/fixtures/vendor-codes.jsonl).
//!
//! Every line is **synthesised from documentation**, not collected: for each code, type
//! or message a vendor documents, the body its documented envelope would carry, under
//! the status its table gives, and the class DESIGN 4 gives that meaning. These lines
//! are no corpus cases and count toward no corpus figure (tests/classify.rs measures
//! those); they are the proof that the vocabulary holds for answers nobody has
//! collected yet.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use std::collections::{BTreeMap, BTreeSet};

use purser::decide::fails_over;
use purser::failure::{FailureClass, explain};
use purser::policy::plan::Mode;
use serde_json::Value;

#[path = "common/answers.rs"]
mod answers;
use answers::{api_of, headers_of};

const TABLE: &str = include_str!("fixtures/vendor-codes.jsonl");

fn rows() -> Vec<Value> {
    answers::json_lines(TABLE)
}

/// Every documented code comes out in the class DESIGN 4 gives its meaning, and the
/// verdict names a signal read from the body (or the status, when the vendor's table
/// gives nothing more than the status).
#[test]
fn every_documented_code_is_classified_by_its_meaning() {
    let rows = rows();
    let mut wrong = vec![];
    let mut per_vendor: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in &rows {
        let api = api_of(r);
        let status = r["status"].as_u64().unwrap() as u16;
        let body = r["body"].as_str().unwrap();
        let e = explain(api, status, &headers_of(r), body);
        let got = e
            .outcome
            .class()
            .map(FailureClass::as_str)
            .unwrap_or("success");
        let want = r["expected_class"].as_str().unwrap();
        let vendor = r["vendor"].as_str().unwrap().to_string();
        let tally = per_vendor.entry(vendor.clone()).or_default();
        tally.1 += 1;
        if got == want {
            tally.0 += 1;
        } else {
            wrong.push(format!(
                "{vendor} {} (HTTP {status}): want {want}, got {got} by {}\n    {body}",
                r["code"].as_str().unwrap_or(""),
                e.signal
            ));
        }
    }
    let mut table = String::new();
    for (v, (right, total)) in &per_vendor {
        table.push_str(&format!("{v:<24} {right:>3} / {total:<3}\n"));
    }
    println!("{table}");
    assert!(
        wrong.is_empty(),
        "{} of {} documented codes misread:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}

/// No documented content-policy code, in any vendor's words or language, ends in a
/// class that fails over, whatever status it is sent with.
#[test]
fn no_documented_refusal_fails_over_under_any_status() {
    for r in rows()
        .iter()
        .filter(|r| r["expected_class"] == "content_refusal")
    {
        let api = api_of(r);
        let body = r["body"].as_str().unwrap();
        // Under its documented status, `--explain` names the vocabulary row (and its
        // source) that decided, never the bare status.
        let documented = r["status"].as_u64().unwrap() as u16;
        let e = explain(api, documented, &headers_of(r), body);
        assert!(
            e.signal.source != "status" && !e.signal.basis.is_empty(),
            "{} {}: decided by {} (basis {:?})",
            r["vendor"],
            r["code"],
            e.signal,
            e.signal.basis
        );
        for status in [400, 403, 422, 429, 446, 500, 502, 503, 520] {
            let class = explain(api, status, &headers_of(r), body)
                .outcome
                .class()
                .unwrap();
            for mode in [Mode::Hard, Mode::Soft] {
                assert!(
                    !fails_over(class, mode),
                    "{} {} under {status}: {class}",
                    r["vendor"],
                    r["code"]
                );
            }
        }
    }
}

/// The table is what it says: synthesised from documentation, each line with its
/// source, broad across vendors and classes.
#[test]
fn the_table_is_sourced_marked_and_broad() {
    let rows = rows();
    // The `vocabulary-*` lines say documented meanings in other languages; they are no
    // vendor of their own.
    let vendors: BTreeSet<&str> = rows
        .iter()
        .map(|r| r["vendor"].as_str().unwrap())
        .filter(|v| !v.starts_with("vocabulary-"))
        .collect();
    let classes: BTreeSet<&str> = rows
        .iter()
        .map(|r| r["expected_class"].as_str().unwrap())
        .collect();
    for r in &rows {
        assert_eq!(r["synthesised"], true, "{r}");
        assert!(!r["doc"].as_str().unwrap().is_empty(), "{r}");
        assert!(FailureClass::parse(r["expected_class"].as_str().unwrap()).is_some());
    }
    assert!(rows.len() >= 350, "{} rows", rows.len());
    assert!(vendors.len() >= 35, "{} vendors", vendors.len());
    for c in [
        "auth",
        "rate_limited",
        "context_length",
        "model_not_found",
        "content_refusal",
        "overloaded",
        "server_error",
        "timeout",
        "malformed",
    ] {
        assert!(classes.contains(c), "no row of class {c}");
    }
}
