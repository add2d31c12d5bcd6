//! The rollups' deltas of one group commit, added up in the writer's memory (#23).
//!
//! The row triggers of migration 0009 upserted two or three rollup rows for every row
//! the writer changed: about a dozen small statements per request, which halved the
//! group commit's throughput. Migration 0012 keeps those triggers for every other
//! connection and path, but they stand aside while the writer's transaction holds its
//! `rollup_batching` row. Then the writer connection's own TEMP triggers (`batched.sql`,
//! created by `Deltas::install` on that connection alone) hand each row's delta (the
//! old row leaving its key, the new row joining its key) to `purser_rollup_attempt` /
//! `purser_rollup_request`, which add it up here by rollup key; the writer writes one
//! upsert per key just before COMMIT, in the same transaction: a group of a thousand
//! requests in one hour and policy writes a handful of rollup rows, not thousands.
//! Every trigger's WHEN is plain SQL, so any connection (an operator's `sqlite3`) can
//! still prepare a write to `requests` or `attempts`.
//!
//! What is added up here belongs to the open transaction only: it is written into that
//! transaction or thrown away with it (`Deltas::close`), never carried to the next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, params_from_iter};

use super::decimal_arg;
use crate::money::Money;

/// Key columns of `attempts_hourly`, in its primary key's order.
const ATTEMPT_KEY: usize = 9;
/// The position of `client` in that key: the lean table's key is the same without it.
const CLIENT: usize = 3;
/// Key columns of `requests_hourly`.
const REQUEST_KEY: usize = 6;

fn arg_count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The writer connection's deltas, shared with the SQL functions registered on it.
/// Only the thread holding the writer's connection touches them, so the lock is never
/// contended; it is a lock because SQLite's functions must be `Send`.
pub(super) struct Deltas {
    pending: Arc<Mutex<Pending>>,
}

#[derive(Default)]
struct Pending {
    /// A transaction of the writer is open: the batched triggers are chosen.
    open: bool,
    /// By encoded `attempts_hourly` key (see `encode`).
    attempts: HashMap<Vec<u8>, Sums>,
    /// By encoded `requests_hourly` key.
    requests: HashMap<Vec<u8>, i64>,
    /// The key being looked up, reused so that a key already present costs no
    /// allocation.
    scratch: Vec<u8>,
}

impl Pending {
    /// Nothing added up; batching (`open`) or not.
    fn reset(&mut self, open: bool) {
        self.attempts.clear();
        self.requests.clear();
        self.open = open;
    }
}

/// What a rollup row gains (or loses): attempts, cost and worst case. Signed.
#[derive(Clone, Copy, Default)]
struct Sums {
    attempts: i64,
    cost: Money,
    worst_case: Money,
}

impl Sums {
    fn add(&mut self, other: Sums) -> rusqlite::Result<()> {
        let overflow = || rusqlite::Error::UserFunctionError("decimal overflow".into());
        self.attempts = self
            .attempts
            .checked_add(other.attempts)
            .ok_or_else(overflow)?;
        self.cost = self.cost.checked_add(other.cost).ok_or_else(overflow)?;
        self.worst_case = self
            .worst_case
            .checked_add(other.worst_case)
            .ok_or_else(overflow)?;
        Ok(())
    }

    fn is_zero(&self) -> bool {
        self.attempts == 0 && self.cost == Money::ZERO && self.worst_case == Money::ZERO
    }
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    // A panic inside a function (caught by rusqlite) leaves the maps as they were
    // between two whole deltas; and they are cleared at the end of every transaction.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Deltas {
    /// Register the functions the batched triggers call on the writer's connection, and
    /// create those TEMP triggers there (`batched.sql`).
    pub(super) fn install(conn: &Connection) -> rusqlite::Result<Deltas> {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let p = pending.clone();
        conn.create_scalar_function(
            "purser_rollup_attempt",
            arg_count(ATTEMPT_KEY + 3),
            FunctionFlags::SQLITE_UTF8,
            move |ctx| note_attempt(&mut lock(&p), ctx).map(|()| true),
        )?;
        let p = pending.clone();
        conn.create_scalar_function(
            "purser_rollup_request",
            arg_count(REQUEST_KEY + 1),
            FunctionFlags::SQLITE_UTF8,
            move |ctx| note_request(&mut lock(&p), ctx).map(|()| true),
        )?;
        conn.execute_batch(include_str!("batched.sql"))?;
        Ok(Deltas { pending })
    }

