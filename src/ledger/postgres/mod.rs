//! The ledger on PostgreSQL, shared by several purser replicas.
//!
//! Budgets are kept in the database only (no copy in memory: another replica may
//! change them at any time) and every change to them is one conditional statement
//! (`sql`). Each replica writes through one group-commit task (`writer`) and keeps a
//! lease (`lease`): rows it leaves in flight carry its id, and are recovered by it at
//! restart, or by any live replica once its lease has expired.

mod batch;
mod later;
mod lease;
mod migrate;
pub mod read;
pub mod recorded;
mod rollup;
pub mod series;
mod sql;
mod window;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::NoTls;

pub use migrate::{MIGRATIONS, latest as latest_version};
pub use window::window_start_at;

use super::{AttemptResult, LedgerError, Op, Recovered};

/// How this replica identifies itself and how long its lease lasts.
#[derive(Debug, Clone)]
pub struct Replica {
    pub id: String,
    pub lease: Duration,
}

/// The writing side of one replica, and the pool its reads use.
pub struct Store {
    shared: Arc<writer::Shared>,
    queue: Option<mpsc::UnboundedSender<writer::Envelope>>,
    /// Renews the lease and recovers dead replicas; stopped with the store.
    lease_task: Option<tokio::task::JoinHandle<()>>,
    /// Until when this replica holds its lease; `None` for a reader (no lease).
    lease: Option<Arc<lease::Held>>,
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(t) = &self.lease_task {
            t.abort();
        }
    }
}

/// Connections for reads.
const READ_CONNECTIONS: usize = 8;
/// The writer uses one at a time; a second stands by while a broken one is replaced.
const WRITE_CONNECTIONS: usize = 2;

