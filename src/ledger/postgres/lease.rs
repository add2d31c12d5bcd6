//! Replica leases and recovery. A replica renews its lease every third of its length.
//! Its rows left in flight are recovered by itself at its next start, or by any live
//! replica once the lease has expired, so a replica that never comes back cannot hold
//! budget forever. Recovery is what SQLite does at start: attempts become
//! `interrupted` / `maybe_billed` at their worst case, and what the requests held
//! moves from `reserved` to `spent` until an operator settles them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{Client, Pool};

use super::{Replica, client, later, sql};
use crate::ledger::{LedgerError, Recovered};

const RECOVERED_HERE: &str =
    "this replica stopped while this attempt was in flight; the upstream may have billed it";
const RECOVERED_ELSEWHERE: &str = "its replica stopped renewing its lease while this attempt was in flight; recovered by another replica; the upstream may have billed it";

/// Until when this process holds its lease, as far as it can know: the instant its
/// last successful renewal was *sent*, plus the lease's length (the database may have
/// renewed it later than that, never earlier). Past it another replica may be
/// recovering this one's rows, so it admits nothing and tops nothing up.
pub struct Held {
    epoch: Instant,
    lease: Duration,
    /// Milliseconds after `epoch`; 0 until the lease is first taken.
    until_ms: AtomicU64,
}

impl Held {
    pub fn new(lease: Duration) -> Held {
        Held {
            epoch: Instant::now(),
            lease,
            until_ms: AtomicU64::new(0),
        }
    }

    fn renewed(&self, sent: Instant) {
        let until = sent.saturating_duration_since(self.epoch) + self.lease;
        let ms = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.until_ms.fetch_max(ms, Ordering::SeqCst);
    }

    /// `Err(LeaseLost)` once the lease may have run out.
    pub fn check(&self) -> Result<(), LedgerError> {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let until = self.until_ms.load(Ordering::SeqCst);
        if now < until {
            Ok(())
        } else {
            let lease = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
            // Since the last renewal that counted was sent.
            Err(LedgerError::LeaseLost(
                now.saturating_sub(until.saturating_sub(lease)),
            ))
        }
    }
}

fn lease_ms(r: &Replica) -> i64 {
    i64::try_from(r.lease.as_millis()).unwrap_or(i64::MAX)
}

/// Take the replica id (waiting out a previous process's lease, which a crash leaves
/// behind) and recover that process's rows.
pub async fn start(
    pool: &Pool,
    r: &Replica,
    instance: &str,
    held: &Held,
) -> Result<Recovered, LedgerError> {
    let c = client(pool).await?;
    let claim = c.prepare_cached(sql::CLAIM).await?;
    // Waiting one lease and a bit is enough for a dead process's lease to run out; a
    // lease still renewed after that belongs to a live process using the same id.
    let deadline = tokio::time::Instant::now() + r.lease + r.lease / 2 + Duration::from_millis(200);
    let mut warned = false;
    loop {
        let sent = Instant::now();
        if c.query_opt(&claim, &[&r.id, &instance, &lease_ms(r)])
            .await?
            .is_some()
        {
            held.renewed(sent);
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LedgerError::ReplicaInUse(r.id.clone()));
        }
        if !warned {
            tracing::info!(replica = %r.id, lease_ms = lease_ms(r), "waiting for the lease of this replica id's previous process to expire");
            warned = true;
        }
        tokio::time::sleep((r.lease / 10).max(Duration::from_millis(20))).await;
    }
    recover(&c, &r.id, RECOVERED_HERE, false).await
}

