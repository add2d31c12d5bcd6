//! The least a gateway built as purser is costs while it keeps DESIGN's money rules: the
//! proxy floor (`proxy_floor.rs`) plus only the money path every request must take
//! under DESIGN, done the cheapest way we know, on purser's runtime shape (one request
//! thread on two cores), allocator and commit pattern (an operation alone committed by
//! its caller, a group of several on a writer thread, a request's ending committed
//! before its answer):
//!
//! 1. read the request's JSON (the bound needs its model and caps), into a typed,
//!    borrowed view that keeps nothing past the admission;
//! 2. reserve the worst case in the one budget window, atomically (in memory under the
//!    writer's lock, written in the same commit);
//! 3. write ahead: the request row and its attempt row committed and fsynced
//!    (`synchronous = FULL`) before the call (DESIGN section 1, rule 5);
//! 4. forward the call;
//! 5. read the answer's JSON (its usage is the cost), typed likewise;
//! 6. complete both rows and settle the window, committed to the OS (`NORMAL`; the next
//!    fsync makes it durable, as purser's endings are);
//! 7. answer.
//!
//! Commits are grouped as purser's are (`src/ledger/sqlite/group.rs`): each caller
//! queues its operation and steps back once, so that the requests ready in the same
//! turn queue theirs; an operation still alone is committed by its caller, a queue of
//! several is handed to the writer thread. Rows carry the fields DESIGN section 7 lists and no more; the tables
//! are keyed by their primary keys alone (no other index, no rollup, no trigger, no
//! audit); the cost is the usage at one model's fixed prices; nothing is authenticated,
//! selected or classified, and no metric is kept. WAL checkpoints run on a thread of
//! their own, as purser's do.
//!
//! `benches/gateway.sh` runs it beside purser and the proxy floor. An aim this misses is
//! out of reach for a gateway of purser's shape on this stack and machine: purser does
//! all of this and more. It is not a bound for every design: a writer thread on the
//! second core, or endings committed after the answer, change what one request thread
//! pays (see `docs/performance.md`, the design floor).
//!
//!   UPSTREAM_BASE=http://127.0.0.1:18080/v1 design-floor 127.0.0.1:18103 LEDGER_DIR \
//!     [full|normal] [purser|caller|thread]
//!
//! `normal` is purser's `--durability normal`: no commit waits for an fsync. The last
//! says who commits: `purser` (the default) as above; `caller`, the callers every group,
//! on the request thread (purser's shape before its writer thread); `thread`, the writer
//! thread every operation, even one alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use purser::ledger::rfc3339;
use purser::ledger::sqlite::let_others_run;
use purser::money::{Money, PricePerMTok};
use rusqlite::{Connection, params};
use rust_decimal::Decimal;
use time::OffsetDateTime;
use tokio::sync::oneshot;

#[path = "stack.rs"]
mod stack;

/// What the admission reads of a request (serde still checks the whole body is JSON).
#[derive(serde::Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
    max_tokens: Option<u64>,
}

/// What the ending reads of an answer.
#[derive(serde::Deserialize)]
struct Answer {
    usage: Option<Usage>,
}

#[derive(serde::Deserialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// gpt-4o-mini's prices per million tokens, in and out.
fn prices() -> (PricePerMTok, PricePerMTok) {
    (
        PricePerMTok::new(Money::new(Decimal::new(15, 2))),
        PricePerMTok::new(Money::new(Decimal::new(60, 2))),
    )
}

enum Op {
    Admit {
        id: String,
        at: String,
        model: String,
        worst: Money,
    },
    Finish {
        id: String,
        at: String,
        /// The vendor's HTTP status (0: no answer).
        status: u16,
        /// `billed` with a usage; `maybe_billed` at the worst case without one.
        billing: &'static str,
        worst: Money,
        cost: Money,
        input: u64,
        output: u64,
    },
}

impl Op {
    /// The admission is the write-ahead: its call waits for an fsync.
    fn durable(&self) -> bool {
        matches!(self, Op::Admit { .. })
    }
}

/// The budget window as the writer holds it: its limit (never reached in a run, but
/// checked on every request), what is spent and what is reserved.
struct Window {
    limit: Money,
    spent: Money,
    reserved: Money,
}