    /// A transaction of the writer began: batch from now on. The row that makes the
    /// batched triggers fire (and 0012's row triggers stand aside) is the transaction's
    /// own, so it can never outlive it.
    pub(super) fn open(&self, tx: &Connection) -> rusqlite::Result<()> {
        lock(&self.pending).reset(true);
        tx.prepare_cached("INSERT INTO rollup_batching (one) VALUES (1)")?
            .execute([])?;
        Ok(())
    }

    /// The transaction ended, committed or rolled back: whatever is left belongs to
    /// it and goes with it, and the triggers write row by row again.
    pub(super) fn close(&self) {
        lock(&self.pending).reset(false);
    }

    /// Write what the transaction's rows added up to, one statement per key (two for a
    /// key that may have emptied), into the transaction. The deltas are taken: written
    /// once, whatever happens to the transaction next.
    pub(super) fn write(&self, tx: &Connection) -> rusqlite::Result<()> {
        let (attempts, requests) = {
            let mut p = lock(&self.pending);
            if !p.open {
                // Not batching (a transaction of one operation), or written already.
                return Ok(());
            }
            p.open = false;
            (
                std::mem::take(&mut p.attempts),
                std::mem::take(&mut p.requests),
            )
        };
        // Never committed: other connections' writes keep their row triggers, and so
        // does whatever this transaction writes after this point.
        tx.prepare_cached("DELETE FROM rollup_batching")?
            .execute([])?;
        if attempts.is_empty() && requests.is_empty() {
            return Ok(());
        }
        let mut lean: HashMap<Vec<u8>, Sums> = HashMap::with_capacity(attempts.len());
        for (key, sums) in attempts {
            let values = decode(&key)?;
            let mut lean_key = Vec::with_capacity(key.len());
            for (i, v) in values.iter().enumerate() {
                if i != CLIENT {
                    encode(&mut lean_key, value_ref(v));
                }
            }
            lean.entry(lean_key).or_default().add(sums)?;
            write_attempts(tx, &WIDE, values, sums)?;
        }
        for (key, sums) in lean {
            write_attempts(tx, &LEAN, decode(&key)?, sums)?;
        }
        for (key, n) in requests {
            write_requests(tx, decode(&key)?, n)?;
        }
        Ok(())
    }
}

/// `purser_rollup_attempt(sign, hour, provider, policy, client, model, ingress, class,
/// later, billing, cost, worst_case)`: one attempt row joins (`sign` 1) or leaves (-1)
/// its `attempts_hourly` key.
fn note_attempt(p: &mut Pending, ctx: &Context<'_>) -> rusqlite::Result<()> {
    if !p.open {
        return Err(not_batching());
    }
    let sign = sign(ctx)?;
    let (cost, worst_case) = (
        decimal_arg(ctx, ATTEMPT_KEY + 1)?,
        decimal_arg(ctx, ATTEMPT_KEY + 2)?,
    );
    let delta = match sign {
        Sign::Join => Sums {
            attempts: 1,
            cost,
            worst_case,
        },
        Sign::Leave => Sums {
            attempts: -1,
            cost: Money::ZERO - cost,
            worst_case: Money::ZERO - worst_case,
        },
    };
    let Pending {
        attempts, scratch, ..
    } = p;
    scratch.clear();
    for i in 1..=ATTEMPT_KEY {
        encode(scratch, ctx.get_raw(i));
    }
    match attempts.get_mut(scratch.as_slice()) {
        Some(sums) => sums.add(delta),
        None => {
            attempts.insert(scratch.clone(), delta);
            Ok(())
        }
    }
}

