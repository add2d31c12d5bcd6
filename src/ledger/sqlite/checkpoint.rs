//! WAL checkpoints off the request path.
//!
//! SQLite's automatic checkpoint runs inside the commit that pushes the WAL past 1000
//! pages, on the committing thread: it writes the WAL's pages back into the database
//! file and fsyncs it, which stalled one request in a few hundred by milliseconds (the
//! p99 at c=1 was 2.8 ms on disk, 0.34 ms on tmpfs). Here the writer connection has no
//! automatic checkpoint; its WAL hook only tells a thread of its own, on a connection
//! of its own, that the WAL has grown, and that thread checkpoints beside the writer
//! (`PASSIVE`: it never waits for, nor blocks, a commit).
//!
//! A passive checkpoint copies pages but cannot rewind the WAL while commits keep
//! coming: SQLite starts the WAL again from its beginning only when a write begins
//! after every frame was copied back. Under sustained writes the WAL would grow without
//! end, so once it passes `bound` bytes the writer itself, between two groups, runs a
//! `RESTART` checkpoint: it copies the few frames the passive ones have not reached yet,
//! and the next group starts the WAL over. That is the bound's price, paid once per
//! `bound` bytes written: measured in the gateway benchmark, not assumed. The WAL file
//! thus stays near `bound`, and is reused rather than grown (an fsync of a file that
//! grew must also write its new size).
//!
//! The writer's `RESTART` never waits: when the checkpointer thread is in the middle of
//! a pass, or a reader (an audit query) still reads old frames, it gives up at once and
//! tries again after the next group. (Left to the checkpointer thread, a blocking
//! checkpoint starved: a writer under sustained load holds SQLite's write lock for
//! nearly all of its time, and the lock is not fair.)

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Duration;

use rusqlite::{Connection, wal::CheckpointMode};

use crate::ledger::{LedgerError, Options};

/// SQLite's own automatic checkpoint threshold, in pages: the WAL size at which a
/// checkpoint is worth its database-file fsync.
const PASSIVE_AT_PAGES: u32 = 1000;

/// Least time between two passive checkpoints under sustained writes: each one fsyncs
/// the database file, and pages that change again soon (budget rows, index pages) are
/// written back once per checkpoint, so back-to-back checkpoints write the same pages
/// over and over.
const PACE: Duration = Duration::from_millis(50);

/// How long after a commit that was not fsynced (see `Op::durable_before_reply`) the
/// checkpointer fsyncs the WAL, unless a synced commit has covered it meanwhile: at
/// low load the next request's admission does, and one fsync per request remains.
/// (A commit made while the checkpointer waits for an earlier one waits up to twice
/// this: its own delay starts when that wait ends.)
const SYNC_DELAY: Duration = Duration::from_millis(5);

/// How long the writer connection waits for a lock otherwise (`connect`).
const WRITER_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Pages in the WAL at which the writer wakes the checkpointer, and at which the
/// writer makes the WAL start over.
#[derive(Debug, Clone, Copy)]
struct Marks {
    passive: u32,
    restart: u32,
}

impl Marks {
    fn new(bound_bytes: u64, page_size: u32) -> Marks {
        // A WAL frame is a page and a 24-byte header.
        let frame = u64::from(page_size.max(512)) + 24;
        let restart = u32::try_from((bound_bytes / frame).max(2)).unwrap_or(u32::MAX);
        Marks {
            passive: PASSIVE_AT_PAGES.min(restart / 2).max(1),
            restart,
        }
    }
}