/// Who commits a group (see the module's doc).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Commits {
    Purser,
    Callers,
    Thread,
}

struct Ledger {
    queue: Mutex<Vec<(Op, oneshot::Sender<()>)>>,
    /// The connection, the window, and whether the connection is at `synchronous =
    /// FULL` now (SQLite's default).
    conn: Mutex<(Connection, Window, bool)>,
    /// `full` durability (purser's default): an admission's group is fsynced. At
    /// `normal`, no commit is.
    full: bool,
    commits: Commits,
    /// Wakes the writer thread to commit the queue (`purser` and `thread`).
    wake: Option<SyncSender<()>>,
}

impl Ledger {
    fn open(
        path: &std::path::Path,
        full: bool,
        commits: Commits,
        wake: Option<SyncSender<()>>,
    ) -> Ledger {
        let mut c = Connection::open(path).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE requests (id TEXT PRIMARY KEY, received_at TEXT NOT NULL, client TEXT NOT NULL,
                 policy TEXT NOT NULL, plan_id TEXT NOT NULL, model TEXT NOT NULL, ceiling TEXT NOT NULL,
                 mode TEXT NOT NULL, worst_case TEXT NOT NULL, outcome TEXT NOT NULL, served_by TEXT,
                 cost TEXT) WITHOUT ROWID;
             CREATE TABLE attempts (request_id TEXT NOT NULL, seq INTEGER NOT NULL, provider TEXT NOT NULL,
                 upstream_model TEXT NOT NULL, jurisdiction TEXT NOT NULL, started_at TEXT NOT NULL,
                 finished_at TEXT, status INTEGER, class TEXT, billing TEXT NOT NULL, decision TEXT,
                 input_tokens INTEGER, output_tokens INTEGER, cost TEXT, message TEXT,
                 PRIMARY KEY (request_id, seq)) WITHOUT ROWID;
             CREATE TABLE budget_windows (policy TEXT NOT NULL, period TEXT NOT NULL, start TEXT NOT NULL,
                 spent TEXT NOT NULL, reserved TEXT NOT NULL, PRIMARY KEY (policy, period, start)) WITHOUT ROWID;
             INSERT INTO budget_windows VALUES ('bench', 'day', '2026-12-03', '0', '0');",
        )
        .unwrap();
        checkpointer(&mut c, path.to_path_buf());
        Ledger {
            queue: Mutex::new(Vec::new()),
            full,
            commits,
            wake,
            conn: Mutex::new((
                c,
                Window {
                    limit: Money::new(Decimal::from(1_000_000_000)),
                    spent: Money::ZERO,
                    reserved: Money::ZERO,
                },
                true,
            )),
        }
    }

    /// Queue `op`, let the requests ready now queue theirs, then have the queue
    /// committed unless it already is (purser's `Store::call`).
    async fn call(&self, op: Op) -> bool {
        let (tx, mut rx) = oneshot::channel();
        self.queue.lock().unwrap().push((op, tx));
        if self.commits == Commits::Thread {
            self.hand_over();
            return rx.await.is_ok();
        }
        let_others_run().await;
        // A commit that failed panicked on its thread, dropping the reply: not admitted.
        if rx.try_recv().is_ok() {
            return true;
        }
        let alone = self.queue.lock().unwrap().len() <= 1;
        if self.commits == Commits::Callers || alone || !self.hand_over() {
            self.flush();
        }
        rx.await.is_ok()
    }

    /// Wake the writer thread; false without one (purser's `Writer::hand_over`).
    fn hand_over(&self) -> bool {
        // Full: a wake-up is pending, and the flush it brings will see the queue.
        self.wake
            .as_ref()
            .is_some_and(|w| !matches!(w.try_send(()), Err(TrySendError::Disconnected(()))))
    }

    fn flush(&self) {
        loop {
            {
                let Ok(mut guard) = self.conn.try_lock() else {
                    return;
                };
                let (c, w, at_full) = &mut *guard;
                loop {
                    let group: Vec<_> = std::mem::take(&mut *self.queue.lock().unwrap());
                    if group.is_empty() {
                        break;
                    }
                    let synced = self.full && group.iter().any(|(op, _)| op.durable());
                    if synced != *at_full {
                        run(
                            c,
                            if synced {
                                "PRAGMA synchronous = FULL"
                            } else {
                                "PRAGMA synchronous = NORMAL"
                            },
                        );
                        *at_full = synced;
                    }
                    commit(c, w, &group);
                    for (_, reply) in group {
                        let _ = reply.send(());
                    }
                    restart_past_bound(c);
                }
            }
            if self.queue.lock().unwrap().is_empty() {
                return;
            }
        }
    }
}

