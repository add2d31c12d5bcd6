//! What-if replay (issue #24): traffic recorded through the gateway against mock
//! vendors, then replayed through changed policy sets with no call made. Each replay
//! asserts exact counts and the exact decimal spend delta, on both engines.
//!
//! The traffic: four requests at the default output cap (100) and two asking for 1000,
//! all served by `us1` (the cheaper vendor), and one for a model the policy does not
//! allow. Every vendor answer is 12 prompt and 8 completion tokens, so an answer costs
//! 12 × 1/M + 8 × 2/M = 0.000028 at `us1` and 12 × 1.5/M + 8 × 3/M = 0.000042 at `eu1`.
//! The gateway's input bounds of these bodies are 288 tokens (326 with `max_tokens`),
//! so the worst cases at `us1` are 0.000488 and 0.002326.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::db::{Db, Engine};
use common::money::{assert_money_invariants_on, quiesce_on};
use common::{Gateway, provider, sha};
use purser::ledger::Ledger;
use purser::ledger::recorded::Span;
use purser::money::Money;
use purser::replay::{Code, Report};
use serde_json::json;

const KEY: &str = "key-replay";
const PROVIDERS: [&str; 2] = ["us1", "eu1"];

fn money(s: &str) -> Money {
    s.parse().unwrap()
}

/// The recorded policy: both vendors, a hard ceiling of 0.01 and a day budget of 0.004
/// (room for every request of the traffic; half of it is not).
fn policy(ceiling: &str, jurisdictions: &str, day: &str) -> String {
    format!(
        "kind: policy\nid: team\nclients:\n  - {{ id: t, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [{jurisdictions}]\nceiling: {{ per_request: \"{ceiling}\", mode: hard }}\nmax_output_tokens: 100\nbudgets: [ {{ period: day, limit: \"{day}\" }} ]\n",
        sha(KEY)
    )
}

fn providers(v: &common::vendors::Vendors) -> [String; 2] {
    [
        provider(v, "us1", "openai", "us", &[("m", "1.00", "2.00")]),
        provider(v, "eu1", "openai", "eu", &[("m", "1.50", "3.00")]),
    ]
}

async fn record(e: Engine, test: &str) -> Option<Gateway> {
    let g = common::start_on(e, test, |v| {
        let [us, eu] = providers(v);
        vec![us, eu, policy("0.01", "eu, us", "0.004")]
    })
    .await?;
    let client = reqwest::Client::new();
    for (model, max_tokens) in [
        ("m", None),
        ("m", None),
        ("m", None),
        ("m", None),
        ("m", Some(1000)),
        ("m", Some(1000)),
        ("z", None),
    ] {
        let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
        if let Some(n) = max_tokens {
            body["max_tokens"] = json!(n);
        }
        let r = client
            .post(g.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        let expected = if model == "m" { 200 } else { 403 };
        assert_eq!(r.status().as_u16(), expected, "{}", r.text().await.unwrap());
    }
    quiesce_on(&g.ledger_db, 10).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &PROVIDERS).await;
    assert_eq!(g.vendors.calls("us1"), 6);
    assert_eq!(g.vendors.calls("eu1"), 0);
    Some(g)
}

/// Replay the gateway's ledger through the policy set `docs` (no call is made: the
/// vendors' call counts do not move).
async fn replay(g: &Gateway, docs: Vec<String>) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["kind: gateway\ncurrency: USD\n".to_string()];
    all.extend(docs);
    std::fs::write(dir.path().join("set.yaml"), all.join("---\n")).unwrap();
    let plan = purser::policy::compile_dir(dir.path()).unwrap();
    let ledger = Ledger::open_reader(&g.ledger_db.target()).await.unwrap();
    let before = (g.vendors.calls("us1"), g.vendors.calls("eu1"));
    let r = purser::replay::over(&ledger, &plan, Span::default())
        .await
        .unwrap();
    assert_eq!((g.vendors.calls("us1"), g.vendors.calls("eu1")), before);
    assert_eq!(r.read, 7, "{r:#?}");
    r
}

fn refused(r: &Report) -> Vec<(Code, u64)> {
    r.refused.iter().map(|x| (x.code, x.requests)).collect()
}

fn moved(r: &Report) -> Vec<(String, Option<String>, String, String, u64)> {
    r.moved
        .iter()
        .map(|m| {
            (
                m.route.from.clone(),
                m.route.from_jurisdiction.clone(),
                m.route.to.clone(),
                m.route.to_jurisdiction.clone(),
                m.requests,
            )
        })
        .collect()
}

