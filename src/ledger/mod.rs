//! The ledger: the only module that speaks SQL. Every attempt is written before its
//! upstream call and completed after; budgets are reserved and settled atomically.
//!
//! `Ledger` (in `handle`) is the one interface the rest of purser uses, whichever
//! engine holds the ledger: `sqlite` (one file, one process; the default) or
//! `postgres` (shared by several replicas). What is engine-specific lives in those two
//! modules; the types here, the audit filters (`audit`) and the rows (`read`) are
//! shared by both.

pub mod audit;
mod handle;
mod op;
pub mod postgres;
pub mod read;
pub mod recorded;
pub mod sqlite;
mod target;

use std::time::Duration;

use serde::Serialize;

pub use handle::{Ledger, backup, migrate_at, migrate_at_to, settle_at};
pub use op::Op;
pub use sqlite::migrate::{MIGRATIONS, latest as latest_version, migrate_to};
pub use sqlite::{backup_file, connect, settle_file};
pub use target::Target;

use crate::decide::Action;
use crate::failure::{Billing, FailureClass};
use crate::money::Money;
use crate::policy::plan::{Mode, Period};
use crate::pricing::{CacheTokens, CostBasis};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(
        "the ledger database is at schema version {database}, newer than this purser (version {binary}); upgrade purser or use another file"
    )]
    TooNew { database: u32, binary: u32 },
    #[error("migration {name} failed: {source}")]
    Migration {
        name: &'static str,
        source: rusqlite::Error,
    },
    #[error(
        "SQLite rolled the write group back (disk full or I/O error); nothing in it was recorded"
    )]
    RolledBack,
    #[error("the ledger writer has stopped")]
    WriterGone,
    #[error(
        "{period} budget of policy `{policy}` exhausted: limit {}, spent {}, reserved {}, remaining {}, this request needs up to {}", .limit.for_people_default(), .spent.for_people_default(), .reserved.for_people_default(), .remaining.for_people_default(), .needed.for_people_default()
    )]
    BudgetExhausted {
        policy: String,
        period: &'static str,
        limit: Money,
        spent: Money,
        reserved: Money,
        remaining: Money,
        needed: Money,
    },
    #[error("no request `{0}` in the ledger")]
    UnknownRequest(String),
    #[error("request `{request_id}` cannot be settled: {why}")]
    NotSettleable { request_id: String, why: String },
    #[error("invalid stored value: {0}")]
    Corrupt(String),
    #[error("ledger database error: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("PostgreSQL migration {name} failed: {source}")]
    PgMigration {
        name: &'static str,
        source: tokio_postgres::Error,
    },
    #[error("the ledger database cannot be reached: {0}")]
    Unavailable(String),
    #[error(
        "replica id `{0}` is held by a running purser (its lease keeps being renewed); give each replica its own --replica-id"
    )]
    ReplicaInUse(String),
    #[error("{0}")]
    Unsupported(String),
    /// A failover top-up found its request no longer in flight: another replica
    /// recovered it (this one was stalled past its lease) or it was given up. Nothing
    /// more may be reserved or called for it.
    #[error(
        "request `{0}` is no longer in flight in the ledger (recovered or given up while this attempt ran); no further call is made for it"
    )]
    NotInFlight(String),
    /// This replica has not renewed its lease within the lease's length: another may
    /// be recovering its rows, so it admits nothing and calls no alternate until it
    /// renews it.
    #[error(
        "this replica has not renewed its PostgreSQL lease for {0} ms; it admits nothing until it does"
    )]
    LeaseLost(u64),
}

