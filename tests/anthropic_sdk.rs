//! The official `anthropic` Python SDK's own API tests, run through purser: its
//! `tests/api_resources/test_messages.py` (Messages and count_tokens) and
//! `tests/api_resources/beta/test_messages.py` (the same on `/v1/messages?beta=true`,
//! as Claude Code calls it), from the pinned sdist fetched by name from PyPI, with
//! `TEST_API_BASE_URL` pointing at a gateway in front of a mock Anthropic vendor.
//! Upstream they run against a Prism mock of the OpenAPI spec; each asserts the
//! response parses into the SDK's types, loose and strict (`_strict_response_validation`).
//!
//! Two runs. Under a hard per-request ceiling, every test but the `with_all_params`
//! ones: a plain request passes natively and its answer satisfies the SDK. Under a
//! soft ceiling with no budget (where purser needs no proof of the bound), the
//! `with_all_params` ones: every field the SDK knows passes through. Under a hard
//! ceiling those are refused by design, since they ask for a code-execution
//! `container`, which a hard ceiling cannot bound (that refusal is checked too).
//!
//! Not run, each printed with its reason: the endpoints purser does not serve.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::db::Engine;
use common::money::{assert_money_invariants_on, quiesce_on};
use common::{Gateway, provider, sdk, sha};

/// The key the SDK's test fixtures send (`api_key = "my-anthropic-api-key"` in its conftest).
const SDK_KEY: &str = "my-anthropic-api-key";
/// The model its tests request.
const SDK_MODEL: &str = "claude-opus-5-5";
/// The models its `test_deprecated_model_warning` sends (`anthropic._data.DEPRECATED_MODELS`):
/// the warning is the SDK's; the request must still succeed, so the policy allows them.
const DEPRECATED: [&str; 3] = [
    "claude-mythos-preview",
    "claude-opus-4-5",
    "claude-opus-4-5-20251101",
];

const MESSAGES: &str = "tests/api_resources/test_messages.py";
const BETA_MESSAGES: &str = "tests/api_resources/beta/test_messages.py";

/// The SDK's API test files for endpoints purser does not serve, with the reason.
const NOT_SERVED: &[(&str, &str)] = &[
    (
        "tests/api_resources/messages/test_batches.py",
        "message batches are an asynchronous Anthropic-hosted job queue, billed after the gateway's call ends; purser does not serve them",
    ),
    (
        "tests/api_resources/beta/messages/test_batches.py",
        "beta message batches: as above",
    ),
    (
        "tests/api_resources/test_models.py",
        "purser's /v1/models answers in the OpenAI list shape for its own policy's models, not Anthropic's paginated model objects",
    ),
    (
        "tests/api_resources/beta/test_models.py",
        "beta models: as above",
    ),
    (
        "tests/api_resources/beta/test_files.py",
        "the Files API stores uploads at Anthropic; purser does not serve it",
    ),
    (
        "tests/api_resources/test_files.py",
        "the Files API: as above",
    ),
    (
        "tests/api_resources/beta/ (agents, sessions, skills, environments, memory stores, vaults, deployments, tunnels, webhooks, …)",
        "Anthropic-hosted agent and account resources, no model call purser could bound; not served",
    ),
    (
        "tests/api_resources/{organization,skills,user_profiles}",
        "Anthropic account administration; not served",
    ),
];