/// `purser_rollup_request(sign, hour, policy, client, model, ingress, outcome)`: one
/// request row joins or leaves its `requests_hourly` key.
fn note_request(p: &mut Pending, ctx: &Context<'_>) -> rusqlite::Result<()> {
    if !p.open {
        return Err(not_batching());
    }
    let delta = match sign(ctx)? {
        Sign::Join => 1,
        Sign::Leave => -1,
    };
    let Pending {
        requests, scratch, ..
    } = p;
    scratch.clear();
    for i in 1..=REQUEST_KEY {
        encode(scratch, ctx.get_raw(i));
    }
    match requests.get_mut(scratch.as_slice()) {
        Some(n) => *n = n.saturating_add(delta),
        None => {
            requests.insert(scratch.clone(), delta);
        }
    }
    Ok(())
}

fn not_batching() -> rusqlite::Error {
    rusqlite::Error::UserFunctionError("a rollup delta outside a transaction of the writer".into())
}

enum Sign {
    Join,
    Leave,
}

fn sign(ctx: &Context<'_>) -> rusqlite::Result<Sign> {
    match ctx.get_raw(0) {
        ValueRef::Integer(1) => Ok(Sign::Join),
        ValueRef::Integer(-1) => Ok(Sign::Leave),
        other => Err(rusqlite::Error::UserFunctionError(
            format!("a rollup delta's sign must be 1 or -1, got {other:?}").into(),
        )),
    }
}

/// A key's SQL values as bytes (a type tag, then the value; text and blobs with their
/// length), so the maps hash one buffer and the writer binds the values exactly as the
/// trigger gave them: the same types, so the same rows as 0009's upserts.
fn encode(buf: &mut Vec<u8>, v: ValueRef<'_>) {
    match v {
        ValueRef::Null => buf.push(0),
        ValueRef::Integer(i) => {
            buf.push(1);
            buf.extend_from_slice(&i.to_le_bytes());
        }
        ValueRef::Real(f) => {
            buf.push(2);
            buf.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        ValueRef::Text(t) => {
            buf.push(3);
            buf.extend_from_slice(&(t.len() as u64).to_le_bytes());
            buf.extend_from_slice(t);
        }
        ValueRef::Blob(b) => {
            buf.push(4);
            buf.extend_from_slice(&(b.len() as u64).to_le_bytes());
            buf.extend_from_slice(b);
        }
    }
}

fn value_ref(v: &Value) -> ValueRef<'_> {
    match v {
        Value::Null => ValueRef::Null,
        Value::Integer(i) => ValueRef::Integer(*i),
        Value::Real(f) => ValueRef::Real(*f),
        Value::Text(t) => ValueRef::Text(t.as_bytes()),
        Value::Blob(b) => ValueRef::Blob(b),
    }
}

fn decode(mut buf: &[u8]) -> rusqlite::Result<Vec<Value>> {
    let corrupt = || rusqlite::Error::UserFunctionError("a rollup key in memory is corrupt".into());
    let mut out = Vec::with_capacity(ATTEMPT_KEY);
    while let Some((&tag, rest)) = buf.split_first() {
        let word = |rest: &[u8]| -> rusqlite::Result<(u64, usize)> {
            let bytes: [u8; 8] = rest
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(corrupt)?;
            Ok((u64::from_le_bytes(bytes), 8))
        };
        let (value, used) = match tag {
            0 => (Value::Null, 0),
            1 => {
                let (w, n) = word(rest)?;
                (Value::Integer(w as i64), n)
            }
            2 => {
                let (w, n) = word(rest)?;
                (Value::Real(f64::from_bits(w)), n)
            }
            3 | 4 => {
                let (len, n) = word(rest)?;
                let len = usize::try_from(len).map_err(|_| corrupt())?;
                let bytes = rest.get(n..n + len).ok_or_else(corrupt)?;
                let v = if tag == 3 {
                    Value::Text(String::from_utf8(bytes.to_vec()).map_err(|_| corrupt())?)
                } else {
                    Value::Blob(bytes.to_vec())
                };
                (v, n + len)
            }
            _ => return Err(corrupt()),
        };
        out.push(value);
        buf = rest.get(used..).ok_or_else(corrupt)?;
    }
    Ok(out)
}

