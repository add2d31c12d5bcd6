//! Operations: `/metrics` after scripted traffic (counters checked against the ledger),
//! and logs of a real `purser serve` in both formats with no key in any line.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::Command;

use common::vendors::{Script, Vendors};
use common::{provider, sha};
use purser::metrics::nanos;
use purser::money::Money;

const KEY: &str = "key-ops";

/// `name{a="x",b="y"} value` lines as (name, sorted labels) -> value.
fn scrape(text: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let mut l: Vec<&str> = rest
                    .trim_end_matches('}')
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .collect();
                l.sort();
                (n.to_string(), l.join(","))
            }
            None => (series.to_string(), String::new()),
        };
        out.insert((name, labels), value.parse().unwrap());
    }
    out
}

#[tokio::test]
async fn metrics_count_what_the_ledger_holds() {
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "p1", "openai", "us", &[("m", "0.15", "0.60")]),
            provider(vendors, "p2", "anthropic", "us", &[("m", "0.25", "1.25")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\nbudgets:\n  - {{ period: day, limit: \"2\" }}\nalternates:\n  m: p2/m\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    for _ in 0..2 {
        assert_eq!(g.chat(KEY, "m").await.0, 200);
    }
    g.vendors.script("p1", vec![Script::Status(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#.into())]);
    assert_eq!(g.chat(KEY, "m").await.0, 200);
    g.vendors.script("p1", vec![Script::Status(400, r#"{"error":{"message":"Your request was rejected by our safety system.","type":"invalid_request_error","code":"content_policy_violation"}}"#.into())]);
    assert_eq!(g.chat(KEY, "m").await.0, 400);
    assert_eq!(g.chat(KEY, "other").await.0, 403);

    let (status, text) = g.get_as("/metrics", None).await;
    assert_eq!(status, 200);
    let m = scrape(&text);
    let get = |name: &str, labels: &[(&str, &str)]| {
        let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        l.sort();
        *m.get(&(name.to_string(), l.join(",")))
            .unwrap_or_else(|| panic!("{name} {labels:?} missing:\n{text}"))
    };
    assert_eq!(
        get(
            "purser_requests_total",
            &[
                ("ingress", "chat"),
                ("policy", "pol"),
                ("outcome", "served")
            ]
        ),
        3.0
    );
    assert_eq!(
        get(
            "purser_requests_total",
            &[
                ("ingress", "chat"),
                ("policy", "pol"),
                ("outcome", "content_refusal")
            ]
        ),
        1.0
    );
    assert_eq!(
        get(
            "purser_requests_total",
            &[
                ("ingress", "chat"),
                ("policy", "pol"),
                ("outcome", "model_not_allowed")
            ]
        ),
        1.0
    );
    assert_eq!(
        get(
            "purser_attempts_total",
            &[("provider", "p1"), ("class", "success")]
        ),
        2.0
    );
    assert_eq!(
        get(
            "purser_attempts_total",
            &[("provider", "p1"), ("class", "rate_limited")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "purser_attempts_total",
            &[("provider", "p1"), ("class", "content_refusal")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "purser_attempts_total",
            &[("provider", "p2"), ("class", "success")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "purser_failovers_total",
            &[("from", "p1"), ("to", "p2"), ("class", "rate_limited")]
        ),
        1.0
    );
    assert_eq!(
        get("purser_refusals_total", &[("class", "content_refusal")]),
        1.0
    );
    assert_eq!(
        get("purser_refusals_total", &[("class", "model_not_allowed")]),
        1.0
    );
    assert_eq!(
        get(
            "purser_upstream_latency_seconds_count",
            &[("provider", "p1")]
        ),
        4.0
    );
    assert_eq!(get("purser_circuit_state", &[("provider", "p1")]), 0.0);
    assert_eq!(
        get("purser_plan_info", &[("plan_id", g.engine.plan().id())]),
        1.0
    );

    // Spend and budget gauges agree with the ledger, exactly, in nano-units.
    let conn = purser::ledger::read::open_reader(&g.db).unwrap();
    for p in ["p1", "p2"] {
        let cost: String = conn
            .query_row(
                "SELECT COALESCE(dsum(cost), '0') FROM attempts WHERE provider = ?1",
                [p],
                |r| r.get(0),
            )
            .unwrap();
        let cost: Money = cost.parse().unwrap();
        assert!(cost.is_positive());
        assert_eq!(
            get(
                "purser_spend_nanos_total",
                &[("provider", p), ("currency", "USD")]
            ),
            nanos(cost) as f64,
            "{p}"
        );
    }
    let b = &purser::ledger::read::budgets(&conn).unwrap()[0];
    let remaining: Money = "2".parse::<Money>().unwrap() - b.spent.parse().unwrap();
    assert_eq!(
        get(
            "purser_budget_remaining_nanos",
            &[("policy", "pol"), ("period", "day")]
        ),
        nanos(remaining) as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_never_contain_a_key() {
    const CLIENT_KEY: &str = "sk-client-SECRET-4242";
    const PROVIDER_KEY: &str = "sk-provider-SECRET-9191";
    let vendors = Vendors::start().await;
    for format in ["json", "pretty"] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("policies");
        std::fs::create_dir_all(&config).unwrap();
        let p = provider(&vendors, "p1", "openai", "us", &[("m", "0.15", "0.60")]).replace(
            "timeout_ms: 300",
            "timeout_ms: 2000\ncredential: { env: PURSER_TEST_PROVIDER_KEY }",
        );
        std::fs::write(
            config.join("set.yaml"),
            [
                "kind: gateway\ncurrency: USD\n".to_string(),
                p,
                format!(
                    "kind: policy\nid: pol\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\n",
                    sha(CLIENT_KEY)
                ),
            ]
            .join("---\n"),
        )
        .unwrap();
        let mut served = common::serve_child(
            &config,
            &dir.path().join("l.db"),
            &["--log-format", format],
            &[
                ("PURSER_TEST_PROVIDER_KEY", PROVIDER_KEY),
                ("PURSER_ADMIN_TOKEN", "admin-SECRET-7777"),
                ("RUST_LOG", "debug"),
            ],
            true,
        )
        .await;
        let client = reqwest::Client::new();
        let base = served.base();
        let chat = |key: &'static str| {
            let client = client.clone();
            let url = format!("{base}/v1/chat/completions");
            async move {
                client
                    .post(url)
                    .bearer_auth(key)
                    .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        };
        assert_eq!(chat(CLIENT_KEY).await, 200);
        // The upstream echoes the key back in its error, as real providers do.
        vendors.script("p1", vec![Script::Status(401, format!(r#"{{"error":{{"message":"Incorrect API key provided: {PROVIDER_KEY}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#))]);
        assert_eq!(chat(CLIENT_KEY).await, 401);
        assert_eq!(chat("sk-wrong-SECRET-0000").await, 401);
        let r = client
            .get(format!("{base}/audit/v1/requests"))
            .bearer_auth("admin-SECRET-7777")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let _ = Command::new("kill")
            .args(["-TERM", &served.child.id().to_string()])
            .status();
        let _ = served.child.wait();
        let mut logs = String::new();
        served
            .child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut logs)
            .unwrap();
        assert!(
            logs.contains("attempt") && logs.contains("p1"),
            "{format}: the attempts are logged:\n{logs}"
        );
        assert!(
            logs.contains("auth"),
            "{format}: the class is logged:\n{logs}"
        );
        // Every key in this test (client, provider, admin, a wrong one) contains SECRET.
        let leaked: Vec<&str> = logs.lines().filter(|l| l.contains("SECRET")).collect();
        assert!(
            leaked.is_empty(),
            "{format}: a key reached the log:\n{}",
            leaked.join("\n")
        );
        if format == "json" {
            for line in logs.lines() {
                let v: serde_json::Value =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                assert!(v["level"].is_string());
            }
            assert!(
                logs.lines()
                    .any(|l| l.contains("\"request_id\"") && l.contains("\"policy\":\"pol\"")),
                "request spans carry the request id and policy:\n{logs}"
            );
        }
    }
}
