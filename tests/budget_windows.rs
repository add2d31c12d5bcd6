//! Budget windows start from the ledger and are checked against the running plan, on
//! both engines (PostgreSQL with `PURSER_TEST_POSTGRES`; see `common::pg`):
//! a budget added mid-day counts the day's spend, a failover top-up checks a limit
//! lowered by a reload, a reload that changes currency is refused, and `purser settle`
//! keeps the worst cases of a request's other attempts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::rows::{attempt, closed, day_limit, ended, new_request};
use common::vendors::{Script, Vendors};
use common::{ADMIN, sha};
use purser::clock::SystemClock;
use purser::failure::Billing;
use purser::gateway::Engine;
use purser::ledger::{Ledger, LedgerError, Options, Outcome, Target};
use purser::money::Money;
use serde_json::{Value, json};

const KEY: &str = "key-budget-windows";

#[derive(Clone, Copy, Debug)]
enum Kind {
    Sqlite,
    Postgres,
}

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

/// A ledger of `kind` in `dir` (SQLite) or a fresh schema (PostgreSQL); `None` when
/// PostgreSQL tests are skipped.
async fn target(kind: Kind, test: &str, dir: &tempfile::TempDir) -> Option<Target> {
    Some(match kind {
        Kind::Sqlite => Target::Sqlite(dir.path().join("ledger.db")),
        Kind::Postgres => Target::Postgres(common::pg::fresh_schema(test).await?),
    })
}

fn options(replica: &str) -> Options {
    Options {
        replica: Some(replica.into()),
        lease: Duration::from_secs(5),
        ..Options::default()
    }
}

// ---- a gateway on either engine ----

