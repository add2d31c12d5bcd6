//! `stream: true` end to end against the streaming mock vendors of each API:
//! translation to OpenAI chunks with the closing usage chunk; classification and
//! failover before the first content; after it, an error event and a `maybe_billed`
//! row instead of a splice; client disconnects recorded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::time::Duration;

use common::vendors::Script;
use common::{Gateway, provider, sha};
use futures_util::StreamExt;
use purser::ledger::read::RequestRow;
use purser::money::Money;
use serde_json::{Value, json};

const SOFT: &str = "key-stream-soft";
const HARD: &str = "key-stream-hard";

async fn gateway() -> Gateway {
    common::start(|vendors| {
        vec![
            provider(vendors, "oa", "openai", "us", &[("m", "0.15", "0.60")]),
            provider(vendors, "an", "anthropic", "us", &[("m", "0.25", "1.25"), ("c", "0.25", "1.25")]),
            provider(vendors, "ge", "gemini", "us", &[("g", "0.10", "0.40")]),
            format!(
                "kind: policy\nid: soft\nclients:\n  - {{ id: s, key_sha256: \"{}\" }}\nmodels: [m, c, g]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: soft }}\nmax_output_tokens: 100\nalternates:\n  m: an/m\n",
                sha(SOFT)
            ),
            format!(
                "kind: policy\nid: hard\nclients:\n  - {{ id: h, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\nalternates:\n  m: an/m\n",
                sha(HARD)
            ),
        ]
    })
    .await
}

fn body(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hello"}]})
}

/// POST a streaming request; the response as it starts.
async fn send(g: &Gateway, key: &str, model: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body(model))
        .send()
        .await
        .unwrap()
}

