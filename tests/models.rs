//! `GET /v1/models` and `GET /v1/models/{id}` as OpenAI clients read them, and the
//! `param` of error envelopes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::{provider, sha};
use serde_json::Value;

const KEY: &str = "key-models";

async fn gateway() -> common::Gateway {
    common::start(|vendors| {
        vec![
            provider(vendors, "p", "openai", "us", &[("m", "0.15", "0.60"), ("ft:gpt-4o-mini:acme", "0.15", "0.60"), ("hidden", "0.15", "0.60")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [m, ft:gpt-4o-mini:acme]\njurisdictions: [us]\nceiling: {{ per_request: \"1.00\", mode: hard }}\nmax_output_tokens: 256\n",
                sha(KEY)
            ),
        ]
    })
    .await
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap()
}

/// Every DESIGN 6 envelope field, and OpenAI's `param`.
fn assert_envelope(v: &Value, code: &str) {
    let e = &v["error"];
    for k in [
        "message",
        "type",
        "param",
        "code",
        "provider",
        "request_id",
        "attempts",
    ] {
        assert!(e.get(k).is_some(), "envelope lacks `{k}`: {v}");
    }
    assert_eq!(e["code"], code, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_gives_openai_model_objects_for_the_policy() {
    let g = gateway().await;
    let (status, body) = g.get_as("/v1/models", Some(KEY)).await;
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{v}");
    assert!(
        ids.contains(&"m") && ids.contains(&"ft:gpt-4o-mini:acme"),
        "{v}"
    );
    for m in v["data"].as_array().unwrap() {
        assert_eq!(m["object"], "model");
        assert!(m["created"].as_i64().is_some_and(|c| c > 0), "{m}");
        assert!(m["owned_by"].is_string(), "{m}");
    }
    let (status, body) = g.get_as("/v1/models", None).await;
    assert_eq!(status, 401);
    assert_envelope(&json(&body), "unauthorized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_model_answers_when_allowed_and_404s_otherwise() {
    let g = gateway().await;
    for id in ["m", "ft:gpt-4o-mini:acme"] {
        let (status, body) = g.get_as(&format!("/v1/models/{id}"), Some(KEY)).await;
        assert_eq!(status, 200, "{id}: {body}");
        let v = json(&body);
        assert_eq!(
            (v["id"].as_str(), v["object"].as_str()),
            (Some(id), Some("model"))
        );
        assert!(
            v["created"].as_i64().is_some() && v["owned_by"].is_string(),
            "{v}"
        );
    }
    // Configured on the provider but not allowed by the policy, unknown altogether, and
    // an id with a slash (schema-invalid as a model name, so never allowed): all
    // answered with OpenAI's envelope, not an empty 404.
    for id in ["hidden", "nope", "org/other"] {
        let (status, body) = g.get_as(&format!("/v1/models/{id}"), Some(KEY)).await;
        assert_eq!(status, 404, "{id}: {body}");
        let v = json(&body);
        assert_envelope(&v, "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let (status, body) = g.get_as("/v1/models/m", None).await;
    assert_eq!(status, 401, "{body}");
    assert_envelope(&json(&body), "unauthorized");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_request_names_the_field_in_param() {
    let g = gateway().await;
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_envelope(&v, "invalid_request");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    // Errors with no field at fault carry `param: null`.
    let (status, _, body) = g.chat(KEY, "not-allowed").await;
    assert_eq!(status, 403);
    assert_envelope(&body, "model_not_allowed");
    assert!(body["error"]["param"].is_null(), "{body}");
}
