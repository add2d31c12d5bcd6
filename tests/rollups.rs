//! The hourly rollups (#25): over a ledger filled through the gateway, the spend
//! page's queries (`spend` by every grouping, `spend/series` by every bucket and
//! grouping, `failures`) answer the same from the rollups as from the raw rows, to the
//! last decimal, for windows cut mid-hour, on whole hours and open-ended, with filters
//! the rollups keep and ones they do not. Both engines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::db::{Db, Engine};
use common::money::{assert_money_invariants_on, assert_rollups_on, quiesce_on};
use common::vendors::Script;
use common::{Gateway, provider, sha};
use purser::ledger::Ledger;
use purser::ledger::Outcome;
use purser::ledger::audit::{Bucket, Filter, GroupBy, Instant, RequestOutcome, Source};

const A: &str = "key-rollups-a";
const B: &str = "key-rollups-b";

fn docs(vendors: &common::vendors::Vendors) -> Vec<String> {
    vec![
        provider(vendors, "p1", "openai", "us", &[("m", "0.15", "0.60")]),
        provider(vendors, "p2", "anthropic", "us", &[("m", "0.25", "1.25")]),
        format!(
            "kind: policy\nid: hard\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\nbudgets:\n  - {{ period: month, limit: \"3\" }}\nalternates:\n  m: p2/m\n",
            sha(A)
        ),
        format!(
            "kind: policy\nid: soft\nclients:\n  - {{ id: app, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: soft }}\nmax_output_tokens: 100\nalternates:\n  m: p2/m\n",
            sha(B)
        ),
    ]
}

/// Served, failed over, timed out (maybe billed), refused, on two policies.
async fn fill(g: &Gateway) {
    for key in [A, B] {
        for _ in 0..3 {
            g.chat(key, "m").await;
        }
        g.vendors
            .script("p1", vec![Script::Status(503, "overloaded".into())]);
        g.chat(key, "m").await;
        g.vendors.script("p1", vec![Script::Delay(1_000)]);
        g.chat(key, "m").await;
        g.chat(key, "not-a-model").await;
        for _ in 0..2 {
            g.chat(key, "m").await;
        }
    }
}

/// Run `sql` on the ledger as an operator would (on SQLite through purser's own
/// connection, which has the decimal functions the rollup triggers use).
async fn exec(db: &Db, sql: &str) {
    match db {
        Db::Sqlite(path) => {
            purser::ledger::connect(path, &purser::ledger::Options::default())
                .unwrap()
                .execute_batch(sql)
                .unwrap();
        }
        Db::Postgres(url) => common::pg::connect(url)
            .await
            .batch_execute(sql)
            .await
            .unwrap(),
    }
}

/// Spread the requests over the last hours: request n moves back `n % 4` hours and
/// `n % 3` times 20 minutes, its attempts with it. The triggers move their rollup rows.
async fn spread(db: &Db) {
    let sql = match db {
        Db::Sqlite(_) => {
            "UPDATE attempts SET started_at = (SELECT strftime('%Y-%m-%dT%H:%M:%fZ', attempts.started_at,
                 '-' || ((r.ledger_seq % 4) * 60 + (r.ledger_seq % 3) * 20) || ' minutes')
                 FROM requests r WHERE r.id = attempts.request_id);
             UPDATE requests SET
                 received_at = strftime('%Y-%m-%dT%H:%M:%fZ', received_at, '-' || ((ledger_seq % 4) * 60 + (ledger_seq % 3) * 20) || ' minutes'),
                 received_ms = received_ms - ((ledger_seq % 4) * 60 + (ledger_seq % 3) * 20) * 60000;"
        }
        Db::Postgres(_) => {
            "UPDATE attempts a SET started_at = a.started_at - ((r.ledger_seq % 4) * 60 + (r.ledger_seq % 3) * 20) * interval '1 minute'
             FROM requests r WHERE r.id = a.request_id;
             UPDATE requests SET received_at = received_at - ((ledger_seq % 4) * 60 + (ledger_seq % 3) * 20) * interval '1 minute';"
        }
    };
    exec(db, sql).await;
}

fn instant(t: time::OffsetDateTime) -> Instant {
    Instant::new(t)
}

