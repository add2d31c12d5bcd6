//! Group commit on PostgreSQL: one task per replica takes every operation queued since
//! its last commit and applies them in one transaction, as one statement per kind of
//! operation (`batch`), so a group costs one round trip (a few when it holds an
//! operation that reads before it decides) and one WAL flush however many requests
//! share it.
//!
//! A statement that fails spoils the transaction: the group is rolled back and each
//! operation is applied again in its own transaction, so each caller learns its own
//! fate and nothing is half-applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::{Client, Pool};
use tokio::sync::{mpsc, oneshot};

use super::{batch, sql};
use crate::ledger::{LedgerError, Op};

/// A group at least this large says the writer is under load, and the next one waits
/// `GATHER` before it is taken.
const GATHER_AFTER: usize = 4;
const GATHER: std::time::Duration = std::time::Duration::from_micros(400);

/// Most operations committed together; bounds the latency one commit adds.
const MAX_GROUP: usize = 512;

pub struct Envelope {
    pub op: Op,
    pub reply: oneshot::Sender<Result<(), LedgerError>>,
}

/// What the writer task shares with the handle.
pub struct Shared {
    /// Reads and the lease.
    pub pool: Pool,
    /// The writer's own connections, created on its thread (see `spawn`).
    pub writes: Pool,
    pub replica: Arc<str>,
    /// Whether the last group could reach PostgreSQL (readiness).
    pub writable: AtomicBool,
}

/// Start the writer; operations sent to the returned queue are applied in order of
/// arrival, in groups. It ends when every sender is gone.
///
/// It runs on a thread of its own, as SQLite's writer does, with its connections'
/// tasks beside it: on the request runtime each step of a group (send, answer, reply)
/// waited behind every request task ready at that moment, and a group of eight took
/// as long as one of sixty-four.
pub fn spawn(shared: Arc<Shared>) -> Result<mpsc::UnboundedSender<Envelope>, LedgerError> {
    let (tx, rx) = mpsc::unbounded_channel::<Envelope>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LedgerError::Unavailable(format!("cannot start the ledger writer: {e}")))?;
    std::thread::Builder::new()
        .name("purser-ledger".into())
        .spawn(move || runtime.block_on(run(shared, rx)))
        .map_err(|e| LedgerError::Unavailable(format!("cannot start the ledger writer: {e}")))?;
    Ok(tx)
}

/// How often admissions whose commit could not be confirmed are looked for again
/// while the writer has nothing else to do.
const RECONCILE_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Most doubtful admissions kept through a long outage; past it the rest are left to
/// this replica's recovery at its next start (or another's, should it die).
const DOUBTFUL_MAX: usize = 100_000;

const ABANDONED: &str = "the database connection failed as the admission's commit was answered, so the gateway made no call; the admission had committed, and is ended here once the database answers again";

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Envelope>) {
    let mut group = Vec::new();
    let mut last = 0;
    // Admissions that failed with a transient error: their `COMMIT` may have been
    // applied with its answer lost, leaving a reservation nobody will settle (the
    // caller made no call). Ended by `reconcile` once the database answers.
    let mut doubtful: Vec<String> = Vec::new();
    loop {
        let next = if doubtful.is_empty() {
            rx.recv().await
        } else {
            tokio::select! {
                env = rx.recv() => env,
                () = tokio::time::sleep(RECONCILE_EVERY) => {
                    reconcile(&shared, &mut doubtful).await;
                    continue;
                }
            }
        };
        let Some(first) = next else {
            break;
        };
        if last >= GATHER_AFTER {
            // Under load the callers just answered are about to send their next
            // operations from the other threads; a moment's wait lets them join this
            // group instead of trickling into several small ones. This thread has
            // nothing else to do meanwhile; at low load nobody waits.
            std::thread::sleep(GATHER);
        }
        group.push(first);
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(env) => group.push(env),
                Err(_) => break,
            }
        }
        let results = apply_group(&shared, &group).await;
        // A refusal of the operation itself (a budget, an unknown id) says the
        // database answered; only a failure of every operation to reach it does not.
        let reached = results
            .iter()
            .any(|r| !r.as_ref().is_err_and(LedgerError::is_transient));
        shared.writable.store(reached, Ordering::Relaxed);
        for (env, res) in group.iter().zip(&results) {
            if let (Op::Admit { req, .. }, Err(e)) = (&env.op, res)
                && e.is_transient()
                && doubtful.len() < DOUBTFUL_MAX
            {
                doubtful.push(req.id.clone());
            }
        }
        if reached && !doubtful.is_empty() {
            reconcile(&shared, &mut doubtful).await;
        }
        last = group.len();
        for (env, res) in group.drain(..).zip(results) {
            let _ = env.reply.send(res);
        }
    }
}

