//! The end of every attempt, counted and written in one place — a plain answer, a
//! failure and the tail of a stream all come here — and the guard that keeps a
//! request from staying `in_flight` while the process lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};

use super::attempt::Bill;
use super::{Engine, GatewayError, LedgerStage};
use crate::decide::Action;
use crate::failure::{Billing, FailureClass};
use crate::ledger::{self, AttemptResult, Decision, Ledger, RequestResult};
use crate::money::Money;
use crate::policy::plan::Destination;
use crate::pricing::Charge;

/// How an attempt ended: served with its answer priced, or failed with its class and
/// bill. A success with no charge, or a failure with no class, cannot be written.
pub enum Verdict {
    /// The answer went to the client, priced at its usage.
    Served(Charge),
    Failed {
        class: FailureClass,
        bill: Bill,
        /// What the decision did next.
        decision: Action,
        /// The upstream's words, truncated and redacted.
        message: String,
    },
}

/// One attempt as it ended.
pub struct Ended<'a> {
    pub seq: u32,
    pub dest: &'a Destination,
    /// What the attempt could have cost: charged when it may have been billed.
    pub worst: Money,
    /// When the call was sent; `None` when none was made.
    pub sent: Option<Instant>,
    pub status: Option<u16>,
    pub verdict: Verdict,
    pub reason: String,
    /// The response the vendor stored for a later turn (Responses API).
    pub stored: Option<crate::upstream::StoredResponse>,
}

/// How the request ends, written with its last attempt.
pub struct Closing {
    pub outcome: ledger::Outcome,
    pub served_by: Option<String>,
    pub error_code: Option<String>,
}

/// The request's running totals and its in-flight guard.
pub struct Recorder {
    engine: Arc<Engine>,
    request_id: String,
    currency: String,
    billed: Money,
    charged: Money,
    pending: Pending,
    client: ClientWatch,
}

impl Recorder {
    pub fn new(
        engine: Arc<Engine>,
        request_id: &str,
        currency: &str,
        pending: Pending,
        client: ClientWatch,
    ) -> Recorder {
        Recorder {
            engine,
            request_id: request_id.to_string(),
            currency: currency.to_string(),
            billed: Money::ZERO,
            charged: Money::ZERO,
            pending,
            client,
        }
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The engine clock's monotonic milliseconds (breakers).
    pub fn now_ms(&self) -> u64 {
        self.engine.clock.now_ms()
    }

    /// The client stopped reading the answer (a stream it hung up on).
    pub fn client_left(&self) {
        self.client.gone.store(true, Ordering::Relaxed);
    }

    /// Billed cost of the attempts recorded so far.
    pub fn billed(&self) -> Money {
        self.billed
    }

    /// What the budgets are charged so far: billed cost plus the worst case of every
    /// attempt that may have been billed without a receipt.
    pub fn charged(&self) -> Money {
        self.charged
    }

    /// Count the attempt (metrics, trace, the request's totals) and write it; with
    /// `closing`, the request ends in the same commit and stops being in flight.
    pub async fn record(
        &mut self,
        e: Ended<'_>,
        closing: Option<Closing>,
    ) -> Result<(), GatewayError> {
        let engine = &self.engine;
        let provider = e.dest.provider.as_str();
        let (class, billing, charge, decision, message) = match e.verdict {
            Verdict::Served(c) => (None, Billing::Billed, Some(c), Decision::Served, None),
            Verdict::Failed {
                class,
                bill,
                decision,
                message,
            } => {
                let charge = match bill {
                    Bill::Billed(c) => Some(c),
                    Bill::MaybeBilled | Bill::NotBilled => None,
                };
                (
                    Some(class),
                    bill.billing(),
                    charge,
                    Decision::After(decision),
                    Some(message),
                )
            }
        };
        let class_name = class.map_or("success", FailureClass::as_str);
        engine
            .metrics
            .attempt(provider, class_name, e.sent.map(|s| s.elapsed()));
        let cost = charge.map_or(Money::ZERO, |c| c.cost);
        if let Some(c) = charge {
            engine.metrics.priced(provider, c.basis.as_str());
        }
        if cost.is_positive() {
            engine.metrics.spend(provider, &self.currency, cost);
        }
        self.billed = self.billed + cost;
        self.charged = self.charged
            + match billing {
                Billing::Billed => cost,
                Billing::MaybeBilled => e.worst,
                Billing::NotBilled => Money::ZERO,
            };
        tracing::info!(seq = e.seq, provider, class = class_name, status = e.status, %cost, decision = decision.as_str(), reason = %e.reason, "attempt");
        let attempt = AttemptResult {
            request_id: self.request_id.clone(),
            seq: e.seq,
            finished_at: engine.clock.wall(),
            status: e.status,
            class,
            billing,
            decision,
            reason: e.reason,
            input_tokens: charge.and_then(|c| c.input_tokens),
            output_tokens: charge.and_then(|c| c.output_tokens),
            cache: charge.map(|c| c.cache).unwrap_or_default(),
            cost,
            cost_basis: charge.map(|c| c.basis),
            message,
            stored: e.stored,
        };
        let written = match closing {
            None => engine.ledger.finish_attempt(attempt).await,
            Some(c) => {
                let error_code = if self.client.gone() {
                    Some("client_disconnected".to_string())
                } else {
                    c.error_code
                };
                let done = engine
                    .ledger
                    .finish(
                        attempt,
                        RequestResult {
                            request_id: self.request_id.clone(),
                            outcome: c.outcome,
                            error_code,
                            served_by: c.served_by,
                            cost: self.billed,
                            charged: self.charged,
                        },
                    )
                    .await;
                if done.is_ok() {
                    self.pending.done();
                }
                done
            }
        };
        written.map_err(|e| GatewayError::ledger(LedgerStage::AfterCall, e))
    }
}

/// Whether the client is still waiting for this request's answer; it also carries the
/// request's concurrency permit, released when the last clone (the recorder's) drops.
#[derive(Clone, Default)]
pub struct ClientWatch {
    gone: Arc<AtomicBool>,
    /// Held, never read: dropping the last clone releases the permit.
    _hold: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl ClientWatch {
    pub fn new(hold: Option<tokio::sync::OwnedSemaphorePermit>) -> ClientWatch {
        ClientWatch {
            gone: Arc::default(),
            _hold: hold.map(Arc::new),
        }
    }

    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    /// A guard the client's side holds: dropped before `answered`, the client left.
    pub fn guard(&self) -> ClientGuard {
        ClientGuard(Some(self.clone()))
    }
}

pub struct ClientGuard(Option<ClientWatch>);

impl ClientGuard {
    pub fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        if let Some(w) = &self.0 {
            w.gone.store(true, Ordering::Relaxed);
        }
    }
}

/// Requests this process is running or has admitted and not yet finished, counted so
/// that shutdown can wait for them; an admitted one is handed to the sweeper if its
/// task ends without a finish.
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
    stuck: mpsc::UnboundedSender<String>,
    sweeper: std::sync::Mutex<Option<mpsc::UnboundedReceiver<String>>>,
}

