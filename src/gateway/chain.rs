//! The chain of one admitted request: attempt → classify → decide → record, until it
//! is served or stops. It reaches at most the primary and the policy's one alternate,
//! and the alternate only once its worst case is reserved in every period budget.
//!
//! Every fact the failover turns on — the alternate's upstream, ceiling, fields, and
//! budget room — is an input of `decide`, which is the only decision. The budget room
//! costs a ledger write to learn (it is learnt by reserving it), so the chain asks for
//! it only when `decide::awaits_budget` says it is all that stands in the way, and
//! decides again with the answer.

use tracing::Instrument;

use super::attempt::{Bill, Caller, Failure, Observed, Seen, Started};
use super::recorder::{Closing, Ended, Recorder, Verdict};
use super::stream;
use super::{AttemptReport, GatewayError, LedgerStage, Reply, Served, truncate_redact};
use crate::clock::Clock;
use crate::decide::{self, Action, AlternateState, BudgetRoom, Decision};
use crate::failure::{Billing, FailureClass};
use crate::ingress::Ingress;
use crate::ledger::{self, Ledger, LedgerError, NewAttempt};
use crate::metrics::Metrics;
use crate::money::Money;
use crate::policy::plan::{Api, Destination, Plan, Policy};
use crate::pricing;
use crate::selection::{AlternateFit, Selected};
use crate::upstream::{self, ChatRequest};

/// What the chain may use of the engine, and nothing more: the ledger for the
/// alternate's attempt row and its top-up, the caller for the calls, metrics for
/// failovers and refusals, the clock for timestamps. The request's own writes go
/// through its `Recorder`.
pub struct Deps<'a> {
    pub ledger: &'a Ledger,
    pub metrics: &'a Metrics,
    pub clock: &'a dyn Clock,
    pub caller: Caller<'a>,
    /// The plan running now (a reload may have swapped it since admission): a top-up
    /// is checked against its budgets.
    pub running_plan: &'a (dyn Fn() -> std::sync::Arc<Plan> + Send + Sync),
}

/// What the chain runs under: one plan snapshot, the selection, and what it needs to
/// know of the request once its body is parked (`run` holds the request itself).
pub struct Chain<'a> {
    pub plan: &'a Plan,
    pub policy: &'a Policy,
    pub sel: &'a Selected,
    /// The request's API.
    pub ingress: Ingress,
    /// Whether the request has the vendor store its response (`openai::stores`).
    pub stores: bool,
    pub deps: Deps<'a>,
}

/// Where the chain stands between attempts.
struct Cursor<'a> {
    seq: u32,
    /// The primary's or the alternate's, borrowed from the selection: a clone was 352
    /// bytes of the request's task while it waits on the vendor, and a few allocations.
    dest: &'a Destination,
    worst: Money,
    on_alternate: bool,
    retried: bool,
    force_open: bool,
    /// Billing of every attempt so far, worst first.
    earlier: Billing,
    /// What the request holds in its budget windows (admission reserved the primary's
    /// worst case; a failover may top it up).
    held: Money,
    reports: Vec<AttemptReport>,
}

/// What to do after a failed attempt.
enum Next {
    /// Send again to the same destination (a rotated credential).
    Retry,
    /// Go on to the alternate.
    Alternate,
}

/// The ledger's answer to a failover's top-up.
enum Reservation {
    Reserved,
    /// A period budget cannot hold it (the ledger's words); nothing was reserved.
    Refused(String),
}

/// A failed attempt's decision, with what it rests on.
struct Decided {
    decision: Decision,
    bill: Bill,
    /// Why the alternate cannot carry the request, when that decided.
    unfit: Option<String>,
    /// The budget's refusal, when that decided.
    over_budget: Option<String>,
}

