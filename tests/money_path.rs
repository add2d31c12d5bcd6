//! The money path under real traffic (issue #14): one test per defect found, each
//! ending with the ledger's money invariants.
//!
//! Streams whose events arrive several to a read or split anywhere, clients that hang
//! up while the call is out, fields that multiply or escape the output bound, a
//! failover that must fit the budget, answers without usage, a ledger that comes back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::time::Duration;

use common::db::Engine;
use common::money::{assert_money_invariants_on, quiesce_on};
use common::vendors::{Script, stream_body};
use common::{Gateway, provider, sha};
use proptest::prelude::*;
use purser::ledger::read::RequestRow;
use serde_json::{Value, json};

fn dec(s: &str) -> rust_decimal::Decimal {
    s.parse().unwrap()
}

const SOFT: &str = "key-money-soft";
const HARD: &str = "key-money-hard";
const PROVIDERS: [&str; 3] = ["oa", "an", "ge"];

/// Three vendors (one per API) with 3 s timeouts; a soft and a hard policy with small
/// day budgets, the soft one failing over from OpenAI to Anthropic.
fn docs(vendors: &common::vendors::Vendors, hard_budget: &str, hard_alt: bool) -> Vec<String> {
    let slow = |s: String| s.replace("timeout_ms: 300", "timeout_ms: 3000");
    vec![
        slow(provider(
            vendors,
            "oa",
            "openai",
            "us",
            &[("m", "0.15", "0.60")],
        )),
        slow(provider(
            vendors,
            "an",
            "anthropic",
            "us",
            &[("m", "0.25", "1.25"), ("c", "0.25", "1.25")],
        )),
        slow(provider(
            vendors,
            "ge",
            "gemini",
            "us",
            &[("g", "0.10", "0.40")],
        )),
        format!(
            "kind: policy\nid: soft\nclients:\n  - {{ id: s, key_sha256: \"{}\" }}\nmodels: [m, c, g]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: soft }}\nmax_output_tokens: 100\nbudgets: [ {{ period: day, limit: \"0.5\" }} ]\nalternates:\n  m: an/m\n",
            sha(SOFT)
        ),
        format!(
            "kind: policy\nid: hard\nclients:\n  - {{ id: h, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.011\", mode: hard }}\nmax_output_tokens: 100\nbudgets: [ {{ period: day, limit: \"{hard_budget}\" }} ]\n{}",
            sha(HARD),
            if hard_alt {
                "alternates:\n  m: an/m\n"
            } else {
                ""
            }
        ),
    ]
}

/// The usual gateway of these scenarios, on `e`; `None` when PostgreSQL is skipped here.
async fn gateway(e: Engine, test: &str) -> Option<Gateway> {
    common::start_on(e, test, |v| docs(v, "0.05", false)).await
}

/// Each scenario runs on both engines, as `name::sqlite` and `name::postgres`.
macro_rules! on_both_engines {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::Engine::Sqlite).await
            }
            #[tokio::test]
            async fn postgres() {
                super::$name(super::Engine::Postgres).await
            }
        }
    )*};
}

async fn post(g: &Gateway, key: &str, body: Value) -> (u16, Value, reqwest::header::HeaderMap) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.json().await.unwrap_or(Value::Null), headers)
}

fn ask(model: &str, extra: Value) -> Value {
    let mut b = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

async fn row(g: &Gateway, id: &str) -> RequestRow {
    g.ledger_db.request(id).await
}

async fn only_request(g: &Gateway) -> RequestRow {
    g.ledger_db.last_request().await
}

async fn settle(g: &Gateway) {
    // Every request's task first: one whose client gave up before its admission is not
    // in the ledger yet, so the ledger alone cannot say that nothing is left to come.
    tokio::time::timeout(Duration::from_secs(10), g.engine.drained())
        .await
        .expect("a request's task still running after 10 s");
    quiesce_on(&g.ledger_db, 10).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &PROVIDERS).await;
}

/// Streamed data payloads, with the per-request random fields (`id`, `created`) blanked
/// so two runs of the same upstream stream compare byte for byte.
async fn stream_text(g: &Gateway, model: &str) -> (String, Vec<String>) {
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(SOFT)
        .json(&ask(model, json!({"stream": true})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-purser-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let text = r.text().await.unwrap();
    let data = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let d = e.strip_prefix("data: ").unwrap_or(e);
            match serde_json::from_str::<Value>(d) {
                Ok(mut v) => {
                    v["id"] = json!("-");
                    v["created"] = json!(0);
                    v.to_string()
                }
                Err(_) => d.to_string(),
            }
        })
        .collect();
    (id, data)
}