/// Interrupt `replica`'s in-flight rows in one transaction; with `take_over`, only if
/// its lease has still expired when the transaction claims it.
async fn recover(
    c: &Client,
    replica: &str,
    reason: &str,
    take_over: bool,
) -> Result<Recovered, LedgerError> {
    c.batch_execute("BEGIN").await?;
    let result = async {
        c.batch_execute(sql::COMMIT_ORDER).await?;
        if take_over {
            let st = c.prepare_cached(sql::TAKE_OVER).await?;
            if c.query_opt(&st, &[&replica]).await?.is_none() {
                return Ok(Recovered::default());
            }
        }
        let st = c.prepare_cached(sql::INTERRUPT_ATTEMPTS_OF).await?;
        let attempts = c.execute(&st, &[&replica, &reason]).await?;
        let st = c.prepare_cached(sql::IN_FLIGHT_OF).await?;
        let ids: Vec<String> = c
            .query(&st, &[&replica])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        let (_, requests) = later::interrupt(c, &ids, reason).await?;
        Ok::<_, LedgerError>(Recovered {
            attempts: usize::try_from(attempts).unwrap_or(usize::MAX),
            requests: usize::try_from(requests).unwrap_or(usize::MAX),
        })
    }
    .await;
    match result {
        Ok(r) => {
            c.batch_execute("COMMIT").await?;
            Ok(r)
        }
        Err(e) => {
            let _ = c.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// Renew the lease, and recover replicas whose lease has expired, until aborted. `pool`
/// is the lease's own (one connection): a renewal must never wait behind reads such as
/// a long CSV export, or the lease lapses under a healthy database.
pub async fn keep(
    pool: Pool,
    r: Replica,
    instance: std::sync::Arc<str>,
    held: std::sync::Arc<Held>,
) {
    let every = (r.lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        // A renewal that hangs (a database cut without a reset) must not hold up the
        // next: the lease lapses locally meanwhile, and admission stops.
        match tokio::time::timeout(every, renew(&pool, &r, &instance, &held)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, replica = %r.id, "cannot renew the replica lease; admitting nothing until it is renewed");
                continue;
            }
            Err(_) => {
                tracing::warn!(replica = %r.id, "the replica lease renewal did not answer in time; admitting nothing until it is renewed");
                continue;
            }
        }
        if let Err(e) = recover_dead(&pool, &r).await {
            tracing::warn!(error = %e, replica = %r.id, "cannot recover replicas whose lease expired");
        }
    }
}

async fn renew(pool: &Pool, r: &Replica, instance: &str, held: &Held) -> Result<(), LedgerError> {
    let c = client(pool).await?;
    let renew = c.prepare_cached(sql::RENEW).await?;
    let sent = Instant::now();
    if c.execute(&renew, &[&r.id, &instance, &lease_ms(r)]).await? == 1 {
        held.renewed(sent);
        return Ok(());
    }
    // This process was stalled past its lease and another replica recovered its
    // rows. Its later results still land (see `sql::FINISH_ATTEMPTS`); a top-up for
    // a recovered request is refused (`NotInFlight`). Take the id back.
    tracing::error!(replica = %r.id, "this replica's lease expired while it ran; another replica recovered its rows in flight");
    let claim = c.prepare_cached(sql::CLAIM).await?;
    let sent = Instant::now();
    if c.query_opt(&claim, &[&r.id, &instance, &lease_ms(r)])
        .await?
        .is_some()
    {
        held.renewed(sent);
    }
    Ok(())
}

async fn recover_dead(pool: &Pool, r: &Replica) -> Result<(), LedgerError> {
    let c = client(pool).await?;
    let expired = c.prepare_cached(sql::EXPIRED).await?;
    let dead: Vec<String> = c
        .query(&expired, &[&r.id])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    for id in dead {
        let rec = recover(&c, &id, RECOVERED_ELSEWHERE, true).await?;
        if rec.attempts > 0 || rec.requests > 0 {
            tracing::warn!(
                dead_replica = %id,
                attempts = rec.attempts,
                requests = rec.requests,
                "recovered the rows a replica with an expired lease left in flight; they are interrupted / maybe_billed, charged at worst case; settle them with `purser settle`"
            );
        }
    }
    Ok(())
}
