//! The spend page (`GET /audit/`) in a real browser: Debian's headless `chromium`
//! driven through `chromium-driver` by Python `selenium` (`tests/browser/page.py`),
//! against a gateway whose ledger was filled through real requests to the mock vendors.
//!
//! With `CI=true` a missing browser, driver or selenium fails the test; otherwise it
//! prints SKIPPED and passes (the pattern of `tests/common/sdk.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::vendors::Script;
use common::{ADMIN, Gateway, provider, sha};
use serde_json::{Value, json};

const KEY: &str = "key-page";

/// Text an upstream put in its error message, meant to run if the page ever renders
/// ledger text as markup.
const HOSTILE: &str = "<script>window.__pwned='script'</script><img src=x onerror=\"window.__pwned='img'\"> quota";

fn docs(vendors: &common::vendors::Vendors) -> Vec<String> {
    vec![
        provider(vendors, "p1", "openai", "us", &[("m", "0.15", "0.60")]),
        provider(vendors, "p2", "anthropic", "us", &[("m", "0.25", "1.25")]),
        format!(
            "kind: policy\nid: pol\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\nbudgets:\n  - {{ period: month, limit: \"3\" }}\n  - {{ period: day, limit: \"1\" }}\nalternates:\n  m: p2/m\n",
            sha(KEY)
        ),
    ]
}

/// Served, failed over, timed out (maybe billed), refused, and one hostile message.
async fn fill(g: &Gateway) -> String {
    for _ in 0..4 {
        g.chat(KEY, "m").await;
    }
    g.vendors
        .script("p1", vec![Script::Status(503, "overloaded".into())]);
    g.chat(KEY, "m").await;
    g.vendors.script("p1", vec![Script::Delay(1_000)]);
    g.chat(KEY, "m").await;
    g.chat(KEY, "other").await;
    let body = json!({"error": {"message": HOSTILE, "type": "invalid_request_error"}}).to_string();
    g.vendors.script("p1", vec![Script::Status(400, body)]);
    let (_, id, _) = g.chat(KEY, "m").await;
    for _ in 0..2 {
        g.chat(KEY, "m").await;
    }
    id.expect("the hostile request has an id")
}

fn have(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Skip (print why) or, under CI, fail when the browser stack is missing.
fn browser_ready() -> bool {
    let missing: Vec<&str> = [
        ("chromium (apt-get install chromium)", have("chromium", &["--version"])),
        (
            "chromium-driver (apt-get install chromium-driver)",
            have("chromedriver", &["--version"]),
        ),
        (
            "python selenium (pip install -r tests/requirements.txt)",
            have(&common::sdk::python(), &["-c", "import selenium"]),
        ),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(what, _)| what)
    .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and the browser test cannot run: missing {missing:?} (.ci/run installs them)");
    }
    eprintln!("SKIPPED: the browser test needs {missing:?}; with CI=true this fails");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spend_page_in_a_real_browser() {
    if !browser_ready() {
        return;
    }
    let g = common::start(docs).await;
    let hostile = fill(&g).await;
    common::money::quiesce(&g.db, 5).await;

    // What the page must agree with: the API's own answers.
    let spend = g.admin_json("/audit/v1/spend?group_by=provider").await;
    let mut total = rust_decimal::Decimal::ZERO;
    for r in spend["rows"].as_array().unwrap() {
        total += r["cost"].as_str().unwrap().parse::<rust_decimal::Decimal>().unwrap();
    }
    let p2 = g.admin_json("/audit/v1/requests?provider=p2&limit=1").await;
    let failover_id = p2["requests"][0]["id"].as_str().unwrap().to_string();
    let failover = g
        .admin_json(&format!("/audit/v1/requests/{failover_id}"))
        .await;
    assert!(
        failover["attempts"].as_array().unwrap().len() >= 1,
        "{failover}"
    );
    let hostile_row = g.admin_json(&format!("/audit/v1/requests/{hostile}")).await;
    assert!(
        hostile_row.to_string().contains("onerror"),
        "the hostile message reached the ledger: {hostile_row}"
    );

    let timed_out = g.admin_json("/audit/v1/requests?class=timeout&limit=1").await;
    let timed_out = timed_out["requests"][0].clone();
    assert!(
        timed_out["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["billing"] == "maybe_billed" && a["cost"] == "0"),
        "a timed-out attempt is maybe billed at a proven 0: {timed_out}"
    );
    let expect = json!({
        "maybe_billed": timed_out,
        "base": g.url("/audit/"),
        "token": ADMIN,
        "total_spend": total.normalize().to_string(),
        "provider": "p2",
        "request": failover,
        "hostile_id": hostile,
        "screenshots": std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs"),
    });
    let file = g.dir.path().join("expect.json");
    std::fs::write(&file, expect.to_string()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/page.py");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(common::sdk::python())
            .arg(&script)
            .arg(&file)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "the browser test failed:\n{text}");
    for step in ["wrong token", "total", "filter", "attempts", "escaping", "exposure"] {
        assert!(text.contains(&format!("PASS {step}")), "step `{step}` did not pass:\n{text}");
    }
    let attempts: Value = g.admin_json("/audit/v1/spend").await;
    assert!(attempts["rows"].as_array().is_some_and(|r| !r.is_empty()));
    common::money::assert_money_invariants(&g.db, &g.vendors, &["p1", "p2"]);
}

/// The page is served with its assets and a policy that forbids inline script, and
/// without the token (it holds no data until the token is entered).
#[tokio::test]
async fn the_page_and_its_assets_are_embedded() {
    let g = common::start(docs).await;
    let r = reqwest::get(g.url("/audit/")).await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    let html = r.text().await.unwrap();
    assert!(html.contains("assets/chart-4.6.1.umd.min.js") && html.contains("assets/app.js"));
    for (asset, needle) in [
        ("app.js", "sessionStorage"),
        ("chart-4.6.1.umd.min.js", "Chart.js v4.6.1"),
        ("chart.js-LICENSE.md", "MIT"),
        ("app.css", "--fg"),
    ] {
        let body = reqwest::get(g.url(&format!("/audit/assets/{asset}")))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(body.contains(needle), "{asset}");
    }
    let js = reqwest::get(g.url("/audit/assets/app.js")).await.unwrap().text().await.unwrap();
    // Ledger text reaches the page as text nodes only.
    assert!(!js.contains(".innerHTML =") && !js.contains("insertAdjacentHTML") && !js.contains("document.write"));
    assert_eq!(
        reqwest::get(g.url("/audit/assets/nope.js")).await.unwrap().status(),
        404
    );
}