async fn unchanged_policy_reports_zero_changes(e: Engine) {
    let Some(g) = record(e, "replay_unchanged").await else {
        return;
    };
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.01", "eu, us", "0.004")]).await;
    assert_eq!(r.changes(), 0, "{r:#?}");
    assert_eq!(r.skipped_no_shape, 0);
    assert_eq!(r.same_destination, 6);
    assert_eq!(r.still_refused, 1, "the model it does not allow, as before");
    assert_eq!(r.spend.billed_before, money("0.000168"));
    assert_eq!(r.spend.billed_after, money("0.000168"));
    assert_eq!(r.spend.delta, Money::ZERO);
    assert_eq!(r.spend.worst_case_before, Money::ZERO);
    assert!(r.budgets.iter().all(|b| b.exhausted.is_empty()), "{r:#?}");
    let text = purser::replay::text(&r);
    assert!(text.contains("changes: 0"), "{text}");
}

/// A ceiling lowered below the worst case of the 1000-token requests: those two are
/// refused `ceiling_exceeded`, and their billed 2 × 0.000028 goes.
async fn lowered_ceiling(e: Engine) {
    let Some(g) = record(e, "replay_ceiling").await else {
        return;
    };
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.001", "eu, us", "0.004")]).await;
    assert_eq!(refused(&r), vec![(Code::CeilingExceeded, 2)], "{r:#?}");
    assert_eq!(r.same_destination, 4);
    assert_eq!(r.still_refused, 1);
    assert!(r.moved.is_empty());
    assert_eq!(r.changes(), 2);
    assert_eq!(r.spend.billed_after, money("0.000112"));
    assert_eq!(r.spend.delta, money("-0.000056"));
    // The same ceiling with `on_exceed: clamp`: the two are admitted with their output
    // cap lowered to fit (at us1: (0.001 - 326 × 1/M) / (2/M) = 337 tokens), and
    // their recorded tokens cost what they cost.
    let [us, eu] = providers(&g.vendors);
    let clamp =
        policy("0.001", "eu, us", "0.004").replace("mode: hard", "mode: hard, on_exceed: clamp");
    let r = replay(&g, vec![us, eu, clamp]).await;
    assert_eq!(r.clamped, 2, "{r:#?}");
    assert!(r.refused.is_empty());
    assert_eq!(r.same_destination, 6);
    assert_eq!(r.changes(), 2);
    assert_eq!(r.spend.delta, Money::ZERO);
}

/// The cheaper vendor removed: every served request goes to `eu1`, from the US to the
/// EU, at its prices: +6 × (0.000042 - 0.000028).
async fn removed_vendor(e: Engine) {
    let Some(g) = record(e, "replay_vendor").await else {
        return;
    };
    let [_, eu] = providers(&g.vendors);
    let r = replay(&g, vec![eu, policy("0.01", "eu, us", "0.004")]).await;
    assert_eq!(
        moved(&r),
        vec![(
            "us1/m".to_string(),
            Some("us".to_string()),
            "eu1/m".to_string(),
            "eu".to_string(),
            6
        )],
        "{r:#?}"
    );
    assert!(r.refused.is_empty(), "{r:#?}");
    assert_eq!(r.same_destination, 0);
    assert_eq!(r.spend.billed_after, money("0.000252"));
    assert_eq!(r.spend.delta, money("0.000084"));
    let md = purser::replay::markdown(&r);
    assert!(md.contains("| us1/m | eu1/m | us → eu | 6 |"), "{md}");
    assert!(
        md.contains("| billed | 0.000168 | 0.000252 | +0.000084 |"),
        "{md}"
    );
}

/// Jurisdictions narrowed to `eu`: the US vendor is out of bounds, so the same six
/// move to `eu1`, and a model with no EU destination would be `no_destination`.
async fn jurisdiction_narrowed_to_eu(e: Engine) {
    let Some(g) = record(e, "replay_eu").await else {
        return;
    };
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.01", "eu", "0.004")]).await;
    assert_eq!(moved(&r).len(), 1, "{r:#?}");
    assert_eq!(r.moved[0].requests, 6);
    assert_eq!(r.moved[0].route.to_jurisdiction, "eu");
    assert_eq!(r.moved[0].route.from_jurisdiction.as_deref(), Some("us"));
    assert_eq!(r.spend.delta, money("0.000084"));
    // Narrowed to a jurisdiction no vendor serves: nothing has a destination.
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.01", "ap", "0.004")]).await;
    assert_eq!(refused(&r), vec![(Code::NoDestination, 6)], "{r:#?}");
    assert_eq!(r.spend.delta, money("-0.000168"));
}

