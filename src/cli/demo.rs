//! `purser demo`: the whole mechanism, offline. Simulated providers on loopback, the
//! example policies pointed at them, one request per scenario, and a table read back
//! from the ledger.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::clock::SystemClock;
use crate::gateway::Engine;
use crate::http;
use crate::ledger::{Ledger, Options};
use crate::policy;
use crate::sim::{Script, Sim};

/// The example policy set, embedded so the demo runs from any directory.
const EXAMPLES: [(&str, &str); 8] = [
    ("gateway.yaml", include_str!("../../policies/gateway.yaml")),
    (
        "providers/pool.yaml",
        include_str!("../../policies/providers/pool.yaml"),
    ),
    (
        "providers/openai.yaml",
        include_str!("../../policies/providers/openai.yaml"),
    ),
    (
        "providers/anthropic.yaml",
        include_str!("../../policies/providers/anthropic.yaml"),
    ),
    (
        "providers/gemini.yaml",
        include_str!("../../policies/providers/gemini.yaml"),
    ),
    (
        "teams/finance.yaml",
        include_str!("../../policies/teams/finance.yaml"),
    ),
    (
        "teams/research.yaml",
        include_str!("../../policies/teams/research.yaml"),
    ),
    (
        "teams/eu-analytics.yaml",
        include_str!("../../policies/teams/eu-analytics.yaml"),
    ),
];

const KEY_FINANCE: &str = "sk-purser-demo-finance";
const KEY_RESEARCH: &str = "sk-purser-demo-research";
const KEY_EU: &str = "sk-purser-demo-eu-analytics";
/// Attempt timeout the demo gives the simulated providers, so a "timeout" is quick.
const DEMO_TIMEOUT_MS: u64 = 400;

/// The request Claude Code 2.1.332 sends for one "say hi" turn, recorded 2026-12-01.
const CLAUDE_CODE_TURN: &str =
    include_str!("../../tests/fixtures/agents/claude-code-2.1.332-say-hi.json");
/// The request Codex CLI 0.169.0 sends for one "say hi" turn, recorded 2026-12-01.
const CODEX_TURN: &str = include_str!("../../tests/fixtures/agents/codex-0.169.0-say-hi.json");