/// Windows whose bounds fall exactly on attempts, a millisecond past them, on whole
/// hours, and open: every way a window splits between rollups and rows.
fn windows(starts: &[time::OffsetDateTime]) -> Vec<(Option<Instant>, Option<Instant>)> {
    let first = *starts.first().unwrap();
    let last = *starts.last().unwrap();
    let mid = starts[starts.len() / 2];
    let hour = |t: time::OffsetDateTime| {
        t.replace_minute(0)
            .unwrap()
            .replace_second(0)
            .unwrap()
            .replace_nanosecond(0)
            .unwrap()
    };
    let ms = time::Duration::milliseconds(1);
    let mut bounds = vec![
        None,
        Some(first),
        Some(first + ms),
        Some(mid),
        Some(mid + ms),
        Some(hour(mid)),
        Some(hour(first)),
        Some(hour(last) + time::Duration::HOUR),
        Some(last),
        Some(last + ms),
    ];
    bounds.dedup();
    let mut out = Vec::new();
    for since in &bounds {
        for until in &bounds {
            if let (Some(s), Some(u)) = (since, until)
                && s >= u
            {
                continue;
            }
            out.push((since.map(instant), until.map(instant)));
        }
    }
    out
}

fn filters() -> Vec<Filter> {
    vec![
        Filter::default(),
        Filter {
            provider: Some("p1".into()),
            ..Filter::default()
        },
        Filter {
            policy: Some("soft".into()),
            ..Filter::default()
        },
        Filter {
            class: Some("success".into()),
            client: Some("bot".into()),
            ..Filter::default()
        },
        // Not kept by the attempts rollup: the whole window reads the rows.
        Filter {
            outcome: Some(RequestOutcome::Ended(Outcome::Served)),
            ..Filter::default()
        },
    ]
}

/// Every page query, from the rollups and from the rows, must agree; returns how many
/// answers were compared.
async fn compare(rollups: &Ledger, rows: &Ledger, starts: &[time::OffsetDateTime]) -> usize {
    let mut compared = 0;
    for (since, until) in windows(starts) {
        for base in filters() {
            let f = Filter {
                since: since.clone(),
                until: until.clone(),
                ..base
            };
            for by in GroupBy::ALL {
                let (a, b) = (
                    rollups.spend(f.clone(), by).await.unwrap(),
                    rows.spend(f.clone(), by).await.unwrap(),
                );
                assert_eq!(a, b, "spend by {by:?} for {f:?}");
                compared += 1;
            }
            for bucket in Bucket::ALL {
                for by in [
                    GroupBy::Provider,
                    GroupBy::Policy,
                    GroupBy::Client,
                    GroupBy::Model,
                ] {
                    let (a, b) = (
                        rollups.series(f.clone(), bucket, by).await.unwrap(),
                        rows.series(f.clone(), bucket, by).await.unwrap(),
                    );
                    assert_eq!(a, b, "series {bucket:?} by {by:?} for {f:?}");
                    compared += 1;
                }
            }
            let (a, b) = (
                rollups.failures(f.clone()).await.unwrap(),
                rows.failures(f.clone()).await.unwrap(),
            );
            assert_eq!(a, b, "failures for {f:?}");
            compared += 1;
        }
    }
    compared
}

async fn starts(db: &Db) -> Vec<time::OffsetDateTime> {
    let mut out: Vec<time::OffsetDateTime> = db
        .column(&format!("SELECT {} FROM attempts", db.utc("started_at")))
        .await
        .iter()
        .map(|t| {
            // PostgreSQL's text has microseconds and no zone; SQLite's is purser's.
            let t = t.trim_end_matches('Z');
            time::PrimitiveDateTime::parse(
                t,
                &time::format_description::well_known::Iso8601::DEFAULT,
            )
            .unwrap()
            .assume_utc()
        })
        .collect();
    out.sort();
    out
}