/// The day budget halved to 0.002: after the four small requests (charged
/// 4 × 0.000028), a 1000-token request's worst case (over 0.002 alone) no longer fits,
/// so both are refused `budget_exhausted`, in today's window, from the first of them.
async fn halved_day_budget(e: Engine) {
    let Some(g) = record(e, "replay_budget").await else {
        return;
    };
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.01", "eu, us", "0.002")]).await;
    assert_eq!(refused(&r), vec![(Code::BudgetExhausted, 2)], "{r:#?}");
    assert_eq!(r.same_destination, 4);
    assert_eq!(r.spend.delta, money("-0.000056"));
    assert_eq!(r.budgets.len(), 1);
    let b = &r.budgets[0];
    assert_eq!(
        (b.policy.as_str(), b.period, b.limit),
        ("team", "day", money("0.002"))
    );
    assert_eq!(b.windows, 1);
    assert_eq!(b.exhausted.len(), 1, "{b:#?}");
    let x = &b.exhausted[0];
    assert_eq!(x.refused, 2);
    assert_eq!(x.charged, money("0.000112"));
    // It ran out when the first 1000-token request came, in its window.
    let fifth = g
        .ledger_db
        .column(&format!(
            "SELECT {} FROM requests ORDER BY ledger_seq LIMIT 1 OFFSET 4",
            g.ledger_db.utc("received_at")
        ))
        .await;
    assert_eq!(x.ran_out_at[..19], fifth[0][..19], "{x:#?}");
    assert!(x.ran_out_at.starts_with(&x.window_start[..10]), "{x:#?}");
}

/// An answer without usage is charged at its worst case: the replay shows it apart
/// from what was billed, before (as recorded) and after (the new destination's worst
/// case), and never adds it to the billed delta.
async fn worst_case_charges_are_shown_apart(e: Engine) {
    let Some(g) = record(e, "replay_worst").await else {
        return;
    };
    g.vendors
        .script("us1", vec![common::vendors::Script::NoUsage]);
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    quiesce_on(&g.ledger_db, 10).await;
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &PROVIDERS).await;
    let dir = tempfile::tempdir().unwrap();
    let [_, eu] = providers(&g.vendors);
    let set = [
        "kind: gateway\ncurrency: USD\n".to_string(),
        eu,
        policy("0.01", "eu, us", "0.004"),
    ];
    std::fs::write(dir.path().join("set.yaml"), set.join("---\n")).unwrap();
    let plan = purser::policy::compile_dir(dir.path()).unwrap();
    let ledger = Ledger::open_reader(&g.ledger_db.target()).await.unwrap();
    let r = purser::replay::over(&ledger, &plan, Span::default())
        .await
        .unwrap();
    assert_eq!(r.read, 8);
    assert_eq!(r.moved[0].requests, 7, "{r:#?}");
    // Billed: the six answers with usage, before and at eu1.
    assert_eq!(r.spend.billed_before, money("0.000168"));
    assert_eq!(r.spend.delta, money("0.000084"));
    // At worst case: 288 × 1/M + 100 × 2/M at us1, then 288 × 1.5/M + 100 × 3/M at eu1.
    assert_eq!(r.spend.worst_case_before, money("0.000488"), "{r:#?}");
    assert_eq!(r.spend.worst_case_after, money("0.000732"));
}

/// Run `sql` on the ledger as its owner would (the test's own write connection).
async fn execute(db: &Db, sql: &str) {
    match db {
        Db::Sqlite(p) => rusqlite::Connection::open(p)
            .unwrap()
            .execute_batch(sql)
            .unwrap(),
        Db::Postgres(url) => common::pg::connect(url)
            .await
            .batch_execute(sql)
            .await
            .unwrap(),
    }
}

