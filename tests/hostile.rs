//! Hostile clients cost nothing: a stranger's body is never read, load beyond the
//! in-flight limit is shed with 503 + Retry-After, `/metrics` (every policy's remaining
//! budget) can sit behind a token or on its own address, a missing provider
//! credential tells the client nothing about where secrets live, a redirecting
//! upstream is never followed, and money in refusals is shown in minor units.
//!
//! Real HTTP on loopback against the mock vendors. Nothing here is timed: a held call
//! is held by a gate the test opens, and "the gateway did not wait for the body" is
//! proved by an answer arriving while the body is still unsent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::sync::Arc;

use common::vendors::Script;
use common::{provider, sha};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "key-hostile";

fn policy(id: &str, key: &str, models: &str, extra: &str) -> String {
    format!(
        "kind: policy\nid: {id}\nclients:\n  - {{ id: {id}-bot, key_sha256: \"{}\" }}\nmodels: [{models}]\njurisdictions: [us]\nceiling: {{ per_request: \"5\", mode: hard }}\nmax_output_tokens: 100\n{extra}",
        sha(key)
    )
}

/// One OpenAI-shaped provider `p` serving `m`, one policy for `KEY`.
async fn one_provider(tune: impl FnOnce(&mut purser::http::Options)) -> common::Gateway {
    common::start_tuned(
        |v| {
            vec![
                // Long enough that a call held at the vendor is never cut by the gateway.
                provider(v, "p", "openai", "us", &[("m", "0.15", "0.60")])
                    .replace("timeout_ms: 300", "timeout_ms: 60000"),
                policy(
                    "pol",
                    KEY,
                    "m",
                    "budgets:\n  - { period: day, limit: \"3\" }\n",
                ),
            ]
        },
        Some(common::ADMIN),
        tune,
    )
    .await
}

/// Send the head of a POST announcing `announced` body bytes and only `sent` of them,
/// then read the answer's status line. Answering proves the body was not awaited: the
/// rest of it never comes. The timeout only turns a hang into a failure.
async fn status_before_body(
    addr: std::net::SocketAddr,
    auth: Option<&str>,
    announced: usize,
    sent: usize,
) -> String {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = auth
        .map(|k| format!("authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{auth}content-length: {announced}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&vec![b'{'; sent]).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !got.windows(2).any(|w| w == b"\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), read)
        .await
        .expect("no answer: the gateway waited for a body it should never read");
    let text = String::from_utf8_lossy(&got).to_string();
    text.lines().next().unwrap_or_default().to_string()
}

async fn post_raw(g: &common::Gateway, key: Option<&str>, body: Vec<u8>) -> (u16, Value) {
    let mut rb = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    let r = rb.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_wrong_or_missing_key_is_refused_before_the_body_is_read() {
    let g = one_provider(|_| {}).await;
    let nine_mib = 9 * 1024 * 1024;
    // A 9 MiB body announced, 64 KiB of it sent: the 401 comes without the rest.
    for auth in [Some("not-a-client-key"), None] {
        let line = status_before_body(g.addr, auth, nine_mib, 64 * 1024).await;
        assert!(line.starts_with("HTTP/1.1 401"), "{auth:?}: {line}");
    }
    // A body that is not JSON is never parsed for a stranger: 401, not 400.
    let (status, v) = post_raw(&g, Some("not-a-client-key"), b"{not json".to_vec()).await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "unauthorized");
    let (status, v) = post_raw(&g, None, b"{not json".to_vec()).await;
    assert_eq!(status, 401, "{v}");
    // The client it belongs to still gets the parser's verdict and the body limit.
    let (status, v) = post_raw(&g, Some(KEY), b"{not json".to_vec()).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_request");
    let (status, v) = post_raw(&g, Some(KEY), vec![b' '; 11 * 1024 * 1024]).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(g.vendors.calls("p"), 0);
    // A stranger is counted as refused, as the engine counts its own refusals.
    let (_, text) = g.get_as("/metrics", None).await;
    assert!(
        text.lines().any(|l| l.starts_with("purser_refusals_total")
            && l.contains("unauthorized")
            && l.ends_with(" 4")),
        "{text}"
    );
}