impl LedgerError {
    /// Whether the same operation may succeed if tried again later: the database could
    /// not be reached, was busy, or could not write for now (disk full, I/O). Every
    /// retry in purser asks this, whichever engine answered; refusals of the operation
    /// itself (a budget, an unknown id, a corrupt value) are final.
    pub fn is_transient(&self) -> bool {
        match self {
            LedgerError::Sqlite(e) => sqlite_transient(e),
            LedgerError::Postgres(e) => postgres_transient(e),
            LedgerError::RolledBack | LedgerError::Unavailable(_) | LedgerError::LeaseLost(_) => {
                true
            }
            LedgerError::TooNew { .. }
            | LedgerError::Migration { .. }
            | LedgerError::WriterGone
            | LedgerError::BudgetExhausted { .. }
            | LedgerError::UnknownRequest(_)
            | LedgerError::NotSettleable { .. }
            | LedgerError::Corrupt(_)
            | LedgerError::PgMigration { .. }
            | LedgerError::ReplicaInUse(_)
            | LedgerError::Unsupported(_)
            | LedgerError::NotInFlight(_) => false,
        }
    }
}

impl LedgerError {
    /// Whether the error refuses this one operation and leaves the transaction it ran
    /// in sound: nothing was written for it, or only the record of its refusal (the
    /// refused request row). The rest of its group commits; any other error spoils the
    /// group, which is then redone one operation at a time.
    pub fn is_refusal(&self) -> bool {
        match self {
            LedgerError::BudgetExhausted { .. } | LedgerError::NotInFlight(_) => true,
            LedgerError::Sqlite(_)
            | LedgerError::TooNew { .. }
            | LedgerError::Migration { .. }
            | LedgerError::RolledBack
            | LedgerError::WriterGone
            | LedgerError::UnknownRequest(_)
            | LedgerError::NotSettleable { .. }
            | LedgerError::Corrupt(_)
            | LedgerError::Postgres(_)
            | LedgerError::PgMigration { .. }
            | LedgerError::Unavailable(_)
            | LedgerError::ReplicaInUse(_)
            | LedgerError::Unsupported(_)
            | LedgerError::LeaseLost(_) => false,
        }
    }
}

/// SQLite errors of the environment (locks, disk, I/O, memory), not of the statement.
fn sqlite_transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    let Some(code) = e.sqlite_error_code() else {
        return false;
    };
    // `ErrorCode` is rusqlite's, non-exhaustive: a code it adds later is not assumed to
    // pass by itself.
    matches!(
        code,
        C::DatabaseBusy
            | C::DatabaseLocked
            | C::DiskFull
            | C::SystemIoFailure
            | C::CannotOpen
            | C::OutOfMemory
            | C::ReadOnly
            | C::PermissionDenied
            | C::FileLockingProtocolFailed
            | C::OperationInterrupted
    )
}

/// PostgreSQL errors that say the server could not be reached or could not serve the
/// statement for now: no SQLSTATE (the connection failed), connection exceptions
/// (08), insufficient resources (53), operator intervention such as a restart (57P),
/// and transaction rollbacks a retry resolves (40: serialization, deadlock).
fn postgres_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    let Some(code) = e.code() else {
        return true;
    };
    let c = code.code();
    c.starts_with("08") || c.starts_with("53") || c.starts_with("57P") || c.starts_with("40")
}

/// Durability of each group commit (SQLite `synchronous`, in WAL mode). PostgreSQL
/// commits as its server is configured (`synchronous_commit`); this does not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// Survives a process crash; the last commits may be lost on power loss or an OS
    /// crash, including the row of a call already sent (DESIGN's write-ahead rule then
    /// holds only against process crashes). No fsync per commit.
    Normal,
    /// Survives power loss too: a commit that a call waits on (see
    /// `Op::durable_before_reply`) returns only after the WAL is fsynced, so an attempt
    /// is on disk before its call is sent; a commit that records how a call ended is
    /// fsynced by the next such commit or by the checkpointer within milliseconds.
    Full,
}