/// Rows written before the ledger recorded shapes are counted and skipped; a ledger
/// whose schema predates the shape columns altogether is read too, every row skipped.
async fn older_rows_are_skipped(e: Engine) {
    let Some(g) = record(e, "replay_older").await else {
        return;
    };
    // Two rows as an older purser wrote them: no shape.
    execute(
        &g.ledger_db,
        "UPDATE requests SET shape_input_tokens = NULL, shape_requested_output = NULL, shape_output_bound = NULL,
             shape_choices = NULL, shape_stream = NULL, shape_tools = NULL, shape_media = NULL, shape_unbounded = NULL
         WHERE ledger_seq IN (SELECT ledger_seq FROM requests ORDER BY ledger_seq LIMIT 2)",
    )
    .await;
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.01", "eu, us", "0.004")]).await;
    assert_eq!(r.skipped_no_shape, 2, "{r:#?}");
    assert_eq!(r.same_destination, 4);
    assert_eq!(r.changes(), 0);
    assert_eq!(
        r.spend.billed_before,
        money("0.000112"),
        "skipped rows are not counted"
    );
    // The schema before the shape columns (SQLite 7, PostgreSQL 3).
    let columns = [
        "shape_input_tokens",
        "shape_requested_output",
        "shape_output_bound",
        "shape_choices",
        "shape_stream",
        "shape_tools",
        "shape_media",
        "shape_unbounded",
    ];
    let drops: Vec<String> = columns
        .iter()
        .map(|c| format!("ALTER TABLE requests DROP COLUMN {c};"))
        .collect();
    execute(&g.ledger_db, &drops.join("\n")).await;
    let [us, eu] = providers(&g.vendors);
    let r = replay(&g, vec![us, eu, policy("0.01", "eu, us", "0.004")]).await;
    assert_eq!(r.skipped_no_shape, 7, "{r:#?}");
    assert_eq!(r.changes(), 0);
    let text = purser::replay::text(&r);
    assert!(
        text.contains("7 skipped (recorded without a shape)"),
        "{text}"
    );
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

on_both_engines!(
    unchanged_policy_reports_zero_changes,
    lowered_ceiling,
    removed_vendor,
    jurisdiction_narrowed_to_eu,
    halved_day_budget,
    older_rows_are_skipped,
    worst_case_charges_are_shown_apart,
);

/// The shape the gateway records: what selection and the proof used.
#[tokio::test]
async fn the_ledger_records_each_requests_shape() {
    let g = record(Engine::Sqlite, "replay_shape").await.unwrap();
    let rows = g
        .ledger_db
        .rows(
            "SELECT shape_input_tokens, shape_requested_output, shape_output_bound, shape_choices,
                    shape_stream, shape_tools, shape_media, shape_unbounded, error_code
             FROM requests ORDER BY ledger_seq",
        )
        .await;
    assert_eq!(rows.len(), 7);
    let s = |v: &Option<String>| v.clone().unwrap_or_else(|| "NULL".into());
    let first: Vec<String> = rows[0].iter().map(s).collect();
    assert_eq!(first[..8], ["288", "NULL", "100", "1", "0", "0", "0", "0"]);
    let big: Vec<String> = rows[4].iter().map(s).collect();
    assert_eq!(big[..3], ["326", "1000", "1000"]);
    // Refused before selection proved anything: no bounds, the rest of the shape kept.
    let refused: Vec<String> = rows[6].iter().map(s).collect();
    assert_eq!(
        refused,
        [
            "NULL",
            "NULL",
            "NULL",
            "1",
            "0",
            "0",
            "0",
            "0",
            "model_not_allowed"
        ]
    );
}

/// `purser replay` and `purser diff --replay` on a ledger file: the markdown a PR
/// comment gets, and `--fail-on widen` still gating.
#[tokio::test]
async fn the_cli_replays_a_backup_and_diff_appends_it() {
    let g = record(Engine::Sqlite, "replay_cli").await.unwrap();
    let backup = g.dir.path().join("backup.db");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["backup", "--db"])
        .arg(&g.db)
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = g.dir.path().join("new");
    std::fs::create_dir_all(&new).unwrap();
    let [_, eu] = providers(&g.vendors);
    std::fs::write(
        new.join("set.yaml"),
        // The US vendor gone, and the ceiling raised (a widening change), which
        // changes nothing the traffic did: everything fitted already.
        [
            "kind: gateway\ncurrency: USD\n".to_string(),
            eu,
            policy("0.02", "eu, us", "0.004"),
        ]
        .join("---\n"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["replay", "--format", "json", "--since", "1d", "--db"])
        .arg(&backup)
        .arg("--config")
        .arg(&new)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["spend"]["delta"], "0.000084");
    assert_eq!(v["moved"][0]["requests"], 6);
    assert_eq!(v["moved"][0]["to_jurisdiction"], "eu");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["diff", "--format", "markdown", "--fail-on", "widen"])
        .arg(&g.config)
        .arg(&new)
        .arg("--replay")
        .arg(&backup)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "a raised ceiling widens: {md}");
    assert!(md.contains("### purser policy diff"), "{md}");
    assert!(md.contains("### purser replay"), "{md}");
    assert!(md.contains("| another destination | 6 |"), "{md}");

    // A ledger that is not there fails the diff rather than print half of it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["diff"])
        .arg(&g.config)
        .arg(&new)
        .arg("--replay")
        .arg(g.dir.path().join("missing.db"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}
