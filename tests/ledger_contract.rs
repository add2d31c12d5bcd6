//! The ledger's contract, run unchanged against both engines: a real SQLite file and a
//! real PostgreSQL schema (`PURSER_TEST_POSTGRES`; see `common::pg`). Every test body
//! speaks only the `Ledger` interface; the engine is chosen by the module it runs in.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::sync::Arc;
use std::time::Duration;

use purser::failure::Billing;
use purser::ledger::Decision;
use purser::ledger::audit::{Filter, GroupBy, RequestOutcome};
use purser::ledger::{
    AttemptResult, BudgetLimit, Ledger, LedgerError, NewAttempt, NewRequest, Options, Outcome,
    Recovered, RequestResult, Target,
};
use purser::money::Money;
use purser::policy::plan::{Mode, Period};
use purser::pricing::CostBasis;

/// One engine's ledger, reopened at will (a reopen is a restart of the same replica).
pub enum Db {
    Sqlite(tempfile::TempDir),
    Postgres(String),
}

impl Db {
    fn target(&self) -> Target {
        match self {
            Db::Sqlite(dir) => Target::Sqlite(dir.path().join("ledger.db")),
            Db::Postgres(url) => Target::Postgres(url.clone()),
        }
    }

    async fn open(&self) -> (Ledger, Recovered) {
        Ledger::open_at(&self.target(), options()).await.unwrap()
    }

    async fn try_open(&self) -> Result<(Ledger, Recovered), LedgerError> {
        Ledger::open_at(&self.target(), options()).await
    }

    /// Record a schema version above this binary's, as a newer purser would.
    async fn record_future_version(&self) {
        match self {
            Db::Sqlite(dir) => {
                rusqlite::Connection::open(dir.path().join("ledger.db"))
                    .unwrap()
                    .execute(
                        "INSERT INTO schema_migrations VALUES (999, 'future', 'x')",
                        [],
                    )
                    .unwrap();
            }
            Db::Postgres(url) => {
                common::pg::connect(url)
                    .await
                    .execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (999, 'future')",
                        &[],
                    )
                    .await
                    .unwrap();
            }
        }
    }
}

/// A lease short enough that a reopen (which waits out the previous lease on
/// PostgreSQL) is quick, and long enough that a loaded machine does not let it run out
/// between two calls: at 300 ms, four copies of this file run at once lost it
/// (`LeaseLost`, a replica refusing to write as it must) in every run.
fn options() -> Options {
    Options {
        replica: Some("contract".into()),
        lease: Duration::from_secs(2),
        ..Options::default()
    }
}

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

fn req(id: &str, worst: &str) -> NewRequest {
    NewRequest {
        id: id.into(),
        received_at: time::OffsetDateTime::now_utc(),
        client: "bot".into(),
        policy: "team".into(),
        plan_id: "p1".into(),
        model: "gpt-4o-mini".into(),
        mode: Mode::Hard,
        ceiling: m("1"),
        worst_case: m(worst),
        ingress: Default::default(),
        shape: None,
    }
}

fn attempt(id: &str, seq: u32) -> NewAttempt {
    NewAttempt {
        request_id: id.into(),
        seq,
        provider: "openai-us".into(),
        upstream_model: "gpt-4o-mini".into(),
        jurisdiction: "us".into(),
        started_at: time::OffsetDateTime::now_utc(),
        worst_case: m("0.01"),
    }
}

fn served(id: &str, seq: u32, cost: &str) -> AttemptResult {
    AttemptResult {
        request_id: id.into(),
        seq,
        finished_at: time::OffsetDateTime::now_utc(),
        status: Some(200),
        class: None,
        billing: Billing::Billed,
        decision: Decision::Served,
        reason: "ok".into(),
        input_tokens: Some(10),
        output_tokens: Some(10),
        cost: m(cost),
        cost_basis: Some(CostBasis::Usage),
        cache: Default::default(),
        stored: None,
        message: None,
    }
}

fn done(id: &str, cost: &str) -> RequestResult {
    RequestResult {
        request_id: id.into(),
        outcome: Outcome::Served,
        error_code: None,
        served_by: Some("openai-us".into()),
        cost: m(cost),
        charged: m(cost),
    }
}

fn day(limit: &str) -> Vec<BudgetLimit> {
    vec![BudgetLimit {
        period: Period::Day,
        limit: m(limit),
    }]
}

