//! Per-destination circuit breakers. Provider-fault classes count toward opening one;
//! client-fault classes never do, and an open circuit never re-trips itself.
//!
//! One small mutex per destination, held for a few comparisons: no lock is shared
//! between destinations and none is held across an await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::failure::FailureClass;
use crate::ids::ProviderId;
use crate::policy::plan::{CircuitConfig, Plan};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
enum Inner {
    /// Times (ms) of recent provider-fault failures inside the window.
    Closed(VecDeque<u64>),
    Open {
        until_ms: u64,
    },
    HalfOpen {
        probe_out: bool,
    },
}

#[derive(Debug)]
pub struct Breaker {
    config: CircuitConfig,
    inner: Mutex<Inner>,
}

/// What the breaker allows for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    Call,
    /// Half-open: this call is the single probe that decides.
    Probe,
    Rejected,
}

impl Breaker {
    pub fn new(config: CircuitConfig) -> Self {
        Breaker {
            config,
            inner: Mutex::new(Inner::Closed(VecDeque::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the state inconsistent (every
        // update is a single assignment), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self, now_ms: u64) -> State {
        match &*self.lock() {
            Inner::Closed(_) => State::Closed,
            Inner::Open { until_ms } if now_ms >= *until_ms => State::HalfOpen,
            Inner::Open { .. } => State::Open,
            Inner::HalfOpen { .. } => State::HalfOpen,
        }
    }

    /// Whether a call would be rejected now (selection skips such destinations).
    pub fn is_open(&self, now_ms: u64) -> bool {
        match &*self.lock() {
            Inner::Closed(_) => false,
            Inner::Open { until_ms } => now_ms < *until_ms,
            Inner::HalfOpen { probe_out } => *probe_out,
        }
    }

    /// Ask to make a call; a half-open breaker lets exactly one probe through.
    pub fn acquire(&self, now_ms: u64) -> Permit {
        let mut g = self.lock();
        match &mut *g {
            Inner::Closed(_) => Permit::Call,
            Inner::Open { until_ms } if now_ms < *until_ms => Permit::Rejected,
            Inner::Open { .. } => {
                *g = Inner::HalfOpen { probe_out: true };
                Permit::Probe
            }
            Inner::HalfOpen { probe_out: true } => Permit::Rejected,
            Inner::HalfOpen { probe_out } => {
                *probe_out = true;
                Permit::Probe
            }
        }
    }

    /// A probe that ended without an answer to judge by (its task died): let the next
    /// call probe instead, so the provider is never left half-open with no probe out.
    pub fn release_probe(&self) {
        if let Inner::HalfOpen { probe_out } = &mut *self.lock() {
            *probe_out = false;
        }
    }

    /// Record how a permitted call ended: `None` for success.
    pub fn record(&self, class: Option<FailureClass>, now_ms: u64) {
        let trips = class.is_some_and(FailureClass::trips_circuit);
        let cooldown = self.config.cooldown_s.saturating_mul(1000);
        let window = self.config.window_s.saturating_mul(1000);
        let mut g = self.lock();
        match &mut *g {
            Inner::Closed(fails) => {
                if trips {
                    fails.push_back(now_ms);
                    while fails
                        .front()
                        .is_some_and(|t| now_ms.saturating_sub(*t) >= window)
                    {
                        fails.pop_front();
                    }
                    if fails.len() >= self.config.failures as usize {
                        *g = Inner::Open {
                            until_ms: now_ms.saturating_add(cooldown),
                        };
                    }
                }
            }
            // The probe decides: a provider fault reopens, any real answer closes (an
            // upstream that says "bad request" is up).
            Inner::HalfOpen { .. } | Inner::Open { .. } => {
                if trips {
                    *g = Inner::Open {
                        until_ms: now_ms.saturating_add(cooldown),
                    };
                } else if class != Some(FailureClass::CircuitOpen) {
                    *g = Inner::Closed(VecDeque::new());
                }
            }
        }
    }
}

/// The breakers of every destination of a plan, kept across plan reloads by id.
pub struct Breakers {
    clock: Arc<dyn Clock>,
    map: HashMap<ProviderId, Arc<Breaker>>,
}

impl Breakers {
    pub fn for_plan(plan: &Plan, clock: Arc<dyn Clock>, previous: Option<&Breakers>) -> Breakers {
        let map = plan
            .providers()
            .map(|p| {
                let b = previous
                    .and_then(|prev| prev.map.get(&p.id))
                    .filter(|b| b.config == p.circuit)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Breaker::new(p.circuit)));
                (p.id.clone(), b)
            })
            .collect();
        Breakers { clock, map }
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn get(&self, id: &ProviderId) -> Option<&Arc<Breaker>> {
        self.map.get(id)
    }

    pub fn is_open(&self, id: &ProviderId) -> bool {
        self.map
            .get(id)
            .is_some_and(|b| b.is_open(self.clock.now_ms()))
    }

    pub fn states(&self) -> impl Iterator<Item = (&ProviderId, State)> {
        let now = self.clock.now_ms();
        self.map.iter().map(move |(k, b)| (k, b.state(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CircuitConfig {
        CircuitConfig {
            failures: 3,
            window_s: 10,
            cooldown_s: 5,
        }
    }

    #[test]
    fn opens_after_n_provider_faults_in_window() {
        let b = Breaker::new(cfg());
        b.record(Some(FailureClass::ServerError), 0);
        b.record(Some(FailureClass::Timeout), 1_000);
        assert_eq!(b.state(1_000), State::Closed);
        b.record(Some(FailureClass::RateLimited), 2_000);
        assert_eq!(b.state(2_000), State::Open);
        assert_eq!(b.acquire(3_000), Permit::Rejected);
    }

    #[test]
    fn old_failures_leave_the_window() {
        let b = Breaker::new(cfg());
        b.record(Some(FailureClass::ServerError), 0);
        b.record(Some(FailureClass::ServerError), 1_000);
        b.record(Some(FailureClass::ServerError), 20_000);
        assert_eq!(b.state(20_000), State::Closed);
    }

    #[test]
    fn client_faults_and_circuit_open_never_count() {
        let b = Breaker::new(cfg());
        for _ in 0..10 {
            for c in [
                FailureClass::Auth,
                FailureClass::Malformed,
                FailureClass::ContentRefusal,
                FailureClass::ContextLength,
                FailureClass::ModelNotFound,
                FailureClass::CircuitOpen,
            ] {
                b.record(Some(c), 0);
            }
        }
        assert_eq!(b.state(0), State::Closed);
    }

    #[test]
    fn half_open_lets_one_probe_which_decides() {
        let b = Breaker::new(cfg());
        for t in 0..3 {
            b.record(Some(FailureClass::Overloaded), t);
        }
        assert!(b.is_open(4_000));
        assert!(!b.is_open(5_002));
        assert_eq!(b.acquire(5_002), Permit::Probe);
        assert_eq!(b.acquire(5_003), Permit::Rejected);
        assert!(b.is_open(5_003));
        b.record(Some(FailureClass::ServerError), 5_004);
        assert_eq!(b.state(5_005), State::Open);
        assert_eq!(b.acquire(10_004), Permit::Probe);
        b.record(None, 10_005);
        assert_eq!(b.state(10_005), State::Closed);
        assert_eq!(b.acquire(10_006), Permit::Call);
    }
}