fn run(c: &Connection, sql: &str) {
    c.prepare_cached(sql).unwrap().execute([]).unwrap();
}

/// One transaction for the group; the window row once per group, as purser's books.
fn commit(c: &Connection, w: &mut Window, group: &[(Op, oneshot::Sender<()>)]) {
    run(c, "BEGIN IMMEDIATE");
    for (op, _) in group {
        match op {
            Op::Admit {
                id,
                at,
                model,
                worst,
            } => {
                assert!(
                    w.spent + w.reserved + *worst <= w.limit,
                    "the bench budget ran out"
                );
                w.reserved = w.reserved + *worst;
                c.prepare_cached(
                    "INSERT INTO requests VALUES (?1, ?2, 'bench-client', 'bench', 'plan-0001', ?3, '1', 'hard', ?4, 'in_flight', NULL, NULL)",
                )
                .unwrap()
                .execute(params![id, at, model, worst.to_string()])
                .unwrap();
                c.prepare_cached(
                    "INSERT INTO attempts (request_id, seq, provider, upstream_model, jurisdiction, started_at, billing)
                     VALUES (?1, 1, 'mock', ?2, 'us', ?3, 'maybe_billed')",
                )
                .unwrap()
                .execute(params![id, model, at])
                .unwrap();
            }
            Op::Finish {
                id,
                at,
                status,
                billing,
                worst,
                cost,
                input,
                output,
            } => {
                w.reserved = w.reserved - *worst;
                w.spent = w.spent + *cost;
                c.prepare_cached(
                    "UPDATE attempts SET finished_at = ?2, status = ?3, billing = ?4, decision = 'answered',
                     input_tokens = ?5, output_tokens = ?6, cost = ?7 WHERE request_id = ?1 AND seq = 1",
                )
                .unwrap()
                .execute(params![
                    id,
                    at,
                    status,
                    billing,
                    count(*input),
                    count(*output),
                    cost.to_string()
                ])
                .unwrap();
                c.prepare_cached(
                    "UPDATE requests SET outcome = 'answered', served_by = 'mock', cost = ?2 WHERE id = ?1",
                )
                .unwrap()
                .execute(params![id, cost.to_string()])
                .unwrap();
            }
        }
    }
    c.prepare_cached(
        "UPDATE budget_windows SET spent = ?1, reserved = ?2 WHERE policy = 'bench' AND period = 'day' AND start = '2026-12-03'",
    )
    .unwrap()
    .execute(params![w.spent.to_string(), w.reserved.to_string()])
    .unwrap();
    run(c, "COMMIT");
}

/// The writer thread (`purser` and `thread`): commits the queue each time it is woken.
fn writer_thread(ledger: Arc<Ledger>, woken: Receiver<()>) {
    std::thread::spawn(move || {
        while woken.recv().is_ok() {
            ledger.flush();
        }
    });
}

/// WAL pages after the last commit (the writer's WAL hook sets it).
static WAL_PAGES: AtomicU32 = AtomicU32::new(0);
/// As purser's checkpointer: passive checkpoints from 1,000 pages, at most every 50 ms,
/// on a thread of their own; the writer restarts the WAL past 32 MiB.
const PASSIVE_AT: u32 = 1000;
const RESTART_AT: u32 = 8144;

/// Checkpoints off the request thread, as purser's (`src/ledger/sqlite/checkpoint.rs`).
fn checkpointer(writer: &mut Connection, path: std::path::PathBuf) {
    writer
        .wal_hook(Some(|_: &mut rusqlite::hooks::Wal, n: i32| {
            WAL_PAGES.store(u32::try_from(n).unwrap_or(0), Ordering::Relaxed);
            Ok(())
        }))
        .unwrap();
    std::thread::spawn(move || {
        let c = Connection::open(path).unwrap();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            if WAL_PAGES.load(Ordering::Relaxed) >= PASSIVE_AT {
                let _ = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
            }
        }
    });
}

