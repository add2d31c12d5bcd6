//! `Ledger`: the one interface the gateway, the audit API, `/metrics` and the CLI use,
//! whichever engine holds the ledger. Each method hands the work to the engine's
//! store; nothing here speaks SQL.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::audit::{
    AttemptLine, Bucket, BudgetState, Cursor, Failures, Filter, GroupBy, RequestPage, SeriesRow,
    Source, SpendRow,
};
use super::read::{BudgetRow, RequestRow};
use super::recorded::{BATCH, Recorded, Span};
use super::{
    AttemptResult, BudgetLimit, LedgerError, NewAttempt, NewRequest, Op, Options, Recovered,
    RequestResult, Target, postgres, sqlite,
};
use crate::money::Money;
use crate::policy::plan::Budget;

/// Handle to the ledger; cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    engine: Arc<Engine>,
    /// Where the spend page's totals are read (the rollups unless a test asks).
    source: Source,
}

enum Engine {
    Sqlite(sqlite::Store),
    Postgres(postgres::Store),
}

/// Lines of `attempt_lines` waiting for their reader; bounds what a slow client holds.
const LINES_IN_FLIGHT: usize = 256;

impl Ledger {
    /// Open (creating or migrating) the SQLite ledger at `path`, and recover the rows a
    /// previous process left in flight.
    pub fn open(path: &Path, opts: Options) -> Result<(Ledger, Recovered), LedgerError> {
        let (store, recovered) = sqlite::Store::open(path, &opts)?;
        Ok((Ledger::wrap(Engine::Sqlite(store)), recovered))
    }

    /// Open the ledger at `target` (either engine), migrating it and recovering what
    /// this replica's previous process left in flight.
    pub async fn open_at(
        target: &Target,
        opts: Options,
    ) -> Result<(Ledger, Recovered), LedgerError> {
        match target {
            Target::Sqlite(path) => Ledger::open(path, opts),
            Target::Postgres(url) => {
                let replica = postgres::Replica {
                    id: opts.replica.clone().unwrap_or_else(default_replica_id),
                    lease: opts.lease,
                };
                let (store, recovered) = postgres::Store::open(url, replica).await?;
                Ok((Ledger::wrap(Engine::Postgres(store)), recovered))
            }
        }
    }

    /// For reading and operator settlement beside running gateways: no migration, no
    /// recovery (which would misread their in-flight rows), no lease.
    pub async fn open_reader(target: &Target) -> Result<Ledger, LedgerError> {
        Ok(Ledger::wrap(match target {
            Target::Sqlite(path) => Engine::Sqlite(sqlite::Store::open_reader(path)?),
            Target::Postgres(url) => Engine::Postgres(postgres::Store::open_reader(url).await?),
        }))
    }

    fn wrap(engine: Engine) -> Ledger {
        Ledger {
            engine: Arc::new(engine),
            source: Source::default(),
        }
    }

    /// The same ledger, answering `spend`, `series` and `failures` from `source`: with
    /// `Source::Rows` from the raw rows alone, to check the rollups against them and to
    /// measure what they save.
    pub fn reading(&self, source: Source) -> Ledger {
        Ledger {
            engine: Arc::clone(&self.engine),
            source,
        }
    }

    /// The SQLite file, when the ledger is one.
    pub fn path(&self) -> Option<&Path> {
        match &*self.engine {
            Engine::Sqlite(s) => Some(s.path()),
            Engine::Postgres(_) => None,
        }
    }

    /// Whether the last write could reach the database (readiness); true before any
    /// write.
    pub fn writable(&self) -> bool {
        match &*self.engine {
            Engine::Sqlite(s) => s.writable(),
            Engine::Postgres(s) => s.writable(),
        }
    }

    /// A write that costs one small row: readiness asks it after a failed write, and
    /// its success makes the ledger writable again.
    pub async fn probe(&self) -> Result<(), LedgerError> {
        self.call(Op::Probe).await
    }