fn docs(vendors: &common::vendors::Vendors, ceiling: &str) -> Vec<String> {
    let mut models = vec![(SDK_MODEL, "5", "25")];
    models.extend(DEPRECATED.iter().map(|m| (*m, "5", "25")));
    let names = models.iter().map(|m| m.0).collect::<Vec<_>>().join(", ");
    vec![
        provider(vendors, "vendor", "anthropic", "us", &models),
        format!(
            "kind: policy\nid: sdk\nclients:\n  - {{ id: sdk-tests, key_sha256: \"{}\" }}\nmodels: [{names}]\njurisdictions: [us]\nceiling: {ceiling}\nmax_output_tokens: 2048\n",
            sha(SDK_KEY)
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_messages_tests_pass_through_purser() {
    if !sdk::prerequisite(
        sdk::python_has_sdk(
            sdk::ANTHROPIC,
            &[
                "pytest",
                "pytest_asyncio",
                "aiohttp",
                "httpx2",
                "inline_snapshot",
                "http_snapshot",
            ],
        )
        .map_err(|e| println!("{e}"))
        .is_ok(),
        "the anthropic SDK and its test requirements are not importable",
    ) {
        return;
    }
    let tree = match sdk::sdist_of(sdk::ANTHROPIC) {
        Ok(t) => t,
        Err(e) => {
            sdk::prerequisite(false, &e);
            return;
        }
    };
    for (file, why) in NOT_SERVED {
        println!("not run {file}: {why}");
    }
    let files = [MESSAGES, BETA_MESSAGES];

    // Hard ceiling, SQLite ledger: everything but the all-params tests.
    let hard = "{ per_request: \"1.00\", mode: hard }";
    let g = gateway(Engine::Sqlite, "anthropic_sdk_hard", hard).await;
    let run = sdk::pytest(
        &tree,
        &files,
        &[],
        g.url(""),
        &["-k", "not with_all_params"],
    )
    .await;
    println!("hard ceiling ({:?}): {}", g.ledger_db.engine(), run.summary);
    assert!(
        run.passed,
        "the anthropic SDK's tests failed through purser under a hard ceiling:\n{}\n{}",
        run.stdout, run.stderr
    );
    settled(&g).await;

    // Soft ceiling, no budget, PostgreSQL ledger: the all-params tests, every field
    // passed through.
    let soft = "{ per_request: \"1.00\", mode: soft }";
    let g = gateway(Engine::Postgres, "anthropic_sdk_soft", soft).await;
    let run = sdk::pytest(&tree, &files, &[], g.url(""), &["-k", "with_all_params"]).await;
    println!("soft ceiling ({:?}): {}", g.ledger_db.engine(), run.summary);
    assert!(
        run.passed,
        "the anthropic SDK's all-params tests failed through purser under a soft ceiling:\n{}\n{}",
        run.stdout, run.stderr
    );
    settled(&g).await;

    // The same all-params body under the hard ceiling: refused, naming the field.
    let g = gateway(Engine::Sqlite, "anthropic_sdk_refused", hard).await;
    let r = reqwest::Client::new()
        .post(g.url("/v1/messages"))
        .header("x-api-key", SDK_KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({
            "model": SDK_MODEL, "max_tokens": 1024,
            "messages": [{"role": "user", "content": "Hello, world"}],
            "container": {"id": "id", "skills": [{"skill_id": "pdf", "type": "anthropic", "version": "latest"}]},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`container`"), "{body}");
    assert_eq!(g.vendors.calls("vendor"), 0);
}

/// A gateway over `docs` on `engine`; on SQLite when the PostgreSQL tests are skipped
/// on this machine (never in CI), so the run itself is never skipped.
async fn gateway(engine: Engine, test: &str, ceiling: &str) -> Gateway {
    let c = ceiling.to_string();
    if let Some(g) = common::start_on(engine, test, |v| docs(v, &c)).await {
        return g;
    }
    common::start_on(Engine::Sqlite, test, |v| docs(v, &c))
        .await
        .unwrap()
}

/// Calls reached the vendor, each request is booked as a served Messages request, and
/// the ledger holds the money invariants for them.
async fn settled(g: &Gateway) {
    assert!(g.vendors.calls("vendor") > 0, "no call reached the vendor");
    quiesce_on(&g.ledger_db, 10).await;
    let booked = g
        .ledger_db
        .column("SELECT DISTINCT ingress || ' ' || outcome FROM requests")
        .await;
    assert_eq!(booked, ["messages served"]);
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["vendor"]).await;
}