async fn window(l: &Ledger, period: &str) -> (String, String, String) {
    let b = l
        .budgets()
        .await
        .unwrap()
        .into_iter()
        .find(|b| b.period == period)
        .unwrap();
    (b.limit, b.spent, b.reserved)
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Db::Sqlite(tempfile::tempdir().unwrap())).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let test = concat!("ledger_contract::postgres::", stringify!($name));
                    let Some(url) = crate::common::pg::fresh_schema(test).await else { return };
                    super::$name(super::Db::Postgres(url)).await
                }
            )*
        }
    };
}

contract!(
    in_flight_rows_become_interrupted_at_restart_and_settle,
    concurrent_admissions_never_pass_the_cap,
    a_refusal_in_one_window_reserves_nothing_in_the_others,
    one_failing_operation_does_not_spoil_its_group,
    a_changed_limit_applies_to_the_next_admission,
    settlement_refuses_what_is_not_interrupted_or_already_settled,
    audit_reads_agree_with_what_was_written,
    a_thousand_tiny_costs_sum_exactly,
    a_newer_schema_is_refused,
    a_top_up_raises_every_window_or_none,
    an_interrupted_request_is_charged_what_its_attempts_may_have_cost,
    a_probe_is_a_write,
    cache_tokens_and_stored_responses_read_back_and_are_found_by_id_within_their_policy,
);

async fn in_flight_rows_become_interrupted_at_restart_and_settle(db: Db) {
    {
        let (l, rec) = db.open().await;
        assert_eq!(rec, Recovered::default());
        l.admit(req("r1", "0.30"), day("1")).await.unwrap();
        l.begin_attempt(attempt("r1", 1)).await.unwrap();
        // The process "dies" here: the attempt is never completed.
    }
    let (l, rec) = db.open().await;
    assert_eq!((rec.attempts, rec.requests), (1, 1));
    let row = l.request("r1").await.unwrap().unwrap();
    assert_eq!(row.outcome, "interrupted");
    assert_eq!(row.attempts[0].state, "interrupted");
    assert_eq!(row.attempts[0].billing, "maybe_billed");
    // The reservation stays counted, as spent, until an operator settles it.
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.3", "0"));
    l.settle("r1", m("0.05")).await.unwrap();
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.05", "0"));
    let row = l.request("r1").await.unwrap().unwrap();
    assert_eq!(
        (row.cost.as_str(), row.attempts[0].billing.as_str()),
        ("0.05", "billed")
    );
}

