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
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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

/// The writer's side: how many pages its WAL held after its last commit, and whether
/// its last commits are still waiting for an fsync.
pub struct Bound {
    pages: Arc<AtomicU32>,
    restart: u32,
    unsynced: Arc<AtomicBool>,
    wake: SyncSender<()>,
}

impl Bound {
    /// After a group committed without an fsync: the checkpointer fsyncs the WAL soon.
    pub fn commit_unsynced(&self) {
        self.unsynced.store(true, Ordering::Release);
        wake(&self.wake);
    }

    /// After a group committed with an fsync, which made every earlier commit durable too.
    pub fn commit_synced(&self) {
        self.unsynced.store(false, Ordering::Release);
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
    let page_size: u32 = writer.pragma_query_value(None, "page_size", |r| r.get(0))?;
    let marks = Marks::new(opts.wal_bound, page_size);
    let conn = super::connect(path, opts)?;
    let pages = Arc::new(AtomicU32::new(0));
    let unsynced = Arc::new(AtomicBool::new(false));
    // One pending wake-up is enough: the checkpointer reads what to do from the atomics.
    let (waker, woken) = std::sync::mpsc::sync_channel::<()>(1);
    let seen = pages.clone();
    let wake_hook = waker.clone();
    // Replaces SQLite's automatic checkpoint (which is itself a WAL hook). Runs inside
    // each commit on the writer's thread, so it does no more than an atomic store and
    // a non-blocking send.
    writer.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, n: i32| {
        let n = u32::try_from(n).unwrap_or(0);
        seen.store(n, Ordering::Relaxed);
        if n >= marks.passive {
            wake(&wake_hook);
        }
        Ok(())
    }))?;
    let thread = Checkpointer {
        conn,
        wal: wal_path(path),
        pages: pages.clone(),
        unsynced: unsynced.clone(),
        passive: marks.passive,
    };
    std::thread::Builder::new()
        .name("purser-checkpoint".into())
        .spawn(move || thread.run(&woken))
        .map_err(|e| LedgerError::Unavailable(format!("cannot start the checkpointer: {e}")))?;
    Ok(Bound {
        pages,
        restart: marks.restart,
        unsynced,
        wake: waker,
    })
}

fn wake(w: &SyncSender<()>) {
    match w.try_send(()) {
        Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
    }
}

fn wal_path(db: &Path) -> std::path::PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

/// The thread's side.
struct Checkpointer {
    conn: Connection,
    wal: std::path::PathBuf,
    pages: Arc<AtomicU32>,
    unsynced: Arc<AtomicBool>,
    passive: u32,
}

impl Checkpointer {
    /// Fsync what the writer left unsynced, and run a passive pass whenever the WAL is
    /// past the mark, at most one per `PACE`.
    fn run(&self, woken: &Receiver<()>) {
        while woken.recv().is_ok() {
            if self.unsynced.load(Ordering::Acquire) {
                std::thread::sleep(SYNC_DELAY);
                if self.unsynced.swap(false, Ordering::AcqRel)
                    && let Err(e) = std::fs::File::open(&self.wal).and_then(|f| f.sync_data())
                {
                    // Left for the next synced commit or checkpoint, which sync it.
                    tracing::warn!(error = %e, "cannot fsync the ledger's WAL");
                }
            }
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
}