struct Gw {
    addr: std::net::SocketAddr,
    /// The ledger, for the money invariants.
    db: common::db::Db,
    engine: Arc<Engine>,
    vendors: Vendors,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

/// The policy set: provider `p` (and `alt`, the alternate), model `m` at 1000 per
/// million tokens each way (a normal answer, 12 + 8 tokens, costs 0.02), a policy with
/// `budgets` (YAML list items) and `mode`.
fn policy_set(vendors: &Vendors, currency: &str, mode: &str, budgets: &[String]) -> String {
    // `alt` dearer, so `p` is always the primary.
    let prov = |id: &str| {
        let price = if id == "p" { "1000" } else { "1100" };
        common::provider(vendors, id, "openai", "us", &[("m", price, price)])
            .replace("timeout_ms: 300", "timeout_ms: 1500")
    };
    let budgets = if budgets.is_empty() {
        String::new()
    } else {
        format!("budgets:\n{}", budgets.join(""))
    };
    [
        format!("kind: gateway\ncurrency: {currency}\n"),
        prov("p"),
        prov("alt"),
        format!(
            "kind: policy\nid: team\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"1\", mode: {mode} }}\nmax_output_tokens: 20\nalternates:\n  m: alt/m\n{budgets}",
            sha(KEY)
        ),
    ]
    .join("---\n")
}

fn day(limit: &str) -> String {
    format!("  - {{ period: day, limit: \"{limit}\" }}\n")
}

async fn gateway(kind: Kind, test: &str, mode: &str, budgets: &[String]) -> Option<Gw> {
    let dir = tempfile::tempdir().unwrap();
    let target = target(kind, test, &dir).await?;
    let vendors = Vendors::start().await;
    let config = dir.path().join("policies");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("set.yaml"),
        policy_set(&vendors, "USD", mode, budgets),
    )
    .unwrap();
    let plan = purser::policy::compile_dir(&config).unwrap();
    let (ledger, _) = Ledger::open_at(&target, options(test)).await.unwrap();
    let engine = Arc::new(Engine::new(plan, ledger, SystemClock::shared()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = purser::http::Options {
        admin_token: purser::http::AdminToken::new(ADMIN),
        reloader: Some(Arc::new(purser::reload::Reloader::new(
            engine.clone(),
            config.clone(),
        ))),
        ..purser::http::Options::default()
    };
    let app = purser::http::router(engine.clone(), opts);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let db = match &target {
        Target::Sqlite(p) => common::db::Db::Sqlite(p.clone()),
        Target::Postgres(u) => common::db::Db::Postgres(u.clone()),
    };
    Some(Gw {
        addr,
        db,
        engine,
        vendors,
        config,
        _dir: dir,
    })
}

impl Gw {
    async fn chat(&self) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("http://{}/v1/chat/completions", self.addr))
            .bearer_auth(KEY)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// Rewrite the policy set and reload it; the admin API's status and answer.
    async fn reload(&self, set: String) -> (u16, Value) {
        std::fs::write(self.config.join("set.yaml"), set).unwrap();
        let r = reqwest::Client::new()
            .post(format!("http://{}/admin/v1/reload", self.addr))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn quiet(&self) {
        for _ in 0..500 {
            if self.engine.in_flight() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("requests still in flight");
    }
}

// ---- defect 5a: a window created mid-period starts from the ledger ----

/// A team spends 0.08 today with no budget; a reload adds a 0.05 day budget. Its
/// window is created at the next admission, from the day's charges: the request is
/// refused. (On main the window started empty and the request was admitted.)
async fn a_budget_added_mid_day_counts_the_days_spend(kind: Kind) {
    let Some(gw) = gateway(kind, &format!("added_mid_day_{kind:?}"), "hard", &[]).await else {
        return;
    };
    for _ in 0..4 {
        assert_eq!(gw.chat().await.0, 200);
    }
    gw.quiet().await;
    let (status, body) = gw
        .reload(policy_set(&gw.vendors, "USD", "hard", &[day("0.05")]))
        .await;
    assert_eq!(status, 200, "{body}");
    // Before any admission creates it, the audit API shows the window as it will start.
    let budgets: Value = reqwest::Client::new()
        .get(format!("http://{}/audit/v1/budgets", gw.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shown = budgets["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["period"] == "day")
        .unwrap();
    assert_eq!(m(shown["spent"].as_str().unwrap()), m("0.08"), "{budgets}");
    let (status, body) = gw.chat().await;
    assert_eq!(
        status, 402,
        "admitted under a budget the day has spent: {body}"
    );
    assert_eq!(body["error"]["code"], "budget_exhausted", "{body}");
    assert_eq!(gw.vendors.calls("p"), 4);
    let windows = gw.engine.ledger.stored_budgets().await.unwrap();
    let w = windows.iter().find(|w| w.period == "day").unwrap();
    assert_eq!(
        w.spent,
        m("0.08"),
        "the window starts from the day's charges"
    );
    common::money::assert_money_invariants_after_reloads_on(&gw.db, &gw.vendors, &["p", "alt"])
        .await;
}

#[tokio::test]
async fn a_budget_added_mid_day_counts_the_days_spend_sqlite() {
    a_budget_added_mid_day_counts_the_days_spend(Kind::Sqlite).await;
}

#[tokio::test]
async fn a_budget_added_mid_day_counts_the_days_spend_postgres() {
    a_budget_added_mid_day_counts_the_days_spend(Kind::Postgres).await;
}

/// A budget removed by one reload and added back by another within the day: what was
/// spent while it was absent counts when it returns. (Before, the window row of the
/// morning was kept and missed those charges: the team passed its budget.)
async fn a_budget_removed_and_added_back_counts_what_was_spent_without_it(kind: Kind) {
    let Some(gw) = gateway(kind, &format!("readded_{kind:?}"), "hard", &[day("5")]).await else {
        return;
    };
    assert_eq!(gw.chat().await.0, 200); // 0.02 in the morning's window
    gw.quiet().await;
    let (status, body) = gw.reload(policy_set(&gw.vendors, "USD", "hard", &[])).await;
    assert_eq!(status, 200, "{body}");
    for _ in 0..5 {
        let (status, body) = gw.chat().await;
        assert_eq!(status, 200, "{body}"); // 0.10 more, with no budget
    }
    gw.quiet().await;
    // A limit the morning's window alone would admit the next request under (0.02 +
    // its worst case + 0.05), but the day's charges (0.12 + its worst case) do not.
    let page = gw
        .engine
        .ledger
        .requests(purser::ledger::audit::Filter::default(), 1, None)
        .await
        .unwrap();
    let worst = m(&page.requests[0].worst_case);
    let limit = m("0.07") + worst;
    let (status, body) = gw
        .reload(policy_set(
            &gw.vendors,
            "USD",
            "hard",
            &[day(&limit.to_string())],
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw.chat().await;
    assert_eq!(
        status, 402,
        "0.12 spent today, the budget is {limit}: {body}"
    );
    assert_eq!(gw.vendors.calls("p"), 6);
    let windows = gw.engine.ledger.stored_budgets().await.unwrap();
    let w = windows.iter().find(|w| w.period == "day").unwrap();
    assert_eq!(
        w.spent,
        m("0.12"),
        "the day's charges, the budget-less ones too"
    );
    common::money::assert_money_invariants_after_reloads_on(&gw.db, &gw.vendors, &["p", "alt"])
        .await;
}

#[tokio::test]
async fn a_budget_removed_and_added_back_counts_what_was_spent_without_it_sqlite() {
    a_budget_removed_and_added_back_counts_what_was_spent_without_it(Kind::Sqlite).await;
}

#[tokio::test]
async fn a_budget_removed_and_added_back_counts_what_was_spent_without_it_postgres() {
    a_budget_removed_and_added_back_counts_what_was_spent_without_it(Kind::Postgres).await;
}

/// The seed counts billed costs and maybe-billed worst cases, makes requests in flight
/// holders of the window (in `reserved`), and a request it counted is not counted
/// again when it finishes.
async fn a_new_window_is_seeded_from_the_ledger(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let Some(target) = target(kind, &format!("seeded_{kind:?}"), &dir).await else {
        return;
    };
    let (l, _) = Ledger::open_at(&target, options("seed")).await.unwrap();
    // Served at 0.075 with no budget.
    l.admit_with_attempt(new_request("a", "0.1"), vec![], attempt("a", 1, "0.1"))
        .await
        .unwrap();
    l.finish(
        ended("a", 1, Billing::Billed, "0.075"),
        closed("a", Outcome::Served, "0.075", "0.075"),
    )
    .await
    .unwrap();
    // Failed maybe-billed (worst 0.01), no budget.
    l.admit_with_attempt(new_request("b", "0.01"), vec![], attempt("b", 1, "0.01"))
        .await
        .unwrap();
    l.finish(
        ended("b", 1, Billing::MaybeBilled, "0"),
        closed("b", Outcome::Failed, "0", "0.01"),
    )
    .await
    .unwrap();
    // In flight, its attempt's worst case 0.02.
    l.admit_with_attempt(new_request("c", "0.02"), vec![], attempt("c", 1, "0.02"))
        .await
        .unwrap();
    // A 0.2 day budget appears: 0.075 + 0.01 = 0.085 is spent and `c`, in flight, is
    // made a holder of the new window (0.02 reserved), so 0.1 does not fit.
    match l.admit(new_request("d", "0.1"), day_limit("0.2")).await {
        Err(LedgerError::BudgetExhausted {
            spent, reserved, ..
        }) => assert_eq!((spent, reserved), (m("0.085"), m("0.02"))),
        other => panic!("admitted past the day's charges: {other:?}"),
    }
    l.admit(new_request("e", "0.05"), day_limit("0.2"))
        .await
        .unwrap();
    // `c` finishes: it settles into the window it was given, as any holder does.
    l.finish(
        ended("c", 1, Billing::Billed, "0.02"),
        closed("c", Outcome::Served, "0.02", "0.02"),
    )
    .await
    .unwrap();
    let w = l.stored_budgets().await.unwrap();
    assert_eq!((w[0].spent, w[0].reserved), (m("0.105"), m("0.05")));
}

#[tokio::test]
async fn a_new_window_is_seeded_from_the_ledger_sqlite() {
    a_new_window_is_seeded_from_the_ledger(Kind::Sqlite).await;
}

#[tokio::test]
async fn a_new_window_is_seeded_from_the_ledger_postgres() {
    a_new_window_is_seeded_from_the_ledger(Kind::Postgres).await;
}

// ---- defect 5b: a failover top-up checks the running plan's limit ----

/// A soft request's primary times out while a reload lowers the day budget to what the
/// request already holds: the failover's top-up is checked against the new limit and
/// refused, and the alternate is never called. (On main the top-up was checked against
/// the stored limit of the admission, and the alternate was called.)
async fn a_top_up_checks_the_reloaded_limit(kind: Kind) {
    let Some(gw) = gateway(
        kind,
        &format!("top_up_reload_{kind:?}"),
        "soft",
        &[day("10")],
    )
    .await
    else {
        return;
    };
    // Past the provider's 1.5 s timeout: a timeout, which a soft request fails over.
    gw.vendors.script("p", vec![Script::Delay(4000)]);
    let gw = Arc::new(gw);
    let call = tokio::spawn({
        let gw = gw.clone();
        async move { gw.chat().await }
    });
    // While the primary is out, lower the limit to what the request holds.
    let held = loop {
        let windows = gw.engine.ledger.stored_budgets().await.unwrap();
        if let Some(w) = windows.iter().find(|w| w.reserved.is_positive()) {
            break w.reserved;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (status, body) = gw
        .reload(policy_set(
            &gw.vendors,
            "USD",
            "soft",
            &[day(&held.to_string())],
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call.await.unwrap();
    assert_eq!(
        gw.vendors.calls("alt"),
        0,
        "the alternate was called past the reloaded limit: {body}"
    );
    assert_eq!(status, 402, "{body}");
    assert_eq!(body["error"]["code"], "budget_exhausted", "{body}");
    gw.quiet().await;
    common::money::assert_money_invariants_after_reloads_on(&gw.db, &gw.vendors, &["p", "alt"])
        .await;
}

#[tokio::test]
async fn a_top_up_checks_the_reloaded_limit_sqlite() {
    a_top_up_checks_the_reloaded_limit(Kind::Sqlite).await;
}

#[tokio::test]
async fn a_top_up_checks_the_reloaded_limit_postgres() {
    a_top_up_checks_the_reloaded_limit(Kind::Postgres).await;
}

// ---- defect 5c: a currency change at reload is refused ----

#[tokio::test]
async fn a_reload_that_changes_currency_is_refused() {
    let Some(gw) = gateway(Kind::Sqlite, "currency", "hard", &[day("1")]).await else {
        return;
    };
    assert_eq!(gw.chat().await.0, 200);
    let before = gw.engine.plan().id().to_string();
    let (status, body) = gw
        .reload(policy_set(&gw.vendors, "EUR", "hard", &[day("1")]))
        .await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("USD") && message.contains("EUR") && message.contains("currency"),
        "{message}"
    );
    assert_eq!(gw.engine.plan().id(), before, "the old plan keeps serving");
    assert_eq!(gw.engine.plan().currency(), "USD");
    assert_eq!(gw.chat().await.0, 200);
    gw.quiet().await;
    common::money::assert_money_invariants_after_reloads_on(&gw.db, &gw.vendors, &["p", "alt"])
        .await;
}

// ---- defect 5d: settle keeps other attempts' worst cases ----

/// A request's first attempt timed out maybe-billed (worst 0.1); its failover attempt
/// was interrupted (worst 0.1). The operator settles the interrupted one at 0.03: the
/// day is charged 0.03 plus the first attempt's 0.1. (On main: 0.03 alone.)
async fn settle_keeps_the_worst_case_of_other_attempts(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let Some(target) = target(kind, &format!("settle_{kind:?}"), &dir).await else {
        return;
    };
    let (l, _) = Ledger::open_at(&target, options("settle")).await.unwrap();
    l.admit_with_attempt(
        new_request("r", "0.1"),
        day_limit("1"),
        attempt("r", 1, "0.1"),
    )
    .await
    .unwrap();
    l.finish_attempt(ended("r", 1, Billing::MaybeBilled, "0"))
        .await
        .unwrap();
    l.top_up("r", m("0.1"), day_limit("1")).await.unwrap();
    l.begin_attempt(attempt("r", 2, "0.1")).await.unwrap();
    l.interrupt("r", "its task died").await.unwrap();
    let w = &l.stored_budgets().await.unwrap()[0];
    assert_eq!((w.spent, w.reserved), (m("0.2"), Money::ZERO));
    // `purser settle`, as the CLI runs it.
    purser::ledger::settle_at(&target, "r", m("0.03"))
        .await
        .unwrap();
    let w = &l.stored_budgets().await.unwrap()[0];
    assert_eq!(
        (w.spent, w.reserved),
        (m("0.13"), Money::ZERO),
        "the first attempt's worst case was dropped"
    );
    let row = l.request("r").await.unwrap().unwrap();
    assert_eq!(m(&row.cost), m("0.03"));
    let billing: Vec<&str> = row.attempts.iter().map(|a| a.billing.as_str()).collect();
    assert_eq!(billing, ["maybe_billed", "billed"]);
}

#[tokio::test]
async fn settle_keeps_the_worst_case_of_other_attempts_sqlite() {
    settle_keeps_the_worst_case_of_other_attempts(Kind::Sqlite).await;
}

#[tokio::test]
async fn settle_keeps_the_worst_case_of_other_attempts_postgres() {
    settle_keeps_the_worst_case_of_other_attempts(Kind::Postgres).await;
}
