//! Group commit on SQLite: operations applied in groups, one transaction per group; a
//! group spoiled by one failing operation is redone one operation per transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, TryLockError, Weak};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::books::Books;
use super::checkpoint::Bound;
use super::deltas::Deltas;
use super::ops::apply_op;
use crate::ledger::{LedgerError, Op};

/// Most operations committed together; bounds the latency one commit adds.
const MAX_GROUP: usize = 1024;

pub struct Envelope {
    pub op: Op,
    pub reply: oneshot::Sender<Result<(), LedgerError>>,
}

/// The write connection and the operations waiting for it. A caller whose operation is
/// the only one queued commits it on its own thread, which costs no hand-off (one
/// request at a time). When several are queued, their group goes to the writer's own
/// thread (`hand_over`), so that its commit, and under full durability its fsync, does
/// not stop the runtime thread that serves every other request: in the gateway bench at
/// c=64, 60-70% more requests a second and 5-20% less CPU per request than callers
/// committing every group, the groups being larger (`docs/performance.md`). Whichever
/// thread finds the connection free commits everything queued so far, in groups (see
/// `Store::call`).
pub struct Writer {
    queue: Mutex<Vec<Envelope>>,
    conn: Mutex<(Connection, Books)>,
    /// The rollups' deltas of the open transaction, kept by the connection's functions.
    deltas: Deltas,
    /// Whether the last group could write at all (readiness).
    writable: AtomicBool,
    /// Keeps the WAL bounded (checkpoints themselves run on their own thread), and
    /// fsyncs what a group left unsynced.
    wal: Bound,
    /// Full durability: groups that hold an operation a call waits on are fsynced.
    full: bool,
    /// Whether the connection is at `synchronous = FULL` now (read and changed only
    /// under the connection's lock).
    at_full: AtomicBool,
    /// Wakes the writer's thread to commit the queue (set once it is started).
    helper: OnceLock<SyncSender<()>>,
}

impl Writer {
    /// `full`: the connection was opened at `synchronous = FULL`.
    pub fn new(conn: Connection, deltas: Deltas, wal: Bound, full: bool) -> Self {
        Writer {
            queue: Mutex::new(Vec::new()),
            conn: Mutex::new((conn, Books::default())),
            deltas,
            writable: AtomicBool::new(true),
            wal,
            full,
            at_full: AtomicBool::new(full),
            helper: OnceLock::new(),
        }
    }

