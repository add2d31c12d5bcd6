//! One attempt: breaker permit, credential, the call, and its classification. What
//! comes back is what was observed, not yet decided or recorded.

use std::time::Instant;

use serde_json::Value;

use super::stream::{self, Live};
use super::upstream_message;
use crate::breaker::{Breaker, Breakers, Permit};
use crate::failure::{self, Billing, FailureClass, Outcome as Classified};
use crate::policy::plan::{Api, Destination, Provider};
use crate::pricing::{self, Charge};
use crate::selection::TokenBounds;
use crate::upstream::{self, ChatRequest, Credentials, Observation, Usage};

/// How far the vendor got before an attempt failed: what makes it billable whatever
/// its class (DESIGN 5, "Billable once started").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// No 2xx answer: a transport failure or a non-2xx status. The model did not run,
    /// or the vendor says so with a status that bills nothing.
    No,
    /// A 2xx answer: a body, or a stream's head. The vendor accepted the call, so the
    /// model may have run whatever error follows (OpenRouter, for one, answers 200 once
    /// the model started, and a relay's stream head comes after the model began). The
    /// class still comes from the error, as for the same error sent plainly (DESIGN 4);
    /// only the billing is raised (DESIGN 5, "any 2xx"): under a hard ceiling such an
    /// attempt does not fail over, under a soft one it may.
    Answered,
    /// A stream sent content, reasoning or a tool call before it failed.
    Generated,
}

/// A failed attempt, as observed: its class, and what may have billed it.
pub struct Failure {
    pub class: FailureClass,
    /// Why the classifier chose the class (cited in the ledger's reason).
    pub reason: String,
    /// The upstream's own words (or the transport error), unredacted.
    pub message: String,
    pub started: Started,
    /// Usage found anywhere in the answer (an error body or event may carry it).
    pub usage: Usage,
}

/// Whether and how a failed attempt is billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bill {
    NotBilled,
    /// May have been billed without a receipt: charged at its worst case.
    MaybeBilled,
    /// Its usage was found: charged at it.
    Billed(Charge),
}

impl Bill {
    pub fn billing(self) -> Billing {
        match self {
            Bill::NotBilled => Billing::NotBilled,
            Bill::MaybeBilled => Billing::MaybeBilled,
            Bill::Billed(_) => Billing::Billed,
        }
    }
}

impl Failure {
    pub fn new(class: FailureClass, reason: impl Into<String>, message: String) -> Failure {
        Failure {
            class,
            reason: reason.into(),
            message,
            started: Started::No,
            usage: Usage::default(),
        }
    }

    /// The rule that makes a started attempt billable, in one place: usage found in
    /// the answer is priced (`billed`), whatever the class; else an attempt the vendor
    /// started is at least `maybe_billed`; else its class says. Usage counts as found
    /// when it carries an output figure: an input count alone (Anthropic's
    /// `message_start`) is a prompt size, not a receipt, and the worst case covers more.
    pub fn bill(&self, dest: &Destination, bounds: TokenBounds) -> Bill {
        if self.usage.output.is_some() {
            return Bill::Billed(pricing::charge(dest, &self.usage, bounds));
        }
        let floor = match self.started {
            Started::No => Billing::NotBilled,
            Started::Answered | Started::Generated => Billing::MaybeBilled,
        };
        match self.class.billing().max(floor) {
            Billing::NotBilled => Bill::NotBilled,
            // A class that says `billed` has no charge to show: charged at its worst case.
            Billing::MaybeBilled | Billing::Billed => Bill::MaybeBilled,
        }
    }
}

/// What an attempt produced; a success always carries its answer.
pub enum Seen {
    /// A complete answer, parsed, with the text it was parsed from.
    Complete {
        json: Value,
        raw: String,
    },
    /// The upstream's first content is in; the rest is still arriving.
    Stream(Box<Live>),
    Failed(Failure),
}

/// How one attempt went, before any decision.
pub struct Observed {
    pub seen: Seen,
    pub status: Option<u16>,
    /// The key the call used, to redact it from messages and to spot a rotation.
    pub key: Option<String>,
    /// When the call was sent; `None` when no call was made.
    pub sent: Option<Instant>,
}

impl Observed {
    fn no_call(class: FailureClass, reason: &str, message: String) -> Observed {
        Observed {
            seen: Seen::Failed(Failure::new(class, reason, message)),
            status: None,
            key: None,
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
fn observe(api: Api, obs: Observation) -> (Option<u16>, Seen) {
    match obs {
        Observation::Transport(t, detail) => {
            let (class, reason) = failure::classify_transport(t);
            (
                None,
                Seen::Failed(Failure::new(class, reason, format!("{reason}: {detail}"))),
            )
        }
        Observation::Answer {
            status,
            headers,
            body,
        } => {
            let (o, json) = failure::classify_answer(api, status, &headers, &body);
            let seen = match (o, json) {
                (Classified::Success, Some(json)) => Seen::Complete { json, raw: body },
                // The classifier passes a 2xx event stream as a success, for the
                // streaming path; as a complete answer it holds nothing to hand on.
                (Classified::Success, None) => Seen::Failed(Failure {
                    started: Started::Answered,
                    ..Failure::new(
                        FailureClass::Unclassified,
                        "a 2xx event stream to a request that did not ask for one",
                        upstream_message(&body),
                    )
                }),
                (Classified::Failure { class, reason }, json) => Seen::Failed(Failure {
                    class,
                    reason: reason.into_owned(),
                    message: upstream_message(&body),
                    started: if (200..300).contains(&status) {
                        Started::Answered
                    } else {
                        Started::No
                    },
                    usage: json
                        .as_ref()
                        .map_or_else(Usage::default, |v| upstream::usage(api, v)),
                }),
            };
            (Some(status), seen)
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
        req: &mut ChatRequest,
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
            upstream::prepare(provider.api, dest, &provider.endpoints, key.as_deref(), req);
        // The call's bytes are made: the parsed body is not needed while it runs.
        req.park();
        let (stream, ingress) = (req.stream, req.ingress);
        // Names the ledger row of this call, so a vendor's logs (and a test's mock) can
        // be matched with the ledger call by call.
        prepared
            .headers
            .push(("x-purser-attempt", attempt_id.to_string()));
        let sent = Instant::now();
        let (status, seen) = if stream {
            match upstream::open_stream(self.http, prepared, provider.timeout()).await {
                upstream::Opened::Complete(obs) => observe(provider.api, obs),
                upstream::Opened::Streaming { status, body, .. } => {
                    // Boxed (2.4 kB of future): otherwise every call's state, a plain
                    // call's too (about 1 kB), would be sized by this streaming wait.
                    match Box::pin(stream::first_content(
                        provider.api,
                        ingress,
                        dest,
                        body,
                        provider.timeout(),
                    ))
                    .await
                    {
                        stream::Start::Content(live) => (Some(status), Seen::Stream(live)),
                        stream::Start::Failed(f) => (Some(status), Seen::Failed(f)),
                    }
                }
            }
        } else {
            let obs = upstream::send(self.http, prepared, provider.timeout()).await;
            observe(provider.api, obs)
        };
        if let Some(b) = breaker {
            let class = match &seen {
                Seen::Complete { .. } | Seen::Stream(_) => None,
                Seen::Failed(f) => Some(f.class),
            };
            b.record(class, self.breakers.now_ms());
        }
        probe.0 = None;
        Observed {
            seen,
            status,
            key,
            sent: Some(sent),
        }
    }
}