    /// Whether the ledger can be read now (readiness): a read connection opens and
    /// answers.
    pub async fn readable(&self) -> Result<(), LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => s.read(|_| Ok(())).await,
            Engine::Postgres(s) => {
                s.reader().await?.simple_query("SELECT 1").await?;
                Ok(())
            }
        }
    }

    async fn call(&self, op: Op) -> Result<(), LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => s.call(op).await,
            // Boxed: its future (1.2 kB, against SQLite's 0.5) would otherwise size
            // every ledger call's, and with them every request's task, on either engine.
            Engine::Postgres(s) => Box::pin(s.call(op)).await,
        }
    }

    /// Record the request and reserve its worst case against every period budget,
    /// atomically; refused (and recorded as refused) when any budget would overflow.
    pub async fn admit(
        &self,
        req: NewRequest,
        budgets: Vec<BudgetLimit>,
    ) -> Result<(), LedgerError> {
        self.call(Op::Admit {
            req,
            budgets,
            first: None,
        })
        .await
    }

    /// `admit`, and the first attempt written `in_flight` in the same commit.
    pub async fn admit_with_attempt(
        &self,
        req: NewRequest,
        budgets: Vec<BudgetLimit>,
        first: NewAttempt,
    ) -> Result<(), LedgerError> {
        self.call(Op::Admit {
            req,
            budgets,
            first: Some(first),
        })
        .await
    }

    /// Complete the last attempt and its request in one commit.
    pub async fn finish(&self, a: AttemptResult, r: RequestResult) -> Result<(), LedgerError> {
        self.call(Op::Finish(a, r)).await
    }

    /// Record a request refused before any attempt (ceiling, destination, model).
    pub async fn record_refusal(
        &self,
        req: NewRequest,
        error_code: &str,
    ) -> Result<(), LedgerError> {
        self.call(Op::Refusal {
            req,
            error_code: error_code.to_string(),
        })
        .await
    }

    /// Write the attempt as `in_flight` before its upstream call is sent.
    pub async fn begin_attempt(&self, a: NewAttempt) -> Result<(), LedgerError> {
        self.call(Op::BeginAttempt(a)).await
    }

    pub async fn finish_attempt(&self, r: AttemptResult) -> Result<(), LedgerError> {
        self.call(Op::FinishAttempt(r)).await
    }

    /// Complete the request and settle its reservations to what it was charged.
    pub async fn finish_request(&self, r: RequestResult) -> Result<(), LedgerError> {
        self.call(Op::FinishRequest(r)).await
    }

    /// Raise what the request holds in each of its budget windows by `extra`, before
    /// a failover's call; refused, with nothing changed, when any window would pass
    /// its limit in `limits` (the running plan's budgets for the request's policy).
    /// Refused with `NotInFlight` when the request is no longer in flight (another
    /// replica recovered it): no further call may be made for it.
    pub async fn top_up(
        &self,
        request_id: &str,
        extra: Money,
        limits: Vec<BudgetLimit>,
    ) -> Result<(), LedgerError> {
        self.call(Op::TopUp {
            request_id: request_id.to_string(),
            extra,
            limits,
        })
        .await
    }

    /// A live process gives up on a request it can no longer finish (its task died, or
    /// its last write failed): like start-up recovery, its in-flight attempts become
    /// `interrupted` / `maybe_billed` and what it holds is counted as spent. A request
    /// no longer in flight is left alone.
    pub async fn interrupt(&self, request_id: &str, reason: &str) -> Result<(), LedgerError> {
        self.call(Op::Interrupt {
            request_id: request_id.to_string(),
            reason: reason.to_string(),
        })
        .await
    }

    /// Operator settlement of an interrupted request: its charge becomes `cost`.
    /// Budgets a reload adds (or adds back): their current windows count again what the
    /// ledger charges in them (see `Op::ReseedWindows`).
    pub async fn reseed_windows(
        &self,
        windows: Vec<(String, crate::policy::plan::Period)>,
        at: time::OffsetDateTime,
    ) -> Result<(), LedgerError> {
        if windows.is_empty() {
            return Ok(());
        }
        self.call(Op::ReseedWindows { windows, at }).await
    }

    pub async fn settle(&self, request_id: &str, cost: Money) -> Result<(), LedgerError> {
        self.call(Op::Settle {
            request_id: request_id.to_string(),
            cost,
        })
        .await
    }

    // ---- reads (audit API, /metrics, CLI) ----

    pub async fn request(&self, id: &str) -> Result<Option<RequestRow>, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                let id = id.to_string();
                s.read(move |c| sqlite::read::request(c, &id)).await
            }
            Engine::Postgres(s) => postgres::read::request(&s.reader().await?, id).await,
        }
    }

    /// The turn of `policy` whose stored response is `response_id` (a Responses API
    /// `previous_response_id`), as recorded when it ended.
    pub async fn stored_turn(
        &self,
        response_id: &str,
        policy: &str,
    ) -> Result<Option<super::StoredTurn>, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                let (id, policy) = (response_id.to_string(), policy.to_string());
                s.read(move |c| sqlite::read::stored_turn(c, &id, &policy))
                    .await
            }
            Engine::Postgres(s) => {
                postgres::read::stored_turn(&s.reader().await?, response_id, policy).await
            }
        }
    }

    /// Requests newest first (by commit order), one page.
    pub async fn requests(
        &self,
        f: Filter,
        limit: u32,
        cursor: Option<Cursor>,
    ) -> Result<RequestPage, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                s.read(move |c| sqlite::audit::requests(c, &f, limit, cursor))
                    .await
            }
            Engine::Postgres(s) => {
                postgres::read::requests(&s.reader().await?, &f, limit, cursor).await
            }
        }
    }

    pub async fn spend(&self, f: Filter, by: GroupBy) -> Result<Vec<SpendRow>, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                let source = self.source;
                s.read(move |c| sqlite::audit::spend_from(c, &f, by, source))
                    .await
            }
            Engine::Postgres(s) => {
                postgres::read::spend_from(&s.reader().await?, &f, by, self.source).await
            }
        }
    }

    /// Spend per time bucket and group (the spend page's chart).
    pub async fn series(
        &self,
        f: Filter,
        bucket: Bucket,
        by: GroupBy,
    ) -> Result<Vec<SeriesRow>, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                let source = self.source;
                s.read(move |c| sqlite::series::series_from(c, &f, bucket, by, source))
                    .await
            }
            Engine::Postgres(s) => {
                postgres::series::series_from(&s.reader().await?, &f, bucket, by, self.source).await
            }
        }
    }

    /// Attempts per provider and class, and how requests ended (the failure panel).
    pub async fn failures(&self, f: Filter) -> Result<Failures, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                let source = self.source;
                s.read(move |c| sqlite::series::failures_from(c, &f, source))
                    .await
            }
            Engine::Postgres(s) => {
                postgres::series::failures_from(&s.reader().await?, &f, self.source).await
            }
        }
    }

    /// Every attempt matching `f`, oldest first, as the query yields them. The query
    /// stops when the receiver is dropped; an error ends the lines.
    pub fn attempt_lines(&self, f: Filter) -> mpsc::Receiver<Result<AttemptLine, LedgerError>> {
        let (tx, rx) = mpsc::channel(LINES_IN_FLIGHT);
        let engine = self.engine.clone();
        tokio::spawn(async move {
            let result = match &*engine {
                Engine::Sqlite(s) => {
                    let tx = tx.clone();
                    s.read(move |c| {
                        sqlite::audit::each_attempt(c, &f, |line| {
                            tx.blocking_send(Ok(line)).is_ok()
                        })
                    })
                    .await
                }
                Engine::Postgres(s) => match s.reader().await {
                    Ok(c) => postgres::read::attempt_lines(&c, &f, &tx).await,
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        rx
    }

    /// Every recorded request of `span`, in the order the ledger admitted them, in
    /// batches as the query yields them (a replay holds one batch, whatever the ledger
    /// holds). The query stops when the receiver is dropped; an error ends the batches.
    pub fn recorded(&self, span: Span) -> mpsc::Receiver<Result<Vec<Recorded>, LedgerError>> {
        // Two batches in flight: the reader works while the replay does.
        let (tx, rx) = mpsc::channel(2);
        let engine = self.engine.clone();
        tokio::spawn(async move {
            let result = match &*engine {
                Engine::Sqlite(s) => {
                    let tx = tx.clone();
                    s.read(move |c| {
                        let mut batch = Vec::with_capacity(BATCH);
                        let mut open = true;
                        sqlite::recorded::each(c, &span, |r| {
                            batch.push(r);
                            if batch.len() >= BATCH {
                                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                                open = tx.blocking_send(Ok(full)).is_ok();
                            }
                            open
                        })?;
                        if open && !batch.is_empty() {
                            let _ = tx.blocking_send(Ok(batch));
                        }
                        Ok(())
                    })
                    .await
                }
                Engine::Postgres(s) => match s.reader().await {
                    Ok(c) => postgres::recorded::send(&c, &span, &tx).await,
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        rx
    }

    /// Every stored budget window, as stored (operators without the policy set at hand).
    pub async fn budgets(&self) -> Result<Vec<BudgetRow>, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => s.read(sqlite::read::budgets).await,
            Engine::Postgres(s) => postgres::read::budgets(&s.reader().await?).await,
        }
    }

    /// Every stored budget window with what remains of it.
    pub async fn stored_budgets(&self) -> Result<Vec<BudgetState>, LedgerError> {
        self.budgets()
            .await?
            .into_iter()
            .map(BudgetState::try_from)
            .collect()
    }

    /// The budgets a plan configures, each in the window containing `now` (zero when
    /// no request has touched it yet).
    pub async fn current_budgets(
        &self,
        configured: &[(String, Budget)],
        now: time::OffsetDateTime,
    ) -> Result<Vec<BudgetState>, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => {
                let configured = configured.to_vec();
                s.read(move |c| sqlite::audit::current_budgets(c, &configured, now))
                    .await
            }
            Engine::Postgres(s) => {
                postgres::read::current_budgets(&s.reader().await?, configured, now).await
            }
        }
    }

    /// Exact total of billed attempt costs.
    pub async fn total_cost(&self) -> Result<String, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => s.read(sqlite::read::total_cost).await,
            Engine::Postgres(s) => postgres::read::total_cost(&s.reader().await?).await,
        }
    }

    /// The SQLite file's own read connection, for tests that inspect the file; an
    /// error on PostgreSQL. Code outside the ledger uses the methods above.
    #[doc(hidden)]
    pub fn reader(&self) -> Result<rusqlite::Connection, LedgerError> {
        match &*self.engine {
            Engine::Sqlite(s) => sqlite::read::open_reader(s.path()),
            Engine::Postgres(_) => Err(LedgerError::Corrupt(
                "a PostgreSQL ledger has no SQLite reader".into(),
            )),
        }
    }
}

/// A replica id that survives restarts: the host name.
fn default_replica_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "purser".to_string())
}