/// A pool on `url` that fails fast: a ledger that cannot be reached must turn a
/// request into a 503 within seconds, not hang it.
fn pool(url: &str, size: usize) -> Result<Pool, LedgerError> {
    let mut cfg: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
        LedgerError::Unavailable(format!("invalid PostgreSQL URL: {e}"))
    })?;
    cfg.connect_timeout(Duration::from_secs(3));
    cfg.application_name("purser");
    let mgr = Manager::from_config(
        cfg,
        NoTls,
        ManagerConfig {
            // A closed connection is noticed without a query; a half-dead one fails its
            // group, which then reports the ledger unavailable, and is replaced.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(3)))
        .create_timeout(Some(Duration::from_secs(3)))
        .recycle_timeout(Some(Duration::from_secs(3)))
        .build()
        .map_err(|e| LedgerError::Unavailable(e.to_string()))
}

async fn client(pool: &Pool) -> Result<deadpool_postgres::Client, LedgerError> {
    pool.get()
        .await
        .map_err(|e| LedgerError::Unavailable(format!("PostgreSQL: {e}")))
}

impl Store {
    /// Connect, migrate, take this replica's lease (waiting out the previous
    /// process's, after a crash) and recover what that process left in flight.
    pub async fn open(url: &str, replica: Replica) -> Result<(Store, Recovered), LedgerError> {
        let pool = pool(url, READ_CONNECTIONS)?;
        {
            let mut c = client(&pool).await?;
            migrate::migrate(&mut c).await?;
        }
        let instance: Arc<str> = ulid::Ulid::generate().to_string().into();
        // The lease on a connection of its own: renewing it never waits for a read.
        let lease_pool = self::pool(url, 1)?;
        let held = Arc::new(lease::Held::new(replica.lease));
        let recovered = lease::start(&lease_pool, &replica, &instance, &held).await?;
        let shared = Arc::new(writer::Shared {
            pool: pool.clone(),
            writes: self::pool(url, WRITE_CONNECTIONS)?,
            replica: replica.id.clone().into(),
            writable: AtomicBool::new(true),
        });
        let queue = writer::spawn(shared.clone())?;
        let lease_task = tokio::spawn(lease::keep(lease_pool, replica, instance, held.clone()));
        Ok((
            Store {
                shared,
                queue: Some(queue),
                lease_task: Some(lease_task),
                lease: Some(held),
            },
            recovered,
        ))
    }

    /// Reads (and operator settlement) only: no lease, no recovery, no migration;
    /// the schema must be this binary's.
    pub async fn open_reader(url: &str) -> Result<Store, LedgerError> {
        let pool = pool(url, READ_CONNECTIONS)?;
        let version = migrate::current_version(&client(&pool).await?).await?;
        if version != migrate::latest() {
            return Err(LedgerError::Corrupt(format!(
                "the ledger is at schema version {version}, this purser expects {}; run `purser migrate` on it first",
                migrate::latest()
            )));
        }
        Ok(Store {
            shared: Arc::new(writer::Shared {
                pool,
                writes: self::pool(url, WRITE_CONNECTIONS)?,
                replica: "reader".into(),
                writable: AtomicBool::new(true),
            }),
            queue: None,
            lease_task: None,
            lease: None,
        })
    }

    /// Apply the migrations and stop (`purser migrate`).
    pub async fn migrate(url: &str) -> Result<u32, LedgerError> {
        let pool = pool(url, 1)?;
        let mut c = client(&pool).await?;
        migrate::migrate(&mut c).await
    }

    /// Apply the migrations up to `version` and stop.
    pub async fn migrate_to(url: &str, version: u32) -> Result<u32, LedgerError> {
        let pool = pool(url, 1)?;
        let mut c = client(&pool).await?;
        migrate::migrate_to(&mut c, version).await
    }

    /// Whether the last group reached PostgreSQL and this replica holds its lease.
    pub fn writable(&self) -> bool {
        self.shared.writable.load(Ordering::Relaxed)
            && self.lease.as_ref().is_none_or(|l| l.check().is_ok())
    }

    pub async fn call(&self, op: Op) -> Result<(), LedgerError> {
        // Without its lease a replica admits nothing and calls no alternate: another
        // may be recovering its rows (DESIGN 5). Finishing what it has is still right:
        // the vendor's answer is better knowledge than recovery's worst case.
        if let Some(held) = &self.lease {
            match &op {
                Op::Admit { .. } | Op::TopUp { .. } => held.check()?,
                Op::Refusal { .. }
                | Op::BeginAttempt(_)
                | Op::FinishAttempt(_)
                | Op::FinishRequest(_)
                | Op::Finish(..)
                | Op::Settle { .. }
                | Op::Interrupt { .. }
                | Op::ReseedWindows { .. }
                | Op::Probe => {}
            }
        }
        let Some(queue) = &self.queue else {
            return self.call_alone(op).await;
        };
        let (reply, rx) = oneshot::channel();
        queue
            .send(writer::Envelope { op, reply })
            .map_err(|_| LedgerError::WriterGone)?;
        rx.await.map_err(|_| LedgerError::WriterGone)?
    }

    /// A store opened for reading applies an operator's operation in a group of one.
    async fn call_alone(&self, op: Op) -> Result<(), LedgerError> {
        let (reply, rx) = oneshot::channel();
        let queue = writer::spawn(self.shared.clone())?;
        queue
            .send(writer::Envelope { op, reply })
            .map_err(|_| LedgerError::WriterGone)?;
        rx.await.map_err(|_| LedgerError::WriterGone)?
    }

    pub async fn reader(&self) -> Result<deadpool_postgres::Client, LedgerError> {
        client(&self.shared.pool).await
    }
}

/// The attempt columns that are typed in purser and text in SQL.
pub(crate) struct AttemptColumns {
    pub class: &'static str,
    pub decision: &'static str,
    pub cost_basis: Option<&'static str>,
}

impl AttemptColumns {
    pub fn of(r: &AttemptResult) -> AttemptColumns {
        AttemptColumns {
            class: r.class_name(),
            decision: r.decision.as_str(),
            cost_basis: r.cost_basis.map(crate::pricing::CostBasis::as_str),
        }
    }
}