async fn concurrent_admissions_never_pass_the_cap(db: Db) {
    let (l, _) = db.open().await;
    let l = Arc::new(l);
    // The cap fits exactly 50 worst cases of 0.02.
    let budgets = vec![
        BudgetLimit {
            period: Period::Day,
            limit: m("1.00"),
        },
        BudgetLimit {
            period: Period::Month,
            limit: m("100"),
        },
    ];
    let mut tasks = vec![];
    for i in 0..200 {
        let l = l.clone();
        let b = budgets.clone();
        tasks.push(tokio::spawn(async move {
            l.admit(req(&format!("r{i}"), "0.02"), b).await
        }));
    }
    let (mut admitted, mut refused) = (vec![], 0);
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(()) => admitted.push(format!("r{i}")),
            Err(LedgerError::BudgetExhausted {
                period: "day",
                remaining,
                ..
            }) => {
                assert_eq!(remaining, Money::ZERO);
                refused += 1
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((admitted.len(), refused), (50, 150));
    let refusals = Filter {
        outcome: Some(RequestOutcome::Ended(Outcome::Refused)),
        ..Filter::default()
    };
    let page = l.requests(refusals, 1000, None).await.unwrap();
    assert_eq!(page.requests.len(), 150, "refusals are on record");
    assert!(
        page.requests
            .iter()
            .all(|r| r.error_code.as_deref() == Some("budget_exhausted"))
    );
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0", "1"));
    let (_, _, month_reserved) = window(&l, "month").await;
    assert_eq!(
        month_reserved, "1",
        "the month holds exactly what was admitted"
    );

    // Settling to the actual cost frees the rest of the reservation.
    let id = &admitted[0];
    l.begin_attempt(attempt(id, 1)).await.unwrap();
    l.finish(served(id, 1, "0.005"), done(id, "0.005"))
        .await
        .unwrap();
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.005", "0.98"));
}

async fn a_refusal_in_one_window_reserves_nothing_in_the_others(db: Db) {
    let (l, _) = db.open().await;
    // The day has room, the month does not: nothing may stay reserved in the day.
    let budgets = vec![
        BudgetLimit {
            period: Period::Day,
            limit: m("10"),
        },
        BudgetLimit {
            period: Period::Month,
            limit: m("0.5"),
        },
    ];
    l.admit(req("a", "0.4"), budgets.clone()).await.unwrap();
    match l.admit(req("b", "0.4"), budgets.clone()).await {
        Err(LedgerError::BudgetExhausted {
            period: "month",
            spent,
            reserved,
            needed,
            ..
        }) => {
            assert_eq!((spent, reserved, needed), (m("0"), m("0.4"), m("0.4")));
        }
        other => panic!("admitted past the month: {other:?}"),
    }
    let (_, _, day_reserved) = window(&l, "day").await;
    assert_eq!(
        day_reserved, "0.4",
        "the refused request holds nothing in the day"
    );
    // What fits both still gets in.
    l.admit(req("c", "0.1"), budgets).await.unwrap();
    let (_, _, month_reserved) = window(&l, "month").await;
    assert_eq!(month_reserved, "0.5");
}

async fn one_failing_operation_does_not_spoil_its_group(db: Db) {
    let (l, _) = db.open().await;
    let l = Arc::new(l);
    l.admit(req("ok", "0.1"), vec![]).await.unwrap();
    l.begin_attempt(attempt("ok", 1000)).await.unwrap();
    // Many valid operations in flight together with invalid ones (a duplicate attempt,
    // an unknown request): they share group commits.
    let mut tasks = vec![];
    for seq in 1..=60u32 {
        let one = l.clone();
        tasks.push(tokio::spawn(async move {
            (seq, one.begin_attempt(attempt("ok", seq)).await)
        }));
        if seq % 20 == 0 {
            let dup = l.clone();
            tasks.push(tokio::spawn(async move {
                (0, dup.begin_attempt(attempt("ok", 1000)).await)
            }));
            let missing = l.clone();
            tasks.push(tokio::spawn(async move {
                let r = missing.finish_request(done("missing", "0")).await;
                (u32::MAX, r)
            }));
        }
    }
    let mut failed = 0;
    for t in tasks {
        match t.await.unwrap() {
            (0 | u32::MAX, r) => {
                assert!(r.is_err());
                failed += 1;
            }
            (seq, r) => assert!(r.is_ok(), "attempt {seq}: {r:?}"),
        }
    }
    assert_eq!(failed, 6);
    let row = l.request("ok").await.unwrap().unwrap();
    assert_eq!(
        row.attempts.len(),
        61,
        "every valid attempt is recorded exactly once"
    );
}

async fn a_changed_limit_applies_to_the_next_admission(db: Db) {
    let (l, _) = db.open().await;
    l.admit(req("r1", "0.5"), day("1")).await.unwrap();
    // The plan raised the cap: admission checks the new limit and stores it.
    l.admit(req("r2", "0.9"), day("2")).await.unwrap();
    let (limit, _, reserved) = window(&l, "day").await;
    assert_eq!((limit.as_str(), reserved.as_str()), ("2", "1.4"));
    // And a lowered cap refuses what no longer fits.
    match l.admit(req("r3", "0.2"), day("1.5")).await {
        Err(LedgerError::BudgetExhausted { .. }) => {}
        other => panic!("admitted over a lowered cap: {other:?}"),
    }
}

async fn settlement_refuses_what_is_not_interrupted_or_already_settled(db: Db) {
    let (l, _) = db.open().await;
    assert!(matches!(
        l.settle("nobody", m("0")).await,
        Err(LedgerError::UnknownRequest(_))
    ));
    l.admit(req("s", "0.2"), day("1")).await.unwrap();
    l.begin_attempt(attempt("s", 1)).await.unwrap();
    l.finish(served("s", 1, "0.01"), done("s", "0.01"))
        .await
        .unwrap();
    assert!(matches!(
        l.settle("s", m("0.01")).await,
        Err(LedgerError::NotSettleable { .. })
    ));
    l.admit(req("i", "0.2"), day("1")).await.unwrap();
    l.begin_attempt(attempt("i", 1)).await.unwrap();
    drop(l);
    let (l, _) = db.open().await;
    l.settle("i", m("0")).await.unwrap();
    assert!(matches!(
        l.settle("i", m("0")).await,
        Err(LedgerError::NotSettleable { .. })
    ));
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.01", "0"));
    let row = l.request("i").await.unwrap().unwrap();
    assert_eq!(row.attempts[0].billing, "not_billed");
}

async fn audit_reads_agree_with_what_was_written(db: Db) {
    let (l, _) = db.open().await;
    for i in 0..5 {
        let id = format!("q{i}");
        l.admit_with_attempt(req(&id, "0.1"), day("10"), attempt(&id, 1))
            .await
            .unwrap();
        l.finish(served(&id, 1, "0.001"), done(&id, "0.001"))
            .await
            .unwrap();
    }
    l.record_refusal(req("x", "0.1"), "ceiling_exceeded")
        .await
        .unwrap();
    // Newest first, in pages that neither repeat nor skip.
    let first = l.requests(Filter::default(), 4, None).await.unwrap();
    let ids: Vec<_> = first.requests.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids, ["x", "q4", "q3", "q2"]);
    let cursor = purser::ledger::audit::Cursor::decode(first.next_cursor.as_deref().unwrap());
    let rest = l.requests(Filter::default(), 4, cursor).await.unwrap();
    let ids: Vec<_> = rest.requests.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids, ["q1", "q0"]);
    assert!(rest.next_cursor.is_none());

    let q0 = l.request("q0").await.unwrap().unwrap();
    assert_eq!(
        (
            q0.outcome.as_str(),
            q0.cost.as_str(),
            q0.worst_case.as_str()
        ),
        ("served", "0.001", "0.1")
    );
    assert_eq!(q0.attempts[0].status, Some(200));
    assert_eq!(q0.attempts[0].input_tokens, Some(10));
    assert!(
        q0.received_at.ends_with('Z') && q0.received_at.len() == 24,
        "{}",
        q0.received_at
    );

    let spend = l.spend(Filter::default(), GroupBy::Provider).await.unwrap();
    assert_eq!(spend.len(), 1);
    assert_eq!(
        (spend[0].key.as_str(), spend[0].cost, spend[0].billed),
        ("openai-us", m("0.005"), 5)
    );
    let by_day = l.spend(Filter::default(), GroupBy::Day).await.unwrap();
    assert_eq!(by_day[0].key.len(), 10, "a day is YYYY-MM-DD");

    let mut lines = l.attempt_lines(Filter::default());
    let mut n = 0;
    while let Some(line) = lines.recv().await {
        let line = line.unwrap();
        assert_eq!(line.attempt.cost, "0.001");
        n += 1;
    }
    assert_eq!(n, 5);
    assert_eq!(l.total_cost().await.unwrap(), "0.005");

    let configured = vec![(
        "team".to_string(),
        purser::policy::plan::Budget {
            period: Period::Day,
            limit: m("10"),
        },
    )];
    let now = time::OffsetDateTime::now_utc();
    let current = l.current_budgets(&configured, now).await.unwrap();
    assert_eq!(current[0].spent, m("0.005"));
    assert_eq!(current[0].remaining, m("9.995"));
    assert!(current[0].window_start.ends_with("T00:00:00Z"));
}