/// End the doubtful admissions that did commit (`sql::ABANDON`); kept for later when
/// the database cannot be reached.
async fn reconcile(shared: &Shared, doubtful: &mut Vec<String>) {
    let client = match shared.writes.get().await {
        Ok(c) => c,
        Err(_) => return,
    };
    let done = async {
        client.batch_execute(sql::BEGIN_WRITE).await?;
        let st = client.prepare_cached(sql::ABANDON).await?;
        let ended: i64 = client
            .query_one(&st, &[&*doubtful, &ABANDONED, &&*shared.replica])
            .await?
            .try_get(0)?;
        client.batch_execute("COMMIT").await?;
        Ok::<_, tokio_postgres::Error>(ended)
    }
    .await;
    match done {
        Ok(ended) => {
            if ended > 0 {
                tracing::warn!(
                    requests = ended,
                    "admissions whose commit was not confirmed had committed; ended as failed / ledger_unavailable, their reservations given back (no call was made)"
                );
            }
            doubtful.clear();
        }
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            tracing::warn!(error = %e, "cannot yet end admissions whose commit was not confirmed; retrying");
        }
    }
}

async fn apply_group(shared: &Shared, group: &[Envelope]) -> Vec<Result<(), LedgerError>> {
    let client = match shared.writes.get().await {
        Ok(c) => c,
        Err(e) => {
            let why = e.to_string();
            return group
                .iter()
                .map(|_| Err(LedgerError::Unavailable(why.clone())))
                .collect();
        }
    };
    match try_group(&client, &shared.replica, group).await {
        Ok(results) => results,
        // The database could not be reached (or could not commit): every caller is
        // told so. Otherwise one operation failed: each is tried alone.
        Err(e) if e.is_transient() => group.iter().map(|_| Err(clone_err(&e))).collect(),
        Err(spoiled) => {
            tracing::debug!(error = %spoiled, "a group failed; its operations are applied one at a time");
            let mut results = Vec::with_capacity(group.len());
            for env in group {
                let one = std::slice::from_ref(env);
                let r = match try_group(&client, &shared.replica, one).await {
                    Ok(mut r) => r.pop().unwrap_or(Ok(())),
                    Err(e) => Err(e),
                };
                results.push(r);
            }
            results
        }
    }
}

/// A copy of a group-wide failure for each caller.
fn clone_err(e: &LedgerError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

/// Apply `group` in one transaction. `Err` means the transaction was rolled back:
/// nothing in it was applied.
async fn try_group(
    client: &Client,
    replica: &str,
    group: &[Envelope],
) -> Result<Vec<Result<(), LedgerError>>, LedgerError> {
    let ops: Vec<&Op> = group.iter().map(|env| &env.op).collect();
    if !ops.iter().any(|op| batch::reads_first(op)) {
        // The common group: `BEGIN`, its statements and `COMMIT` in one round trip.
        let r = batch::apply(client, replica, &ops, batch::Tx::Whole).await;
        if r.is_err() {
            // The `COMMIT` sent along has already rolled a failed group back; this
            // only makes sure no transaction stays open on a pooled connection.
            let _ = client.batch_execute("ROLLBACK").await;
        }
        return r;
    }
    if let Err(e) = client.batch_execute(sql::BEGIN_WRITE).await {
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(e.into());
    }
    match batch::apply(client, replica, &ops, batch::Tx::Open).await {
        Ok(results) => {
            client.batch_execute("COMMIT").await?;
            Ok(results)
        }
        Err(e) => {
            // A failed rollback leaves a broken connection, which the pool then drops.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}
