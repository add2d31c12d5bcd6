//! The official `openai` Python SDK's own API tests, run through purser: its
//! `tests/api_resources/chat/test_completions.py` and `tests/api_resources/test_models.py`
//! (from the pinned sdist, fetched by name from PyPI) with `TEST_API_BASE_URL` pointing
//! at a gateway in front of the mock vendors, once per vendor API.
//!
//! Deselected, each printed with its reason: the endpoints purser does not serve, and
//! the tests whose own data the real OpenAI API rejects (`max_tokens=0`).
//!
//! The Responses API's tests (`tests/api_resources/test_responses.py` and
//! `tests/api_resources/responses/`) run the same way in front of an `api: openai`
//! vendor, the only API a Responses request passes to (natively). Their create tests
//! either send no `model` (Prism accepts that; OpenAI and purser refuse it) or send
//! every field, `previous_response_id`, `conversation`, `prompt`, `background` and
//! `store: true` among them, whose cost no gateway can bound: those run under a soft
//! ceiling with no budget, where purser needs no proof, and the same body under a
//! hard ceiling is checked to be refused in the Responses envelope, naming the field.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::db::Engine;
use common::money::{assert_money_invariants_on, quiesce_on};
use common::{Gateway, provider, sdk, sha};

/// The key the SDK's test fixtures send (`api_key = "My API Key"` in its conftest).
const SDK_KEY: &str = "My API Key";
/// The model its tests request.
const SDK_MODEL: &str = "gpt-6-astra";

const CHAT: &str = "tests/api_resources/chat/test_completions.py";
const MODELS: &str = "tests/api_resources/test_models.py";