    /// Start the writer's thread. It holds the writer weakly, and ends once the writer
    /// is dropped (the writer holds the only sender). Without it (it could not be
    /// started) callers commit every group themselves, as they would one alone.
    pub fn start_helper(writer: &Arc<Writer>) -> std::io::Result<()> {
        // One pending wake-up is enough: each one commits all that is queued by then.
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let weak: Weak<Writer> = Arc::downgrade(writer);
        std::thread::Builder::new()
            .name("purser-sqlite".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    let Some(w) = weak.upgrade() else { return };
                    // A panic mid-group drops that group (its callers are told the
                    // writer is gone, and fail closed); the rest of the queue, whose
                    // callers handed it over and wait, is still committed.
                    while std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.flush()))
                        .is_err()
                    {}
                }
            })?;
        // Set once, right after the writer is made.
        let _ = writer.helper.set(wake);
        Ok(())
    }

    /// Have the queue committed: here when it holds one operation alone (no hand-off),
    /// else on the writer's thread, unless there is none (then here too).
    pub fn commit_or_hand_over(&self) {
        if lock(&self.queue).len() <= 1 || !self.hand_over() {
            self.flush();
        }
    }

    /// Ask the writer's thread to commit the queue. False when there is no such thread
    /// (never started, or ended by a panic): the caller commits instead.
    fn hand_over(&self) -> bool {
        match self.helper.get().map(|h| h.try_send(())) {
            // Full: a wake-up is pending, and the flush it brings sees this queue.
            Some(Ok(()) | Err(TrySendError::Full(()))) => true,
            Some(Err(TrySendError::Disconnected(()))) | None => false,
        }
    }

    pub fn writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }

    pub fn enqueue(&self, env: Envelope) {
        lock(&self.queue).push(env);
    }

    /// Commit every queued operation, in groups of at most `MAX_GROUP`. Returns at
    /// once when another thread holds the connection: that thread looks at the queue
    /// again after releasing it, so nothing queued is left behind.
    pub fn flush(&self) {
        loop {
            {
                let mut conn = match self.conn.try_lock() {
                    Ok(c) => c,
                    // A panic mid-group dropped its transaction, which rolled back:
                    // the connection itself is sound, but the books may hold what the
                    // rolled-back group reserved or settled, so they are read again.
                    Err(TryLockError::Poisoned(p)) => {
                        let mut c = p.into_inner();
                        c.1.forget();
                        self.conn.clear_poison();
                        c
                    }
                    Err(TryLockError::WouldBlock) => return,
                };
                let (conn, books) = &mut *conn;
                loop {
                    let group: Vec<Envelope> = {
                        let mut q = lock(&self.queue);
                        let n = q.len().min(MAX_GROUP);
                        q.drain(..n).collect()
                    };
                    if group.is_empty() {
                        break;
                    }
                    self.commit(conn, books, group);
                }
            }
            // An operation queued after the last drain, whose caller found the
            // connection taken, is ours to commit.
            if lock(&self.queue).is_empty() {
                return;
            }
        }
    }

    fn commit(&self, conn: &mut Connection, books: &mut Books, group: Vec<Envelope>) {
        // Under full durability, a group of completions only (no call waits on them) is
        // committed without its fsync, which the next synced group or the checkpointer
        // provides (see `Op::durable_before_reply`): one fsync per request at low load
        // instead of two.
        let synced = self.full && group.iter().any(|e| e.op.durable_before_reply());
        let results = match self.set_synced(conn, synced) {
            Ok(()) => apply_group(conn, books, &self.deltas, &group),
            Err(e) => group
                .iter()
                .map(|_| Err(LedgerError::Sqlite(clone_err(&e))))
                .collect(),
        };
        // Refusals of the operation itself (a budget, an unknown id) say nothing about
        // the disk; an SQLite failure of every operation does.
        let wrote = results
            .iter()
            .any(|r| !r.as_ref().is_err_and(LedgerError::is_transient));
        self.writable.store(wrote, Ordering::Relaxed);
        for (env, res) in group.into_iter().zip(results) {
            let _ = env.reply.send(res);
        }
        if self.full && wrote {
            if self.at_full.load(Ordering::Relaxed) {
                self.wal.commit_synced();
            } else {
                self.wal.commit_unsynced();
            }
        }
        // After the replies: the group's callers need not wait for it.
        self.wal.after_commit(conn);
    }

    /// Put the connection at `synchronous = FULL` (`synced`) or `NORMAL` for the next
    /// group. Only under full durability; a failure to relax keeps it at `FULL`.
    fn set_synced(&self, conn: &Connection, synced: bool) -> rusqlite::Result<()> {
        if !self.full || self.at_full.load(Ordering::Relaxed) == synced {
            return Ok(());
        }
        let sql = if synced {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        };
        match conn.prepare_cached(sql).and_then(|mut st| st.execute([])) {
            Ok(_) => {
                self.at_full.store(synced, Ordering::Relaxed);
                Ok(())
            }
            Err(_) if !synced => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The queue's lock is held only to push or drain, never across a panic point that
/// matters: a poisoned queue is still a valid queue.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One transaction for the whole group. An operation that fails for any reason other
/// than a refused budget spoils the group: it is rolled back and every operation is
/// then applied in its own transaction, so each caller learns its own fate and no
/// operation is ever half-applied. (Per-operation savepoints gave the same guarantee
/// at a cost on every operation; failures are rare, so the group pays only then.)
fn apply_group(
    conn: &mut Connection,
    books: &mut Books,
    deltas: &Deltas,
    group: &[Envelope],
) -> Vec<Result<(), LedgerError>> {
    match try_group(conn, books, deltas, group) {
        Some(results) => results,
        None => group
            .iter()
            .map(|env| apply_alone(conn, books, deltas, &env.op))
            .collect(),
    }
}

/// The writer's transaction: `BEGIN IMMEDIATE` and `COMMIT` from the statement cache
/// (rusqlite's `Transaction` parses both again each time, about 5% of a request's
/// CPU in the gateway benchmark). Rolled back when dropped uncommitted.
///
/// While it is open the writer's TEMP rollup triggers batch their deltas in `deltas`
/// (migration 0012, `batched.sql`); they are written just before COMMIT, and dropped
/// with the transaction whether it commits or not, so none outlives the transaction
/// that made it.
struct Tx<'c> {
    conn: &'c Connection,
    deltas: &'c Deltas,
    open: bool,
}

impl<'c> Tx<'c> {
    /// `batch`: sum the rollup deltas in memory. Only worth it for a group: with one
    /// operation the row triggers write the same rows, and the flag row that batching
    /// inserts and deletes would add a page to the commit (at c = 1, one in ten).
    fn begin(conn: &'c Connection, deltas: &'c Deltas, batch: bool) -> rusqlite::Result<Tx<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let tx = Tx {
            conn,
            deltas,
            open: true,
        };
        if batch {
            // A failure here drops `tx`, which rolls back.
            deltas.open(conn)?;
        }
        Ok(tx)
    }

    /// Write the rollup deltas so far into the transaction (`commit` does it too).
    fn write_rollups(&self) -> rusqlite::Result<()> {
        self.deltas.write(self.conn)
    }

    fn commit(mut self) -> rusqlite::Result<()> {
        self.write_rollups()?;
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        Ok(())
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        self.deltas.close();
        if self.open {
            // Fails only when SQLite already rolled back on its own (a failed COMMIT).
            let _ = self
                .conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut st| st.execute([]));
        }
    }
}

