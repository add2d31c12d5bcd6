//! Shared harness: a policy set written to a temp dir, the mock vendors, and a
//! real gateway (engine + ledger file + HTTP) on loopback.

#![allow(dead_code)] // each test file uses part of the harness

pub mod db;
pub mod money;
pub mod pg;
pub mod rows;
pub mod sdk;
pub mod vendors;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use db::Db;
use purser::clock::SystemClock;
use purser::gateway::Engine;
use purser::ledger::{Ledger, Options};
use serde_json::Value;
use vendors::Vendors;

pub const ADMIN: &str = "admin-token-for-tests";

pub fn sha(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

pub struct Gateway {
    pub vendors: Vendors,
    pub addr: SocketAddr,
    /// The SQLite ledger file (named, not used, when the ledger is on PostgreSQL).
    pub db: PathBuf,
    /// The ledger, on whichever engine it is.
    pub ledger_db: Db,
    pub config: PathBuf,
    pub engine: Arc<Engine>,
    pub dir: tempfile::TempDir,
}

/// `provider`'s document with a call timeout of `ms` instead of its 300 ms, for a test
/// whose calls must outlast a loaded machine (what it tests is not the timeout).
pub fn with_call_timeout(provider: String, ms: u64) -> String {
    assert!(provider.contains("timeout_ms: 300\n"), "{provider}");
    provider.replace("timeout_ms: 300\n", &format!("timeout_ms: {ms}\n"))
}

/// A provider document served by the mock vendors.
pub fn provider(
    vendors: &Vendors,
    id: &str,
    api: &str,
    jurisdiction: &str,
    models: &[(&str, &str, &str)],
) -> String {
    let mut s = format!(
        "kind: provider\nid: {id}\napi: {api}\nbase_url: {}\njurisdiction: {jurisdiction}\ntimeout_ms: 300\nmodels:\n",
        vendors.base_url(id, api),
    );
    for (m, pin, pout) in models {
        s.push_str(&format!(
            "  {m}:\n    context_window: 100000\n    input_per_mtok: \"{pin}\"\n    output_per_mtok: \"{pout}\"\n"
        ));
    }
    s
}

/// Start a gateway over `docs` (joined as one multi-document file) with the admin token set.
pub async fn start(docs: impl FnOnce(&Vendors) -> Vec<String>) -> Gateway {
    start_with(docs, Some(ADMIN)).await
}

pub async fn start_with(
    docs: impl FnOnce(&Vendors) -> Vec<String>,
    admin: Option<&str>,
) -> Gateway {
    start_tuned(docs, admin, |_| {}).await
}

/// As `start_with`, with the HTTP options adjusted by `tune` (limits, metrics access).
pub async fn start_tuned(
    docs: impl FnOnce(&Vendors) -> Vec<String>,
    admin: Option<&str>,
    tune: impl FnOnce(&mut purser::http::Options),
) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::Sqlite(dir.path().join("ledger.db"));
    start_at(
        dir,
        db.clone(),
        db,
        docs,
        admin,
        tune,
        SystemClock::shared(),
    )
    .await
}

/// A gateway whose ledger is on `engine` (PostgreSQL: a fresh schema of its own), or
/// `None` when the PostgreSQL tests are skipped on this machine (never in CI).
pub async fn start_on(
    engine: db::Engine,
    test: &str,
    docs: impl FnOnce(&Vendors) -> Vec<String>,
) -> Option<Gateway> {
    start_on_via(engine, test, docs, str::to_string).await
}

/// As `start_on`, with the gateway reaching a PostgreSQL ledger at `via(url)` (a fault
/// proxy in front of the server); the test itself reads the ledger directly.
pub async fn start_on_via(
    engine: db::Engine,
    test: &str,
    docs: impl FnOnce(&Vendors) -> Vec<String>,
    via: impl FnOnce(&str) -> String,
) -> Option<Gateway> {
    start_on_clocked(engine, test, docs, via, SystemClock::shared()).await
}

