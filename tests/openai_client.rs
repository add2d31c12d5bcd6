//! End to end with the official `openai` Python client (installed from PyPI by
//! `.ci/run`): a plain call, a streaming call, and typed errors read through the
//! client's exceptions, against a real gateway and the mock vendors of tests/common/vendors.rs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::vendors::Script;
use common::{provider, sha};

const KEY: &str = "key-openai-client";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_sees_an_openai_api() {
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "primary", "openai", "us", &[("m", "0.15", "0.60")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: py, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 256\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    // Calls that reach the provider: plain, stream, then the refusal.
    g.vendors.script(
        "primary",
        vec![
            Script::Ok,
            Script::Ok,
            Script::Status(
                400,
                r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}"#.into(),
            ),
        ],
    );
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/openai_client.py");
    let base = g.url("/v1");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .env("PURSER_BASE_URL", base)
            .env("PURSER_KEY", KEY)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'openai'"),
        "the openai client is not installed: pip install -r tests/requirements.txt (.ci/run does)"
    );
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("openai client e2e: ok"), "{stdout}");
    assert_eq!(g.vendors.calls("primary"), 3);
}
