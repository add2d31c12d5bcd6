//! The audit API over HTTP, on a ledger filled by real gateway calls against the
//! mock vendors (tests/common/vendors.rs): auth, every filter, pagination while rows
//! arrive, exact spend, CSV that parses back with its formula guard, budgets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::vendors::Script;
use common::{ADMIN, Gateway, provider, sha};
use purser::money::Money;
use serde_json::Value;

const ALPHA_BOT: &str = "key-alpha-bot";
const ALPHA_OPS: &str = "key-alpha-ops";
const BETA_BOT: &str = "key-beta-bot";

/// alpha (hard, day budget): model m on us-openai, alternate eu-anthropic/m.
/// beta (soft): model m2 on eu-anthropic, alternate us-openai/m2.
async fn gateway() -> Gateway {
    common::start(|vendors| {
        vec![
            provider(vendors, "us-openai", "openai", "us", &[("m", "0.15", "0.60"), ("m2", "1", "2")]),
            provider(vendors, "eu-anthropic", "anthropic", "eu", &[("m", "0.25", "1.25"), ("m2", "0.5", "1")]),
            format!(
                "kind: policy\nid: alpha\nclients:\n  - {{ id: alpha-bot, key_sha256: \"{}\" }}\n  - {{ id: alpha-ops, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us, eu]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 1000\nbudgets:\n  - {{ period: day, limit: \"10\" }}\nalternates:\n  m: eu-anthropic/m\n",
                sha(ALPHA_BOT),
                sha(ALPHA_OPS)
            ),
            format!(
                "kind: policy\nid: beta\nclients:\n  - {{ id: beta-bot, key_sha256: \"{}\" }}\nmodels: [m2]\njurisdictions: [eu, us]\nceiling: {{ per_request: \"0.50\", mode: soft }}\nmax_output_tokens: 1000\nalternates:\n  m2: us-openai/m2\n",
                sha(BETA_BOT)
            ),
        ]
    })
    .await
}

