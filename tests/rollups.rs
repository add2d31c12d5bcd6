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
