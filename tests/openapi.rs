//! The audit API against its OpenAPI description (`schemas/audit.openapi.json`):
//! schemathesis (from PyPI; `.ci/run` installs it) generates requests from the
//! description, sends them to a live gateway and checks every response conforms.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::vendors::Script;
use common::{ADMIN, provider, sha};

const KEY: &str = "key-openapi";

/// The schemathesis command: its script, or the module when the script is not on PATH.
fn schemathesis() -> Vec<String> {
    for cmd in [
        vec!["schemathesis".to_string()],
        vec!["python3".into(), "-m".into(), "schemathesis.cli".into()],
    ] {
        if let Ok(out) = std::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .arg("--version")
            .output()
            && out.status.success()
        {
            return cmd;
        }
    }
    panic!(
        "schemathesis is not installed; run `pip install -r tests/requirements.txt` (`.ci/run` does)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_responses_match_the_openapi_description() {
    let st = schemathesis();
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "p1", "openai", "us", &[("m", "0.15", "0.60")]),
            provider(vendors, "p2", "anthropic", "us", &[("m", "0.25", "1.25")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: soft }}\nmax_output_tokens: 100\nbudgets:\n  - {{ period: month, limit: \"3\" }}\nalternates:\n  m: p2/m\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    // Some of each shape: served, failed over, refused, with money and messages.
    for _ in 0..3 {
        g.chat(KEY, "m").await;
    }
    g.vendors
        .script("p1", vec![Script::Status(503, "overloaded".into())]);
    g.chat(KEY, "m").await;
    g.vendors.script(
        "p1",
        vec![Script::Status(
            400,
            r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#.into(),
        )],
    );
    g.chat(KEY, "m").await;
    g.chat(KEY, "other").await;

    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/audit.openapi.json");
    let url = format!("http://{}", g.addr);
    let junit = g.dir.path().join("schemathesis.xml");
    let junit_out = junit.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&st[0])
            .args(&st[1..])
            .arg("run")
            .arg(&spec)
            .args(["--url", &url])
            .args(["--header", &format!("Authorization: Bearer {ADMIN}")])
            .args(["--checks", "all"])
            .args(["--max-examples", "40"])
            .args(["--seed", "1"])
            .args(["--workers", "2"])
            .args(["--report", "junit"])
            .arg("--report-junit-path")
            .arg(&junit)
            .env("SCHEMATHESIS_TELEMETRY", "false")
            .env("NO_COLOR", "1")
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
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    // It really exercised every operation.
    let report = std::fs::read_to_string(&junit_out).unwrap();
    for op in [
        "/audit/v1/requests",
        "/audit/v1/requests/{id}",
        "/audit/v1/spend",
        "/audit/v1/attempts.csv",
        "/audit/v1/budgets",
        "/audit/v1/spend/series",
        "/audit/v1/failures",
        "/audit/v1/focus.csv",
    ] {
        assert!(
            report.contains(&format!("GET {op}\"")),
            "{op} not tested:\n{report}"
        );
    }
}