/// (test-id prefix, reason) for every deselected test, sync and async classes alike.
fn deselected() -> Vec<(String, &'static str)> {
    let stored = "stored chat completions (retrieve/update/list/delete) are an OpenAI-hosted store purser does not serve";
    let mut out = Vec::new();
    for class in ["TestCompletions", "TestAsyncCompletions"] {
        for verb in ["retrieve", "update", "list", "delete"] {
            for style in ["method", "raw_response", "streaming_response"] {
                out.push((format!("{CHAT}::{class}::test_{style}_{verb}"), stored));
            }
        }
        for n in [1, 2] {
            out.push((
                format!("{CHAT}::{class}::test_method_create_with_all_params_overload_{n}"),
                "its data sends max_tokens=0 and max_completion_tokens=0, which the real OpenAI API rejects too (purser answers 400 invalid_request, param max_completion_tokens)",
            ));
        }
    }
    for class in ["TestModels", "TestAsyncModels"] {
        for style in ["method", "raw_response", "streaming_response"] {
            out.push((
                format!("{MODELS}::{class}::test_{style}_delete"),
                "deleting a fine-tuned model is an OpenAI account operation purser does not serve",
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_api_tests_pass_through_purser_for_every_vendor_api() {
    if !sdk::prerequisite(
        sdk::python_has(&["pytest", "pytest_asyncio", "rich", "aiohttp", "httpx2"])
            .map_err(|e| println!("{e}"))
            .is_ok(),
        "the openai SDK and its test requirements are not importable",
    ) {
        return;
    }
    let tree = match sdk::sdist() {
        Ok(t) => t,
        Err(e) => {
            sdk::prerequisite(false, &e);
            return;
        }
    };
    let deselect = deselected();
    for (id, why) in &deselect {
        println!("deselected {id}: {why}");
    }
    let mut summary = Vec::new();
    for api in ["openai", "anthropic", "gemini"] {
        let g = common::start(|vendors| {
            vec![
                provider(vendors, "vendor", api, "us", &[(SDK_MODEL, "0.15", "0.60")]),
                format!(
                    "kind: policy\nid: sdk\nclients:\n  - {{ id: sdk-tests, key_sha256: \"{}\" }}\nmodels: [{SDK_MODEL}]\njurisdictions: [us]\nceiling: {{ per_request: \"1.00\", mode: hard }}\nmax_output_tokens: 256\n",
                    sha(SDK_KEY)
                ),
            ]
        })
        .await;
        let base = g.url("/v1");
        let tree = tree.clone();
        let args: Vec<String> = deselect
            .iter()
            .map(|(id, _)| format!("--deselect={id}"))
            .collect();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(sdk::python())
                .current_dir(&tree)
                .args(["-m", "pytest", CHAT, MODELS])
                // The sdist's own addopts ask for pytest-xdist; one process is enough here.
                .args(["-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rfE"])
                .args(["--tb=short", "--color=no"])
                .args(args)
                .env("TEST_API_BASE_URL", base)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stdout
            .lines()
            .rev()
            .find(|l| l.contains(" in "))
            .unwrap_or_default()
            .to_string();
        println!("{api}: {last}");
        assert!(
            out.status.success() && !last.contains("failed") && !last.contains("error"),
            "the SDK's tests failed through purser in front of {api}:\n{stdout}\n{stderr}"
        );
        assert!(
            g.vendors.calls("vendor") > 0,
            "{api}: no call reached the vendor"
        );
        summary.push(format!("{api}: {last}"));
    }
    println!("SDK api tests through purser:\n{}", summary.join("\n"));
}

const RESPONSES: &str = "tests/api_resources/test_responses.py";
const INPUT_ITEMS: &str = "tests/api_resources/responses/test_input_items.py";
const INPUT_TOKENS: &str = "tests/api_resources/responses/test_input_tokens.py";

/// (test-id prefix, reason) for every deselected Responses test.
fn responses_deselected() -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for class in ["TestResponses", "TestAsyncResponses"] {
        for verb in ["retrieve", "delete", "cancel"] {
            for style in [
                "method",
                "raw_response",
                "streaming_response",
                "path_params",
            ] {
                out.push((
                    format!("{RESPONSES}::{class}::test_{style}_{verb}"),
                    "stored responses (retrieve/delete/cancel) live in OpenAI's store; purser does not serve them",
                ));
            }
        }
        for style in ["method", "raw_response", "streaming_response"] {
            out.push((
                format!("{RESPONSES}::{class}::test_{style}_compact"),
                "compaction (/v1/responses/compact) rewrites a stored conversation at OpenAI; purser does not serve it",
            ));
            for n in [1, 2] {
                out.push((
                    format!("{RESPONSES}::{class}::test_{style}_create_overload_{n}"),
                    "its data sends no `model` (Prism accepts that): the real OpenAI API rejects it and purser answers 400 invalid_request, param model",
                ));
            }
        }
    }
    for class in ["TestInputItems", "TestAsyncInputItems"] {
        out.push((
            format!("{INPUT_ITEMS}::{class}"),
            "a stored response's input items live in OpenAI's store; purser does not serve them",
        ));
    }
    for class in ["TestInputTokens", "TestAsyncInputTokens"] {
        out.push((
            format!("{INPUT_TOKENS}::{class}"),
            "/v1/responses/input_tokens is not served (purser counts tokens for the Messages API only)",
        ));
    }
    out
}

fn responses_docs(vendors: &common::vendors::Vendors, mode: &str) -> Vec<String> {
    vec![
        provider(
            vendors,
            "vendor",
            "openai",
            "us",
            &[(SDK_MODEL, "0.15", "0.60")],
        ),
        format!(
            "kind: policy\nid: sdk\nclients:\n  - {{ id: sdk-tests, key_sha256: \"{}\" }}\nmodels: [{SDK_MODEL}]\njurisdictions: [us]\nceiling: {{ per_request: \"1.00\", mode: {mode} }}\nmax_output_tokens: 256\n",
            sha(SDK_KEY)
        ),
    ]
}

/// A gateway on `engine`; on SQLite when the PostgreSQL tests are skipped on this
/// machine (never in CI), so the run itself is never skipped.
async fn gateway(engine: Engine, test: &str, mode: &'static str) -> Gateway {
    if let Some(g) = common::start_on(engine, test, |v| responses_docs(v, mode)).await {
        return g;
    }
    common::start_on(Engine::Sqlite, test, |v| responses_docs(v, mode))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_responses_tests_pass_through_purser() {
    if !sdk::prerequisite(
        sdk::python_has(&["pytest", "pytest_asyncio", "rich", "aiohttp", "httpx2"])
            .map_err(|e| println!("{e}"))
            .is_ok(),
        "the openai SDK and its test requirements are not importable",
    ) {
        return;
    }
    let tree = match sdk::sdist() {
        Ok(t) => t,
        Err(e) => {
            sdk::prerequisite(false, &e);
            return;
        }
    };
    let deselect = responses_deselected();
    for (id, why) in &deselect {
        println!("deselected {id}: {why}");
    }
    let g = gateway(Engine::Postgres, "openai_sdk_responses", "soft").await;
    let files = [RESPONSES, INPUT_ITEMS, INPUT_TOKENS];
    let run = sdk::pytest(&tree, &files, &deselect, g.url("/v1"), &[]).await;
    println!(
        "responses, soft ceiling ({:?}): {}",
        g.ledger_db.engine(),
        run.summary
    );
    assert!(
        run.passed,
        "the SDK's responses tests failed through purser:\n{}\n{}",
        run.stdout, run.stderr
    );
    assert!(g.vendors.calls("vendor") > 0, "no call reached the vendor");
    quiesce_on(&g.ledger_db, 10).await;
    let booked = g
        .ledger_db
        .column("SELECT DISTINCT ingress || ' ' || outcome FROM requests")
        .await;
    assert_eq!(booked, ["responses served"]);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["vendor"]).await;

    // The same kind of body under a hard ceiling: refused in the Responses envelope,
    // naming a field whose cost the gateway cannot see, and no vendor call.
    let g = gateway(Engine::Sqlite, "openai_sdk_responses_hard", "hard").await;
    let r = reqwest::Client::new()
        .post(g.url("/v1/responses"))
        .bearer_auth(SDK_KEY)
        .json(&serde_json::json!({
            "model": SDK_MODEL, "input": "string", "max_output_tokens": 16,
            "previous_response_id": "previous_response_id",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["param"], "previous_response_id", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    // The deselected create tests' body (`client.responses.create()` sends `{}`): the
    // 400 the deselection names, in the Responses envelope.
    let r = reqwest::Client::new()
        .post(g.url("/v1/responses"))
        .bearer_auth(SDK_KEY)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["param"], "model", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(g.vendors.calls("vendor"), 0);
}