fn request_id(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-purser-request-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

/// Status, request id, and the SSE data payloads in order.
async fn stream(g: &Gateway, key: &str, model: &str) -> (u16, String, Vec<String>) {
    let r = send(g, key, model).await;
    let status = r.status().as_u16();
    let id = request_id(&r);
    let text = r.text().await.unwrap_or_default();
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    (status, id, data)
}

fn text_of(data: &[String]) -> String {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

/// The request row once its stream has been recorded to the end.
async fn settled(g: &Gateway, id: &str) -> RequestRow {
    for _ in 0..200 {
        let conn = purser::ledger::read::open_reader(&g.db).unwrap();
        if let Some(r) = purser::ledger::read::request(&conn, id).unwrap()
            && r.outcome != "in_flight"
        {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request {id} never left in_flight");
}

#[tokio::test]
async fn each_api_streams_as_openai_chunks_with_usage_and_exact_cost() {
    let g = gateway().await;
    for (model, provider, price_in, price_out) in [
        ("m", "oa", "0.15", "0.60"),
        ("c", "an", "0.25", "1.25"),
        ("g", "ge", "0.10", "0.40"),
    ] {
        let (status, id, data) = stream(&g, SOFT, model).await;
        assert_eq!(status, 200, "{model}: {data:?}");
        assert_eq!(text_of(&data), format!("Hello from {provider}."), "{model}");
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{model}");
        let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 12, "{model}");
        assert_eq!(usage["usage"]["completion_tokens"], 8, "{model}");
        let first: Value = serde_json::from_str(&data[0]).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["model"], model, "the client's model name");
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let finish: Vec<&str> = data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .map(|s| if s == "stop" { "stop" } else { "other" })
            .collect();
        assert_eq!(finish, ["stop"], "{model}: one finish reason");

        let row = settled(&g, &id).await;
        assert_eq!(
            (row.outcome.as_str(), row.served_by.as_deref()),
            ("served", Some(provider))
        );
        let a = &row.attempts[0];
        assert_eq!(
            (a.class.as_deref(), a.billing.as_str()),
            (Some("success"), "billed")
        );
        assert_eq!((a.input_tokens, a.output_tokens), (Some(12), Some(8)));
        let want = (price_in.parse::<Money>().unwrap().decimal() * rust_decimal::Decimal::from(12)
            + price_out.parse::<Money>().unwrap().decimal() * rust_decimal::Decimal::from(8))
            / rust_decimal::Decimal::from(1_000_000);
        assert_eq!(a.cost.parse::<Money>().unwrap().decimal(), want, "{model}");
        assert_eq!(
            usage["purser_cost"]
                .as_str()
                .unwrap()
                .parse::<Money>()
                .unwrap()
                .decimal(),
            want
        );
    }
}

#[tokio::test]
async fn an_error_event_before_content_fails_over_like_a_plain_error() {
    // The class is the error's, as for the same error sent plainly; the 2xx head makes
    // the attempt maybe billed (DESIGN 5), which a soft ceiling allows to fail over.
    let g = gateway().await;
    g.vendors.script("oa", vec![Script::StreamError(r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#.into())]);
    let (status, id, data) = stream(&g, SOFT, "m").await;
    assert_eq!(status, 200);
    assert_eq!(
        text_of(&data),
        "Hello from an.",
        "the alternate's stream, nothing from the first"
    );
    let row = settled(&g, &id).await;
    let classes: Vec<_> = row
        .attempts
        .iter()
        .map(|a| {
            (
                a.provider.as_str(),
                a.class.as_deref().unwrap(),
                a.billing.as_str(),
                a.decision.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        classes,
        [
            ("oa", "rate_limited", "maybe_billed", "failover"),
            ("an", "success", "billed", "served")
        ]
    );
    assert_eq!((g.vendors.calls("oa"), g.vendors.calls("an")), (1, 1));
}

/// Under a hard ceiling the same stream stops: its 2xx head means the vendor accepted
/// the call, so it is the request's one potentially billable attempt.
#[tokio::test]
async fn an_error_event_after_a_2xx_head_stops_a_hard_request() {
    let g = gateway().await;
    g.vendors.script("oa", vec![Script::StreamError(r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#.into())]);
    let r = send(&g, HARD, "m").await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limited", "{v}");
    let id = v["error"]["request_id"].as_str().unwrap().to_string();
    let row = settled(&g, &id).await;
    assert_eq!(row.attempts.len(), 1);
    assert_eq!(row.attempts[0].billing, "maybe_billed");
    assert_eq!((g.vendors.calls("oa"), g.vendors.calls("an")), (1, 0));
}

#[tokio::test]
async fn a_cut_before_content_is_dropped_and_hard_does_not_fail_over() {
    let g = gateway().await;
    g.vendors.script("oa", vec![Script::StreamCut(0)]);
    let r = send(&g, HARD, "m").await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "dropped");
    assert_eq!(
        (g.vendors.calls("oa"), g.vendors.calls("an")),
        (1, 0),
        "maybe billed: no second call under hard"
    );

    // Soft may fail over on the same cut.
    g.vendors.script("oa", vec![Script::StreamCut(0)]);
    let (status, _, data) = stream(&g, SOFT, "m").await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&data), "Hello from an.");
}

#[tokio::test]
async fn a_failure_after_content_ends_the_stream_with_an_error_event() {
    let g = gateway().await;
    // Cut after the first content chunk.
    g.vendors.script("oa", vec![Script::StreamCut(1)]);
    let (status, id, data) = stream(&g, SOFT, "m").await;
    assert_eq!(status, 200);
    assert_eq!(text_of(&data), "Hello from ");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "dropped", "{data:?}");
    assert_eq!(last["error"]["provider"], "oa");
    assert_eq!(last["error"]["request_id"], id.as_str());
    assert!(!data.iter().any(|d| d == "[DONE]"));
    assert_eq!(
        g.vendors.calls("an"),
        0,
        "nothing is spliced from the alternate"
    );
    let row = settled(&g, &id).await;
    assert_eq!(
        (row.outcome.as_str(), row.error_code.as_deref()),
        ("failed", Some("dropped"))
    );
    let a = &row.attempts[0];
    assert_eq!(
        (
            a.class.as_deref(),
            a.billing.as_str(),
            a.decision.as_deref()
        ),
        (Some("dropped"), "maybe_billed", Some("stop"))
    );

    // An error event mid-stream keeps its own class, and is maybe billed too.
    g.vendors.script("oa", vec![Script::StreamErrorAfter(2, r#"{"error":{"message":"The server is overloaded","type":"server_error","code":"overloaded"}}"#.into())]);
    let (_, id, data) = stream(&g, SOFT, "m").await;
    assert_eq!(text_of(&data), "Hello from oa.");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "overloaded", "{data:?}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("overloaded")
    );
    let row = settled(&g, &id).await;
    assert_eq!(
        (
            row.attempts[0].class.as_deref(),
            row.attempts[0].billing.as_str()
        ),
        (Some("overloaded"), "maybe_billed")
    );
}

#[tokio::test]
async fn a_blocked_stream_is_a_refusal_not_a_failover() {
    let g = gateway().await;
    g.vendors.script("oa", vec![Script::StreamError(r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","code":"content_policy_violation"}}"#.into())]);
    let r = send(&g, SOFT, "m").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "content_refusal");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("safety system")
    );
    assert_eq!(g.vendors.calls("an"), 0);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_is_recorded() {
    let g = gateway().await;
    g.vendors.script("oa", vec![Script::StreamSlow(100)]);
    let r = send(&g, SOFT, "m").await;
    let id = request_id(&r);
    let mut chunks = r.bytes_stream();
    let first = chunks.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("Hello from "));
    drop(chunks); // the client goes away
    // The upstream call is not cut: it runs to its end, so the ledger records what the
    // vendor billed, and the request says the client left.
    let row = settled(&g, &id).await;
    assert_eq!(
        (row.outcome.as_str(), row.error_code.as_deref()),
        ("served", Some("client_disconnected"))
    );
    let a = &row.attempts[0];
    assert_eq!(
        (a.class.as_deref(), a.billing.as_str(), a.cost.as_str()),
        (Some("success"), "billed", "0.0000066")
    );
    assert_eq!((a.input_tokens, a.output_tokens), (Some(12), Some(8)));
}