/// The statements that apply a key's sums to one attempts rollup: `?1..?k` the key,
/// then attempts, cost and worst case.
struct Table {
    upsert: &'static str,
    update: &'static str,
    delete: &'static str,
}

const WIDE: Table = Table {
    upsert: "INSERT INTO attempts_hourly (hour, provider, policy, client, model, ingress, class, later, billing, attempts, cost, worst_case)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT (hour, provider, policy, client, model, ingress, class, later, billing) DO UPDATE
             SET attempts = attempts + excluded.attempts, cost = dadd(cost, excluded.cost), worst_case = dadd(worst_case, excluded.worst_case)",
    update: "UPDATE attempts_hourly SET attempts = attempts + ?10, cost = dadd(cost, ?11), worst_case = dadd(worst_case, ?12)
             WHERE (hour, provider, policy, client, model, ingress, class, later, billing) = (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    delete: "DELETE FROM attempts_hourly
             WHERE attempts = 0 AND (hour, provider, policy, client, model, ingress, class, later, billing) = (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
};

const LEAN: Table = Table {
    upsert: "INSERT INTO attempts_hourly_lean (hour, provider, policy, model, ingress, class, later, billing, attempts, cost, worst_case)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
             ON CONFLICT (hour, provider, policy, model, ingress, class, later, billing) DO UPDATE
             SET attempts = attempts + excluded.attempts, cost = dadd(cost, excluded.cost), worst_case = dadd(worst_case, excluded.worst_case)",
    update: "UPDATE attempts_hourly_lean SET attempts = attempts + ?9, cost = dadd(cost, ?10), worst_case = dadd(worst_case, ?11)
             WHERE (hour, provider, policy, model, ingress, class, later, billing) = (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    delete: "DELETE FROM attempts_hourly_lean
             WHERE attempts = 0 AND (hour, provider, policy, model, ingress, class, later, billing) = (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
};

/// Apply `sums` to the row of `key`, as 0009's triggers would have row by row: a key
/// that gains attempts is upserted; one that only loses (or only changes its sums) is
/// updated where it exists, and deleted once it counts no attempt.
fn write_attempts(
    tx: &Connection,
    table: &Table,
    key: Vec<Value>,
    sums: Sums,
) -> rusqlite::Result<()> {
    if sums.is_zero() {
        // Rows that joined the key and left it again in the same group.
        return Ok(());
    }
    let n = key.len();
    let mut args = key;
    args.extend([
        Value::Integer(sums.attempts),
        Value::Text(sums.cost.to_string()),
        Value::Text(sums.worst_case.to_string()),
    ]);
    if sums.attempts > 0 {
        tx.prepare_cached(table.upsert)?
            .execute(params_from_iter(&args))?;
        return Ok(());
    }
    tx.prepare_cached(table.update)?
        .execute(params_from_iter(&args))?;
    tx.prepare_cached(table.delete)?
        .execute(params_from_iter(&args[..n]))?;
    Ok(())
}

/// The same for `requests_hourly`.
fn write_requests(tx: &Connection, key: Vec<Value>, n: i64) -> rusqlite::Result<()> {
    if n == 0 {
        return Ok(());
    }
    let mut args = key;
    args.push(Value::Integer(n));
    if n > 0 {
        tx.prepare_cached(
            "INSERT INTO requests_hourly (hour, policy, client, model, ingress, outcome, requests)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (hour, policy, client, model, ingress, outcome) DO UPDATE
             SET requests = requests + excluded.requests",
        )?
        .execute(params_from_iter(&args))?;
        return Ok(());
    }
    tx.prepare_cached(
        "UPDATE requests_hourly SET requests = requests + ?7
         WHERE (hour, policy, client, model, ingress, outcome) = (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params_from_iter(&args))?;
    tx.prepare_cached(
        "DELETE FROM requests_hourly
         WHERE requests = 0 AND (hour, policy, client, model, ingress, outcome) = (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params_from_iter(&args[..REQUEST_KEY]))?;
    Ok(())
}
