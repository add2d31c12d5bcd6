//! The DESIGN 5 rows that `tests/gateway.rs` does not already cover, over real HTTP
//! against the mock vendors (tests/common/vendors.rs): every refusal class, a
//! blocked 2xx from each vendor, each adapter's wire shape, every provider-side class
//! failing over, the same-upstream alternate skipped, the alternate over the ceiling,
//! and the alternate failing too. Each checks what the client got, the calls each
//! provider received, and the ledger rows.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::vendors::Script;
use common::{Gateway, provider, sha};
use purser::ledger::read::RequestRow;

const SOFT: &str = "key-dec-soft";
const HARD: &str = "key-dec-hard";
/// OpenAI's 429 for too many requests.
const RATE_LIMITED: &str =
    r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;

/// primary `a` (cheapest), alternate `b`; `same` is the same upstream as `a`; `pricey`
/// is an alternate no hard request fits.
async fn gateway() -> Gateway {
    common::start(|vendors| {
        let same = provider(vendors, "same", "openai", "us", &[("m", "0.20", "0.80")]).replace(
            &vendors.base_url("same", "openai"),
            &vendors.base_url("a", "openai"),
        );
        vec![
            provider(vendors, "a", "openai", "us", &[("m", "0.15", "0.60")]),
            provider(vendors, "b", "anthropic", "us", &[("m", "0.25", "1.25")]),
            provider(vendors, "c", "gemini", "us", &[("m", "0.30", "1.50")]),
            same,
            provider(vendors, "pricey", "anthropic", "us", &[("m", "500", "500")]),
            policy("soft", "s", SOFT, "soft", "b"),
            policy("hard", "h", HARD, "hard", "pricey"),
            policy("twin", "t", "key-dec-twin", "soft", "same"),
        ]
    })
    .await
}

/// A policy document for model `m` in the US with a 0.05 ceiling in `mode`, one
/// client holding `key`, and `alternate` as the alternate.
fn policy(id: &str, client: &str, key: &str, mode: &str, alternate: &str) -> String {
    format!(
        "kind: policy\nid: {id}\nclients:\n  - {{ id: {client}, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: {mode} }}\nmax_output_tokens: 100\nalternates:\n  m: {alternate}/m\n",
        sha(key)
    )
}

fn row(g: &Gateway, id: &str) -> RequestRow {
    let conn = purser::ledger::read::open_reader(&g.db).unwrap();
    purser::ledger::read::request(&conn, id).unwrap().unwrap()
}