/// Which of the writer's groups are durable. Groups are numbered in commit order; an
/// fsync makes every group committed before it durable. The checkpointer fsyncs a group
/// left unsynced only if no later synced group has covered it: a flag ("something is
/// unsynced") cannot tell the group it was woken for from a newer one, and at c = 1,
/// where the last commit is nearly always a request's unsynced ending, it fsynced every
/// 5 ms what the next admission had already made durable: 91-101 fsyncs in 7 s (about
/// one per 85 requests; strace on the checkpointer thread alone), each one contending
/// for the disk with an admission's. Numbered, 1 in 7 s.
#[derive(Default)]
struct Durable {
    /// Groups committed (the number of the last one).
    groups: AtomicU64,
    /// Every group up to this one is fsynced.
    synced: AtomicU64,
    /// The last group committed without an fsync.
    last_unsynced: AtomicU64,
    /// fsyncs the checkpointer made for unsynced groups.
    fsyncs: AtomicU64,
    /// Set by the WAL hook when a commit wrote frames; taken by the next group's count.
    /// A transaction that changed nothing writes no frame and fsyncs nothing, even at
    /// `synchronous = FULL` (a refused top-up, say): it covers no earlier group.
    wrote_frames: AtomicBool,
}

/// The writer's side: how many pages its WAL held after its last commit, and which of
/// its commits are durable.
pub struct Bound {
    pages: Arc<AtomicU32>,
    restart: u32,
    durable: Arc<Durable>,
    wake: SyncSender<()>,
}

impl Bound {
    /// After a group committed without an fsync: the checkpointer fsyncs the WAL soon,
    /// unless a synced group covers this one first.
    pub fn commit_unsynced(&self) {
        self.durable.wrote_frames.store(false, Ordering::Relaxed);
        let g = self.durable.groups.fetch_add(1, Ordering::AcqRel) + 1;
        self.durable.last_unsynced.store(g, Ordering::Release);
        wake(&self.wake);
    }

    /// After a group committed with an fsync, which made every earlier commit durable too.
    pub fn commit_synced(&self) {
        let g = self.durable.groups.fetch_add(1, Ordering::AcqRel) + 1;
        if self.durable.wrote_frames.swap(false, Ordering::Relaxed) {
            self.durable.synced.fetch_max(g, Ordering::AcqRel);
        }
    }

    /// After a group's commit: past the bound, try to make the WAL start over (see the
    /// module's comment). Never waits for a lock, never fails a request: a busy or
    /// failed attempt is tried again after the next group.
    pub fn after_commit(&self, conn: &Connection) {
        if self.pages.load(Ordering::Relaxed) < self.restart {
            return;
        }
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return;
        }
        match conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::RESTART) {
            // Copied and synced: the next group's write starts the WAL over.
            Ok(_) => self.pages.store(0, Ordering::Relaxed),
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
            Err(e) => {
                tracing::warn!(error = %e, "WAL restart checkpoint failed; retrying after the next commit")
            }
        }
        if let Err(e) = conn.busy_timeout(WRITER_BUSY_TIMEOUT) {
            tracing::warn!(error = %e, "cannot restore the ledger writer's busy timeout");
        }
    }
}

/// Turn the writer's automatic checkpoint off and start the checkpointer on `path`.
/// The thread ends when the writer connection is closed (its hook holds the only
/// sender).
pub fn start(writer: &mut Connection, path: &Path, opts: &Options) -> Result<Bound, LedgerError> {
    start_with(writer, path, opts, SYNC_DELAY)
}