impl InFlight {
    pub fn new() -> InFlight {
        let (stuck, rx) = mpsc::unbounded_channel();
        InFlight {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            stuck,
            sweeper: std::sync::Mutex::new(Some(rx)),
        }
    }

    /// A guard for an admitted request. The first call starts the sweeper, on the
    /// runtime serving requests.
    pub fn admit(self: &Arc<Self>, request_id: &str, ledger: &Ledger) -> Pending {
        let rx = self
            .sweeper
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(rx) = rx {
            tokio::spawn(sweep(rx, ledger.clone()));
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        Pending {
            request_id: Some(request_id.to_string()),
            owner: Arc::clone(self),
        }
    }

    /// A guard for a request whose task has started, held by that task from its spawn
    /// to its end. A client that hangs up before its request is admitted leaves the
    /// task running, and it may still be admitted and call the vendor: counted from
    /// the spawn, it is waited for by shutdown as an admitted one is.
    pub fn running(self: &Arc<Self>) -> Running {
        self.count.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(self))
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn release(&self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Wait until no request is left running or in flight.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// An admitted request not yet finished in the ledger. Dropped unfinished — its task
/// panicked, or its last write failed — it is handed to the sweeper, which marks it
/// `interrupted` / `maybe_billed` at its worst case.
pub struct Pending {
    request_id: Option<String>,
    owner: Arc<InFlight>,
}

impl Pending {
    fn done(&mut self) {
        self.request_id = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(id) = self.request_id.take() {
            let _ = self.owner.stuck.send(id);
        }
        self.owner.release();
    }
}

/// A request's task, running (see `InFlight::running`).
pub struct Running(Arc<InFlight>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.release();
    }
}

const STUCK_REASON: &str = "the gateway could not finish recording this request while it ran (its task ended or its last ledger write failed); the upstream may have billed it, so it is charged at its worst case";

/// Interrupt each stuck request, retrying while the ledger cannot write.
async fn sweep(mut rx: mpsc::UnboundedReceiver<String>, ledger: Ledger) {
    while let Some(id) = rx.recv().await {
        let mut wait = Duration::from_millis(50);
        loop {
            match ledger.interrupt(&id, STUCK_REASON).await {
                Ok(()) => {
                    tracing::warn!(request_id = %id, "request interrupted by the sweeper: settle it with `purser settle` once its cost is known");
                    break;
                }
                // Either engine: a database cut, busy or full passes, and then the
                // request must stop being in flight (DESIGN 5).
                Err(e) if e.is_transient() => {
                    tracing::error!(request_id = %id, error = %e, "cannot interrupt a stuck request yet; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::error!(request_id = %id, error = %e, "cannot interrupt a stuck request; it is recovered at the next start");
                    break;
                }
            }
        }
    }
}