#[tokio::test]
async fn requests_beyond_max_in_flight_get_503_with_retry_after() {
    let g = one_provider(|o| o.max_in_flight = 2).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    g.vendors.script(
        "p",
        vec![Script::Hold(gate.clone()), Script::Hold(gate.clone())],
    );
    let g = Arc::new(g);
    let held: Vec<_> = (0..2)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { g.chat(KEY, "m").await })
        })
        .collect();
    // Both are in the gateway once both calls reached the vendor.
    for _ in 0..3000 {
        if g.vendors.calls("p") == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        g.vendors.calls("p"),
        2,
        "the held calls never reached the vendor"
    );

    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let v: Value = r.json().await.unwrap();
    let e = &v["error"];
    assert_eq!(e["code"], "overloaded", "{v}");
    for field in [
        "message",
        "type",
        "code",
        "provider",
        "request_id",
        "attempts",
    ] {
        assert!(e.get(field).is_some(), "{field} missing: {v}");
    }
    // Shed load is not an upstream call and not a ledger row.
    assert_eq!(g.vendors.calls("p"), 2);
    // A stranger is still told 401 at the limit: the key is checked first.
    let (status, _) = post_raw(&g, Some("not-a-client-key"), b"{}".to_vec()).await;
    assert_eq!(status, 401);

    gate.add_permits(2);
    for h in held {
        let (status, _, v) = h.await.unwrap();
        assert_eq!(status, 200, "{v}");
    }
    // The permits came back: the next request is served.
    assert_eq!(g.chat(KEY, "m").await.0, 200);
    let requests = g.admin_json("/audit/v1/requests").await;
    assert_eq!(
        requests["requests"].as_array().unwrap().len(),
        3,
        "{requests}"
    );
}

/// Two policies with budgets: `/metrics` shows what is left of each.
async fn two_budgets(tune: impl FnOnce(&mut purser::http::Options)) -> common::Gateway {
    common::start_tuned(
        |v| {
            vec![
                provider(v, "p", "openai", "us", &[("m", "0.15", "0.60")]),
                policy(
                    "alpha",
                    KEY,
                    "m",
                    "budgets:\n  - { period: day, limit: \"3\" }\n",
                ),
                policy(
                    "beta",
                    "key-beta",
                    "m",
                    "budgets:\n  - { period: month, limit: \"40\" }\n",
                ),
            ]
        },
        Some(common::ADMIN),
        tune,
    )
    .await
}

fn shows_every_budget(text: &str) {
    for policy in ["alpha", "beta"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("purser_budget_remaining_nanos{")
                    && l.contains(&format!("policy=\"{policy}\""))),
            "{policy} missing:\n{text}"
        );
    }
}

#[tokio::test]
async fn metrics_behind_a_token() {
    let token = "metrics-token-for-tests";
    let g = two_budgets(|o| {
        o.metrics =
            purser::http::MetricsAccess::Token(purser::http::AdminToken::new(token).unwrap())
    })
    .await;
    let (status, body) = g.get_as("/metrics", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("purser_budget"), "{body}");
    let (status, _) = g.get_as("/metrics", Some("metrics-token-for-test")).await;
    assert_eq!(status, 401);
    let (status, _) = g.get_as("/metrics", Some(common::ADMIN)).await;
    assert_eq!(status, 401, "the admin token is not the metrics token");
    let (status, text) = g.get_as("/metrics", Some(token)).await;
    assert_eq!(status, 200);
    shows_every_budget(&text);
}

