//! The ledger in one SQLite file (WAL), for one gateway process: the embedded default.
//!
//! One write connection commits in groups: many concurrent requests share one
//! transaction and each waits for its own commit. An operation alone in the queue is
//! committed by its caller, on the caller's thread (no hand-off); a group of several is
//! committed on the writer's own thread, so the request thread goes on serving.
//! Readers (audit, demo, CLI) open their own read-only connections on a blocking
//! thread.

pub mod audit;
mod books;
mod checkpoint;
mod deltas;
mod group;
pub mod migrate;
mod ops;
pub mod read;
pub mod recorded;
mod recover;
mod rollup;
pub mod series;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;
use rusqlite::functions::{Aggregate, Context, FunctionFlags};
use tokio::sync::oneshot;

use super::{LedgerError, Op, Options, Recovered, Sync};
use crate::money::Money;

/// The writing side on one file.
pub struct Store {
    /// None when opened for reading only.
    writer: Option<Arc<group::Writer>>,
    path: PathBuf,
}

impl Store {
    /// Open (creating or migrating) the file, and recover rows a previous process left
    /// in flight.
    pub fn open(path: &Path, opts: &Options) -> Result<(Store, Recovered), LedgerError> {
        let mut conn = connect(path, opts)?;
        migrate::migrate_to(&mut conn, migrate::latest())?;
        // The writer's batching flag is never committed by purser; one committed by
        // anyone else would make every connection's row triggers stand aside.
        conn.execute("DELETE FROM rollup_batching", [])?;
        let recovered = recover::recover(&mut conn)?;
        let bound = checkpoint::start(&mut conn, path, opts)?;
        // After recovery, which writes the rollups row by row like any other path; the
        // TEMP triggers it creates live on the writer's connection alone.
        let deltas = deltas::Deltas::install(&conn)?;
        let writer = Arc::new(group::Writer::new(
            conn,
            deltas,
            bound,
            opts.sync == Sync::Full,
        ));
        if let Err(e) = group::Writer::start_helper(&writer) {
            tracing::warn!(error = %e, "no ledger writer thread: requests commit every group themselves");
        }
        Ok((
            Store {
                writer: Some(writer),
                path: path.to_path_buf(),
            },
            recovered,
        ))
    }

    /// For reads beside a running gateway, on read-only connections: the file must
    /// exist at this binary's schema version; nothing is migrated or recovered.
    pub fn open_reader(path: &Path) -> Result<Store, LedgerError> {
        if !path.exists() {
            return Err(LedgerError::Corrupt(format!(
                "{} does not exist",
                path.display()
            )));
        }
        let version = migrate::current_version_read(&read::open_reader(path)?)?;
        if version != migrate::latest() {
            return Err(LedgerError::Corrupt(format!(
                "the ledger is at schema version {version}, this purser expects {}; run `purser migrate` on it first",
                migrate::latest()
            )));
        }
        Ok(Store {
            writer: None,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn writable(&self) -> bool {
        self.writer.as_ref().is_some_and(|w| w.writable())
    }

    /// Queue the operation and let the other tasks that are ready now queue theirs.
    /// Then, unless it is committed meanwhile: alone in the queue, commit it here (or
    /// leave it to the thread already committing); with others, hand the queue to the
    /// writer's thread, so this one goes on serving requests while the group commits.
    pub async fn call(&self, op: Op) -> Result<(), LedgerError> {
        let Some(w) = &self.writer else {
            return Err(LedgerError::Unsupported(
                "this ledger was opened for reading".into(),
            ));
        };
        let (reply, mut rx) = oneshot::channel();
        w.enqueue(group::Envelope { op, reply });
        let mut cancelled = FlushOnDrop(Some(w));
        let_others_run().await;
        cancelled.0 = None;
        match rx.try_recv() {
            Ok(done) => return done,
            // Committing ours now would cut short the group that others are still
            // queueing into; a caller whose operation is already done does not.
            Err(oneshot::error::TryRecvError::Empty) => w.commit_or_hand_over(),
            Err(oneshot::error::TryRecvError::Closed) => return Err(LedgerError::WriterGone),
        }
        rx.await.map_err(|_| LedgerError::WriterGone)?
    }

    /// Run `f` on a fresh read-only connection, on a blocking thread.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || f(&read::open_reader(&path)?))
            .await
            .map_err(|e| LedgerError::Corrupt(format!("a ledger read did not complete: {e}")))?
    }
}

/// Step back once, behind every task that is already runnable, so that those reaching
/// the ledger in the same turn queue their operations into this group. Unlike
/// `tokio::task::yield_now`, which waits for the runtime to poll for I/O first (one
/// `epoll_wait` per ledger call when traffic is light), the task is simply queued
/// again. Measured at c=64: the same groups (~20 operations), 6-20% less CPU per
/// request over four alternating runs; at c=1 one system call fewer per request.
/// (Public for `benches/gateway/design_floor.rs`, which groups its commits alike.)
pub async fn let_others_run() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Commits whatever is queued if dropped while armed, so an operation whose caller
/// went away (a cancelled request) is still written.
struct FlushOnDrop<'a>(Option<&'a group::Writer>);

impl Drop for FlushOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.0 {
            w.flush();
        }
    }
}