async fn rollups_answer_as_the_rows_do(engine: Engine) {
    let Some(g) = common::start_on(engine, "rollups_answer", docs).await else {
        return;
    };
    fill(&g).await;
    quiesce_on(&g.ledger_db, 10).await;
    // Kept by every write the gateway made (admission, attempts, finish, timeout).
    assert_money_invariants_on(&g.ledger_db, &g.vendors, &["p1", "p2"]).await;
    let counts = g
        .ledger_db
        .rows("SELECT billing, COUNT(*) FROM attempts GROUP BY billing ORDER BY billing")
        .await;
    assert_eq!(
        counts
            .iter()
            .map(|r| r[0].clone().unwrap())
            .collect::<Vec<_>>(),
        ["billed", "maybe_billed", "not_billed"],
        "the ledger has every billing state"
    );

    // Moved across hours by SQL: the triggers follow any change, not only the writer's.
    spread(&g.ledger_db).await;
    assert_rollups_on(&g.ledger_db).await;

    let ledger = Ledger::open_reader(&g.ledger_db.target()).await.unwrap();
    let (rollups, rows) = (
        ledger.reading(Source::Rollups),
        ledger.reading(Source::Rows),
    );
    let starts = starts(&g.ledger_db).await;
    let compared = compare(&rollups, &rows, &starts).await;
    assert!(compared > 1000, "{compared} answers compared");

    // The rollups are what is read: a change to them alone shows in the answer, and
    // the invariant catches it.
    exec(
        &g.ledger_db,
        match engine {
            Engine::Sqlite => {
                "UPDATE attempts_hourly_lean SET cost = dadd(cost, '0.000000001')
                 WHERE billing = 'billed' AND hour = (SELECT min(hour) FROM attempts_hourly_lean WHERE billing = 'billed')"
            }
            Engine::Postgres => {
                "UPDATE attempts_hourly_lean SET cost = cost + 0.000000001
                 WHERE billing = 'billed' AND hour = (SELECT min(hour) FROM attempts_hourly_lean WHERE billing = 'billed')"
            }
        },
    )
    .await;
    let (a, b) = (
        rollups
            .spend(Filter::default(), GroupBy::Provider)
            .await
            .unwrap(),
        rows.spend(Filter::default(), GroupBy::Provider)
            .await
            .unwrap(),
    );
    assert_ne!(a, b, "the tampered rollup is read");
    let db = g.ledger_db.clone();
    let caught = tokio::spawn(async move { assert_rollups_on(&db).await })
        .await
        .is_err();
    assert!(caught, "the invariant notices a rollup off by 1e-9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_answer_as_the_rows_do_on_sqlite() {
    rollups_answer_as_the_rows_do(Engine::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_answer_as_the_rows_do_on_postgres() {
    rollups_answer_as_the_rows_do(Engine::Postgres).await
}

/// A ledger written before the rollups: the migration back-fills them from its rows,
/// in-flight and settled, across hours, exactly.
async fn the_migration_back_fills_the_rollups(engine: Engine) {
    let dir = tempfile::tempdir().unwrap();
    let (db, before) = match engine {
        Engine::Sqlite => (Db::Sqlite(dir.path().join("ledger.db")), 8),
        Engine::Postgres => {
            let Some(url) = common::pg::fresh_schema("rollups_back_fill").await else {
                return;
            };
            (Db::Postgres(url), 4)
        }
    };
    purser::ledger::migrate_at_to(&db.target(), before)
        .await
        .unwrap();
    let time_of = |t: &str| match engine {
        Engine::Sqlite => format!("'{t}'"),
        Engine::Postgres => format!("timestamptz '{t}'"),
    };
    let extra = match engine {
        Engine::Sqlite => ("received_ms, ", "0, ", "", ""),
        Engine::Postgres => ("", "", ", replica", ", 'r'"),
    };
    let (ms_col, ms_val, replica_col, replica_val) = extra;
    let mut sql = String::new();
    for (i, (at, outcome)) in [
        ("2026-11-01T10:20:00.000Z", "served"),
        ("2026-11-01T10:59:59.999Z", "served"),
        ("2026-11-01T11:00:00.000Z", "in_flight"),
        ("2026-11-02T23:30:00.500Z", "interrupted"),
    ]
    .into_iter()
    .enumerate()
    {
        sql.push_str(&format!(
            "INSERT INTO requests (id, received_at, {ms_col}client, policy, plan_id, model, mode, ceiling, worst_case, outcome{replica_col})
             VALUES ('r{i}', {at}, {ms_val}'c{}', 'p', 'x', 'm', 'hard', 1, 0.1, '{outcome}'{replica_val});
             INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, state, class, billing, cost, worst_case{replica_col})
             VALUES ('r{i}', 1, 'p1', 'm', 'us', {at}, 'done', 'overloaded', 'not_billed', 0, 0.1{replica_val}),
                    ('r{i}', 2, 'p2', 'm', 'us', {at}, '{}', {}, '{}', {}, 0.1{replica_val});",
            i % 2,
            if outcome == "served" { "done" } else { "interrupted" },
            if outcome == "served" { "'success'" } else { "NULL" },
            if outcome == "served" { "billed" } else { "maybe_billed" },
            if outcome == "served" { "0.000123" } else { "0" },
            at = time_of(at),
        ));
    }
    let sql = match engine {
        // SQLite keeps amounts as decimal text.
        Engine::Sqlite => sql
            .replace(", 1, 0.1, '", ", '1', '0.1', '")
            .replace(", 0, 0.1)", ", '0', '0.1')")
            .replace(", 0.000123, 0.1)", ", '0.000123', '0.1')")
            .replace(", 0.1)", ", '0.1')"),
        Engine::Postgres => sql,
    };
    exec(&db, &sql).await;
    let (ledger, _) = Ledger::open_at(&db.target(), purser::ledger::Options::default())
        .await
        .unwrap();
    assert_rollups_on(&db).await;
    let rows = db.count("SELECT COUNT(*) FROM attempts_hourly").await;
    assert!(rows >= 5, "{rows} rollup rows");
    let (a, b) = (
        ledger.spend(Filter::default(), GroupBy::Day).await.unwrap(),
        ledger
            .reading(Source::Rows)
            .spend(Filter::default(), GroupBy::Day)
            .await
            .unwrap(),
    );
    assert_eq!(a, b);
}

#[tokio::test]
async fn the_migration_back_fills_the_rollups_on_sqlite() {
    the_migration_back_fills_the_rollups(Engine::Sqlite).await
}

#[tokio::test]
async fn the_migration_back_fills_the_rollups_on_postgres() {
    the_migration_back_fills_the_rollups(Engine::Postgres).await
}

/// Spawn every future at once on this (single-threaded) runtime, so the ledger calls
/// queue together and share group commits; their results in order.
async fn together<F, T>(futures: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Admit request `id` for `model` with its first attempt in flight, under a day budget
/// of 100: the admission these tests make (owned arguments, so it can be spawned).
async fn admit_request(
    l: std::sync::Arc<Ledger>,
    id: String,
    model: &'static str,
) -> Result<(), purser::ledger::LedgerError> {
    use common::rows::{attempt, day_limit, new_request};
    let mut r = new_request(&id, "0.1");
    r.model = model.into();
    l.admit_with_attempt(r, day_limit("100"), attempt(&id, 1, "0.05"))
        .await
}

/// On SQLite the writer adds the rollups' deltas up in memory for the transaction of
/// each group commit and writes one upsert per key before it commits (#23, migration
/// 0012). Groups that commit, a group spoiled by one failing operation (rolled back,
/// then redone one operation per transaction) and a group spoiled by its own rollup
/// rows (an operator's rule on them that one request breaks) all leave the rollups
/// equal to the rows. Deltas dropped, written twice, or left over from a rolled-back
/// group for the next transaction would each break that equality.
#[tokio::test]
async fn the_writers_batched_deltas_count_once_per_committed_group() {
    use common::rows::{attempt, closed, ended};
    use purser::failure::Billing;
    use purser::ledger::LedgerError;
    use std::sync::Arc;
    type Call =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LedgerError>> + Send>>;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let db = Db::Sqlite(path.clone());
    drop(Ledger::open(&path, purser::ledger::Options::default()).unwrap());
    exec(
        &db,
        "CREATE TRIGGER poison BEFORE INSERT ON requests_hourly WHEN NEW.model = 'poison'
         BEGIN SELECT RAISE(ABORT, 'poisoned rollup'); END;",
    )
    .await;
    let (l, _) = Ledger::open(&path, purser::ledger::Options::default()).unwrap();
    let l = Arc::new(l);
    let admit = |id: String, model: &'static str| admit_request(l.clone(), id, model);
    let requests = || db.count("SELECT COUNT(*) FROM requests");

    // One group admits 40 requests, each with its first attempt in flight.
    let admitted = together((0..40).map(|i| admit(format!("r{i}"), "m")).collect()).await;
    assert!(admitted.iter().all(Result::is_ok), "{admitted:?}");
    assert_rollups_on(&db).await;

    // The next ends them (every other one failing over to a second attempt, which
    // joins a new key and leaves the in-flight one) while ten more are admitted.
    let mut work: Vec<Call> = Vec::new();
    for i in 0..40 {
        let (l, id) = (l.clone(), format!("r{i}"));
        work.push(Box::pin(async move {
            if i % 2 == 0 {
                let cost = format!("0.0{}", i % 7 + 1);
                l.finish(
                    ended(&id, 1, Billing::Billed, &cost),
                    closed(&id, Outcome::Served, &cost, &cost),
                )
                .await
            } else {
                l.finish_attempt(ended(&id, 1, Billing::NotBilled, "0"))
                    .await?;
                l.begin_attempt(attempt(&id, 2, "0.05")).await
            }
        }));
    }
    for i in 40..50 {
        work.push(Box::pin(admit(format!("r{i}"), "m")));
    }
    let done = together(work).await;
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_rollups_on(&db).await;

    // A group spoiled by an operation (an attempt that already exists): it is rolled
    // back with the deltas its other operations added up, and each is redone alone.
    let mut work: Vec<Call> = (50..70)
        .map(|i| Box::pin(admit(format!("r{i}"), "m")) as Call)
        .collect();
    let dup = l.clone();
    work.push(Box::pin(async move {
        dup.begin_attempt(attempt("r0", 1, "0.05")).await
    }));
    let done = together(work).await;
    assert_eq!(done.iter().filter(|r| r.is_err()).count(), 1, "{done:?}");
    assert!(
        done[20].is_err(),
        "the duplicate attempt is refused: {done:?}"
    );
    assert_eq!(requests().await, 70);
    assert_rollups_on(&db).await;

    // A group spoiled by its rollup rows: the poisoned request's key cannot be written.
    // The group is rolled back and redone alone; only that request is refused.
    let done = together(
        (70..90)
            .map(|i| admit(format!("r{i}"), if i == 80 { "poison" } else { "m" }))
            .collect(),
    )
    .await;
    for (i, r) in (70..90).zip(&done) {
        match (i, r) {
            (80, Err(e)) => assert!(e.to_string().contains("poisoned rollup"), "{e}"),
            (80, Ok(())) => panic!("the poisoned request was admitted"),
            (_, r) => assert!(r.is_ok(), "r{i}: {r:?}"),
        }
    }
    assert_eq!(requests().await, 89);
    assert_rollups_on(&db).await;

    // And the next group starts clean.
    let done = together((90..95).map(|i| admit(format!("r{i}"), "m")).collect()).await;
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_rollups_on(&db).await;
    let counted = db
        .count("SELECT COALESCE(SUM(requests), 0) FROM requests_hourly")
        .await;
    assert_eq!(counted, 94);
}

/// The writer's batched triggers are TEMP triggers of its own connection, and 0012's
/// row triggers stand aside only while the writer's uncommitted `rollup_batching` row
/// exists. So, with purser's writer open and working, a plain `sqlite3` connection
/// (no purser functions at all) can still write a request, and its row triggers keep
/// the rollups right; purser's own connection can move attempts (their triggers add
/// money with `dadd`). Failed before: any such write failed to prepare ("no such
/// function: purser_rollup_batching"), or, had the flag ever been committed, the
/// rollups would have missed the operator's rows.
#[tokio::test]
async fn writes_from_other_connections_keep_the_rollups_while_the_writer_batches() {
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let db = Db::Sqlite(path.clone());
    let (l, _) = Ledger::open(&path, purser::ledger::Options::default()).unwrap();
    let l = Arc::new(l);
    // Admit these requests together, so that they share group commits (batched).
    let admit_all = |ids: std::ops::Range<u32>| {
        let calls = ids
            .map(|i| admit_request(l.clone(), format!("r{i}"), "m"))
            .collect();
        async move {
            let admitted = together(calls).await;
            assert!(admitted.iter().all(Result::is_ok), "{admitted:?}");
        }
    };
    admit_all(0..5).await;
    let plain = rusqlite::Connection::open(&path).unwrap();
    plain
        .execute_batch(
            "UPDATE requests SET outcome = 'failed' WHERE id = 'r1';
             INSERT INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, ingress)
             SELECT 'op1', received_at, received_ms, client, policy, plan_id, 'operator-model', mode, ceiling, worst_case, 'refused', ingress
             FROM requests WHERE id = 'r0';
             DELETE FROM requests WHERE id = 'op1';
             INSERT INTO requests (id, received_at, received_ms, client, policy, plan_id, model, mode, ceiling, worst_case, outcome, ingress)
             SELECT 'op2', received_at, received_ms, client, policy, plan_id, 'operator-model', mode, ceiling, worst_case, 'refused', ingress
             FROM requests WHERE id = 'r0';",
        )
        .unwrap();
    assert_eq!(
        plain
            .query_row("SELECT COUNT(*) FROM rollup_batching", [], |r| r
                .get::<_, i64>(0))
            .unwrap(),
        0,
        "the writer's flag is never committed"
    );
    exec(
        &db,
        "UPDATE attempts SET billing = 'billed', cost = '0.02', class = 'success' WHERE request_id = 'r2';",
    )
    .await;
    assert_rollups_on(&db).await;
    // And the writer still batches after them.
    admit_all(5..8).await;
    assert_rollups_on(&db).await;
    let counted = db
        .count("SELECT COALESCE(SUM(requests), 0) FROM requests_hourly")
        .await;
    assert_eq!(counted, 9);

    // The writer does batch: twenty admissions in one group move their one
    // `requests_hourly` row once or twice (a group cut in two), not twenty times.
    exec(
        &db,
        "CREATE TABLE rollup_writes (n INTEGER);
         CREATE TRIGGER count_rollup_inserts AFTER INSERT ON requests_hourly BEGIN INSERT INTO rollup_writes VALUES (1); END;
         CREATE TRIGGER count_rollup_updates AFTER UPDATE ON requests_hourly BEGIN INSERT INTO rollup_writes VALUES (1); END;",
    )
    .await;
    admit_all(8..28).await;
    let writes = db.count("SELECT COUNT(*) FROM rollup_writes").await;
    assert!(
        (1..=2).contains(&writes),
        "{writes} writes of requests_hourly for 20 admissions"
    );
    assert_rollups_on(&db).await;
}

/// Version 11 was first a batching design that was reverted (its triggers called a
/// function purser no longer registers); a ledger that ran it is at version 11 with
/// those triggers. Migration 0012 must bring it back: afterwards purser admits and
/// finishes requests and the rollups equal the rows. And a flag row committed by
/// someone else is cleared when purser opens the ledger. Failed before 0012 existed
/// (admission: "no such function: purser_rollup_batching").
#[tokio::test]
async fn a_ledger_that_ran_the_first_0011_is_brought_back_by_0012() {
    use common::rows::{closed, ended};
    use purser::failure::Billing;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let db = Db::Sqlite(path.clone());
    {
        let (l, _) = Ledger::open(&path, purser::ledger::Options::default()).unwrap();
        admit_request(std::sync::Arc::new(l), "old".into(), "m")
            .await
            .unwrap();
    }
    // As a ledger that ran the first 0011 has it (at version 11), plus a stray committed flag.
    let conn = purser::ledger::connect(&path, &purser::ledger::Options::default()).unwrap();
    // It drops the triggers of 0009's names (here 0012's) and creates its own.
    conn.execute_batch(include_str!("fixtures/ledger/sqlite-0011-first.sql"))
        .unwrap();
    conn.execute_batch(
        "DELETE FROM schema_migrations WHERE version = 12;
         INSERT INTO rollup_batching (one) VALUES (1);",
    )
    .unwrap();
    drop(conn);

    let (l, _) = Ledger::open(&path, purser::ledger::Options::default()).unwrap();
    let l = std::sync::Arc::new(l);
    let calls = (0..10)
        .map(|i| {
            let (l, id) = (l.clone(), format!("r{i}"));
            async move {
                admit_request(l.clone(), id.clone(), "m").await?;
                l.finish(
                    ended(&id, 1, Billing::Billed, "0.01"),
                    closed(&id, Outcome::Served, "0.01", "0.01"),
                )
                .await
            }
        })
        .collect();
    let done = together(calls).await;
    assert!(done.iter().all(Result::is_ok), "{done:?}");
    assert_eq!(db.count("SELECT COUNT(*) FROM rollup_batching").await, 0);
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'trigger' AND name LIKE '%_batched'"
        )
        .await,
        0
    );
    assert_rollups_on(&db).await;
    assert_eq!(
        db.count("SELECT COALESCE(SUM(requests), 0) FROM requests_hourly")
            .await,
        11
    );
}