struct Scenario {
    name: &'static str,
    /// The client API; Messages and Responses send the recorded agent request.
    ingress: crate::ingress::Ingress,
    key: &'static str,
    model: &'static str,
    max_tokens: Option<u64>,
    scripts: Vec<(&'static str, Vec<Script>)>,
    rotate_key: Option<&'static str>,
}

fn scenarios() -> Vec<Scenario> {
    let s = |status: u16, body: &str| Script::Status(status, body.to_string());
    let sc = |name, key, model, scripts| Scenario {
        name,
        ingress: crate::ingress::Ingress::Chat,
        key,
        model,
        max_tokens: None,
        scripts,
        rotate_key: None,
    };
    vec![
        sc("normal answer", KEY_FINANCE, "gpt-4o-mini", vec![]),
        sc("own pool first", KEY_EU, "llama-3.1-8b", vec![]),
        sc(
            "rate limit → alternate",
            KEY_FINANCE,
            "gpt-4o-mini",
            vec![(
                "openai-us",
                vec![s(
                    429,
                    r#"{"error":{"message":"Rate limit reached for gpt-4o-mini on tokens per min (TPM).","type":"tokens","code":"rate_limit_exceeded"}}"#,
                )],
            )],
        ),
        sc(
            "outage (503) → alternate",
            KEY_RESEARCH,
            "gpt-4o",
            vec![(
                "openai-us",
                vec![s(
                    503,
                    r#"{"error":{"message":"The server is overloaded.","type":"server_error"}}"#,
                )],
            )],
        ),
        sc(
            "timeout, hard ceiling: stop",
            KEY_FINANCE,
            "gpt-4o-mini",
            vec![("openai-us", vec![Script::Delay(1_500)])],
        ),
        sc(
            "timeout, soft ceiling → alternate",
            KEY_RESEARCH,
            "gpt-4o-mini",
            vec![("openai-us", vec![Script::Delay(1_500)])],
        ),
        sc(
            "content refusal (400)",
            KEY_FINANCE,
            "gpt-4o-mini",
            vec![(
                "openai-us",
                vec![s(
                    400,
                    r#"{"error":{"code":"content_policy_violation","message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error"}}"#,
                )],
            )],
        ),
        sc(
            "content refusal (blocked 200)",
            KEY_EU,
            "gemini-flash",
            vec![(
                "gemini-eu",
                vec![s(
                    200,
                    r#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":9}}"#,
                )],
            )],
        ),
        sc(
            "context overflow",
            KEY_RESEARCH,
            "claude-sonnet",
            vec![(
                "anthropic-eu",
                vec![s(
                    400,
                    r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                )],
            )],
        ),
        sc(
            "bad key",
            KEY_RESEARCH,
            "gemini-flash",
            vec![(
                "gemini-eu",
                vec![s(
                    401,
                    r#"{"error":{"code":401,"message":"API key not valid. Please pass a valid API key.","status":"UNAUTHENTICATED"}}"#,
                )],
            )],
        ),
        Scenario {
            rotate_key: Some("anthropic-eu"),
            ..sc(
                "rotated key → retry once",
                KEY_FINANCE,
                "claude-haiku",
                vec![(
                    "anthropic-eu",
                    vec![Script::RequireKey("demo-key-anthropic-eu-rotated".into())],
                )],
            )
        },
        Scenario {
            max_tokens: Some(100_000),
            ..sc(
                "over the ceiling: no call",
                KEY_FINANCE,
                "gpt-4o-mini",
                vec![],
            )
        },
        sc("model not allowed", KEY_EU, "gpt-4o", vec![]),
        Scenario {
            ingress: crate::ingress::Ingress::Messages,
            ..sc(
                "Claude Code turn: 128k cap clamped",
                KEY_RESEARCH,
                "claude-sonnet",
                vec![],
            )
        },
        Scenario {
            ingress: crate::ingress::Ingress::Messages,
            ..sc(
                "Claude Code turn, hard ceiling: no call",
                KEY_EU,
                "claude-sonnet",
                vec![],
            )
        },
        Scenario {
            ingress: crate::ingress::Ingress::Responses,
            ..sc("Codex turn (Responses API)", KEY_RESEARCH, "gpt-4o", vec![])
        },
    ]
}

/// Write the example set into `dir`, pointed at the simulator, with key files.
fn write_config(dir: &Path, sim: &Sim) -> Result<(), String> {
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).map_err(|e| e.to_string())?;
    for (name, text) in EXAMPLES {
        let mut out = String::new();
        for doc in serde_yaml::Deserializer::from_str(text) {
            let mut v: serde_yaml::Value =
                serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
            if v.get("kind").and_then(|k| k.as_str()) == Some("provider") {
                let id = v
                    .get("id")
                    .and_then(|k| k.as_str())
                    .unwrap_or_default()
                    .to_string();
                let api = v
                    .get("api")
                    .and_then(|k| k.as_str())
                    .unwrap_or_default()
                    .to_string();
                let key_file = keys.join(&id);
                std::fs::write(&key_file, format!("demo-key-{id}\n")).map_err(|e| e.to_string())?;
                if let Some(m) = v.as_mapping_mut() {
                    m.insert("base_url".into(), sim.base_url(&id, &api).into());
                    m.insert("timeout_ms".into(), DEMO_TIMEOUT_MS.into());
                    let mut cred = serde_yaml::Mapping::new();
                    cred.insert("file".into(), key_file.display().to_string().into());
                    m.insert("credential".into(), cred.into());
                }
            }
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(&v).map_err(|e| e.to_string())?);
        }
        let path = dir.join(name.replace('/', "-"));
        std::fs::write(path, out).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub struct Row {
    pub scenario: String,
    pub policy: String,
    pub status: u16,
    pub attempts: String,
    pub decision: String,
    pub served_by: String,
    pub cost: String,
}

pub async fn demo(
    once: bool,
    listen: Option<std::net::SocketAddr>,
    db: Option<PathBuf>,
) -> ExitCode {
    match run(once, listen, db).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    once: bool,
    listen: Option<std::net::SocketAddr>,
    db: Option<PathBuf>,
) -> Result<(), String> {
    let tmp = std::env::temp_dir().join(format!("purser-demo-{}", ulid::Ulid::generate()));
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    eprintln!(
        "purser demo: starting simulated OpenAI, Anthropic and Gemini providers on loopback…"
    );
    let sim = Sim::start(0).await.map_err(|e| e.to_string())?;
    let config = tmp.join("policies");
    std::fs::create_dir_all(&config).map_err(|e| e.to_string())?;
    write_config(&config, &sim)?;
    let plan = policy::compile_dir(&config).map_err(|d| d.to_string())?;
    let db = db.unwrap_or_else(|| tmp.join("ledger.db"));
    let (ledger, _) = Ledger::open(&db, Options::default()).map_err(|e| e.to_string())?;
    eprintln!(
        "purser demo: plan {} from the example policies; ledger {}",
        plan.id(),
        db.display()
    );
    let engine = Arc::new(
        Engine::new(plan, ledger.clone(), SystemClock::shared()).map_err(|e| e.to_string())?,
    );
    let listener =
        tokio::net::TcpListener::bind(listen.unwrap_or_else(|| ([127, 0, 0, 1], 0).into()))
            .await
            .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // A fresh admin token per run, printed at the end so the audit API can be tried.
    let admin_token = format!("purser-demo-admin-{}", ulid::Ulid::generate());
    let app = http::router(
        engine,
        http::Options {
            admin_token: http::AdminToken::new(&admin_token),
            ..http::Options::default()
        },
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    eprintln!("purser demo: gateway on http://{addr}; sending one request per scenario");

    let client = reqwest::Client::new();
    let mut rows = Vec::new();
    let all = scenarios();
    for (i, sc) in all.iter().enumerate() {
        eprintln!("  [{:>2}/{}] {}", i + 1, all.len(), sc.name);
        for (p, script) in &sc.scripts {
            sim.script(p, script.clone());
        }
        if let Some(p) = sc.rotate_key {
            std::fs::write(
                config.join("keys").join(p),
                "demo-key-anthropic-eu-rotated\n",
            )
            .map_err(|e| e.to_string())?;
        }
        let (path, mut body) = match sc.ingress {
            crate::ingress::Ingress::Chat => (
                "/v1/chat/completions",
                json!({"model": sc.model, "messages": [{"role": "user", "content": "Summarise our Q3 invoices in one line."}]}),
            ),
            crate::ingress::Ingress::Messages => ("/v1/messages", recorded_body(CLAUDE_CODE_TURN)?),
            crate::ingress::Ingress::Responses => ("/v1/responses", recorded_body(CODEX_TURN)?),
        };
        body["model"] = json!(sc.model);
        if let Some(n) = sc.max_tokens {
            body["max_tokens"] = json!(n);
        }
        let resp = client
            .post(format!("http://{addr}{path}"))
            .bearer_auth(sc.key)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let header_id = resp
            .headers()
            .get("x-purser-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        let id = header_id.or_else(|| {
            v.pointer("/error/request_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let found = match id.as_deref() {
            Some(id) => Some(ledger.request(id).await),
            None => None,
        };
        let row = match found {
            Some(Ok(Some(r))) => Row {
                scenario: sc.name.into(),
                policy: format!("{} ({})", r.policy, r.mode),
                status,
                attempts: if r.attempts.is_empty() {
                    "no call".into()
                } else {
                    r.attempts
                        .iter()
                        .map(|a| format!("{}: {}", a.provider, a.class.as_deref().unwrap_or("?")))
                        .collect::<Vec<_>>()
                        .join(" → ")
                },
                decision: r
                    .attempts
                    .last()
                    .and_then(|a| a.decision.clone())
                    .unwrap_or_else(|| r.error_code.clone().unwrap_or_else(|| r.outcome.clone())),
                served_by: r.served_by.clone().unwrap_or_else(|| "—".into()),
                cost: shown_cost(&r),
            },
            _ => Row {
                scenario: sc.name.into(),
                policy: "—".into(),
                status,
                attempts: "no call".into(),
                decision: v
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .into(),
                served_by: "—".into(),
                cost: "0".into(),
            },
        };
        rows.push(row);
    }
    print!("{}", table(&rows));
    println!(
        "\nEvery row above was read back from the ledger at {}.",
        db.display()
    );
    println!(
        "Try it yourself: curl -s http://{addr}/v1/chat/completions -H 'Authorization: Bearer {KEY_RESEARCH}' -H 'content-type: application/json' -d '{{\"model\":\"gpt-4o-mini\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!("Audit API: http://{addr}/audit/v1/requests (also /spend, /budgets, /attempts.csv)");
    println!("Admin token for this run: {admin_token}");
    println!(
        "  curl -s http://{addr}/audit/v1/spend?group_by=provider -H 'Authorization: Bearer {admin_token}'"
    );
    if once {
        return Ok(());
    }
    println!("Serving until Ctrl-C.");
    super::serve::shutdown_signal().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

/// The body of a recorded agent request.
fn recorded_body(recorded: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(recorded).map_err(|e| e.to_string())?;
    v.get("body")
        .cloned()
        .ok_or_else(|| "a recorded request without a body".to_string())
}

/// What a request cost as people should read it: the billed cost, and beside it what
/// attempts that may have been billed without proof could still have cost (their
/// worst case, charged to the budgets) — never a bare 0 for a call that may have run.
fn shown_cost(r: &crate::ledger::read::RequestRow) -> String {
    let exposure: Option<crate::money::Money> = r
        .attempts
        .iter()
        .filter(|a| a.billing == "maybe_billed")
        .map(|a| a.worst_case.parse::<crate::money::Money>().ok())
        .sum();
    match exposure {
        Some(e) if e.is_positive() => format!("{} + up to {e} unproven", r.cost),
        Some(_) | None => r.cost.clone(),
    }
}

pub fn table(rows: &[Row]) -> String {
    let head = [
        "scenario",
        "policy (mode)",
        "HTTP",
        "attempts (provider: class)",
        "last decision",
        "served by",
        "cost",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.clone(),
                r.policy.clone(),
                r.status.to_string(),
                r.attempts.clone(),
                r.decision.clone(),
                r.served_by.clone(),
                r.cost.clone(),
            ]
        })
        .collect();
    let mut w = head.map(|h| h.chars().count());
    for c in &cells {
        for (i, x) in c.iter().enumerate() {
            w[i] = w[i].max(x.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, c: &[String]| {
        let parts: Vec<String> = c
            .iter()
            .enumerate()
            .map(|(i, x)| format!("{x}{}", " ".repeat(w[i] - x.chars().count())))
            .collect();
        let _ = writeln!(out, "{}", parts.join(" │ ").trim_end());
    };
    line(&mut out, &head.map(String::from));
    let _ = writeln!(
        out,
        "{}",
        w.iter()
            .map(|n| "─".repeat(*n))
            .collect::<Vec<_>>()
            .join("─┼─")
    );
    for c in &cells {
        line(&mut out, c);
    }
    out
}