/// Exact decimal sum over TEXT amounts, so SQL can total money without floats.
pub(crate) struct DecimalSum;

impl Aggregate<Money, String> for DecimalSum {
    fn init(&self, _: &mut Context<'_>) -> rusqlite::Result<Money> {
        Ok(Money::ZERO)
    }
    fn step(&self, ctx: &mut Context<'_>, acc: &mut Money) -> rusqlite::Result<()> {
        // Borrow the text in place: this runs once per row of a spend report.
        let text = match ctx.get_raw(0) {
            rusqlite::types::ValueRef::Null => None,
            rusqlite::types::ValueRef::Text(t) => Some(
                std::str::from_utf8(t)
                    .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))?,
            ),
            other => {
                return Err(rusqlite::Error::UserFunctionError(
                    format!("dsum expects decimal TEXT, got {:?}", other.data_type()).into(),
                ));
            }
        };
        if let Some(v) = text {
            let m: Money = v
                .parse()
                .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))?;
            *acc = acc
                .checked_add(m)
                .ok_or_else(|| rusqlite::Error::UserFunctionError("decimal overflow".into()))?;
        }
        Ok(())
    }
    fn finalize(&self, _: &mut Context<'_>, acc: Option<Money>) -> rusqlite::Result<String> {
        Ok(acc.unwrap_or(Money::ZERO).to_string())
    }
}

/// A decimal TEXT argument of `dadd`/`dsub`.
fn decimal_arg(ctx: &Context<'_>, i: usize) -> rusqlite::Result<Money> {
    match ctx.get_raw(i) {
        rusqlite::types::ValueRef::Text(t) => std::str::from_utf8(t)
            .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))?
            .parse()
            .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e))),
        other => Err(rusqlite::Error::UserFunctionError(
            format!("expected a decimal TEXT, got {:?}", other.data_type()).into(),
        )),
    }
}

/// `dadd(a, b)` and `dsub(a, b)`: exact decimal arithmetic on TEXT amounts, for the
/// rollup triggers (migration 0009), which must add money in SQL without floats.
fn register_decimal_ops(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function("dadd", 2, flags, |ctx| {
        let (a, b) = (decimal_arg(ctx, 0)?, decimal_arg(ctx, 1)?);
        a.checked_add(b)
            .map(|m| m.to_string())
            .ok_or_else(|| rusqlite::Error::UserFunctionError("decimal overflow".into()))
    })?;
    conn.create_scalar_function("dsub", 2, flags, |ctx| {
        let (a, b) = (decimal_arg(ctx, 0)?, decimal_arg(ctx, 1)?);
        a.decimal()
            .checked_sub(b.decimal())
            .map(|d| Money::new(d).to_string())
            .ok_or_else(|| rusqlite::Error::UserFunctionError("decimal overflow".into()))
    })
}