/// The traffic every test starts from; returns request ids by label.
async fn traffic(g: &Gateway) -> BTreeMap<&'static str, String> {
    let mut ids = BTreeMap::new();
    for i in 0..3 {
        let (s, id, _) = g.chat(ALPHA_BOT, "m").await;
        assert_eq!(s, 200);
        ids.insert(["alpha-1", "alpha-2", "alpha-3"][i], id.unwrap());
    }
    // Rate limit on the primary: fails over to the EU alternate.
    g.vendors.script("us-openai", vec![Script::Status(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#.into())]);
    let (s, id, _) = g.chat(ALPHA_OPS, "m").await;
    assert_eq!(s, 200);
    ids.insert("ops-failover", id.unwrap());
    // An upstream message that a spreadsheet would run as a formula.
    g.vendors.script("us-openai", vec![Script::Status(400, r#"{"error":{"message":"=HYPERLINK(\"http://evil.example\",\"x\")","type":"invalid_request_error"}}"#.into())]);
    let (s, id, _) = g.chat(ALPHA_BOT, "m").await;
    assert_eq!(s, 400);
    ids.insert("alpha-malformed", id.unwrap());
    // Soft policy, primary times out (maybe billed), alternate serves.
    g.vendors.script("eu-anthropic", vec![Script::Delay(1_000)]);
    let (s, id, _) = g.chat(BETA_BOT, "m2").await;
    assert_eq!(s, 200);
    ids.insert("beta-timeout", id.unwrap());
    let (s, id, _) = g.chat(BETA_BOT, "m2").await;
    assert_eq!(s, 200);
    ids.insert("beta-ok", id.unwrap());
    // Refused before any call.
    let (s, id, _) = g.chat(BETA_BOT, "m").await;
    assert_eq!(s, 403);
    ids.insert("beta-refused", id.unwrap());
    ids
}

fn ids_of(v: &Value) -> BTreeSet<String> {
    v["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

fn set(ids: &BTreeMap<&str, String>, labels: &[&str]) -> BTreeSet<String> {
    labels.iter().map(|l| ids[l].clone()).collect()
}

#[tokio::test]
async fn audit_needs_the_admin_token_and_is_off_without_one() {
    let g = gateway().await;
    g.chat(ALPHA_BOT, "m").await;
    for path in [
        "/audit/v1/requests",
        "/audit/v1/spend",
        "/audit/v1/budgets",
        "/audit/v1/attempts.csv",
        "/audit/v1/requests/x",
    ] {
        for token in [None, Some("wrong"), Some(ALPHA_BOT)] {
            let (status, body) = g.get_as(path, token).await;
            assert_eq!(status, 401, "{path} with {token:?}: {body}");
            assert!(body.contains("\"unauthorized\""), "{body}");
        }
        assert_eq!(
            g.get_as(path, Some(ADMIN)).await.0 / 100 * 100,
            if path.ends_with("/x") { 400 } else { 200 }
        );
    }

    let off = common::start_with(
        |vendors| vec![provider(vendors, "p", "openai", "us", &[("m", "1", "1")])],
        None,
    )
    .await;
    let (status, body) = off.get_as("/audit/v1/requests", Some("anything")).await;
    assert_eq!(status, 403);
    assert!(body.contains("PURSER_ADMIN_TOKEN"), "{body}");
}

#[tokio::test]
async fn every_filter_selects_exactly_its_requests() {
    let g = gateway().await;
    let ids = traffic(&g).await;
    let all: BTreeSet<String> = ids.values().cloned().collect();
    let q = |s: &str| format!("/audit/v1/requests?{s}");
    let cases: Vec<(String, BTreeSet<String>)> = vec![
        (q("limit=1000"), all.clone()),
        (
            q("provider=eu-anthropic"),
            set(&ids, &["ops-failover", "beta-timeout", "beta-ok"]),
        ),
        (
            q("provider=us-openai&policy=beta"),
            set(&ids, &["beta-timeout"]),
        ),
        (
            q("policy=beta"),
            set(&ids, &["beta-timeout", "beta-ok", "beta-refused"]),
        ),
        (q("client=alpha-ops"), set(&ids, &["ops-failover"])),
        (q("model=m2"), set(&ids, &["beta-timeout", "beta-ok"])),
        (q("class=rate_limited"), set(&ids, &["ops-failover"])),
        (q("class=timeout"), set(&ids, &["beta-timeout"])),
        (q("class=malformed"), set(&ids, &["alpha-malformed"])),
        // An upstream refusal and a gateway refusal are both `refused`.
        (
            q("outcome=refused"),
            set(&ids, &["alpha-malformed", "beta-refused"]),
        ),
        (q("outcome=failed"), BTreeSet::new()),
        (
            q("outcome=served&policy=alpha"),
            set(&ids, &["alpha-1", "alpha-2", "alpha-3", "ops-failover"]),
        ),
        (
            q("since=2000-01-01T00:00:00Z&until=2999-01-01T00:00:00Z"),
            all.clone(),
        ),
        (q("since=2999-01-01T00:00:00Z"), BTreeSet::new()),
        (q("until=2000-01-01T00:00:00Z"), BTreeSet::new()),
    ];
    for (path, want) in cases {
        let v = g.admin_json(&path).await;
        assert_eq!(ids_of(&v), want, "{path}");
    }

    // The one-request view: every attempt in order, with the plan that decided it.
    let v = g
        .admin_json(&format!("/audit/v1/requests/{}", ids["ops-failover"]))
        .await;
    assert_eq!(v["plan_id"], g.engine.plan().id());
    assert_eq!(v["policy"], "alpha");
    assert_eq!(v["mode"], "hard");
    assert_eq!(v["outcome"], "served");
    assert_eq!(v["served_by"], "eu-anthropic");
    let attempts = v["attempts"].as_array().unwrap();
    let summary: Vec<(i64, &str, &str, &str, &str)> = attempts
        .iter()
        .map(|a| {
            (
                a["seq"].as_i64().unwrap(),
                a["provider"].as_str().unwrap(),
                a["jurisdiction"].as_str().unwrap(),
                a["class"].as_str().unwrap(),
                a["decision"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, "us-openai", "us", "rate_limited", "failover"),
            (2, "eu-anthropic", "eu", "success", "served")
        ]
    );
    assert!(
        attempts[0]["message"]
            .as_str()
            .unwrap()
            .contains("Rate limit reached")
    );
    for money in [&v["cost"], &v["ceiling"], &attempts[1]["cost"]] {
        assert!(money.is_string(), "money is a decimal string: {money}");
    }

    // Bad filters name what is wrong; unknown ids are 404.
    for (path, needle) in [
        (q("class=nope"), "class"),
        (q("limit=0"), "limit"),
        (q("since=yesterday"), "since"),
        (q("cursor=abc"), "cursor"),
        (q("vendor=x"), "vendor"),
        ("/audit/v1/spend?group_by=vendor".into(), "group_by"),
        ("/audit/v1/attempts.csv?outcome=ok".into(), "outcome"),
    ] {
        let (status, body) = g.admin_get(&path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body.contains(needle) && body.contains("invalid_request"),
            "{path}: {body}"
        );
    }
    let (status, body) = g.admin_get("/audit/v1/requests/01NOSUCHREQUEST").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn pages_have_no_gaps_or_duplicates_while_rows_arrive() {
    let g = gateway().await;
    let mut before = BTreeSet::new();
    for _ in 0..9 {
        before.insert(g.chat(ALPHA_BOT, "m").await.1.unwrap());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/audit/v1/requests?limit=2&cursor={c}"),
            None => "/audit/v1/requests?limit=2".to_string(),
        };
        let v = g.admin_json(&path).await;
        pages += 1;
        let page: Vec<String> = v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        assert!(page.len() <= 2);
        seen.extend(page);
        // New requests land while the listing is being paged.
        g.chat(BETA_BOT, "m2").await;
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 5);
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates: {seen:?}");
    assert_eq!(
        unique, before,
        "exactly the requests that existed when paging began"
    );
    // Newest first.
    let first = g.admin_json("/audit/v1/requests?limit=1").await;
    assert_eq!(first["requests"][0]["policy"], "beta");
}

#[tokio::test]
async fn spend_sums_equal_the_attempt_costs_exactly() {
    let g = gateway().await;
    let ids = traffic(&g).await;
    // Ground truth: every attempt's cost and worst case from the per-request view.
    let mut billed: BTreeMap<String, Money> = BTreeMap::new();
    let mut maybe: BTreeMap<String, Money> = BTreeMap::new();
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for id in ids.values() {
        let v = g.admin_json(&format!("/audit/v1/requests/{id}")).await;
        for a in v["attempts"].as_array().unwrap() {
            let p = a["provider"].as_str().unwrap().to_string();
            let cost: Money = a["cost"].as_str().unwrap().parse().unwrap();
            *billed.entry(p.clone()).or_insert(Money::ZERO) =
                billed.get(&p).copied().unwrap_or(Money::ZERO) + cost;
            if a["billing"] == "maybe_billed" {
                let wc: Money = a["worst_case"].as_str().unwrap().parse().unwrap();
                *maybe.entry(p.clone()).or_insert(Money::ZERO) =
                    maybe.get(&p).copied().unwrap_or(Money::ZERO) + wc;
            }
            *counts
                .entry((p, a["billing"].as_str().unwrap().to_string()))
                .or_default() += 1;
        }
    }
    let v = g.admin_json("/audit/v1/spend?group_by=provider").await;
    assert_eq!(v["group_by"], "provider");
    assert_eq!(v["currency"], "USD");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let p = r["key"].as_str().unwrap();
        assert_eq!(
            r["cost"].as_str().unwrap().parse::<Money>().unwrap(),
            billed[p],
            "{p}"
        );
        assert_eq!(
            r["maybe_billed_cost"]
                .as_str()
                .unwrap()
                .parse::<Money>()
                .unwrap(),
            maybe.get(p).copied().unwrap_or(Money::ZERO),
            "{p}"
        );
        for b in ["billed", "maybe_billed", "not_billed"] {
            assert_eq!(
                r[b].as_u64().unwrap(),
                counts
                    .get(&(p.to_string(), b.to_string()))
                    .copied()
                    .unwrap_or(0),
                "{p} {b}"
            );
        }
    }
    // The timed-out EU attempt may have been billed: shown apart from proven cost.
    let eu = rows.iter().find(|r| r["key"] == "eu-anthropic").unwrap();
    assert_eq!(eu["maybe_billed"], 1);
    assert_ne!(eu["maybe_billed_cost"], "0");

    // Every grouping totals the same.
    let total: Money = billed.values().copied().sum();
    for by in ["provider", "policy", "client", "model", "day"] {
        let v = g
            .admin_json(&format!("/audit/v1/spend?group_by={by}"))
            .await;
        let sum: Money = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["cost"].as_str().unwrap().parse::<Money>().unwrap())
            .sum();
        assert_eq!(sum, total, "group_by={by}");
    }
    let by_policy = g
        .admin_json("/audit/v1/spend?group_by=policy&policy=beta")
        .await;
    assert_eq!(by_policy["rows"].as_array().unwrap().len(), 1);
    let empty = g
        .admin_json("/audit/v1/spend?since=2999-01-01T00:00:00Z")
        .await;
    assert_eq!(empty["rows"], serde_json::json!([]));
    assert_eq!(empty["since"], "2999-01-01T00:00:00.000Z");
}

#[tokio::test]
async fn csv_parses_back_with_formulas_neutralised() {
    let g = gateway().await;
    let ids = traffic(&g).await;
    let (status, body) = g.admin_get("/audit/v1/attempts.csv").await;
    assert_eq!(status, 200);
    let mut rd = csv::Reader::from_reader(body.as_bytes());
    let header: Vec<String> = rd.headers().unwrap().iter().map(str::to_string).collect();
    assert_eq!(header, purser::audit::CSV_HEADER);
    let rows: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
    // alpha 3 + failover 2 + malformed 1 + beta timeout 2 + beta ok 1; refusal has none.
    assert_eq!(rows.len(), 9);
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let bad = rows
        .iter()
        .find(|r| r[col("request_id")] == ids["alpha-malformed"])
        .unwrap();
    assert!(
        bad[col("message")].starts_with("'=HYPERLINK("),
        "guarded: {}",
        &bad[col("message")]
    );
    assert_eq!(&bad[col("class")], "malformed");
    for r in &rows {
        for cell in r.iter() {
            assert!(
                !cell.starts_with(['=', '+', '-', '@']),
                "unguarded cell {cell:?}"
            );
        }
    }
    // Filters apply per attempt.
    let (_, only) = g
        .admin_get("/audit/v1/attempts.csv?provider=eu-anthropic&class=success")
        .await;
    let n = csv::Reader::from_reader(only.as_bytes()).records().count();
    assert_eq!(n, 2);
    let exact: Money = rows
        .iter()
        .map(|r| r[col("cost")].parse::<Money>().unwrap())
        .sum();
    let spend = g.admin_json("/audit/v1/spend?group_by=day").await;
    assert_eq!(
        spend["rows"][0]["cost"]
            .as_str()
            .unwrap()
            .parse::<Money>()
            .unwrap(),
        exact
    );
}

#[tokio::test]
async fn csv_streams_a_large_export() {
    let g = gateway().await;
    // Enough rows that the body leaves in several chunks.
    for _ in 0..400 {
        g.chat(ALPHA_BOT, "m").await;
    }
    let r = reqwest::Client::new()
        .get(g.url("/audit/v1/attempts.csv"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(
        r.headers().get("content-length").is_none(),
        "streamed, not buffered"
    );
    let text = r.text().await.unwrap();
    assert_eq!(
        csv::Reader::from_reader(text.as_bytes()).records().count(),
        400
    );
}

#[tokio::test]
async fn budgets_show_limit_spent_reserved_remaining() {
    let g = gateway().await;
    let ids = traffic(&g).await;
    let v = g.admin_json("/audit/v1/budgets").await;
    let b = v["budgets"].as_array().unwrap();
    assert_eq!(b.len(), 1, "{v}");
    assert_eq!(b[0]["policy"], "alpha");
    assert_eq!(b[0]["period"], "day");
    let spent: Money = b[0]["spent"].as_str().unwrap().parse().unwrap();
    let mut charged = Money::ZERO;
    for l in [
        "alpha-1",
        "alpha-2",
        "alpha-3",
        "ops-failover",
        "alpha-malformed",
    ] {
        let r = g
            .admin_json(&format!("/audit/v1/requests/{}", ids[l]))
            .await;
        charged = charged + r["cost"].as_str().unwrap().parse::<Money>().unwrap();
    }
    assert_eq!(
        spent, charged,
        "hard policy, nothing maybe-billed: spent is the billed cost"
    );
    assert_eq!(b[0]["reserved"], "0");
    let remaining: Money = b[0]["remaining"].as_str().unwrap().parse().unwrap();
    assert_eq!(remaining + spent, "10".parse().unwrap());
    assert!(
        b[0]["window_start"]
            .as_str()
            .unwrap()
            .ends_with("T00:00:00Z")
    );
}