/// WAL size past which the checkpointer holds commits back until the WAL can start
/// over (see `sqlite::checkpoint`): 32 MiB, about 8,000 pages.
pub const DEFAULT_WAL_BOUND: u64 = 32 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Options {
    /// SQLite: durability of each group commit.
    pub sync: Sync,
    /// SQLite: bytes of WAL past which a checkpoint blocks commits until the WAL can
    /// start over; checkpoints below it run beside the writer.
    pub wal_bound: u64,
    /// SQLite: upper bound on the database size in pages (a quota; also how tests make
    /// the disk "full").
    pub max_page_count: Option<u64>,
    /// PostgreSQL: this replica's id, stable across its restarts and unique among live
    /// replicas (default: the host name).
    pub replica: Option<String>,
    /// PostgreSQL: how long this replica's lease lasts without renewal; its rows in
    /// flight are recovered by another replica once it has expired.
    pub lease: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sync: Sync::Full,
            wal_bound: DEFAULT_WAL_BOUND,
            max_page_count: None,
            replica: None,
            lease: Duration::from_secs(15),
        }
    }
}

/// A request as admitted.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub id: String,
    pub received_at: time::OffsetDateTime,
    pub client: String,
    pub policy: String,
    pub plan_id: String,
    pub model: String,
    pub mode: Mode,
    pub ceiling: Money,
    pub worst_case: Money,
    /// The client API it came in by.
    pub ingress: crate::ingress::Ingress,
    /// What selection and the ceiling proof used, for `purser replay`; `None` only for
    /// callers that have no request body (tools and tests writing rows directly).
    pub shape: Option<Shape>,
}

/// A request's shape at admission: what selection and the ceiling proof read from it,
/// so that a replay can run it through another plan without its body. Stored in
/// nullable columns: rows written before they existed have no shape, and a replay
/// counts and skips them rather than guessing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Shape {
    /// The input bound at the primary the ceiling proof chose (or, refused at
    /// selection, the smallest bound any candidate had); `None` when no destination
    /// could bound it, or selection never got that far (a model not allowed).
    pub input_tokens: Option<u64>,
    /// The output cap the client asked for, per choice; `None` when it set none (the
    /// policy's `max_output_tokens` applied).
    pub requested_output: Option<u64>,
    /// The per-choice output bound the ceiling was proved with (after any clamp);
    /// `None` when no bound was proved.
    pub output_bound: Option<u64>,
    /// Choices asked for (`n`), at least 1.
    pub choices: u64,
    pub stream: bool,
    /// It declared tools (their framing is in `input_tokens`).
    pub tools: bool,
    /// It carried image, audio, video or file parts (counted in `input_tokens` at the
    /// bound the destination declared, or a stand-in under a soft policy).
    pub media: bool,
    /// It carried a field whose cost no bound counts (admitted only where no proof
    /// was needed).
    pub unbounded: bool,
}

/// A period budget to reserve against.
#[derive(Debug, Clone, Copy)]
pub struct BudgetLimit {
    pub period: Period,
    pub limit: Money,
}

#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub request_id: String,
    pub seq: u32,
    pub provider: String,
    pub upstream_model: String,
    pub jurisdiction: String,
    pub started_at: time::OffsetDateTime,
    pub worst_case: Money,
}

#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub request_id: String,
    pub seq: u32,
    pub finished_at: time::OffsetDateTime,
    pub status: Option<u16>,
    /// `None`: the attempt succeeded.
    pub class: Option<FailureClass>,
    pub billing: Billing,
    pub decision: Decision,
    pub reason: String,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The prompt-cache parts of `input_tokens`, as reported.
    pub cache: CacheTokens,
    pub cost: Money,
    /// How `cost` was reached; `None` when nothing was answered to price.
    pub cost_basis: Option<CostBasis>,
    pub message: Option<String>,
    /// The response the vendor stored, which a later turn may continue from
    /// (`previous_response_id`); `None` for every other answer.
    pub stored: Option<crate::upstream::StoredResponse>,
}

impl AttemptResult {
    /// The class column: `success` or the failure class.
    pub fn class_name(&self) -> &'static str {
        self.class.map_or("success", FailureClass::as_str)
    }
}

