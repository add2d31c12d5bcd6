//! The ledger's floor: the least a write-ahead ledger on SQLite costs per request on
//! this machine's disk, whatever its schema. Each request is two transactions, as
//! DESIGN's write-ahead rule needs: one inserting the request and its attempt, fsynced
//! before the call (`synchronous = FULL`), and one recording how it ended, written to
//! the OS only (`NORMAL`; the next fsync covers it). Two bare tables keyed by their
//! primary keys: no other index, no budget, no rollup, no trigger. The WAL is reused
//! as purser's is (a `RESTART` checkpoint every 256 groups, and at least every 5,120
//! requests so that groups of 1,024 reuse it too), so no fsync also writes a new file
//! size.
//!
//! It prints:
//! - one request at a time (purser at c = 1): the time and CPU its two commits take,
//!   and, given the disk's fsync time, how far beyond one fsync that time is;
//! - groups of 20 (purser's group commits at c = 64), of 64 (the most c = 64 can make:
//!   a group holds at most one admission per request in flight) and of 1,024 (what
//!   grouping tends to): CPU per request.
//!
//! Issue #23's aims leave purser the floor + one fsync + 0.10 ms at p50 at c = 1, and
//! half the floor's CPU at c = 64; this says how much of that the write-ahead alone takes.
//! Run: cargo run --release --example ledger-floor [DIR [FSYNC_P50_MS]]
//! (benches/gateway.sh runs it in the ledger's directory with the fsync p50 it measured
//! there, `benches/harness/lib/fsync.py`, the figure the aims use; DIR defaults to the
//! current one)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

/// This thread's CPU time, user and system (`/proc/thread-self/schedstat`, ns).
fn cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(s.split_whitespace().next().unwrap().parse().unwrap())
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn open(dir: &std::path::Path) -> Connection {
    let c = Connection::open(dir.join("floor.db")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
         CREATE TABLE requests (id TEXT PRIMARY KEY, received_at TEXT NOT NULL, policy TEXT NOT NULL,
                                outcome TEXT NOT NULL, cost TEXT NOT NULL) WITHOUT ROWID;
         CREATE TABLE attempts (request_id TEXT NOT NULL, seq INTEGER NOT NULL, provider TEXT NOT NULL,
                                started_at TEXT NOT NULL, billing TEXT NOT NULL, cost TEXT NOT NULL,
                                PRIMARY KEY (request_id, seq)) WITHOUT ROWID;",
    )
    .unwrap();
    // A ledger that is not new: its B-trees have depth, its pages are cached.
    c.execute_batch("BEGIN").unwrap();
    for k in 0..30_000 {
        c.prepare_cached(
            "INSERT INTO requests VALUES (?1, '2026-12-02T04:00:00.000Z', 'bench', 'served', '0')",
        )
        .unwrap()
        .execute(params![format!("00WARM{k:020}")])
        .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
    restart(&c);
    c
}

fn run(c: &Connection, sql: &str) {
    c.prepare_cached(sql).unwrap().execute([]).unwrap();
}

fn restart(c: &Connection) {
    c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
}

/// One transaction after `synchronous` (its PRAGMA) running each statement once for each
/// request in `ids`.
fn commit(c: &Connection, synchronous: &str, ids: std::ops::Range<usize>, statements: [&str; 2]) {
    run(c, synchronous);
    run(c, "BEGIN IMMEDIATE");
    for k in ids {
        let id = format!("01JREQ{k:020}");
        for sql in statements {
            c.prepare_cached(sql).unwrap().execute(params![id]).unwrap();
        }
    }
    run(c, "COMMIT");
}

/// `n` requests in groups of `group`; each group's two commits timed together.
/// Returns (CPU per request, the groups' times sorted).
fn requests(c: &Connection, first: usize, n: usize, group: usize) -> (Duration, Vec<Duration>) {
    let mut times = Vec::with_capacity(n / group);
    let start = cpu();
    for (g, at) in (first..first + n).step_by(group).enumerate() {
        let t = Instant::now();
        // Admission: the request and its attempt, fsynced before the call.
        commit(
            c,
            "PRAGMA synchronous = FULL",
            at..at + group,
            [
                "INSERT INTO requests VALUES (?1, '2026-12-02T04:00:00.000Z', 'bench', 'in_flight', '0')",
                "INSERT INTO attempts VALUES (?1, 1, 'p', '2026-12-02T04:00:00.000Z', 'maybe_billed', '0')",
            ],
        );
        // The ending: written to the OS; the next fsync makes it durable.
        commit(
            c,
            "PRAGMA synchronous = NORMAL",
            at..at + group,
            [
                "UPDATE attempts SET billing = 'billed', cost = '0.000123' WHERE request_id = ?1 AND seq = 1",
                "UPDATE requests SET outcome = 'served', cost = '0.000123' WHERE id = ?1",
            ],
        );
        times.push(t.elapsed());
        // 256 groups of 20 is 5,120 requests; larger groups restart by requests.
        if g % 256 == 255 || (g + 1) * group % 5_120 < group {
            restart(c);
        }
    }
    let per = (cpu() - start) / u32::try_from(n).unwrap();
    times.sort();
    (per, times)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| ".".into());
    let fsync_p50: Option<f64> = args
        .next()
        .filter(|a| !a.is_empty())
        .map(|a| a.parse().unwrap());
    let dir = tempfile::tempdir_in(base).unwrap();
    let c = open(dir.path());
    println!(
        "ledger floor (two bare tables, two commits per request, one fsync), {}",
        dir.path().display()
    );
    // Rounds interleaved: this machine's disk and neighbours are noisy.
    const GROUPS: [usize; 3] = [20, 64, 1024];
    let (mut one, mut grouped) = (Vec::new(), GROUPS.map(|_| Vec::new()));
    let mut next = 0;
    for _ in 0..3 {
        let (cpu1, t1) = requests(&c, next, 10_000, 1);
        next += 10_000;
        one.push((cpu1, quantile(&t1, 0.5), quantile(&t1, 0.99)));
        for (size, cpus) in GROUPS.iter().zip(grouped.iter_mut()) {
            let (per, _) = requests(&c, next, 40_960, *size);
            next += 40_960;
            cpus.push(per);
        }
    }
    one.sort_by(|a, b| a.1.total_cmp(&b.1));
    for cpus in &mut grouped {
        cpus.sort();
    }
    let (cpu1, p50, p99) = one[1];
    println!(
        "  one request at a time: p50 {p50:.3} ms, p99 {p99:.3} ms, {:.0} µs CPU per request",
        cpu1.as_secs_f64() * 1e6
    );
    if let Some(f50) = fsync_p50 {
        println!(
            "    beyond one fsync (p50 {f50:.3} ms): {:.3} ms at p50 (issue #23 leaves purser 0.10 ms over the floor and one fsync)",
            p50 - f50
        );
    }
    for (size, cpus) in GROUPS.iter().zip(&grouped) {
        println!(
            "  groups of {size}: {:.1} µs CPU per request (median of 3 rounds)",
            cpus[1].as_secs_f64() * 1e6
        );
    }
}
