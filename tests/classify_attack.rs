//! Adversarial answers against the classifier (issue 21's review): benign words that
//! must not freeze an outage, echoes of the client's prompt, successes that must stay
//! successes, 404s on a path, and hostile bodies that must not cost seconds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use purser::failure::{FailureClass, Outcome, READ_BOUND, classify, explain, read_kept};
use purser::policy::plan::Api;
use serde_json::json;

#[path = "common/answers.rs"]
mod answers;

fn class(status: u16, body: &serde_json::Value) -> Option<FailureClass> {
    classify(Api::Openai, status, &[], &body.to_string()).class()
}

#[test]
fn a_prompt_echoed_back_in_an_outage_is_no_refusal() {
    // Gateways that echo the request put the user's words under keys naming the input;
    // a prompt that mentions "harmful" or "jailbreak" does not make a 5xx a refusal.
    for (status, body, want) in [
        (
            500,
            json!({"error": {"message": "internal error"}, "query": "how do I avoid harmful chemicals at home?"}),
            FailureClass::ServerError,
        ),
        (
            502,
            json!({"error": {"message": "Bad gateway"}, "context": "this is sensitive medical data"}),
            FailureClass::ServerError,
        ),
        (
            500,
            json!({"error": {"message": "internal server error", "input_text": "explain the jailbreak of an iPhone"}}),
            FailureClass::ServerError,
        ),
        (
            503,
            json!({"error": {"message": "Service unavailable", "user_prompt": "is this toxic?"}}),
            FailureClass::Overloaded,
        ),
        (
            500,
            json!({"error": {"message": "internal server error", "body": "{\"messages\":[{\"role\":\"user\",\"content\":\"is this toxic?\"}]}"}}),
            FailureClass::ServerError,
        ),
    ] {
        assert_eq!(class(status, &body), Some(want), "{body}");
    }
    // The verdict fields the generic pass was built for still count.
    let verdict = json!({"error": {"message": "blocked"}, "description": "Violation of the hate guardrail detected."});
    assert_eq!(class(500, &verdict), Some(FailureClass::ContentRefusal));
}

#[test]
fn a_success_with_an_empty_error_field_is_a_success() {
    for error in [
        json!({}),
        json!(false),
        json!(0),
        json!({"code": 0, "message": ""}),
    ] {
        let body = json!({"choices": [{"message": {"content": "hi"}}], "error": error});
        assert_eq!(
            classify(Api::Openai, 200, &[], &body.to_string()),
            Outcome::Success,
            "{body}"
        );
    }
    // An error that says something is still read.
    let body = json!({"error": {"message": "Rate limit exceeded", "code": 429}});
    assert_eq!(class(200, &body), Some(FailureClass::RateLimited));
}

#[test]
fn a_404_on_a_path_is_malformed_even_when_the_path_says_models() {
    for body in [
        r#"{"error":{"message":"Unknown request URL: POST /v1/models/chat. Please check the URL"}}"#,
        "Cannot POST /api/v1/model/generate",
    ] {
        assert_eq!(
            classify(Api::Openai, 404, &[], body).class(),
            Some(FailureClass::Malformed),
            "{body}"
        );
    }
    // A 404 naming a model by its resource name is still the model.
    let named = r#"{"error":{"message":"models/gemini-9 is gone for API version v1beta"}}"#;
    assert_eq!(
        classify(Api::Openai, 404, &[], named).class(),
        Some(FailureClass::ModelNotFound)
    );
}

#[test]
fn a_refusal_later_in_a_list_is_still_read() {
    let body = json!({"detail": [{"msg": "a"}, {"msg": "b"}, {"msg": "c"}, {"msg": "d"}, {"msg": "input was flagged as harmful"}]});
    assert_eq!(class(500, &body), Some(FailureClass::ContentRefusal));
}

/// The work a hostile body can make is bounded by what the reader keeps to judge
/// (values and bytes of text), not by the body's size: 20,000 `errors[]`, reasons or
/// exception keys, 300 messages of 64 KB, a 10 MB message. Asserted on those counts,
/// never on a clock; `cargo bench --bench classify` prints what such bodies cost
/// (10–27 s each in release before the bound).
#[test]
fn a_hostile_body_costs_bounded_work() {
    let bodies = answers::hostile_bodies();
    let (max_values, max_bytes) = READ_BOUND;
    // The bound itself is small: real error bodies carry a few dozen values and a few
    // kilobytes of prose, and every value kept costs a pass of every dialect row.
    assert!(
        max_values <= 1024 && max_bytes <= 256 * 1024,
        "{READ_BOUND:?}"
    );
    for (what, body) in bodies {
        let (values, bytes) = read_kept(&[], Some(&body), "");
        assert!(
            values <= max_values && bytes <= max_bytes,
            "{what}: kept {values} values, {bytes} bytes"
        );
        // Bounded, and still read: the first values decide as they would alone.
        assert!(values > 0, "{what}: nothing read");
    }
    // The same holds through the public entry point, which parses the body itself.
    let big = json!({"error": {"message": "a b ".repeat(2_500_000)}}).to_string();
    assert_eq!(
        explain(Api::Openai, 500, &[], &big).outcome.class(),
        Some(FailureClass::ServerError)
    );
}

#[test]
fn a_bearer_named_in_an_outage_or_a_rate_limit_does_not_freeze_it_into_auth() {
    for (status, msg, want) in [
        (
            503,
            "upstream connect error: Authorization: Bearer sk-*** service unavailable",
            FailureClass::Overloaded,
        ),
        (
            429,
            "Rate limit exceeded for Bearer key sk-abc",
            FailureClass::RateLimited,
        ),
        (
            500,
            "Request to https://api.x.ai with the Bearer token forwarded; connection reset",
            FailureClass::ServerError,
        ),
        // A Bearer credential said missing or wrong is still the key, whatever the status.
        (500, "Missing Bearer token", FailureClass::Auth),
        (
            502,
            "Bearer token is invalid or expired",
            FailureClass::Auth,
        ),
    ] {
        let body = json!({"error": {"message": msg}});
        assert_eq!(class(status, &body), Some(want), "{status} {msg}");
    }
}

#[test]
fn advice_beside_an_outage_is_no_refusal() {
    // "See our content policy" in a help or docs field says where to read, not that
    // anything was refused: the outage stays a failover class.
    for (status, body, want) in [
        (
            503,
            json!({"error": {"message": "Service temporarily unavailable"}, "help": "Requests that violate our content policy are rejected; see the docs."}),
            FailureClass::Overloaded,
        ),
        (
            429,
            json!({"error": {"message": "Rate limit exceeded", "documentation_url": "https://example.com/safety-filter"}, "hint": "moderation applies to all requests"}),
            FailureClass::RateLimited,
        ),
    ] {
        assert_eq!(class(status, &body), Some(want), "{body}");
    }
}
