//! One attempt: breaker permit, credential, the call, and its classification. What
//! comes back is what was observed, not yet decided or recorded.

use std::time::Instant;

use serde_json::Value;

use super::stream::{self, Live};
use super::upstream_message;
use crate::breaker::{Breaker, Breakers, Permit};
use crate::failure::{self, FailureClass, Outcome as Classified};
use crate::policy::plan::{Api, Destination, Provider};
use crate::upstream::{self, ChatRequest, Credentials, Observation};

/// What a successful attempt produced.
pub enum Answer {
    /// A complete answer, parsed, with the text it was parsed from.
    Complete { json: Value, raw: String },
    /// The upstream's first content is in; the rest is still arriving.
    Stream(Box<Live>),
}

/// How one attempt went, before any decision.
pub struct Observed {
    pub outcome: Classified,
    pub status: Option<u16>,
    /// The upstream's own words (or the transport error), unredacted.
    pub message: String,
    /// The key the call used, to redact it from messages and to spot a rotation.
    pub key: Option<String>,
    pub answer: Option<Answer>,
    /// When the call was sent; `None` when no call was made.
    pub sent: Option<Instant>,
}

impl Observed {
    pub fn class(&self) -> Option<FailureClass> {
        self.outcome.class()
    }

    fn no_call(class: FailureClass, reason: &str, message: String) -> Observed {
        Observed {
            outcome: Classified::Failure {
                class,
                reason: reason.to_string().into(),
            },
            status: None,
            message,
            key: None,
            answer: None,
            sent: None,
        }
    }
}

/// A half-open breaker's probe must always resolve: if the attempt ends without
/// recording (its task died), the probe is released for the next call.
struct ProbeGuard<'a>(Option<&'a Breaker>);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.0 {
            b.release_probe();
        }
    }
}

/// Classify a complete answer (a plain call's, or a streamed call's that never became
/// a stream); a successful one is parsed once.
fn observe(api: Api, obs: Observation) -> (Classified, Option<u16>, String, Option<Answer>) {
    match obs {
        Observation::Transport(t, detail) => {
            let (class, reason) = failure::classify_transport(t);
            (
                Classified::Failure {
                    class,
                    reason: reason.into(),
                },
                None,
                format!("{reason}: {detail}"),
                None,
            )
        }
        Observation::Answer {
            status,
            headers,
            body,
        } => {
            let (o, json) = failure::classify_answer(api, status, &headers, &body);
            match (o, json) {
                (Classified::Success, Some(json)) => (
                    Classified::Success,
                    Some(status),
                    String::new(),
                    Some(Answer::Complete { json, raw: body }),
                ),
                // The classifier passes a 2xx event stream as a success, for the
                // streaming path; as a complete answer it holds nothing to hand on.
                (Classified::Success, None) => (
                    Classified::Failure {
                        class: FailureClass::Unclassified,
                        reason: "a 2xx event stream to a request that did not ask for one".into(),
                    },
                    Some(status),
                    upstream_message(&body),
                    None,
                ),
                (o @ Classified::Failure { .. }, _) => {
                    (o, Some(status), upstream_message(&body), None)
                }
            }
        }
    }
}

/// Everything one attempt needs from the engine.
pub struct Caller<'a> {
    pub http: &'a reqwest::Client,
    pub credentials: &'a Credentials,
    pub breakers: &'a Breakers,
}

impl Caller<'_> {
    /// Make the attempt. `force_open`: selection found every circuit open, so the
    /// attempt is recorded as `circuit_open` without asking the breaker.
    pub async fn attempt(
        &self,
        provider: &Provider,
        dest: &Destination,
        req: &ChatRequest,
        attempt_id: &str,
        force_open: bool,
    ) -> Observed {
        let breaker = self.breakers.get(&provider.id);
        let permit = match breaker {
            Some(_) if force_open => Permit::Rejected,
            Some(b) => b.acquire(self.breakers.now_ms()),
            None => Permit::Call,
        };
        if permit == Permit::Rejected {
            return Observed::no_call(
                FailureClass::CircuitOpen,
                "circuit open: no call made",
                format!("circuit of {} is open; no call was made", provider.id),
            );
        }
        let mut probe = ProbeGuard(breaker.map(|b| &**b).filter(|_| permit == Permit::Probe));
        let key = match self.credentials.get(provider) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(provider = %provider.id, detail = %e.operator_detail(), "provider credential unavailable");
                // No call was made, so a probe learned nothing: `probe` releases it.
                return Observed::no_call(
                    FailureClass::Auth,
                    "credential unavailable",
                    e.to_string(),
                );
            }
        };
        let mut prepared =
            upstream::prepare(provider.api, dest, &provider.base_url, key.as_deref(), req);
        // Names the ledger row of this call, so a vendor's logs (and a test's mock) can
        // be matched with the ledger call by call.
        prepared
            .headers
            .push(("x-purser-attempt", attempt_id.to_string()));
        let sent = Instant::now();
        let (outcome, status, message, answer) = if req.stream {
            match upstream::open_stream(self.http, prepared, provider.timeout()).await {
                upstream::Opened::Complete(obs) => observe(provider.api, obs),
                upstream::Opened::Streaming { status, body, .. } => {
                    match stream::first_content(provider.api, dest, body, provider.timeout()).await
                    {
                        stream::Start::Content(live) => (
                            Classified::Success,
                            Some(status),
                            String::new(),
                            Some(Answer::Stream(live)),
                        ),
                        stream::Start::Failed {
                            class,
                            reason,
                            message,
                        } => (
                            Classified::Failure {
                                class,
                                reason: reason.into(),
                            },
                            Some(status),
                            message,
                            None,
                        ),
                    }
                }
            }
        } else {
            let obs = upstream::send(self.http, prepared, provider.timeout()).await;
            observe(provider.api, obs)
        };
        if let Some(b) = breaker {
            b.record(outcome.class(), self.breakers.now_ms());
        }
        probe.0 = None;
        Observed {
            outcome,
            status,
            message,
            key,
            answer,
            sent: Some(sent),
        }
    }
}
