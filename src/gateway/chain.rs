//! The chain of one admitted request: attempt → classify → decide → record, until it
//! is served or stops. It reaches at most the primary and the policy's one alternate,
//! and the alternate only once its worst case is reserved in every period budget.

use std::sync::Arc;

use tracing::Instrument;

use super::attempt::{Answer, Caller, Observed};
use super::recorder::{Closing, Ended, Recorder};
use super::stream;
use super::{AttemptReport, GatewayError, Reply, Served, truncate_redact};
use crate::breaker::Breakers;
use crate::decide::{self, Action, AlternateState, Decision, Why};
use crate::failure::{Billing, FailureClass};
use crate::ledger::{self, LedgerError, NewAttempt};
use crate::money::Money;
use crate::policy::plan::{Api, Destination, Plan, Policy};
use crate::pricing;
use crate::selection::Selected;
use crate::upstream::{self, ChatRequest};

/// What the chain runs under: one plan snapshot, the selection, the request.
pub struct Chain<'a> {
    pub plan: &'a Plan,
    pub breakers: &'a Breakers,
    pub policy: &'a Policy,
    pub sel: &'a Selected,
    pub req: &'a ChatRequest,
}

/// Where the chain stands between attempts.
struct Cursor {
    seq: u32,
    dest: Destination,
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

impl Chain<'_> {
    pub async fn run(&self, mut rec: Recorder) -> Result<Served, GatewayError> {
        let engine = Arc::clone(rec.engine());
        let sel = self.sel;
        let mut at = Cursor {
            seq: 0,
            dest: sel.primary.clone(),
            worst: sel.worst_case,
            on_alternate: false,
            retried: false,
            force_open: sel.circuit_open,
            earlier: Billing::NotBilled,
            held: sel.worst_case,
            reports: Vec::new(),
        };
        let caller = Caller {
            http: &engine.http,
            credentials: &engine.credentials,
            breakers: self.breakers,
        };
        loop {
            at.seq += 1;
            let Some(provider) = self.plan.provider(&at.dest.provider) else {
                return Err(GatewayError::LedgerUnavailable(
                    "plan lost a provider".into(),
                ));
            };
            if at.seq > 1 {
                engine
                    .ledger
                    .begin_attempt(NewAttempt {
                        request_id: rec.request_id().to_string(),
                        seq: at.seq,
                        provider: at.dest.provider.to_string(),
                        upstream_model: at.dest.upstream_model.clone(),
                        jurisdiction: at.dest.jurisdiction.to_string(),
                        started_at: engine.clock.wall(),
                        worst_case: at.worst,
                    })
                    .await
                    .map_err(|e| GatewayError::LedgerUnavailable(e.to_string()))?;
            }
            let attempt_id = format!("{}/{}", rec.request_id(), at.seq);
            let seen = caller
                .attempt(provider, &at.dest, self.req, &attempt_id, at.force_open)
                .instrument(tracing::info_span!("attempt", seq = at.seq, provider = %at.dest.provider, model = %at.dest.upstream_model))
                .await;
            at.force_open = false;
            match seen.class() {
                None => return self.served(rec, &at, provider.api, seen).await,
                Some(class) => {
                    if let Some(next) = self.failed(&mut rec, &mut at, class, seen).await? {
                        at.dest = next.destination.clone();
                        at.worst = next.worst_case;
                        at.on_alternate = true;
                        at.retried = false;
                    }
                }
            }
        }
    }

