//! Durable replies without stopping the committing thread (#23).
//!
//! Under full durability a call may start only once its attempt's row is on disk. The
//! writer used to commit such a group at `synchronous = FULL`, so the fsync ran inside
//! COMMIT on the thread that committed: the gateway's only thread on two cores. Each
//! fsync (0.1-0.3 ms here) stopped every request; at c = 64 that thread was off the CPU
//! a tenth of the time (490 fsyncs a second, 0.90 of a CPU used).
//!
//! Now every group commits at `NORMAL` (its frames are written to the WAL, not synced),
//! and the replies a call waits on are held here. This thread fsyncs the WAL and only
//! then sends them, while the gateway goes on with other requests and the next group.
//! A fsync makes every frame written before it durable: it covers every group counted
//! when it started, so the groups that queue up during one fsync share the next.
//! A commit at `NORMAL` followed by an fsync of the WAL is what `FULL` does in WAL mode
//! (SQLite's `FULL` commit syncs the WAL after writing the frames, no more).
//!
//! An fsync that fails leaves the held operations committed but perhaps not on disk:
//! their callers get an error instead of their result and make no call, as when a
//! `FULL` commit failed.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::checkpoint::{Bound, Durable};
use crate::ledger::LedgerError;

/// A reply held until the group that made it is fsynced.
pub struct Held {
    pub reply: oneshot::Sender<Result<(), LedgerError>>,
    pub result: Result<(), LedgerError>,
}

/// The writer's handle on the sync thread; dropping it ends the thread once what it
/// holds is fsynced and sent.
pub struct Syncer {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
}

#[derive(Default)]
struct State {
    held: Vec<Held>,
    closed: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Only pushes and takes happen under it: a poisoned state is still whole.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Syncer {
    /// Start the thread that fsyncs `bound`'s WAL for held replies.
    pub fn start(bound: &Bound) -> Result<Syncer, LedgerError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
        });
        let thread = SyncThread {
            shared: shared.clone(),
            wal: bound.wal_path().to_path_buf(),
            durable: bound.durable(),
        };
        std::thread::Builder::new()
            .name("purser-sync".into())
            .spawn(move || thread.run())
            .map_err(|e| LedgerError::Unavailable(format!("cannot start the WAL syncer: {e}")))?;
        Ok(Syncer { shared })
    }

    /// Hold these replies until an fsync covers the group just counted (call after
    /// `Bound::commit_awaited`, so that the group is counted before they are seen).
    pub fn hold(&self, held: Vec<Held>) {
        if held.is_empty() {
            return;
        }
        lock(&self.shared.state).held.extend(held);
        self.shared.ready.notify_one();
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.ready.notify_one();
    }
}

struct SyncThread {
    shared: Arc<Shared>,
    wal: PathBuf,
    durable: Arc<Durable>,
}

impl SyncThread {
    fn run(&self) {
        loop {
            let held = {
                let mut st = lock(&self.shared.state);
                while st.held.is_empty() && !st.closed {
                    st = self
                        .shared
                        .ready
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if st.held.is_empty() {
                    return; // closed, and nothing is waiting
                }
                std::mem::take(&mut st.held)
            };
            // Every group counted now has written its frames (it is counted after its
            // COMMIT returned), and every reply just taken belongs to one of them.
            let through = self.durable.committed();
            match std::fs::File::open(&self.wal).and_then(|f| f.sync_data()) {
                Ok(()) => {
                    self.durable.synced_through(through);
                    for h in held {
                        let _ = h.reply.send(h.result);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot fsync the ledger's WAL: the calls waiting on it are refused");
                    for h in held {
                        let _ = h.reply.send(Err(LedgerError::Unavailable(format!(
                            "the ledger's write-ahead log could not be made durable: {e}"
                        ))));
                    }
                }
            }
        }
    }
}