fn trail(r: &RequestRow) -> Vec<(String, String, String)> {
    r.attempts
        .iter()
        .map(|a| {
            (
                a.provider.clone(),
                a.class.clone().unwrap_or_default(),
                a.decision.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn t(p: &str, c: &str, d: &str) -> (String, String, String) {
    (p.into(), c.into(), d.into())
}

#[tokio::test]
async fn every_request_side_class_is_refused_without_a_second_call() {
    let g = gateway().await;
    for (class, status, body) in [
        (
            "model_not_found",
            404,
            r#"{"error":{"message":"The model `m` does not exist or you do not have access to it.","type":"invalid_request_error","code":"model_not_found"}}"#,
        ),
        (
            "context_length",
            400,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        ),
        (
            "malformed",
            422,
            r#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error"}}"#,
        ),
        (
            "auth",
            401,
            r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        ),
    ] {
        g.vendors.reset();
        g.vendors
            .script("a", vec![Script::Status(status, body.into())]);
        let (got, id, v) = g.chat(SOFT, "m").await;
        assert_eq!(got, status, "{class}: {v}");
        assert_eq!(v["error"]["code"], class);
        assert_eq!(v["error"]["provider"], "a");
        assert_eq!(v["error"]["attempts"].as_array().unwrap().len(), 1);
        assert_eq!(
            (g.vendors.calls("a"), g.vendors.calls("b")),
            (1, 0),
            "{class}"
        );
        let r = row(&g, &id.unwrap());
        assert_eq!(trail(&r), [t("a", class, "refuse")], "{class}");
        assert_eq!(r.outcome, "refused");
    }
}

#[tokio::test]
async fn every_provider_side_class_fails_over_once_under_soft() {
    let g = gateway().await;
    for (class, script) in [
        (
            "overloaded",
            Script::Status(
                503,
                r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#.into(),
            ),
        ),
        (
            "server_error",
            Script::Status(
                500,
                r#"{"error":{"message":"internal error","type":"server_error"}}"#.into(),
            ),
        ),
        ("dropped", Script::Drop),
        ("timeout", Script::Delay(1_000)),
        (
            "unclassified",
            Script::Status(200, "<html>not json</html>".into()),
        ),
    ] {
        g.vendors.reset();
        g.vendors.script("a", vec![script]);
        let (got, id, v) = g.chat(SOFT, "m").await;
        assert_eq!(got, 200, "{class}: {v}");
        assert_eq!(
            (g.vendors.calls("a"), g.vendors.calls("b")),
            (1, 1),
            "{class}"
        );
        let r = row(&g, &id.unwrap());
        assert_eq!(
            trail(&r),
            [t("a", class, "failover"), t("b", "success", "served")],
            "{class}"
        );
        assert_eq!(r.served_by.as_deref(), Some("b"));
    }
}

#[tokio::test]
async fn the_alternate_failing_too_stops_with_both_attempts_named() {
    let g = gateway().await;
    let overloaded = || {
        Script::Status(
            503,
            r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#.into(),
        )
    };
    g.vendors.script("a", vec![overloaded()]);
    g.vendors.script(
        "b",
        vec![Script::Status(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.into(),
        )],
    );
    let (got, id, v) = g.chat(SOFT, "m").await;
    assert_eq!(got, 503, "{v}");
    let attempts: Vec<(&str, &str)> = v["error"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap(),
                a["class"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(attempts, [("a", "overloaded"), ("b", "overloaded")]);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 attempt(s)")
    );
    assert_eq!((g.vendors.calls("a"), g.vendors.calls("b")), (1, 1));
    let r = row(&g, &id.unwrap());
    assert_eq!(
        trail(&r),
        [
            t("a", "overloaded", "failover"),
            t("b", "overloaded", "stop")
        ]
    );
    assert_eq!(r.outcome, "failed");
}

#[tokio::test]
async fn an_alternate_on_the_same_upstream_is_skipped() {
    let g = gateway().await;
    g.vendors
        .script("a", vec![Script::Status(429, RATE_LIMITED.into())]);
    let (got, id, v) = g.chat("key-dec-twin", "m").await;
    assert_eq!(got, 429, "{v}");
    assert_eq!(
        g.vendors.calls("a"),
        1,
        "the twin would have hit the same upstream: no call"
    );
    let r = row(&g, &id.unwrap());
    assert_eq!(trail(&r), [t("a", "rate_limited", "stop")]);
    assert!(
        r.attempts[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("same upstream")
    );
}

#[tokio::test]
async fn an_alternate_over_the_ceiling_is_not_called() {
    let g = gateway().await;
    g.vendors
        .script("a", vec![Script::Status(429, RATE_LIMITED.into())]);
    let (got, id, v) = g.chat(HARD, "m").await;
    assert_eq!(got, 429, "{v}");
    assert_eq!((g.vendors.calls("a"), g.vendors.calls("pricey")), (1, 0));
    let r = row(&g, &id.unwrap());
    assert_eq!(trail(&r), [t("a", "rate_limited", "stop")]);
    assert!(
        r.attempts[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("does not fit the ceiling")
    );
}

#[tokio::test]
async fn a_refused_connection_fails_over_and_is_not_billed() {
    let g = common::start(|vendors| {
        let dead = provider(vendors, "dead", "openai", "us", &[("m", "0.10", "0.40")])
            .replace(&vendors.base_url("dead", "openai"), "http://127.0.0.1:9/v1");
        vec![
            dead,
            provider(vendors, "b", "anthropic", "us", &[("m", "0.25", "1.25")]),
            policy("hard", "h", HARD, "hard", "b"),
        ]
    })
    .await;
    let (got, id, v) = g.chat(HARD, "m").await;
    assert_eq!(got, 200, "{v}");
    let r = row(&g, &id.unwrap());
    assert_eq!(
        trail(&r),
        [
            t("dead", "connect", "failover"),
            t("b", "success", "served")
        ]
    );
    assert_eq!(
        r.attempts[0].billing, "not_billed",
        "nothing was sent: even hard may fail over"
    );
}

/// A gateway whose soft policy's primary `p` speaks `api`, with the OpenAI `alt` as
/// its alternate.
async fn one_vendor(api: &str) -> Gateway {
    let api = api.to_string();
    common::start(move |vendors| {
        vec![
            provider(vendors, "p", &api, "us", &[("m", "0.15", "0.60")]),
            provider(vendors, "alt", "openai", "us", &[("m", "0.25", "1.25")]),
            policy("soft", "s", SOFT, "soft", "alt"),
        ]
    })
    .await
}

/// A 200 whose content the vendor blocked is a content refusal: the alternate would
/// refuse the same prompt, so it is never asked.
#[tokio::test]
async fn a_blocked_2xx_from_each_vendor_is_refused_without_failover() {
    for api in ["openai", "anthropic", "gemini"] {
        let g = one_vendor(api).await;
        g.vendors.script("p", vec![Script::Blocked]);
        let (got, id, v) = g.chat(SOFT, "m").await;
        assert_eq!(got, 400, "{api}: {v}");
        assert_eq!(v["error"]["code"], "content_refusal", "{api}");
        assert_eq!(v["error"]["provider"], "p", "{api}");
        assert_eq!(
            (g.vendors.calls("p"), g.vendors.calls("alt")),
            (1, 0),
            "{api}"
        );
        let r = row(&g, &id.unwrap());
        assert_eq!(trail(&r), [t("p", "content_refusal", "refuse")], "{api}");
        assert_eq!(r.outcome, "refused", "{api}");
    }
}

/// What each adapter put on the wire, as the vendor received it: the client's OpenAI
/// request translated into the vendor's own shape, with the proven output bound.
#[tokio::test]
async fn each_adapter_sends_the_vendors_own_request_shape() {
    let body = serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]}
        ],
        "max_tokens": 50,
        "temperature": 0.2
    });
    for api in ["openai", "anthropic", "gemini"] {
        let g = one_vendor(api).await;
        let r = reqwest::Client::new()
            .post(g.url("/v1/chat/completions"))
            .bearer_auth(SOFT)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{api}");
        let sent = g.vendors.sent("p");
        assert_eq!(sent.len(), 1, "{api}");
        let b = &sent[0].body;
        match api {
            "openai" => {
                assert_eq!(b["model"], "m");
                assert_eq!(b["max_tokens"], 50);
                assert_eq!(b["messages"][0]["role"], "system");
                assert_eq!(b["temperature"], 0.2);
            }
            "anthropic" => {
                assert_eq!(b["model"], "m");
                assert_eq!(b["max_tokens"], 50, "max_tokens is always set");
                assert_eq!(b["system"], "Be brief.", "system lifted to the top level");
                let msgs = b["messages"].as_array().unwrap();
                assert_eq!(msgs.len(), 1, "{b}");
                assert_eq!(msgs[0]["role"], "user");
                assert_eq!(b["temperature"], 0.2);
            }
            "gemini" => {
                assert!(b.get("model").is_none(), "the model is in the path: {b}");
                assert_eq!(b["contents"][0]["role"], "user", "{b}");
                assert_eq!(b["contents"][0]["parts"][0]["text"], "hello", "{b}");
                assert_eq!(
                    b["systemInstruction"]["parts"][0]["text"], "Be brief.",
                    "{b}"
                );
                assert_eq!(b["generationConfig"]["maxOutputTokens"], 50, "{b}");
                assert_eq!(b["generationConfig"]["temperature"], 0.2, "{b}");
            }
            _ => unreachable!(),
        }
    }
}

/// A vendor that reads the request and closes the connection without answering: the
/// call may have been processed, so it is `maybe_billed`. A soft request moves to the
/// alternate; a hard one has had its one potentially billable attempt.
#[tokio::test]
async fn a_connection_dropped_before_any_answer() {
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "gone", "openai", "us", &[("m", "0.15", "0.60")])
                .replace(&vendors.base_url("gone", "openai"), &vendors.hangup_url()),
            provider(vendors, "alt", "openai", "us", &[("m", "0.25", "1.25")]),
            policy("soft", "s", SOFT, "soft", "alt"),
            policy("hard", "h", HARD, "hard", "alt"),
        ]
    })
    .await;

    let (got, id, v) = g.chat(SOFT, "m").await;
    assert_eq!(got, 200, "{v}");
    assert_eq!((g.vendors.hangups(), g.vendors.calls("alt")), (1, 1));
    let r = row(&g, &id.unwrap());
    assert_eq!(
        trail(&r),
        [
            t("gone", "dropped", "failover"),
            t("alt", "success", "served")
        ]
    );
    assert_eq!(r.attempts[0].billing, "maybe_billed");

    let (got, id, v) = g.chat(HARD, "m").await;
    assert_eq!(got, 502, "{v}");
    assert_eq!(v["error"]["code"], "dropped");
    assert_eq!((g.vendors.hangups(), g.vendors.calls("alt")), (2, 1));
    let r = row(&g, &id.unwrap());
    assert_eq!(trail(&r), [t("gone", "dropped", "stop")]);
    assert_eq!(r.outcome, "failed");
}