/// What followed an attempt, as the ledger's `decision` column records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The attempt's answer went to the client.
    Served,
    /// The decision after a failure.
    After(Action),
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Served => "served",
            Decision::After(a) => a.as_str(),
        }
    }
}

/// How a request ended on its own path, as the gateway records it. The column also
/// holds the states no request ends in by itself: `audit::RequestOutcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Served,
    Refused,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct RequestResult {
    pub request_id: String,
    pub outcome: Outcome,
    pub error_code: Option<String>,
    pub served_by: Option<String>,
    /// Billed cost of all attempts.
    pub cost: Money,
    /// What the budgets are charged: billed cost plus the worst case of every attempt
    /// that may have been billed without proof.
    pub charged: Money,
}

/// UTC window start of `period` containing `t`, as RFC 3339.
pub fn window_start(period: Period, t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let day = match period {
        Period::Day => t.day(),
        Period::Month => 1,
    };
    let mut s = String::with_capacity(20);
    push_date(&mut s, t.year(), u8::from(t.month()), day);
    s.push_str("T00:00:00Z");
    s
}

/// `2026-11-30T12:34:56.789Z`: the ledger's fixed-width UTC timestamp, which sorts as
/// text. Written digit by digit: `format!` with seven padded fields was 8% of the
/// ledger's instructions per request, at three timestamps a request.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let mut s = String::with_capacity(24);
    push_date(&mut s, t.year(), u8::from(t.month()), t.day());
    s.push('T');
    push_digits(&mut s, u32::from(t.hour()), 2);
    s.push(':');
    push_digits(&mut s, u32::from(t.minute()), 2);
    s.push(':');
    push_digits(&mut s, u32::from(t.second()), 2);
    s.push('.');
    push_digits(&mut s, u32::from(t.millisecond()), 3);
    s.push('Z');
    s
}

fn push_date(s: &mut String, year: i32, month: u8, day: u8) {
    // Years before 0 or after 9999 do not occur on a ledger clock; clamp, never panic.
    push_digits(s, year.clamp(0, 9999).unsigned_abs(), 4);
    s.push('-');
    push_digits(s, u32::from(month), 2);
    s.push('-');
    push_digits(s, u32::from(day), 2);
}

/// The last `width` decimal digits of `n`, zero-padded.
fn push_digits(s: &mut String, n: u32, width: u32) {
    for i in (0..width).rev() {
        let d = (n / 10u32.pow(i)) % 10;
        s.push(char::from(b'0' + d as u8));
    }
}

/// A turn whose response the vendor stored, as the ledger recorded it: what bounds the
/// history a later turn continuing from it (`previous_response_id`) is billed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTurn {
    pub request_id: String,
    pub provider: String,
    pub upstream_model: String,
    /// Every input token the turn was billed (its own hidden history included).
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// The output items of its response, each framed as a message when read back.
    pub output_items: u64,
}

/// What start-up recovery found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    pub attempts: usize,
    pub requests: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The digit writer agrees with `format!` on any instant in years 0..=9999.
        #[test]
        fn timestamps_match_the_padded_format(secs in -62_167_219_200i64..253_402_300_799, ms in 0u16..1000) {
            let t = time::OffsetDateTime::from_unix_timestamp(secs)
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                + time::Duration::milliseconds(i64::from(ms));
            let expected = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                t.year(), u8::from(t.month()), t.day(), t.hour(), t.minute(), t.second(), t.millisecond()
            );
            prop_assert_eq!(rfc3339(t), expected);
            let day = format!("{:04}-{:02}-{:02}T00:00:00Z", t.year(), u8::from(t.month()), t.day());
            prop_assert_eq!(window_start(Period::Day, t), day);
            let month = format!("{:04}-{:02}-01T00:00:00Z", t.year(), u8::from(t.month()));
            prop_assert_eq!(window_start(Period::Month, t), month);
        }
    }
}