async fn a_thousand_tiny_costs_sum_exactly(db: Db) {
    let (l, _) = db.open().await;
    let l = Arc::new(l);
    let mut tasks = vec![];
    for w in 0..10 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                let id = format!("t{w}-{i}");
                l.admit_with_attempt(req(&id, "0.001"), day("100"), attempt(&id, 1))
                    .await
                    .unwrap();
                l.finish(served(&id, 1, "0.0000001"), done(&id, "0.0000001"))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(l.total_cost().await.unwrap(), "0.0001");
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.0001", "0"));
}

async fn a_newer_schema_is_refused(db: Db) {
    drop(db.open().await);
    db.record_future_version().await;
    match db.try_open().await {
        Err(e @ LedgerError::TooNew { database: 999, .. }) => {
            assert!(e.to_string().contains("newer than this purser"), "{e}")
        }
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a newer database was accepted"),
    }
}

async fn a_top_up_raises_every_window_or_none(db: Db) {
    let (l, _) = db.open().await;
    let budgets = vec![
        BudgetLimit {
            period: Period::Day,
            limit: m("1"),
        },
        BudgetLimit {
            period: Period::Month,
            limit: m("0.5"),
        },
    ];
    l.admit(req("f", "0.2"), budgets.clone()).await.unwrap();
    // The alternate needs 0.2 more: both windows have room.
    l.top_up("f", m("0.2"), budgets.clone()).await.unwrap();
    assert_eq!(window(&l, "day").await.2, "0.4");
    assert_eq!(window(&l, "month").await.2, "0.4");
    // 0.2 more fits the day but not the month: nothing changes anywhere.
    match l.top_up("f", m("0.2"), budgets.clone()).await {
        Err(LedgerError::BudgetExhausted {
            period: "month",
            needed,
            ..
        }) => assert_eq!(needed, m("0.2")),
        other => panic!("topped up past the month: {other:?}"),
    }
    assert_eq!(window(&l, "day").await.2, "0.4");
    assert_eq!(window(&l, "month").await.2, "0.4");
    // Settling releases the whole holding, top-up included.
    l.begin_attempt(attempt("f", 1)).await.unwrap();
    l.finish(served("f", 1, "0.03"), done("f", "0.03"))
        .await
        .unwrap();
    let (_, spent, reserved) = window(&l, "month").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.03", "0"));
    // A request no longer in flight may not go on (no alternate is called for it),
    // whether or not it needs more; an unknown one is named as such.
    for extra in ["0.1", "0"] {
        match l.top_up("f", m(extra), budgets.clone()).await {
            Err(LedgerError::NotInFlight(id)) => assert_eq!(id, "f"),
            other => panic!("a finished request was topped up by {extra}: {other:?}"),
        }
    }
    assert!(matches!(
        l.top_up("nobody", m("0.1"), budgets.clone()).await,
        Err(LedgerError::UnknownRequest(_))
    ));
    assert_eq!(window(&l, "month").await.2, "0");
}