fn content(data: &[String]) -> String {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

// 1. Several SSE events in one read: every one reaches the client, in order.
async fn a_stream_written_in_one_read_arrives_whole_for_every_api(e: Engine) {
    let Some(g) = gateway(
        e,
        "a_stream_written_in_one_read_arrives_whole_for_every_api",
    )
    .await
    else {
        return;
    };
    for (model, provider) in [("m", "oa"), ("c", "an"), ("g", "ge")] {
        g.vendors.script(provider, vec![Script::StreamBatched]);
        let (id, data) = stream_text(&g, model).await;
        assert_eq!(
            content(&data),
            format!("Hello from {provider}."),
            "{provider}: {data:?}"
        );
        assert_eq!(
            data.last().map(String::as_str),
            Some("[DONE]"),
            "{provider}"
        );
        assert!(
            !data.iter().any(|d| d.contains("\"error\"")),
            "{provider}: {data:?}"
        );
        let r = row(&g, &id).await;
        let a = &r.attempts[0];
        assert_eq!(
            (r.outcome.as_str(), a.billing.as_str()),
            ("served", "billed"),
            "{provider}"
        );
        assert_eq!(
            (a.input_tokens, a.output_tokens),
            (Some(12), Some(8)),
            "{provider}"
        );
    }
    settle(&g).await;
}

/// The same stream, cut into reads at these byte offsets, gives the client the same
/// bytes and the ledger the same row: checked for all three APIs, with `\r\n` endings
/// and multi-byte characters in the text, by property test.
#[test]
fn any_cut_of_a_stream_gives_the_same_answer_and_row() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(gateway(Engine::Sqlite, "any_cut")).unwrap();
    let mut reference: std::collections::HashMap<(usize, bool), (Vec<String>, String)> =
        Default::default();
    let body = |api: usize, crlf: bool| -> Vec<u8> {
        let (name, provider, model) = [
            ("openai", "oa", "m"),
            ("anthropic", "an", "c"),
            ("gemini", "ge", "g"),
        ][api];
        let text = String::from_utf8(stream_body(name, provider, model)).unwrap();
        // "é" and "→" are two and three bytes: cuts inside them must not corrupt them.
        let text = text.replace("Hello from ", "Héllo → from ");
        (if crlf {
            text.replace('\n', "\r\n")
        } else {
            text
        })
        .into_bytes()
    };
    let run = |api: usize, crlf: bool, cuts: &[usize]| -> (Vec<String>, String) {
        let (_, provider, model) = [
            ("openai", "oa", "m"),
            ("anthropic", "an", "c"),
            ("gemini", "ge", "g"),
        ][api];
        let bytes = body(api, crlf);
        let mut at: Vec<usize> = cuts.iter().map(|c| c % bytes.len()).collect();
        at.sort_unstable();
        at.dedup();
        let mut pieces = Vec::new();
        let mut from = 0;
        for c in at.into_iter().chain([bytes.len()]) {
            if c > from {
                pieces.push(bytes[from..c].to_vec());
                from = c;
            }
        }
        g.vendors
            .script(provider, vec![Script::StreamPieces(pieces)]);
        let (id, data) = rt.block_on(stream_text(&g, model));
        let r = rt.block_on(row(&g, &id));
        let a = &r.attempts[0];
        let ledger = format!(
            "{} {} {:?} {} {:?} {:?} {}",
            r.outcome, a.billing, a.class, a.cost, a.input_tokens, a.output_tokens, r.cost
        );
        (data, ledger)
    };
    for api in 0..3 {
        for crlf in [false, true] {
            let whole = run(api, crlf, &[]);
            assert!(content(&whole.0).starts_with("Héllo → from "), "{whole:?}");
            assert!(whole.1.starts_with("served billed"), "{whole:?}");
            reference.insert((api, crlf), whole);
        }
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                0usize..3,
                any::<bool>(),
                proptest::collection::vec(0usize..100_000, 1..8),
            ),
            |(api, crlf, cuts)| {
                let got = run(api, crlf, &cuts);
                prop_assert_eq!(
                    &got,
                    &reference[&(api, crlf)],
                    "api {} crlf {} cuts {:?}",
                    api,
                    crlf,
                    cuts
                );
                Ok(())
            },
        )
        .unwrap();
    // Every single-byte cut of one stream as well: inside `\r\n\r\n`, inside "é" and "→".
    let len = body(2, true).len();
    for c in 1..len {
        assert_eq!(
            run(2, true, &[c]),
            reference[&(2, true)],
            "gemini cut at byte {c}"
        );
    }
    rt.block_on(settle(&g));
}