fn start_with(
    writer: &mut Connection,
    path: &Path,
    opts: &Options,
    sync_delay: Duration,
) -> Result<Bound, LedgerError> {
    let page_size: u32 = writer.pragma_query_value(None, "page_size", |r| r.get(0))?;
    let marks = Marks::new(opts.wal_bound, page_size);
    let conn = super::connect(path, opts)?;
    let pages = Arc::new(AtomicU32::new(0));
    let durable = Arc::new(Durable::default());
    // One pending wake-up is enough: the checkpointer reads what to do from the atomics.
    let (waker, woken) = std::sync::mpsc::sync_channel::<()>(1);
    let seen = pages.clone();
    let wrote = durable.clone();
    let wake_hook = waker.clone();
    // Replaces SQLite's automatic checkpoint (which is itself a WAL hook). Runs inside
    // each commit on the writer's thread, so it does no more than an atomic store and
    // a non-blocking send.
    writer.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, n: i32| {
        let n = u32::try_from(n).unwrap_or(0);
        seen.store(n, Ordering::Relaxed);
        wrote.wrote_frames.store(true, Ordering::Relaxed);
        if n >= marks.passive {
            wake(&wake_hook);
        }
        Ok(())
    }))?;
    let thread = Checkpointer {
        conn,
        wal: wal_path(writer, path),
        pages: pages.clone(),
        durable: durable.clone(),
        passive: marks.passive,
        sync_delay,
    };
    std::thread::Builder::new()
        .name("purser-checkpoint".into())
        .spawn(move || thread.run(&woken))
        .map_err(|e| LedgerError::Unavailable(format!("cannot start the checkpointer: {e}")))?;
    Ok(Bound {
        pages,
        restart: marks.restart,
        durable,
        wake: waker,
    })
}

fn wake(w: &SyncSender<()>) {
    match w.try_send(()) {
        Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
    }
}

/// The WAL file SQLite writes: named after the database file as SQLite resolved it
/// (a ledger opened through a symbolic link has its WAL beside the link's target, not
/// beside the link: fsyncing `<link>-wal` would fail, or sync a stale file).
fn wal_path(writer: &Connection, db: &Path) -> std::path::PathBuf {
    let mut name = match writer.path() {
        Some(resolved) if !resolved.is_empty() => std::ffi::OsString::from(resolved),
        _ => db.as_os_str().to_owned(),
    };
    name.push("-wal");
    name.into()
}

/// The thread's side.
struct Checkpointer {
    conn: Connection,
    wal: std::path::PathBuf,
    pages: Arc<AtomicU32>,
    durable: Arc<Durable>,
    passive: u32,
    sync_delay: Duration,
}

impl Checkpointer {
    /// Fsync the WAL `sync_delay` after the last group left unsynced, unless a synced
    /// group has covered it by then. A group committed meanwhile woke this thread again
    /// (or finds a wake-up already pending) and is looked at in the next turn.
    fn sync_unsynced(&self) {
        let d = &self.durable;
        let target = d.last_unsynced.load(Ordering::Acquire);
        if target <= d.synced.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(self.sync_delay);
        if target <= d.synced.load(Ordering::Acquire) {
            return;
        }
        // Every group counted here has written its frames: the fsync covers them all.
        let through = d.groups.load(Ordering::Acquire);
        match std::fs::File::open(&self.wal).and_then(|f| f.sync_data()) {
            Ok(()) => {
                d.synced.fetch_max(through, Ordering::AcqRel);
                d.fsyncs.fetch_add(1, Ordering::Relaxed);
            }
            // Left for the next synced commit or checkpoint, which sync it.
            Err(e) => tracing::warn!(error = %e, "cannot fsync the ledger's WAL"),
        }
    }