async fn an_interrupted_request_is_charged_what_its_attempts_may_have_cost(db: Db) {
    let (l, _) = db.open().await;
    l.admit(req("s", "0.5"), day("1")).await.unwrap();
    l.begin_attempt(attempt("s", 1)).await.unwrap(); // worst case 0.01
    l.interrupt("s", "its task died").await.unwrap();
    let row = l.request("s").await.unwrap().unwrap();
    assert_eq!(row.outcome, "interrupted");
    let a = &row.attempts[0];
    assert_eq!(
        (a.state.as_str(), a.billing.as_str(), a.reason.as_deref()),
        ("interrupted", "maybe_billed", Some("its task died"))
    );
    // The 0.5 holding became the 0.01 its one attempt may have cost, as spent.
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.01", "0"));
    // Interrupting again changes nothing; settling it works as after a crash.
    l.interrupt("s", "again").await.unwrap();
    l.settle("s", m("0.004")).await.unwrap();
    let (_, spent, reserved) = window(&l, "day").await;
    assert_eq!((spent.as_str(), reserved.as_str()), ("0.004", "0"));
}

async fn a_probe_is_a_write(db: Db) {
    let (l, _) = db.open().await;
    assert!(l.writable());
    l.probe().await.unwrap();
    assert!(l.writable());
}

async fn cache_tokens_and_stored_responses_read_back_and_are_found_by_id_within_their_policy(
    db: Db,
) {
    let (l, _) = db.open().await;
    let cache = purser::pricing::CacheTokens {
        read: Some(3000),
        write: Some(1000),
        write_5m: Some(400),
        write_1h: Some(600),
    };
    l.admit_with_attempt(req("r1", "0.1"), vec![], attempt("r1", 1))
        .await
        .unwrap();
    let stored = AttemptResult {
        input_tokens: Some(4012),
        output_tokens: Some(8),
        cache,
        stored: Some(purser::upstream::StoredResponse {
            id: "resp_1".into(),
            output_items: 2,
        }),
        ..served("r1", 1, "0.001")
    };
    l.finish(stored, done("r1", "0.001")).await.unwrap();
    // Another policy's request, whose attempt stored nothing.
    let other = NewRequest {
        policy: "elsewhere".into(),
        ..req("r2", "0.1")
    };
    l.admit_with_attempt(other, vec![], attempt("r2", 1))
        .await
        .unwrap();
    l.finish(served("r2", 1, "0.001"), done("r2", "0.001"))
        .await
        .unwrap();

    let a = &l.request("r1").await.unwrap().unwrap().attempts[0];
    assert_eq!(
        (
            a.cache_read_tokens,
            a.cache_write_tokens,
            a.cache_write_5m_tokens,
            a.cache_write_1h_tokens
        ),
        (Some(3000), Some(1000), Some(400), Some(600))
    );
    assert_eq!(a.response_id.as_deref(), Some("resp_1"));
    let b = &l.request("r2").await.unwrap().unwrap().attempts[0];
    assert_eq!(
        (
            b.cache_read_tokens,
            b.cache_write_tokens,
            b.response_id.as_deref()
        ),
        (None, None, None),
        "not reported is not a reported 0"
    );

    let turn = l.stored_turn("resp_1", "team").await.unwrap().unwrap();
    assert_eq!(
        turn,
        purser::ledger::StoredTurn {
            request_id: "r1".into(),
            provider: "openai-us".into(),
            upstream_model: "gpt-4o-mini".into(),
            input_tokens: Some(4012),
            output_tokens: Some(8),
            output_items: 2,
        }
    );
    // Only within the policy whose request stored it, and only by its exact id.
    assert_eq!(l.stored_turn("resp_1", "elsewhere").await.unwrap(), None);
    assert_eq!(l.stored_turn("resp_2", "team").await.unwrap(), None);
}