/// Apply the migrations at `target` up to `version` and stop; the version reached.
/// Tests and the audit bench build a ledger as an earlier version left it this way.
pub async fn migrate_at_to(target: &Target, version: u32) -> Result<u32, LedgerError> {
    match target {
        Target::Sqlite(path) => {
            let mut conn = sqlite::connect(path, &Options::default())?;
            sqlite::migrate::migrate_to(&mut conn, version)
        }
        Target::Postgres(url) => postgres::Store::migrate_to(url, version).await,
    }
}

/// Apply the migrations at `target` and stop (`purser migrate`); the version reached.
pub async fn migrate_at(target: &Target) -> Result<u32, LedgerError> {
    match target {
        Target::Sqlite(path) => sqlite::migrate_file(path),
        Target::Postgres(url) => postgres::Store::migrate(url).await,
    }
}

/// Settle an interrupted request from outside the gateway (`purser settle`), safe
/// beside running gateways: it never runs recovery.
pub async fn settle_at(target: &Target, request_id: &str, cost: Money) -> Result<(), LedgerError> {
    match target {
        Target::Sqlite(path) => sqlite::settle_file(path, request_id, cost),
        Target::Postgres(_) => {
            Ledger::open_reader(target)
                .await?
                .settle(request_id, cost)
                .await
        }
    }
}

/// A consistent copy of an SQLite ledger into a new file; PostgreSQL has its own tools.
pub fn backup(target: &Target, dest: &Path) -> Result<(), LedgerError> {
    match target {
        Target::Sqlite(path) => sqlite::backup_file(path, dest),
        Target::Postgres(_) => Err(LedgerError::Unsupported(
            "purser backup copies an SQLite ledger; back a PostgreSQL ledger up with pg_dump (see docs/deploy.md)".into(),
        )),
    }
}