/// A connection on an existing ledger file at this binary's schema version.
fn existing(path: &Path) -> Result<Connection, LedgerError> {
    if !path.exists() {
        return Err(LedgerError::Corrupt(format!(
            "{} does not exist",
            path.display()
        )));
    }
    let conn = connect(path, &Options::default())?;
    let version = migrate::current_version(&conn)?;
    if version != migrate::latest() {
        return Err(LedgerError::Corrupt(format!(
            "the ledger is at schema version {version}, this purser expects {}; run `purser migrate` on it first",
            migrate::latest()
        )));
    }
    Ok(conn)
}

/// Settle an interrupted request directly in a ledger file (the `purser settle`
/// command). Safe beside a running gateway: it takes SQLite's write lock like the
/// writer does, and it never runs crash recovery, which would misread the running
/// gateway's in-flight rows.
pub fn settle_file(path: &Path, request_id: &str, cost: Money) -> Result<(), LedgerError> {
    let mut conn = existing(path)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut books = books::Books::default();
    ops::settle(&tx, &mut books, request_id, cost)?;
    books.write(&tx)?;
    tx.commit()?;
    Ok(())
}

/// Apply the migrations to the file and stop (`purser migrate`).
pub fn migrate_file(path: &Path) -> Result<u32, LedgerError> {
    let mut conn = connect(path, &Options::default())?;
    migrate::migrate_to(&mut conn, migrate::latest())
}

/// A consistent copy of the ledger at `path` into a new file `dest`, taken with
/// SQLite's online backup in small steps so a running gateway keeps writing.
pub fn backup_file(path: &Path, dest: &Path) -> Result<(), LedgerError> {
    if !path.exists() {
        return Err(LedgerError::Corrupt(format!(
            "{} does not exist",
            path.display()
        )));
    }
    if dest.exists() {
        return Err(LedgerError::Corrupt(format!(
            "{} already exists; purser backup never overwrites a file",
            dest.display()
        )));
    }
    let src = read::open_reader(path)?;
    let mut dst = Connection::open(dest)?;
    let backup = rusqlite::backup::Backup::new(&src, &mut dst)?;
    backup.run_to_completion(256, std::time::Duration::from_millis(5), None)?;
    Ok(())
}

/// The page cache of every connection `connect` opens, in KiB (negative: SQLite's
/// unit). Sized for the writer, the one that lives long and writes; the others are the
/// checkpointer (which copies WAL frames without the page cache) and the one-shot
/// `migrate` and `settle` connections.
const WRITER_CACHE_KIB: i64 = -1024;

/// Open a connection with purser's settings and functions.
pub fn connect(path: &Path, opts: &Options) -> Result<Connection, LedgerError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // The writer cycles through more distinct statements than rusqlite's default cache
    // of 16 holds; re-preparing them on every operation cost more than running them.
    conn.set_prepared_statement_cache_capacity(128);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Savepoints keep a statement journal per operation; in memory it costs no file
    // writes (the WAL carries durability, not the journal of a savepoint).
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // The writer's working set is small: new rows go to the right edge of each B-tree,
    // endings update recent rows, and the budget windows and the current hour's rollups
    // are a few pages. SQLite's default cache (2 MiB) fills with pages appended long ago;
    // 1 MiB holds the working set with room to spare (256 pages of 4 kB). Measured at
    // c=1024 on the 200 ms mock: SQLite's heap 3.0 -> 1.9 MB, CPU per request unchanged
    // at c=64 within noise. Readers open their own connections (`read.rs`), with
    // SQLite's default.
    conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)?;
    conn.pragma_update(
        None,
        "synchronous",
        match opts.sync {
            Sync::Normal => "NORMAL",
            Sync::Full => "FULL",
        },
    )?;
    if let Some(n) = opts.max_page_count {
        conn.pragma_update(None, "max_page_count", i64::try_from(n).unwrap_or(i64::MAX))?;
    }
    conn.create_aggregate_function(
        "dsum",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        DecimalSum,
    )?;
    register_decimal_ops(&conn)?;
    Ok(conn)
}