/// After a group: past the bound, make the WAL start over, never waiting for a lock.
fn restart_past_bound(c: &Connection) {
    if WAL_PAGES.load(Ordering::Relaxed) < RESTART_AT {
        return;
    }
    c.busy_timeout(Duration::ZERO).unwrap();
    if c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get::<_, i64>(0)) == Ok(0) {
        WAL_PAGES.store(0, Ordering::Relaxed);
    }
    c.busy_timeout(Duration::from_secs(5)).unwrap();
}

#[derive(Clone)]
struct Gateway {
    upstream: stack::Upstream,
    ledger: Arc<Ledger>,
    next: Arc<AtomicU64>,
    prices: (PricePerMTok, PricePerMTok),
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn forward(State(gw): State<Gateway>, body: Bytes) -> Response {
    // In a scope of its own: nothing of the parse is held while the vendor answers.
    let (model, cap) = match serde_json::from_slice::<Request<'_>>(&body) {
        Ok(r) => (r.model.into_owned(), r.max_tokens.unwrap_or(4096)),
        Err(_) => return (StatusCode::BAD_REQUEST, "not a chat request").into_response(),
    };
    // A bound from the body's size and the cap: a byte is never less than a token.
    let body_len = u64::try_from(body.len()).unwrap_or(u64::MAX);
    let (input_price, output_price) = gw.prices;
    let worst = input_price.cost_of(body_len) + output_price.cost_of(cap);
    let n = gw.next.fetch_add(1, Ordering::Relaxed);
    let id = format!("01JREQ{n:020}");
    let admitted = gw
        .ledger
        .call(Op::Admit {
            id: id.clone(),
            at: rfc3339(OffsetDateTime::now_utc()),
            model,
            worst,
        })
        .await;
    if !admitted {
        return (StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable").into_response();
    }
    let answer = gw.upstream.call(body).await;
    // With a usage, its cost was billed; without one (no answer, or an answer without
    // it), the attempt may have been billed up to its worst case.
    let usage = answer.as_ref().ok().and_then(|(_, bytes)| {
        serde_json::from_slice::<Answer>(bytes)
            .ok()
            .and_then(|a| a.usage)
    });
    let (cost, billing, input, output) = match usage {
        Some(u) => (
            input_price.cost_of(u.prompt_tokens) + output_price.cost_of(u.completion_tokens),
            "billed",
            u.prompt_tokens,
            u.completion_tokens,
        ),
        None => (worst, "maybe_billed", 0, 0),
    };
    gw.ledger
        .call(Op::Finish {
            id,
            at: rfc3339(OffsetDateTime::now_utc()),
            status: answer.as_ref().map_or(0, |(status, _)| status.as_u16()),
            billing,
            worst,
            cost,
            input,
            output,
        })
        .await;
    match answer {
        Ok((status, bytes)) => stack::answer(status, bytes),
        Err(bad_gateway) => bad_gateway,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A failed commit panics (a benchmark fails loudly); it must end the process, not
    // one task: a poisoned writer would leave every later request unanswered.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::exit(101);
    }));
    let upstream = stack::Upstream::from_env()?;
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18103".into());
    let dir = tempfile::tempdir_in(args.next().unwrap_or_else(|| "/tmp".into()))?;
    let full = match args.next().as_deref() {
        None | Some("full") => true,
        Some("normal") => false,
        Some(other) => return Err(format!("durability `{other}`: full or normal").into()),
    };
    let commits = match args.next().as_deref() {
        None | Some("purser") => Commits::Purser,
        Some("caller") => Commits::Callers,
        Some("thread") => Commits::Thread,
        Some(other) => return Err(format!("commits `{other}`: purser, caller or thread").into()),
    };
    let (wake, woken) = if commits == Commits::Callers {
        (None, None)
    } else {
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        (Some(wake), Some(woken))
    };
    let ledger = Arc::new(Ledger::open(
        &dir.path().join("ledger.db"),
        full,
        commits,
        wake,
    ));
    if let Some(woken) = woken {
        writer_thread(ledger.clone(), woken);
    }
    let gw = Gateway {
        upstream,
        ledger,
        next: Arc::default(),
        prices: prices(),
    };
    let app = Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state(gw);
    stack::serve(&listen, app)
}