    /// Fsync what the writer left unsynced, and run a passive pass whenever the WAL is
    /// past the mark, at most one per `PACE`.
    fn run(&self, woken: &Receiver<()>) {
        while woken.recv().is_ok() {
            self.sync_unsynced();
            if self.pages.load(Ordering::Relaxed) >= self.passive {
                // A pass fsyncs the WAL before copying it back, then the database file.
                match self
                    .conn
                    .wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE)
                {
                    Ok(_) => {}
                    // The writer's restart holds the checkpoint lock now: it does the
                    // work this pass would have done.
                    Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {}
                    // The next wake-up tries again; the writer's commits do not depend on it.
                    Err(e) => {
                        tracing::warn!(error = %e, "WAL checkpoint failed; retrying at the next commit")
                    }
                }
                std::thread::sleep(PACE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_follow_the_bound() {
        let m = Marks::new(32 * 1024 * 1024, 4096);
        assert_eq!(m.restart, 8144);
        assert_eq!(m.passive, PASSIVE_AT_PAGES);
        // A bound smaller than SQLite's threshold wakes the checkpointer earlier.
        let small = Marks::new(1024 * 1024, 4096);
        assert_eq!(small.restart, 254);
        assert_eq!(small.passive, 127);
    }

    /// A writer connection on a new ledger file, with its checkpointer waiting `delay`.
    fn writer(dir: &tempfile::TempDir, delay: Duration) -> (Connection, Bound) {
        let path = dir.path().join("l.db");
        let opts = Options::default();
        let mut conn = super::super::connect(&path, &opts).unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let bound = start_with(&mut conn, &path, &opts, delay).unwrap();
        (conn, bound)
    }

    fn commit(conn: &Connection, bound: &Bound, synced: bool) {
        conn.execute("INSERT INTO t VALUES (1)", []).unwrap();
        if synced {
            bound.commit_synced();
        } else {
            bound.commit_unsynced();
        }
    }

    /// Wait (10 s at most) for the checkpointer's first fsync of an unsynced group.
    fn await_checkpointer_fsync(bound: &Bound) {
        let start = std::time::Instant::now();
        while bound.durable.fsyncs.load(Ordering::Relaxed) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the checkpointer never fsynced the unsynced group"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn an_unsynced_commit_left_alone_is_fsynced_by_the_checkpointer() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, bound) = writer(&dir, Duration::from_millis(20));
        commit(&conn, &bound, false);
        await_checkpointer_fsync(&bound);
        assert!(bound.durable.synced.load(Ordering::Acquire) >= 1);
    }

    /// The shape of c = 1: an unsynced ending, the next admission (synced), the next
    /// ending. The first ending is covered by the admission; the checkpointer must not
    /// fsync for it although something is unsynced when its delay ends. (A flag did.)
    #[test]
    fn an_unsynced_commit_covered_by_a_synced_one_costs_no_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let delay = Duration::from_secs(1);
        let (conn, bound) = writer(&dir, delay);
        commit(&conn, &bound, false);
        // Let the checkpointer take the first ending as its target before the next two
        // commits, as at c = 1 (else it may wake for the second ending and rightly sync it).
        std::thread::sleep(delay / 10);
        commit(&conn, &bound, true);
        commit(&conn, &bound, false);
        // Past the first ending's delay, before the second's (which starts when the
        // first's ends): the next admission covers the second ending too.
        std::thread::sleep(delay + delay / 2);
        commit(&conn, &bound, true);
        std::thread::sleep(delay * 2);
        assert_eq!(bound.durable.fsyncs.load(Ordering::Relaxed), 0);
        assert_eq!(bound.durable.synced.load(Ordering::Acquire), 4);
    }

    /// A synced group that wrote nothing (a refused top-up alone) did not fsync: the
    /// ending before it still gets the checkpointer's fsync.
    #[test]
    fn a_synced_group_that_wrote_nothing_covers_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, bound) = writer(&dir, Duration::from_millis(200));
        commit(&conn, &bound, false);
        conn.execute("UPDATE t SET x = 2 WHERE x = 99", []).unwrap();
        bound.commit_synced();
        await_checkpointer_fsync(&bound);
    }

    /// A ledger opened through a symbolic link: SQLite writes its WAL beside the link's
    /// target, and that is the file the checkpointer must fsync (`<link>-wal` does not
    /// exist; the fsync failed, and an ending waited for the next admission's).
    #[test]
    fn a_ledger_opened_through_a_link_has_its_wal_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(real.join("l.db"), &link).unwrap();
        let opts = Options::default();
        // The target must exist for SQLite to open it through the link.
        drop(super::super::connect(&real.join("l.db"), &opts).unwrap());
        let mut conn = super::super::connect(&link, &opts).unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let bound = start_with(&mut conn, &link, &opts, Duration::from_millis(20)).unwrap();
        assert!(real.join("l.db-wal").exists());
        commit(&conn, &bound, false);
        await_checkpointer_fsync(&bound);
    }
}
