//! Time as an injectable edge, so breaker cooldowns and budget windows are testable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub trait Clock: Send + Sync {
    /// Monotonic milliseconds (breakers).
    fn now_ms(&self) -> u64;
    /// Wall-clock time (ledger timestamps, budget windows).
    fn wall(&self) -> time::OffsetDateTime;
}

pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(SystemClock {
            start: Instant::now(),
        })
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
    fn wall(&self) -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc()
    }
}

/// A clock tests move by hand.
pub struct ManualClock {
    ms: AtomicU64,
    wall_start: time::OffsetDateTime,
}

impl ManualClock {
    pub fn new(wall_start: time::OffsetDateTime) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            ms: AtomicU64::new(0),
            wall_start,
        })
    }
    pub fn advance_ms(&self, ms: u64) {
        self.ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::SeqCst)
    }
    fn wall(&self) -> time::OffsetDateTime {
        self.wall_start
            + time::Duration::milliseconds(i64::try_from(self.now_ms()).unwrap_or(i64::MAX))
    }
}