/// As `start_on_via`, with the engine reading time from `clock`.
pub async fn start_on_clocked(
    engine: db::Engine,
    test: &str,
    docs: impl FnOnce(&Vendors) -> Vec<String>,
    via: impl FnOnce(&str) -> String,
    clock: Arc<dyn purser::clock::Clock>,
) -> Option<Gateway> {
    let dir = tempfile::tempdir().unwrap();
    let (db, reached) = match engine {
        db::Engine::Sqlite => {
            let db = Db::Sqlite(dir.path().join("ledger.db"));
            (db.clone(), db)
        }
        db::Engine::Postgres => {
            let url = pg::fresh_schema(test).await?;
            let reached = Db::Postgres(via(&url));
            (Db::Postgres(url), reached)
        }
    };
    Some(start_at(dir, db, reached, docs, Some(ADMIN), |_| {}, clock).await)
}

async fn start_at(
    dir: tempfile::TempDir,
    ledger_db: Db,
    reached: Db,
    docs: impl FnOnce(&Vendors) -> Vec<String>,
    admin: Option<&str>,
    tune: impl FnOnce(&mut purser::http::Options),
    clock: Arc<dyn purser::clock::Clock>,
) -> Gateway {
    let vendors = Vendors::start().await;
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    let mut all = vec!["kind: gateway\ncurrency: USD\n".to_string()];
    all.extend(docs(&vendors));
    std::fs::write(config.join("set.yaml"), all.join("---\n")).unwrap();
    let plan = purser::policy::compile_dir(&config).unwrap();
    // On PostgreSQL `db` names no file; the tests that read one are SQLite's.
    let db = dir.path().join("ledger.db");
    let options = Options {
        replica: Some("test-replica".into()),
        ..Options::default()
    };
    let (ledger, _) = Ledger::open_at(&reached.target(), options).await.unwrap();
    let engine = Arc::new(Engine::new(plan, ledger, clock).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut opts = purser::http::Options {
        admin_token: admin.and_then(purser::http::AdminToken::new),
        reloader: Some(Arc::new(purser::reload::Reloader::new(
            engine.clone(),
            config.clone(),
        ))),
        ..purser::http::Options::default()
    };
    tune(&mut opts);
    let app = purser::http::router(engine.clone(), opts);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Gateway {
        vendors,
        addr,
        db,
        ledger_db,
        config,
        engine,
        dir,
    }
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POST a chat completion; returns status, request id and body.
    pub async fn chat(&self, key: &str, model: &str) -> (u16, Option<String>, Value) {
        self.chat_with(key, model, Value::from("hello")).await
    }

    /// POST a chat completion of one user message with `content` (a string or parts).
    pub async fn chat_with(
        &self,
        key: &str,
        model: &str,
        content: Value,
    ) -> (u16, Option<String>, Value) {
        let r = reqwest::Client::new()
            .post(self.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&serde_json::json!({"model": model, "messages": [{"role": "user", "content": content}]}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let id = r
            .headers()
            .get("x-purser-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let id = id.or_else(|| {
            v.pointer("/error/request_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        (status, id, v)
    }

    /// GET with the admin token; status and body text.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        self.get_as(path, Some(ADMIN)).await
    }

    pub async fn get_as(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut rb = reqwest::Client::new().get(self.url(path));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let r = rb.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// POST with the admin token; status and JSON body.
    pub async fn admin_post(&self, path: &str) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(self.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn admin_json(&self, path: &str) -> Value {
        let (status, body) = self.admin_get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

/// A `purser serve` child process on a free loopback port; killed when dropped.
pub struct ServeChild {
    pub child: std::process::Child,
    pub port: u16,
}

impl ServeChild {
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `purser serve` on `config` and `db` with `extra` arguments and `env`, and wait
/// until it answers `/healthz`. Its stderr is piped when `capture_stderr`.
pub async fn serve_child(
    config: &std::path::Path,
    db: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
    capture_stderr: bool,
) -> ServeChild {
    use std::process::{Command, Stdio};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_purser"));
    cmd.arg("serve")
        .args(extra)
        .arg("--config")
        .arg(config)
        .arg("--db")
        .arg(db)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(if capture_stderr {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    for (k, v) in env {
        cmd.env(k, v);
    }
    let served = ServeChild {
        child: cmd.spawn().unwrap(),
        port,
    };
    let client = reqwest::Client::new();
    // Up to 30 s: a debug build migrating a fresh ledger on a loaded machine took over
    // 10 s once (four copies of `replicas` at once).
    for _ in 0..1500 {
        if client
            .get(format!("{}/healthz", served.base()))
            .send()
            .await
            .is_ok()
        {
            return served;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("purser serve did not start");
}