#[tokio::test]
async fn metrics_on_their_own_listener_leave_the_main_one() {
    let g = two_budgets(|o| o.metrics = purser::http::MetricsAccess::Elsewhere).await;
    let (status, _) = g.get_as("/metrics", None).await;
    assert_eq!(status, 404);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = purser::http::metrics_router(g.engine.clone(), None);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let r = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    shows_every_budget(&r.text().await.unwrap());
    // The metrics address serves nothing else.
    let r = reqwest::get(format!("http://{addr}/v1/models"))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

#[tokio::test]
async fn purser_serve_wires_metrics_listen_token_max_in_flight_and_durability() {
    let g = two_budgets(|_| {}).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let db = g.dir.path().join("serve.db");
    let child = common::serve_child(
        &g.config,
        &db,
        &[
            "--metrics-listen",
            &metrics_addr,
            "--max-in-flight",
            "8",
            "--durability",
            "normal",
        ],
        &[("PURSER_METRICS_TOKEN", "serve-metrics-token")],
        false,
    )
    .await;
    let client = reqwest::Client::new();
    let main = client
        .get(format!("{}/metrics", child.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(main.status().as_u16(), 404);
    let url = format!("http://{metrics_addr}/metrics");
    let anonymous = client.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let r = client
        .get(&url)
        .bearer_auth("serve-metrics-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    shows_every_budget(&r.text().await.unwrap());

    let zero = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["serve", "--max-in-flight", "0", "--config"])
        .arg(&g.config)
        .output()
        .unwrap();
    assert_eq!(zero.status.code(), Some(2));
    // A durability that is not one of the two is a usage error naming them.
    let bogus = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["serve", "--durability", "sometimes", "--config"])
        .arg(&g.config)
        .output()
        .unwrap();
    assert_eq!(bogus.status.code(), Some(2));
    let said = String::from_utf8_lossy(&bogus.stderr);
    assert!(said.contains("full") && said.contains("normal"), "{said}");
}

#[tokio::test]
async fn a_missing_credential_names_no_variable_and_no_path() {
    const VAR: &str = "PURSER_HOSTILE_TEST_KEY_NEVER_SET";
    const PATH: &str = "/nonexistent-purser-secrets/openai-key";
    let g = common::start(|v| {
        vec![
            provider(v, "by-env", "openai", "us", &[("m-env", "0.15", "0.60")]).replace(
                "jurisdiction: us\n",
                &format!("jurisdiction: us\ncredential: {{ env: {VAR} }}\n"),
            ),
            provider(v, "by-file", "openai", "us", &[("m-file", "0.15", "0.60")]).replace(
                "jurisdiction: us\n",
                &format!("jurisdiction: us\ncredential: {{ file: {PATH} }}\n"),
            ),
            policy("pol", KEY, "m-env, m-file", ""),
        ]
    })
    .await;
    for (model, provider) in [("m-env", "by-env"), ("m-file", "by-file")] {
        let (status, id, v) = g.chat(KEY, model).await;
        assert_ne!(status, 200, "{v}");
        let body = v.to_string();
        assert!(body.contains(provider), "{body}");
        assert!(body.contains("no usable credential"), "{body}");
        assert!(!body.contains(VAR), "{body}");
        assert!(!body.contains("nonexistent-purser-secrets"), "{body}");
        let record = g
            .admin_json(&format!("/audit/v1/requests/{}", id.unwrap()))
            .await;
        let ledger = record.to_string();
        assert!(!ledger.contains(VAR), "{ledger}");
        assert!(!ledger.contains("nonexistent-purser-secrets"), "{ledger}");
        assert_eq!(g.vendors.calls(provider), 0);
    }
}

#[tokio::test]
async fn a_redirect_from_upstream_is_never_followed() {
    let g = common::start(|v| {
        vec![
            // A loaded machine must not turn the 302 into a timeout.
            provider(v, "p", "openai", "us", &[("m", "0.15", "0.60")])
                .replace("timeout_ms: 300", "timeout_ms: 30000"),
            provider(v, "elsewhere", "openai", "eu", &[("m", "0.15", "0.60")]),
            policy("pol", KEY, "m", ""),
        ]
    })
    .await;
    let to = format!("http://{}/elsewhere/v1/chat/completions", g.vendors.addr);
    g.vendors.script("p", vec![Script::Redirect(to)]);
    let (status, id, v) = g.chat(KEY, "m").await;
    assert_ne!(status, 200, "{v}");
    assert_eq!(g.vendors.calls("p"), 1);
    assert_eq!(g.vendors.calls("elsewhere"), 0, "the redirect was followed");
    let record = g
        .admin_json(&format!("/audit/v1/requests/{}", id.unwrap()))
        .await;
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{record}");
    assert_eq!(attempts[0]["status"], 302, "{record}");
    assert_eq!(attempts[0]["class"], "unclassified", "{record}");
}

#[tokio::test]
async fn a_budget_refusal_shows_amounts_in_minor_units() {
    // Worst case ≈ 0.1 + 0.1 = 0.2 per request against a day budget of 0.1.
    let g = common::start(|v| {
        vec![
            provider(v, "p", "openai", "us", &[("m", "1000", "1000")]),
            policy(
                "pol",
                KEY,
                "m",
                "budgets:\n  - { period: day, limit: \"0.1\" }\n",
            ),
        ]
    })
    .await;
    let (status, _, v) = g.chat(KEY, "m").await;
    assert_eq!(status, 402, "{v}");
    assert_eq!(v["error"]["code"], "budget_exhausted");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("limit 0.10, spent 0.00, reserved 0.00, remaining 0.10"),
        "{message}"
    );
    assert_eq!(g.vendors.calls("p"), 0);
}