// 2. A client that hangs up: the call runs to its end, is recorded at its true cost,
// and the reservation settles.
async fn a_client_that_hangs_up_leaves_nothing_in_flight_or_reserved(e: Engine) {
    let Some(g) = gateway(
        e,
        "a_client_that_hangs_up_leaves_nothing_in_flight_or_reserved",
    )
    .await
    else {
        return;
    };
    g.vendors.script("oa", vec![Script::Delay(600); 4]);
    for _ in 0..4 {
        let r = reqwest::Client::new()
            .post(g.url("/v1/chat/completions"))
            .bearer_auth(HARD)
            .timeout(Duration::from_millis(150))
            .json(&ask("m", json!({})))
            .send()
            .await;
        assert!(r.is_err(), "the client gave up before the vendor answered");
    }
    settle(&g).await;
    let rows = g
        .ledger_db
        .rows("SELECT outcome, error_code, CAST(cost AS TEXT) FROM requests")
        .await;
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert_eq!(
            (r[0].as_deref(), r[1].as_deref()),
            (Some("served"), Some("client_disconnected"))
        );
        // 12 in × 0.15/M + 8 out × 0.60/M: what the vendor billed.
        assert_eq!(r[2].as_deref().map(dec), Some(dec("0.0000066")));
    }
    // The budget is free again: a later request is served, not refused with 402.
    let (status, v, _) = post(&g, HARD, ask("m", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    settle(&g).await;
}

async fn a_stream_hung_up_on_before_its_first_content_is_recorded_at_its_cost(e: Engine) {
    let Some(g) = gateway(
        e,
        "a_stream_hung_up_on_before_its_first_content_is_recorded_at_its_cost",
    )
    .await
    else {
        return;
    };
    g.vendors.script("an", vec![Script::Delay(500)]);
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(SOFT)
        .timeout(Duration::from_millis(150))
        .json(&ask("c", json!({"stream": true})))
        .send()
        .await;
    assert!(r.is_err());
    // On a loaded machine the client can give up before the request is even admitted;
    // `settle` waits for the request's task, so the call has been made by then.
    settle(&g).await;
    assert_eq!(
        g.vendors.calls("an"),
        1,
        "the call never reached the vendor"
    );
    let r = only_request(&g).await;
    assert_eq!(
        (r.outcome.as_str(), r.error_code.as_deref()),
        ("served", Some("client_disconnected"))
    );
    assert_eq!(r.attempts[0].billing, "billed");
    assert_eq!(
        (r.attempts[0].input_tokens, r.attempts[0].output_tokens),
        (Some(12), Some(8))
    );
}

async fn a_half_open_probe_whose_client_hung_up_still_resolves(e: Engine) {
    let Some(g) = common::start_on(e, "a_half_open_probe", |v| {
        docs(v, "0.05", false)
            .into_iter()
            .map(|d| {
                d.replace(
                    "timeout_ms: 3000\n",
                    "timeout_ms: 3000\ncircuit: { failures: 1, window_s: 30, cooldown_s: 1 }\n",
                )
            })
            .collect()
    })
    .await
    else {
        return;
    };
    g.vendors.script(
        "ge",
        vec![
            Script::Status(
                500,
                r#"{"error":{"code":500,"message":"boom","status":"INTERNAL"}}"#.into(),
            ),
            Script::Delay(400),
        ],
    );
    let (status, _, _) = post(&g, SOFT, ask("g", json!({}))).await;
    assert_eq!(status, 502, "one provider fault opens the circuit");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The probe: its client hangs up while the call is out.
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(SOFT)
        .timeout(Duration::from_millis(100))
        .json(&ask("g", json!({})))
        .send()
        .await;
    assert!(r.is_err());
    settle(&g).await;
    // The probe's answer closed the circuit: the next request is called and served.
    let (status, v, _) = post(&g, SOFT, ask("g", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(g.vendors.calls("ge"), 3);
    settle(&g).await;
}

// 3. Fields that multiply or escape the output bound.
async fn n_multiplies_the_worst_case(e: Engine) {
    let Some(g) = gateway(e, "n_multiplies_the_worst_case").await else {
        return;
    };
    // 100 output tokens × 0.60/M is far under the hard ceiling of 0.011 for one choice;
    // 20,000 output tokens fit once but not eight times.
    let (status, v, _) = post(&g, HARD, ask("m", json!({"max_tokens": 15000}))).await;
    assert_eq!(status, 200, "{v}");
    let (status, v, _) = post(&g, HARD, ask("m", json!({"max_tokens": 15000, "n": 8}))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (402, Some("ceiling_exceeded")),
        "{v}"
    );
    assert_eq!(g.vendors.calls("oa"), 1, "the refused request was not sent");
    let r = only_request(&g).await;
    assert!(r.attempts.is_empty());
    settle(&g).await;
}

async fn exactly_one_output_cap_reaches_the_vendor(e: Engine) {
    let Some(g) = gateway(e, "exactly_one_output_cap_reaches_the_vendor").await else {
        return;
    };
    let (status, v, _) = post(
        &g,
        HARD,
        ask(
            "m",
            json!({"max_tokens": 1000, "max_completion_tokens": 900}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let sent = &g.vendors.sent("oa")[0].body;
    let caps: Vec<&str> = ["max_tokens", "max_completion_tokens"]
        .into_iter()
        .filter(|k| sent.get(k).is_some())
        .collect();
    assert_eq!(caps.len(), 1, "one cap is forwarded: {sent}");
    assert_eq!(
        sent[caps[0]], 900,
        "the bound the ceiling was proved with: {sent}"
    );
    settle(&g).await;
}

/// Refused under a hard ceiling and under any policy with a budget: `soft` relaxes
/// failover, never the budget (issue #20). The soft policy here has a day budget.
async fn fields_no_bound_counts_are_refused_under_hard_and_under_a_budget(e: Engine) {
    let Some(g) = gateway(
        e,
        "fields_no_bound_counts_are_refused_under_hard_and_under_a_budget",
    )
    .await
    else {
        return;
    };
    for (field, value) in [
        ("prediction", json!({"type": "content", "content": "x"})),
        ("modalities", json!(["text", "audio"])),
        ("web_search_options", json!({})),
        ("service_tier", json!("priority")),
        ("some_future_field", json!(true)),
    ] {
        let (status, v, _) = post(&g, HARD, ask("m", json!({ field: value.clone() }))).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{field}: {v}"
        );
        assert_eq!(v["error"]["param"], field, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(field));
        let (status, v, _) = post(&g, SOFT, ask("m", json!({ field: value }))).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some(field)),
            "{field} under soft with a budget: {v}"
        );
    }
    assert_eq!(g.vendors.calls("oa"), 0, "nothing unbounded was sent");
    settle(&g).await;
}

async fn a_model_name_of_a_megabyte_is_refused_before_the_ledger(e: Engine) {
    let Some(g) = gateway(e, "a_model_name_of_a_megabyte_is_refused_before_the_ledger").await
    else {
        return;
    };
    let (status, v, _) = post(&g, HARD, ask(&"x".repeat(1 << 20), json!({}))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("model_not_allowed"))
    );
    assert!(v["error"]["message"].as_str().unwrap().len() < 4096);
    assert_eq!(g.ledger_db.count("SELECT COUNT(*) FROM requests").await, 0);
}

// 4. A failover must fit the budget: the reservation is topped up before the call.
async fn a_failover_that_does_not_fit_the_budget_is_not_called(e: Engine) {
    // Hard budget 0.001 a day. With 1,000 output tokens the primary's worst case is
    // ~0.0006 (0.60/M) and fits; the alternate's is ~0.00125 (1.25/M) and does not.
    let Some(g) = common::start_on(
        e,
        "a_failover_that_does_not_fit_the_budget_is_not_called",
        |v| docs(v, "0.001", true),
    )
    .await
    else {
        return;
    };
    g.vendors.script("oa", vec![Script::Status(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#.into())]);
    let (status, v, _) = post(&g, HARD, ask("m", json!({"max_tokens": 100}))).await;
    assert_eq!(status, 200, "a small request still fits: {v}");
    g.vendors.script("oa", vec![Script::Status(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#.into())]);
    let (status, v, _) = post(&g, HARD, ask("m", json!({"max_tokens": 1000}))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (402, Some("budget_exhausted")),
        "{v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("oa") && msg.contains("an"),
        "names both: {msg}"
    );
    assert_eq!(
        g.vendors.calls("an"),
        1,
        "only the first request's failover reached the alternate"
    );
    let r = only_request(&g).await;
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(r.error_code.as_deref(), Some("budget_exhausted"));
    settle(&g).await;
}

// 5. A success without usage is charged at its bound, and says so.
async fn an_answer_without_usage_is_charged_at_its_worst_case(e: Engine) {
    let Some(g) = gateway(e, "an_answer_without_usage_is_charged_at_its_worst_case").await else {
        return;
    };
    for (model, provider) in [("m", "oa"), ("c", "an"), ("g", "ge")] {
        g.vendors
            .script(provider, vec![Script::NoUsage, Script::NoUsage]);
        let (status, v, h) = post(&g, SOFT, ask(model, json!({"max_tokens": 50}))).await;
        assert_eq!(status, 200, "{v}");
        let id = h["x-purser-request-id"].to_str().unwrap().to_string();
        let r = row(&g, &id).await;
        let a = &r.attempts[0];
        assert_eq!(a.billing, "billed");
        assert_eq!(a.worst_case, a.cost, "{provider}: charged at the bound");
        assert!(a.cost != "0", "{provider}");
        let (_, data) = stream_text(&g, model).await;
        assert_eq!(content(&data), format!("Hello from {provider}."));
    }
    let bases = g.ledger_db.column("SELECT cost_basis FROM attempts").await;
    assert_eq!(bases, vec!["worst_case"; 6]);
    // The basis is in the audit API, its CSV export and /metrics.
    let last = only_request(&g).await;
    let audit = g
        .admin_json(&format!("/audit/v1/requests/{}", last.id))
        .await;
    assert_eq!(audit["attempts"][0]["cost_basis"], "worst_case", "{audit}");
    let (status, csv) = g.admin_get("/audit/v1/attempts.csv").await;
    assert_eq!(status, 200);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "cost_basis").unwrap();
    assert!(
        csv.lines()
            .skip(1)
            .all(|l| l.split(',').nth(col) == Some("worst_case")),
        "{csv}"
    );
    let (_, metrics) = g.get_as("/metrics", None).await;
    assert!(
        metrics
            .contains(r#"purser_priced_attempts_total{cost_basis="worst_case",provider="ge"} 2"#),
        "{metrics}"
    );
    settle(&g).await;
}

async fn a_stream_cut_after_its_finish_but_before_its_usage_is_not_free(e: Engine) {
    let Some(g) = gateway(
        e,
        "a_stream_cut_after_its_finish_but_before_its_usage_is_not_free",
    )
    .await
    else {
        return;
    };
    // OpenAI's fixture: two content chunks, the finish chunk, then usage: cut after 3.
    g.vendors.script("oa", vec![Script::StreamCut(3)]);
    let (id, data) = stream_text(&g, "m").await;
    assert_eq!(content(&data), "Hello from oa.");
    let r = row(&g, &id).await;
    let a = &r.attempts[0];
    assert_eq!(a.billing, "billed");
    assert!(a.cost != "0", "{a:?}");
    let basis = g.ledger_db.column("SELECT cost_basis FROM attempts").await;
    assert_eq!(basis, ["worst_case"]);
    settle(&g).await;
}

// 6. Readiness comes back by itself once the ledger can write again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_recovers_by_itself_after_a_ledger_failure() {
    // SQLite only: the fault is a lock held on its file (PostgreSQL's faults are in
    // tests/pg_faults.rs).
    let g = gateway(Engine::Sqlite, "readyz").await.unwrap();
    let (status, _) = g.get_as("/readyz", None).await;
    assert_eq!(status, 200);
    // Another connection holds the write lock past the writer's busy timeout.
    let lock = rusqlite::Connection::open(&g.db).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (status, v, _) = post(&g, SOFT, ask("m", json!({}))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("ledger_unavailable")),
        "{v}"
    );
    assert_eq!(g.vendors.calls("oa"), 0, "no call without a committed row");
    let (status, _) = g.get_as("/readyz", None).await;
    assert_eq!(status, 503);
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    // No request arrives (a drained node): the probe alone makes it ready again.
    let (status, body) = g.get_as("/readyz", None).await;
    assert_eq!(status, 200, "{body}");
    let (status, v, _) = post(&g, SOFT, ask("m", json!({}))).await;
    assert_eq!(status, 200, "{v}");
    settle(&g).await;
}

on_both_engines!(
    a_stream_written_in_one_read_arrives_whole_for_every_api,
    a_client_that_hangs_up_leaves_nothing_in_flight_or_reserved,
    a_stream_hung_up_on_before_its_first_content_is_recorded_at_its_cost,
    n_multiplies_the_worst_case,
    exactly_one_output_cap_reaches_the_vendor,
    fields_no_bound_counts_are_refused_under_hard_and_under_a_budget,
    a_model_name_of_a_megabyte_is_refused_before_the_ledger,
    an_answer_without_usage_is_charged_at_its_worst_case,
    a_stream_cut_after_its_finish_but_before_its_usage_is_not_free,
    a_failover_that_does_not_fit_the_budget_is_not_called,
    a_half_open_probe_whose_client_hung_up_still_resolves,
);