impl Decided {
    /// The ledger's reason: the decision's, what it rested on, and why the attempt is
    /// billable when its class alone would not say so.
    fn reason(&self, failure: &Failure) -> String {
        let mut r = match (&self.over_budget, &self.unfit) {
            (Some(e), _) | (None, Some(e)) => format!("{}: {e}", self.decision.reason()),
            (None, None) => self.decision.reason(),
        };
        r.push_str(&format!(" (classified by {})", failure.reason));
        if self.bill.billing() > failure.class.billing() {
            r.push_str(match (self.bill, failure.started) {
                (Bill::Billed(_), _) => "; the answer carried usage, so it is billed at it",
                (Bill::MaybeBilled | Bill::NotBilled, Started::Generated) => {
                    "; the stream had generated output, so it may have been billed"
                }
                (Bill::MaybeBilled | Bill::NotBilled, Started::Answered | Started::No) => {
                    "; the vendor answered 2xx, so the model may have run and billed it"
                }
            });
        }
        r
    }
}

impl Chain<'_> {
    /// `req` is parked while each call runs (`ChatRequest::park`), and parsed again
    /// only where another attempt needs it: the alternate's fields, a retry's call.
    pub async fn run(
        &self,
        mut rec: Recorder,
        mut req: Box<ChatRequest>,
    ) -> Result<Served, GatewayError> {
        let sel = self.sel;
        let mut at = Cursor {
            seq: 0,
            dest: &sel.primary,
            worst: sel.worst_case,
            on_alternate: false,
            retried: false,
            force_open: sel.circuit_open,
            earlier: Billing::NotBilled,
            held: sel.worst_case,
            reports: Vec::new(),
        };
        loop {
            at.seq += 1;
            let Some(provider) = self.plan.provider(&at.dest.provider) else {
                return Err(GatewayError::Internal(format!(
                    "the plan has no provider `{}`",
                    at.dest.provider
                )));
            };
            // A retry or the alternate: the body, parked during the last call, is read
            // again, before the attempt's row is begun. It parsed when the request came;
            // should it not now, no call is made, the attempt before has been recorded
            // whole, and the request ends here.
            req.unpark()
                .map_err(|e| GatewayError::Internal(e.to_string()))?;
            // The ledger writes and decisions around the call (`begin` before an
            // alternate's call, `served` and `failed` after one: 1.8-3.5 kB of future
            // each) are boxed, so that the request's task holds only the call's state
            // while it waits on the vendor.
            if at.seq > 1 {
                Box::pin(self.begin(&rec, &at)).await?;
            }
            let attempt_id = format!("{}/{}", rec.request_id(), at.seq);
            let seen = self
                .deps
                .caller
                .attempt(provider, at.dest, &mut req, &attempt_id, at.force_open)
                .instrument(tracing::info_span!("attempt", seq = at.seq, provider = %at.dest.provider, model = %at.dest.upstream_model))
                .await;
            at.force_open = false;
            let Observed {
                seen,
                status,
                key,
                sent,
            } = seen;
            let failure = match seen {
                Seen::Stream(live) => return Ok(self.stream(rec, &at, *live, key, sent)),
                Seen::Complete { json, raw } => {
                    return Box::pin(self.served(
                        rec,
                        &at,
                        provider.api,
                        (json, raw),
                        status,
                        sent,
                    ))
                    .await;
                }
                Seen::Failed(f) => f,
            };
            let seen = Attempted {
                failure,
                status,
                key,
                sent,
            };
            match Box::pin(self.failed(&mut rec, &mut at, seen, &mut req)).await? {
                Next::Retry => at.retried = true,
                Next::Alternate => {
                    let Some(a) = &self.sel.alternate else {
                        return Err(GatewayError::Internal(
                            "failover decided without an alternate".into(),
                        ));
                    };
                    at.dest = &a.destination;
                    at.worst = a.worst_case;
                    at.on_alternate = true;
                    at.retried = false;
                }
            }
        }
    }

    /// The alternate's attempt row, written before its call (the primary's was written
    /// with the admission).
    async fn begin(&self, rec: &Recorder, at: &Cursor<'_>) -> Result<(), GatewayError> {
        self.deps
            .ledger
            .begin_attempt(NewAttempt {
                request_id: rec.request_id().to_string(),
                seq: at.seq,
                provider: at.dest.provider.to_string(),
                upstream_model: at.dest.upstream_model.clone(),
                jurisdiction: at.dest.jurisdiction.to_string(),
                started_at: self.deps.clock.wall(),
                worst_case: at.worst,
            })
            .await
            .map_err(|e| GatewayError::ledger(LedgerStage::BeforeAlternate, e))
    }

    fn served_by(&self, rec: &Recorder, at: &Cursor<'_>, reply: Reply) -> Served {
        Served {
            request_id: rec.request_id().to_string(),
            policy: self.policy.id.to_string(),
            reply,
            provider: at.dest.provider.to_string(),
            attempts: at.seq as usize,
            cost: rec.billed(),
            fallback: at.on_alternate,
            clamped_to: self.sel.clamped_from.map(|_| self.sel.bounds.output),
        }
    }

    /// A stream that has shown content: handed to its tail, which records it when it
    /// ends.
    fn stream(
        &self,
        rec: Recorder,
        at: &Cursor<'_>,
        live: stream::Live,
        key: Option<String>,
        sent: Option<std::time::Instant>,
    ) -> Served {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let served = self.served_by(&rec, at, Reply::Stream(rx));
        let tail = stream::Tail {
            rec,
            seq: at.seq,
            dest: at.dest.clone(),
            worst: at.worst,
            bounds: self.sel.bounds_for(at.dest),
            breaker: self.deps.caller.breakers.get(&at.dest.provider).cloned(),
            sent,
            key,
            stores: self.stores,
        };
        tokio::spawn(tail.run(live, tx).instrument(tracing::Span::current()));
        served
    }

    /// A complete answer: priced and recorded.
    async fn served(
        &self,
        mut rec: Recorder,
        at: &Cursor<'_>,
        api: Api,
        (json, raw): (serde_json::Value, String),
        status: Option<u16>,
        sent: Option<std::time::Instant>,
    ) -> Result<Served, GatewayError> {
        let stored = match api {
            Api::Openai => upstream::openai::stored(self.stores, &json, 0),
            Api::Anthropic | Api::Gemini => None,
        };
        let (usage, reply) = match api {
            // A Messages request translated to chat: the answer goes back as a message.
            Api::Openai if self.ingress == Ingress::Messages => {
                let usage = upstream::openai::usage(&json);
                let message =
                    upstream::from_messages::message(&json, at.dest.model.as_str(), &usage);
                (usage, Reply::Complete(message))
            }
            // Chat or Responses to an OpenAI API: the vendor's own answer, its usage read
            // under either API's names.
            Api::Openai => (upstream::openai::usage(&json), Reply::Verbatim(raw)),
            // A Messages request to Anthropic: the vendor's own answer is the client's.
            Api::Anthropic if self.ingress == Ingress::Messages => (
                json.get("usage")
                    .map_or_else(Default::default, upstream::anthropic::usage),
                Reply::Verbatim(raw),
            ),
            // A Responses request translated to chat for Anthropic or Gemini: the
            // adapter's chat completion goes back as a Responses `response`.
            Api::Anthropic | Api::Gemini if self.ingress == Ingress::Responses => {
                let (chat, usage) = upstream::translate(api, at.dest, json);
                let response =
                    upstream::from_responses::response(&chat, at.dest.model.as_str(), &usage);
                (usage, Reply::Complete(response))
            }
            Api::Anthropic | Api::Gemini => {
                let (translated, usage) = upstream::translate(api, at.dest, json);
                (usage, Reply::Complete(translated))
            }
        };
        let charge = pricing::charge(at.dest, &usage, self.sel.bounds_for(at.dest));
        rec.record(
            Ended {
                seq: at.seq,
                dest: at.dest,
                worst: at.worst,
                sent,
                status,
                verdict: Verdict::Served(charge),
                reason: "a complete answer".into(),
                stored,
            },
            Some(Closing {
                outcome: ledger::Outcome::Served,
                served_by: Some(at.dest.provider.to_string()),
                error_code: None,
            }),
        )
        .await?;
        Ok(self.served_by(&rec, at, reply))
    }

    /// A failure: decide, record, and either go on or end the request with its error.
    async fn failed(
        &self,
        rec: &mut Recorder,
        at: &mut Cursor<'_>,
        seen: Attempted,
        req: &mut ChatRequest,
    ) -> Result<Next, GatewayError> {
        let decided = self.decide(rec, at, &seen, req).await?;
        let msg = truncate_redact(&seen.failure.message, seen.key.as_deref());
        self.record_failure(rec, at, &seen, &decided, &msg).await?;
        let class = seen.failure.class;
        at.earlier = at.earlier.max(decided.bill.billing());
        at.reports.push(AttemptReport {
            provider: at.dest.provider.to_string(),
            model: at.dest.upstream_model.clone(),
            class: class.to_string(),
            status: seen.status,
            message: msg.clone(),
        });
        match decided.decision.action {
            Action::RetrySame => Ok(Next::Retry),
            Action::FailOver => {
                if let Some(a) = &self.sel.alternate {
                    self.deps.metrics.failover(
                        at.dest.provider.as_str(),
                        a.destination.provider.as_str(),
                        class.as_str(),
                    );
                }
                Ok(Next::Alternate)
            }
            Action::Refuse => {
                self.deps.metrics.refusal(class.as_str());
                Err(self.stop_error(rec, at, &seen, &decided, msg))
            }
            Action::Stop => Err(self.stop_error(rec, at, &seen, &decided, msg)),
        }
    }

    /// The decision's inputs, the budget asked when it decides, and the decision.
    /// `req`: parked or not; read again here only when an alternate could carry it.
    async fn decide(
        &self,
        rec: &Recorder,
        at: &mut Cursor<'_>,
        seen: &Attempted,
        req: &mut ChatRequest,
    ) -> Result<Decided, GatewayError> {
        let class = seen.failure.class;
        let bill = seen.failure.bill(at.dest, self.sel.bounds_for(at.dest));
        let provider = self.plan.provider(&at.dest.provider);
        let unfit = match (&self.sel.alternate, at.on_alternate) {
            // A body that cannot be read again cannot be sent anywhere: the failure is
            // recorded and decided as for an alternate that cannot take the fields.
            (Some(a), false) => match req.unpark() {
                Ok(()) => super::ingress::check_request(req, a.destination.api)
                    .err()
                    .map(|(_, why)| why),
                Err(e) => Some(e.to_string()),
            },
            (None, _) | (Some(_), true) => None,
        };
        let alternate = match (&self.sel.alternate, at.on_alternate) {
            (_, true) => AlternateState::AlreadyUsed,
            (None, false) => AlternateState::None,
            (Some(a), false) => AlternateState::Available {
                same_upstream: match (self.plan.provider(&a.destination.provider), provider) {
                    (Some(ap), Some(p)) => ap.same_upstream(p),
                    _ => false,
                },
                fits_ceiling: a.fits,
                carries_fields: unfit.is_none(),
                budget: BudgetRoom::Unasked,
            },
        };
        let credential_changed = class == FailureClass::Auth
            && !at.retried
            && provider
                .is_some_and(|p| self.deps.caller.credentials.refresh(p, seen.key.as_deref()));
        let mut ctx = decide::Context {
            mode: self.policy.ceiling.mode,
            earlier_billing: at.earlier,
            billing: bill.billing(),
            alternate,
            credential_changed,
            already_retried: at.retried,
        };
        let mut over_budget = None;
        if let (true, Some(a)) = (decide::awaits_budget(class, &ctx), &self.sel.alternate) {
            let room = match self.reserve(rec, at, bill, a).await? {
                Reservation::Reserved => BudgetRoom::Reserved,
                Reservation::Refused(why) => {
                    over_budget = Some(why);
                    BudgetRoom::Exhausted
                }
            };
            ctx.alternate = ctx.alternate.with_budget(room);
        }
        Ok(Decided {
            decision: decide::decide(class, &ctx),
            bill,
            unfit,
            over_budget,
        })
    }

    /// Reserve what the budgets must cover once the alternate is called: everything
    /// charged so far, this attempt's charge (its worst case if it may have been
    /// billed), and the alternate's worst case.
    async fn reserve(
        &self,
        rec: &Recorder,
        at: &mut Cursor<'_>,
        bill: Bill,
        a: &AlternateFit,
    ) -> Result<Reservation, GatewayError> {
        let this = match bill {
            Bill::MaybeBilled => at.worst,
            Bill::Billed(c) => c.cost,
            Bill::NotBilled => Money::ZERO,
        };
        let needed = rec.charged() + this + a.worst_case;
        let extra = needed.saturating_sub(at.held);
        let limits = super::current_limits(&(self.deps.running_plan)(), self.policy);
        match self
            .deps
            .ledger
            .top_up(rec.request_id(), extra, limits)
            .await
        {
            Ok(()) => {
                at.held = at.held + extra;
                Ok(Reservation::Reserved)
            }
            Err(e @ LedgerError::BudgetExhausted { .. }) => Ok(Reservation::Refused(e.to_string())),
            // Also `NotInFlight` (another replica recovered the request while this one
            // was stalled) and `LeaseLost`: the request stops here, and the alternate is
            // never called.
            Err(e) => Err(GatewayError::ledger(LedgerStage::BeforeAlternate, e)),
        }
    }

    /// Write the failed attempt; when the decision ends the request, the request ends
    /// in the same commit.
    async fn record_failure(
        &self,
        rec: &mut Recorder,
        at: &Cursor<'_>,
        seen: &Attempted,
        decided: &Decided,
        msg: &str,
    ) -> Result<(), GatewayError> {
        let class = seen.failure.class;
        let closing = match decided.decision.action {
            Action::Refuse => Some(ledger::Outcome::Refused),
            Action::Stop => Some(ledger::Outcome::Failed),
            Action::RetrySame | Action::FailOver => None,
        }
        .map(|outcome| Closing {
            outcome,
            served_by: None,
            error_code: Some(match decided.over_budget {
                Some(_) => "budget_exhausted".to_string(),
                None => class.as_str().to_string(),
            }),
        });
        rec.record(
            Ended {
                seq: at.seq,
                dest: at.dest,
                worst: at.worst,
                sent: seen.sent,
                status: seen.status,
                verdict: Verdict::Failed {
                    class,
                    bill: decided.bill,
                    decision: decided.decision.action,
                    message: msg.to_string(),
                },
                reason: decided.reason(&seen.failure),
                stored: None,
            },
            closing,
        )
        .await
    }

    /// The client's error for a request that ends here: every attempt, in order.
    fn stop_error(
        &self,
        rec: &Recorder,
        at: &mut Cursor<'_>,
        seen: &Attempted,
        decided: &Decided,
        msg: String,
    ) -> GatewayError {
        let class = seen.failure.class;
        let summary = at
            .reports
            .iter()
            .map(|r| format!("{} → {}", r.provider, r.class))
            .collect::<Vec<_>>()
            .join(", ");
        if let (Some(e), Some(a)) = (&decided.over_budget, &self.sel.alternate) {
            return GatewayError::BudgetExhausted(format!(
                "{} failed with {class} ({msg}); failing over to {} needs up to {} more, which the budget cannot hold: {e} ({} attempt(s): {summary})",
                at.dest.provider,
                a.destination.provider,
                a.worst_case,
                at.reports.len(),
            ));
        }
        GatewayError::Upstream {
            class,
            provider: at.dest.provider.to_string(),
            status: seen.status,
            message: format!(
                "{} (provider {}, class {class}; {} attempt(s): {summary}; {})",
                msg,
                at.dest.provider,
                at.reports.len(),
                decided.reason(&seen.failure)
            ),
            attempts: std::mem::take(&mut at.reports),
            request_id: rec.request_id().to_string(),
        }
    }
}

/// A failed attempt with what the call was.
struct Attempted {
    failure: Failure,
    status: Option<u16>,
    key: Option<String>,
    sent: Option<std::time::Instant>,
}