/// `None` when an operation failed and the group was rolled back.
fn try_group(
    conn: &mut Connection,
    books: &mut Books,
    deltas: &Deltas,
    group: &[Envelope],
) -> Option<Vec<Result<(), LedgerError>>> {
    let failed = |e: &rusqlite::Error| {
        group
            .iter()
            .map(|_| Err(LedgerError::Sqlite(clone_err(e))))
            .collect()
    };
    let tx = match Tx::begin(conn, deltas, group.len() > 1) {
        Ok(tx) => tx,
        Err(e) => return Some(failed(&e)),
    };
    if let Err(e) = books.check(&tx) {
        return Some(failed(&e));
    }
    let mut results = Vec::with_capacity(group.len());
    for env in group {
        let r = apply_op(&tx, books, &env.op);
        if r.as_ref().is_err_and(|e| !e.is_refusal()) {
            books.forget();
            return None; // dropping `tx` rolls the group back
        }
        results.push(r);
    }
    // The group's rollup rows can fail as an operation can (a full disk, an operator's
    // constraint on them): then, as for an operation, each is redone alone, so only
    // the one whose rows cannot be written is refused.
    if tx.write_rollups().is_err() {
        books.forget();
        return None; // dropping `tx` rolls the group back, and its deltas with it
    }
    match books.write(&tx).and_then(|()| tx.commit()) {
        Ok(()) => Some(results),
        // Nothing in the group is durable: every caller is told, and fails closed.
        Err(e) => {
            books.forget();
            Some(failed(&e))
        }
    }
}

fn apply_alone(
    conn: &mut Connection,
    books: &mut Books,
    deltas: &Deltas,
    op: &Op,
) -> Result<(), LedgerError> {
    let tx = Tx::begin(conn, deltas, false)?;
    books.check(&tx)?;
    let r = apply_op(&tx, books, op);
    // A refused budget is recorded (the refused request row says why).
    let keep = !r.as_ref().is_err_and(|e| !e.is_refusal());
    let done = if keep {
        books
            .write(&tx)
            .and_then(|()| tx.commit())
            .map_err(Into::into)
    } else {
        Ok(())
    };
    if !keep || done.is_err() {
        books.forget();
    }
    done.and(r)
}

fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e.sqlite_error() {
        Some(s) => rusqlite::Error::SqliteFailure(*s, Some(e.to_string())),
        None => rusqlite::Error::InvalidQuery,
    }
}