    fn served_by(&self, rec: &Recorder, at: &Cursor, reply: Reply) -> Served {
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

    /// A success: a complete answer is priced and recorded; a stream that has shown
    /// content is handed to its tail, which records it when it ends.
    async fn served(
        &self,
        mut rec: Recorder,
        at: &Cursor,
        api: Api,
        seen: Observed,
    ) -> Result<Served, GatewayError> {
        let (json, raw) = match seen.answer {
            Some(Answer::Stream(live)) => {
                let (tx, rx) = tokio::sync::mpsc::channel(64);
                let served = self.served_by(&rec, at, Reply::Stream(rx));
                let tail = stream::Tail {
                    rec,
                    seq: at.seq,
                    dest: at.dest.clone(),
                    worst: at.worst,
                    bounds: self.sel.bounds_for(&at.dest),
                    breaker: self.breakers.get(&at.dest.provider).cloned(),
                    sent: seen.sent,
                    key: seen.key,
                };
                tokio::spawn(tail.run(*live, tx).instrument(tracing::Span::current()));
                return Ok(served);
            }
            Some(Answer::Complete { json, raw }) => (json, raw),
            // The attempt layer never reports a success without an answer.
            None => (serde_json::Value::Null, String::new()),
        };
        let (usage, reply) = match api {
            Api::Openai => (upstream::openai::usage(&json), Reply::Verbatim(raw)),
            Api::Anthropic | Api::Gemini => {
                let (translated, usage) = upstream::translate(api, &at.dest, json);
                (usage, Reply::Complete(translated))
            }
        };
        let charge = pricing::charge(&at.dest, &usage, self.sel.bounds_for(&at.dest));
        rec.record(
            Ended {
                seq: at.seq,
                dest: &at.dest,
                worst: at.worst,
                sent: seen.sent,
                status: seen.status,
                class: None,
                billing: Billing::Billed,
                decision: ledger::Decision::Served,
                reason: "a complete answer".into(),
                charge: Some(charge),
                message: None,
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

    /// A failure: decide, reserve the alternate's worst case if failing over, record.
    /// `Some(alternate)` to go on there, `None` to retry the same destination.
    async fn failed<'s>(
        &'s self,
        rec: &mut Recorder,
        at: &mut Cursor,
        class: FailureClass,
        seen: Observed,
    ) -> Result<Option<&'s crate::selection::AlternateFit>, GatewayError> {
        let engine = Arc::clone(rec.engine());
        let billing = class.billing();
        let msg = truncate_redact(&seen.message, seen.key.as_deref());
        let provider = self.plan.provider(&at.dest.provider);
        let alternate = match (&self.sel.alternate, at.on_alternate) {
            (_, true) => AlternateState::AlreadyUsed,
            (None, false) => AlternateState::None,
            (Some(a), false) => AlternateState::Available {
                same_upstream: match (self.plan.provider(&a.destination.provider), provider) {
                    (Some(ap), Some(p)) => ap.same_upstream(p),
                    _ => false,
                },
                fits_ceiling: a.fits,
            },
        };
        let credential_changed = class == FailureClass::Auth
            && !at.retried
            && provider.is_some_and(|p| engine.credentials.refresh(p, seen.key.as_deref()));
        let mut decision = decide::decide(
            class,
            &decide::Context {
                mode: self.policy.ceiling.mode,
                earlier_billing: at.earlier,
                alternate,
                credential_changed,
                already_retried: at.retried,
            },
        );
        let mut over_budget = None;
        let mut unfit = None;
        if let (Action::FailOver, Some(a)) = (decision.action, &self.sel.alternate)
            && let Err(refusal) = upstream::fields::check(a.destination.api, &self.req.body)
        {
            decision = Decision {
                action: Action::Stop,
                why: Why::AlternateRefusesFields,
                class,
            };
            unfit = Some(refusal.to_string());
        }
        if let (Action::FailOver, Some(a)) = (decision.action, &self.sel.alternate) {
            // What the budgets must cover once the alternate is called: everything
            // charged so far, this attempt's worst case if it may have been billed, and
            // the alternate's worst case. Reserved before the call, or no call.
            let this = match billing {
                Billing::MaybeBilled => at.worst,
                Billing::Billed | Billing::NotBilled => Money::ZERO,
            };
            let needed = rec.charged() + this + a.worst_case;
            let extra = needed.saturating_sub(at.held);
            match engine.ledger.top_up(rec.request_id(), extra).await {
                Ok(()) => at.held = at.held + extra,
                Err(e @ LedgerError::BudgetExhausted { .. }) => {
                    decision = Decision {
                        action: Action::Stop,
                        why: Why::AlternateOverBudget,
                        class,
                    };
                    over_budget = Some(e.to_string());
                }
                Err(e) => return Err(GatewayError::LedgerUnavailable(e.to_string())),
            }
        }
        let closing = match decision.action {
            Action::Refuse => Some(ledger::Outcome::Refused),
            Action::Stop => Some(ledger::Outcome::Failed),
            Action::RetrySame | Action::FailOver => None,
        }
        .map(|outcome| Closing {
            outcome,
            served_by: None,
            error_code: Some(match over_budget {
                Some(_) => "budget_exhausted".to_string(),
                None => class.as_str().to_string(),
            }),
        });
        let reason = match (&over_budget, &unfit) {
            (Some(e), _) | (None, Some(e)) => format!("{}: {e}", decision.reason()),
            (None, None) => decision.reason(),
        };
        rec.record(
            Ended {
                seq: at.seq,
                dest: &at.dest,
                worst: at.worst,
                sent: seen.sent,
                status: seen.status,
                class: Some(class),
                billing,
                decision: ledger::Decision::After(decision.action),
                reason: reason.clone(),
                charge: None,
                message: Some(msg.clone()),
            },
            closing,
        )
        .await?;
        at.earlier = at.earlier.max(billing);
        at.reports.push(AttemptReport {
            provider: at.dest.provider.to_string(),
            model: at.dest.upstream_model.clone(),
            class: class.to_string(),
            status: seen.status,
            message: msg.clone(),
        });
        match decision.action {
            Action::RetrySame => {
                at.retried = true;
                Ok(None)
            }
            Action::FailOver => {
                let Some(a) = &self.sel.alternate else {
                    return Err(GatewayError::LedgerUnavailable(
                        "failover decided without an alternate".into(),
                    ));
                };
                engine.metrics.failover(
                    at.dest.provider.as_str(),
                    a.destination.provider.as_str(),
                    class.as_str(),
                );
                Ok(Some(a))
            }
            Action::Refuse | Action::Stop => {
                if decision.action == Action::Refuse {
                    engine.metrics.refusal(class.as_str());
                }
                let summary = at
                    .reports
                    .iter()
                    .map(|r| format!("{} → {}", r.provider, r.class))
                    .collect::<Vec<_>>()
                    .join(", ");
                if let (Some(e), Some(a)) = (over_budget, &self.sel.alternate) {
                    return Err(GatewayError::BudgetExhausted(format!(
                        "{} failed with {class} ({msg}); failing over to {} needs up to {} more, which the budget cannot hold: {e} ({} attempt(s): {summary})",
                        at.dest.provider,
                        a.destination.provider,
                        a.worst_case,
                        at.reports.len(),
                    )));
                }
                Err(GatewayError::Upstream {
                    class,
                    provider: at.dest.provider.to_string(),
                    status: seen.status,
                    message: format!(
                        "{} (provider {}, class {class}; {} attempt(s): {summary}; {})",
                        msg,
                        at.dest.provider,
                        at.reports.len(),
                        reason
                    ),
                    attempts: std::mem::take(&mut at.reports),
                    request_id: rec.request_id().to_string(),
                })
            }
        }
    }
}
