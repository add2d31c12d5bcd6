//! The request loop: authenticate → select → admit → attempt → classify → decide →
//! record, until served or stopped. Knows nothing of HTTP frameworks: `http` maps its
//! results to responses.

mod stream;

use std::sync::{Arc, RwLock};

use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use crate::breaker::{Breakers, Permit};
use crate::clock::Clock;
use crate::decide::{self, Action, AlternateState};
use crate::failure::{self, Billing, FailureClass, Outcome as Classified};
use crate::ledger::{
    self, AttemptResult, BudgetLimit, Ledger, LedgerError, NewAttempt, NewRequest, RequestResult,
};
use crate::metrics::{Metrics, MetricsError};
use crate::money::Money;
use crate::policy::plan::{Api, ClientRef, Destination, Mode, Plan, Policy, Provider};
use crate::selection::{self, Refusal, TokenBounds};
use crate::upstream::{self, ChatRequest, Credentials, Observation};

/// Most bytes of an upstream message kept in the ledger and shown to clients.
const MESSAGE_LIMIT: usize = 2048;
/// Tokens assumed per image part under a soft ceiling (no provable bound exists).
const SOFT_IMAGE_TOKENS: u64 = 1_600;

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

/// One attempt as the client's error and the headers report it.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptReport {
    pub provider: String,
    pub model: String,
    pub class: String,
    pub status: Option<u16>,
    pub message: String,
}

/// Why a request was not served; each maps to one DESIGN 6 code.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("missing or unknown client key")]
    Unauthorized,
    #[error("{0}")]
    InvalidRequest(String),
    #[error("model `{model}` is not allowed by policy `{policy}`; allowed: {allowed}")]
    ModelNotAllowed {
        model: String,
        policy: String,
        allowed: String,
    },
    #[error(
        "no destination serves model `{model}` in the jurisdictions of policy `{policy}`{hint}"
    )]
    NoDestination {
        model: String,
        policy: String,
        hint: String,
    },
    #[error("{0}")]
    CeilingExceeded(String),
    #[error("{0}")]
    BudgetExhausted(String),
    #[error("the ledger cannot record this request, so no upstream call was made: {0}")]
    LedgerUnavailable(String),
    /// The upstream objected (or every attempt failed): its own words, the class, all attempts.
    #[error("{message}")]
    Upstream {
        class: FailureClass,
        provider: String,
        status: Option<u16>,
        message: String,
        attempts: Vec<AttemptReport>,
        request_id: String,
    },
}

impl GatewayError {
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Unauthorized => "unauthorized",
            GatewayError::InvalidRequest(_) => "invalid_request",
            GatewayError::ModelNotAllowed { .. } => "model_not_allowed",
            GatewayError::NoDestination { .. } => "no_destination",
            GatewayError::CeilingExceeded(_) => "ceiling_exceeded",
            GatewayError::BudgetExhausted(_) => "budget_exhausted",
            GatewayError::LedgerUnavailable(_) => "ledger_unavailable",
            GatewayError::Upstream { class, .. } => class.as_str(),
        }
    }
}

/// A served request.
#[derive(Debug)]
pub struct Served {
    pub request_id: String,
    pub policy: String,
    pub reply: Reply,
    pub provider: String,
    pub attempts: usize,
    pub cost: Money,
    pub fallback: bool,
    pub clamped_to: Option<u64>,
}

/// What a served request hands to the client.
#[derive(Debug)]
pub enum Reply {
    /// The whole answer, translated to the OpenAI chat.completion shape.
    Complete(Value),
    /// An OpenAI-compatible upstream's own chat.completion, passed on as it was sent:
    /// re-serializing it would only reorder its keys, at a cost on every request.
    Verbatim(String),
    /// Server-sent-event bytes (OpenAI chunks) as the upstream produces them; the last
    /// is `data: [DONE]`, or an error event when the stream failed after content.
    Stream(tokio::sync::mpsc::Receiver<bytes::Bytes>),
}

/// What a successful attempt produced.
enum Answer {
    /// A complete answer, parsed, with the text it was parsed from.
    Complete { json: Value, raw: String },
    /// The upstream's first content is in; the rest is still arriving.
    Stream(Box<stream::Live>),
}

pub struct Failed {
    pub request_id: Option<String>,
    /// The policy that governed the request, once the client was known.
    pub policy: Option<String>,
    pub error: GatewayError,
}

/// The plan being served and its breakers, swapped as one: a request takes one
/// snapshot and runs entirely under it.
struct Active {
    plan: Arc<Plan>,
    breakers: Arc<Breakers>,
}

/// The running gateway: the active plan and everything the loop needs.
pub struct Engine {
    active: RwLock<Arc<Active>>,
    /// Serialises plan swaps so breaker state carried across reloads is never lost.
    swap: std::sync::Mutex<()>,
    pub ledger: Ledger,
    pub metrics: Metrics,
    clock: Arc<dyn Clock>,
    http: reqwest::Client,
    credentials: Credentials,
}

/// The parts of the client's body the engine reads.
struct Parsed {
    model: String,
    stream: bool,
    max_tokens: Option<u64>,
    text_bytes: u64,
    messages: u64,
    images: u64,
}

fn parse(body: &Value) -> Result<Parsed, GatewayError> {
    let bad = |m: &str| GatewayError::InvalidRequest(m.to_string());
    let obj = body
        .as_object()
        .ok_or_else(|| bad("the body must be a JSON object"))?;
    let model = match obj.get("model") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(_) => return Err(bad("`model` must be a non-empty string")),
        None => return Err(bad("missing required field `model`")),
    };
    let messages = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty")),
        Some(_) => return Err(bad("`messages` must be an array")),
        None => return Err(bad("missing required field `messages`")),
    };
    let mut text_bytes = 0u64;
    let mut images = 0u64;
    for (i, m) in messages.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(GatewayError::InvalidRequest(format!(
                "messages[{i}].role must be a string"
            )));
        };
        text_bytes += role.len() as u64;
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => text_bytes += s.len() as u64,
            Some(Value::Array(parts)) => {
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            text_bytes += p
                                .get("text")
                                .and_then(Value::as_str)
                                .map_or(0, |t| t.len() as u64)
                        }
                        Some("image_url" | "input_image" | "image") => images += 1,
                        // Other parts count by their JSON size: a bound for any tokenizer.
                        _ => text_bytes += p.to_string().len() as u64,
                    }
                }
            }
            Some(_) => {
                return Err(GatewayError::InvalidRequest(format!(
                    "messages[{i}].content must be a string or an array of parts"
                )));
            }
        }
        // Tool calls and names are sent too.
        for k in ["tool_calls", "name", "tool_call_id"] {
            if let Some(v) = m.get(k) {
                text_bytes += v.to_string().len() as u64;
            }
        }
    }
    for k in ["tools", "response_format", "tool_choice"] {
        if let Some(v) = obj.get(k) {
            text_bytes += v.to_string().len() as u64;
        }
    }
    let int = |k: &str| -> Result<Option<u64>, GatewayError> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| {
                GatewayError::InvalidRequest(format!("`{k}` must be a positive integer"))
            }),
        }
    };
    let max_tokens = int("max_completion_tokens")?.or(int("max_tokens")?);
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`stream` must be a boolean")),
    };
    Ok(Parsed {
        model,
        stream,
        max_tokens,
        text_bytes,
        messages: messages.len() as u64,
        images,
    })
}

fn truncate_redact(text: &str, secret: Option<&str>) -> String {
    let mut s = match secret {
        Some(k) if k.len() >= 4 => text.replace(k, "[REDACTED]"),
        _ => text.to_string(),
    };
    if s.len() > MESSAGE_LIMIT {
        let mut cut = MESSAGE_LIMIT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// The upstream's own words: the error message field when there is one.
fn upstream_message(body: &str) -> String {
    let v: Option<Value> = serde_json::from_str(body).ok();
    let from_json = v.as_ref().and_then(|v| {
        let v = if let Value::Array(a) = v {
            a.first()?
        } else {
            v
        };
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    from_json.unwrap_or_else(|| body.trim().to_string())
}

impl Engine {
    pub fn new(plan: Plan, ledger: Ledger, clock: Arc<dyn Clock>) -> Result<Engine, MetricsError> {
        let breakers = Breakers::for_plan(&plan, clock.clone(), None);
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            // A vendor API does not redirect; following one would send the key and the
            // prompt wherever `Location` points (and it cost 1% CPU per request).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        let metrics = Metrics::new()?;
        metrics.set_plan(plan.id());
        Ok(Engine {
            active: RwLock::new(Arc::new(Active {
                plan: Arc::new(plan),
                breakers: Arc::new(breakers),
            })),
            swap: std::sync::Mutex::new(()),
            ledger,
            metrics,
            clock,
            http,
            credentials: Credentials::default(),
        })
    }

    fn active(&self) -> Arc<Active> {
        self.active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn plan(&self) -> Arc<Plan> {
        self.active().plan.clone()
    }

    /// Refresh the scrape-time gauges (circuits, budgets) and render every metric.
    pub fn render_metrics(&self, budgets: &[crate::ledger::audit::BudgetState]) -> String {
        let active = self.active();
        for (provider, state) in active.breakers.states() {
            let v = match state {
                crate::breaker::State::Closed => 0,
                crate::breaker::State::HalfOpen => 1,
                crate::breaker::State::Open => 2,
            };
            self.metrics.set_circuit(provider.as_str(), v);
        }
        for b in budgets {
            self.metrics
                .set_budget_remaining(&b.policy, &b.period, b.remaining);
        }
        self.metrics.render()
    }

    /// Each period budget the active plan configures, in the window containing now,
    /// as the ledger holds it.
    pub async fn current_budgets(
        &self,
    ) -> Result<Vec<crate::ledger::audit::BudgetState>, LedgerError> {
        let plan = self.plan();
        let configured: Vec<_> = plan
            .policies()
            .flat_map(|p| p.budgets.iter().map(|b| (p.id.to_string(), *b)))
            .collect();
        self.ledger.current_budgets(&configured, self.now()).await
    }

    /// The engine clock's wall time (budget windows, audit).
    pub fn now(&self) -> time::OffsetDateTime {
        self.clock.wall()
    }

    /// Swap in a new plan atomically; requests already running keep theirs. Breaker
    /// state of destinations that survive the change carries over.
    pub fn replace_plan(&self, plan: Plan) -> Arc<Plan> {
        let _one_at_a_time = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.active();
        let breakers = Breakers::for_plan(&plan, self.clock.clone(), Some(&old.breakers));
        self.metrics.set_plan(plan.id());
        *self.active.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Active {
            plan: Arc::new(plan),
            breakers: Arc::new(breakers),
        });
        old.plan.clone()
    }

    /// The client a key belongs to under the current plan.
    pub fn authenticate(&self, plan: &Plan, key: &str) -> Option<ClientRef> {
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(key.as_bytes()).into();
        plan.client_by_key_hash(&digest).cloned()
    }

    /// Models the client's policy may request.
    pub fn models_for(&self, key: &str) -> Result<Vec<String>, GatewayError> {
        let plan = self.plan();
        let who = self
            .authenticate(&plan, key)
            .ok_or(GatewayError::Unauthorized)?;
        let policy = plan
            .policy(who.policy.as_str())
            .ok_or(GatewayError::Unauthorized)?;
        Ok(policy.routes.keys().map(|m| m.to_string()).collect())
    }

    /// Handle one chat completion: the whole chain, recorded, traced and counted.
    pub async fn chat(self: &Arc<Self>, key: Option<&str>, body: Value) -> Result<Served, Failed> {
        let span = tracing::info_span!(
            "request",
            request_id = tracing::field::Empty,
            policy = tracing::field::Empty,
            client = tracing::field::Empty,
            model = tracing::field::Empty,
        );
        let result = self.chat_inner(key, body).instrument(span.clone()).await;
        let _entered = span.enter();
        match &result {
            Ok(s) => {
                self.metrics.request(&s.policy, "served");
                tracing::info!(provider = %s.provider, attempts = s.attempts, cost = %s.cost, fallback = s.fallback, "served");
            }
            Err(f) => {
                let code = f.error.code();
                self.metrics
                    .request(f.policy.as_deref().unwrap_or("-"), code);
                match &f.error {
                    // Upstream refusals are counted by class where they are decided.
                    GatewayError::Upstream { .. } | GatewayError::LedgerUnavailable(_) => {}
                    GatewayError::Unauthorized
                    | GatewayError::InvalidRequest(_)
                    | GatewayError::ModelNotAllowed { .. }
                    | GatewayError::NoDestination { .. }
                    | GatewayError::CeilingExceeded(_)
                    | GatewayError::BudgetExhausted(_) => self.metrics.refusal(code),
                }
                tracing::info!(code, error = %f.error, "not served");
            }
        }
        result
    }

    async fn chat_inner(
        self: &Arc<Self>,
        key: Option<&str>,
        body: Value,
    ) -> Result<Served, Failed> {
        let active = self.active();
        let (plan, breakers) = (&active.plan, &*active.breakers);
        let no_id = |error| Failed {
            request_id: None,
            policy: None,
            error,
        };
        let who = key
            .and_then(|k| self.authenticate(plan, k))
            .ok_or_else(|| no_id(GatewayError::Unauthorized))?;
        let policy = plan
            .policy(who.policy.as_str())
            .ok_or_else(|| no_id(GatewayError::Unauthorized))?;
        let span = tracing::Span::current();
        span.record("policy", policy.id.as_str());
        span.record("client", who.client.as_str());
        let parsed = parse(&body).map_err(|error| Failed {
            request_id: None,
            policy: Some(policy.id.to_string()),
            error,
        })?;
        let request_id = ulid::Ulid::generate().to_string();
        span.record("request_id", request_id.as_str());
        span.record("model", parsed.model.as_str());
        let with_id = |error| Failed {
            request_id: Some(request_id.clone()),
            policy: Some(policy.id.to_string()),
            error,
        };

        let mut new_request = NewRequest {
            id: request_id.clone(),
            received_at: self.clock.wall(),
            client: who.client.to_string(),
            policy: policy.id.to_string(),
            plan_id: plan.id().to_string(),
            model: parsed.model.clone(),
            mode: policy.ceiling.mode,
            ceiling: policy.ceiling.per_request,
            worst_case: Money::ZERO,
        };

        // Selection: a refusal here is recorded, and no upstream is called.
        let selected = match self.select(plan, breakers, policy, &parsed) {
            Ok(s) => s,
            Err(e) => {
                self.ledger
                    .record_refusal(new_request, e.code())
                    .await
                    .map_err(|l| with_id(GatewayError::LedgerUnavailable(l.to_string())))?;
                return Err(with_id(e));
            }
        };
        new_request.worst_case = selected.worst_case;
        let budgets: Vec<BudgetLimit> = policy
            .budgets
            .iter()
            .map(|b| BudgetLimit {
                period: b.period,
                limit: b.limit,
            })
            .collect();
        // The first attempt is written with the admission: one commit, not two.
        let first = NewAttempt {
            request_id: request_id.clone(),
            seq: 1,
            provider: selected.primary.provider.to_string(),
            upstream_model: selected.primary.upstream_model.clone(),
            jurisdiction: selected.primary.jurisdiction.to_string(),
            started_at: self.clock.wall(),
            worst_case: selected.worst_case,
        };
        match self
            .ledger
            .admit_with_attempt(new_request, budgets, first)
            .await
        {
            Ok(()) => {}
            Err(e @ LedgerError::BudgetExhausted { .. }) => {
                return Err(with_id(GatewayError::BudgetExhausted(e.to_string())));
            }
            Err(e) => return Err(with_id(GatewayError::LedgerUnavailable(e.to_string()))),
        }
        let req = ChatRequest {
            body,
            max_tokens: selected.bounds.output,
            stream: parsed.stream,
        };
        self.run_chain(plan, breakers, policy, &request_id, &selected, &req)
            .await
            .map_err(with_id)
    }

    fn select(
        &self,
        plan: &Plan,
        breakers: &Breakers,
        policy: &Policy,
        parsed: &Parsed,
    ) -> Result<selection::Selected, GatewayError> {
        let Some(route) = policy.routes.get(parsed.model.as_str()) else {
            return Err(GatewayError::ModelNotAllowed {
                model: parsed.model.clone(),
                policy: policy.id.to_string(),
                allowed: policy
                    .routes
                    .keys()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let mut text = parsed.text_bytes;
        if parsed.images > 0 {
            match policy.ceiling.mode {
                Mode::Hard => {
                    return Err(GatewayError::CeilingExceeded(format!(
                        "the request has {} image part(s) whose token cost cannot be bounded; a hard ceiling needs a provable bound",
                        parsed.images
                    )));
                }
                Mode::Soft => text += parsed.images * SOFT_IMAGE_TOKENS,
            }
        }
        let bounds = TokenBounds {
            input: selection::input_bound(text, parsed.messages),
            output: parsed.max_tokens.unwrap_or(policy.max_output_tokens),
        };
        selection::select(route, &policy.ceiling, bounds, |d| breakers.is_open(&d.provider)).map_err(|r| match r {
            Refusal::NoDestination => GatewayError::NoDestination {
                model: parsed.model.clone(),
                policy: policy.id.to_string(),
                hint: plan.no_destination_hint().map(|h| format!(". {h}")).unwrap_or_default(),
            },
            Refusal::DoesNotFit { considered, .. } => {
                let detail: Vec<String> = considered
                    .iter()
                    .map(|c| match &c.verdict {
                        selection::Verdict::ContextTooSmall { needed, window } => format!("{}: needs {needed} tokens, window {window}", c.destination.label()),
                        _ => format!(
                            "{}: {} in × {}/M + {} out × {}/M = {}",
                            c.destination.label(),
                            bounds.input,
                            c.destination.input_per_mtok,
                            bounds.output,
                            c.destination.output_per_mtok,
                            c.worst_case
                        ),
                    })
                    .collect();
                GatewayError::CeilingExceeded(format!(
                    "worst case exceeds the ceiling of {} {} per request ({}); lower max_tokens or shorten the input",
                    policy.ceiling.per_request,
                    plan.currency(),
                    detail.join("; ")
                ))
            }
        })
    }

    async fn run_chain(
        self: &Arc<Self>,
        plan: &Plan,
        breakers: &Breakers,
        policy: &Policy,
        request_id: &str,
        sel: &selection::Selected,
        req: &ChatRequest,
    ) -> Result<Served, GatewayError> {
        let mut reports: Vec<AttemptReport> = Vec::new();
        let mut billed = Money::ZERO;
        let mut charged = Money::ZERO;
        let mut earlier_billing = Billing::NotBilled;
        let mut dest: Destination = sel.primary.clone();
        let mut worst = sel.worst_case;
        let mut on_alternate = false;
        let mut retried = false;
        let mut seq = 0u32;
        let mut force_circuit_open = sel.circuit_open;
        let finish =
            |outcome, served_by: Option<String>, error_code: Option<String>, cost, charged| {
                RequestResult {
                    request_id: request_id.to_string(),
                    outcome,
                    error_code,
                    served_by,
                    cost,
                    charged,
                }
            };
        loop {
            seq += 1;
            let Some(provider) = plan.provider(&dest.provider) else {
                return Err(GatewayError::LedgerUnavailable(
                    "plan lost a provider".into(),
                ));
            };
            if seq > 1 {
                self.ledger
                    .begin_attempt(NewAttempt {
                        request_id: request_id.to_string(),
                        seq,
                        provider: dest.provider.to_string(),
                        upstream_model: dest.upstream_model.clone(),
                        jurisdiction: dest.jurisdiction.to_string(),
                        started_at: self.clock.wall(),
                        worst_case: worst,
                    })
                    .await
                    .map_err(|e| GatewayError::LedgerUnavailable(e.to_string()))?;
            }
            let sent = std::time::Instant::now();
            let (outcome, status, message, key, answer) = self
                .attempt(provider, &dest, req, breakers, force_circuit_open)
                .instrument(tracing::info_span!("attempt", seq, provider = %dest.provider, model = %dest.upstream_model))
                .await;
            force_circuit_open = false;
            let class = outcome.class();
            let billing = class.map_or(Billing::Billed, FailureClass::billing);
            let answer = match answer {
                // Committed: the rest of the attempt (and of the request) is recorded by
                // the stream's tail, which also counts it.
                Some(Answer::Stream(live)) if class.is_none() => {
                    let (tx, rx) = tokio::sync::mpsc::channel(64);
                    let tail = stream::Tail {
                        engine: Arc::clone(self),
                        request_id: request_id.to_string(),
                        seq,
                        dest: dest.clone(),
                        currency: plan.currency().to_string(),
                        worst,
                        billed_before: billed,
                        charged_before: charged,
                        breaker: breakers.get(&dest.provider).cloned(),
                        sent,
                        key: key.clone(),
                    };
                    tokio::spawn(tail.run(*live, tx).instrument(tracing::Span::current()));
                    return Ok(Served {
                        request_id: request_id.to_string(),
                        policy: policy.id.to_string(),
                        reply: Reply::Stream(rx),
                        provider: dest.provider.to_string(),
                        attempts: seq as usize,
                        cost: billed,
                        fallback: on_alternate,
                        clamped_to: sel.clamped_from.map(|_| sel.bounds.output),
                    });
                }
                Some(Answer::Stream(_)) => None,
                Some(Answer::Complete { json, raw }) => Some((json, raw)),
                None => None,
            };
            let class_name = class.map_or("success", FailureClass::as_str);
            let called = class != Some(FailureClass::CircuitOpen);
            self.metrics.attempt(
                dest.provider.as_str(),
                class_name,
                called.then(|| sent.elapsed()),
            );
            let (cost, usage_in, usage_out, served_body) = match (&outcome, answer) {
                (Classified::Success, Some((json, raw))) => {
                    let (usage, served) = match provider.api {
                        Api::Openai => (upstream::openai::usage(&json), Reply::Verbatim(raw)),
                        Api::Anthropic | Api::Gemini => {
                            let (translated, usage) =
                                upstream::translate(provider.api, &dest, json);
                            (usage, Reply::Complete(translated))
                        }
                    };
                    (
                        dest.cost(usage.prompt_tokens, usage.completion_tokens),
                        Some(usage.prompt_tokens),
                        Some(usage.completion_tokens),
                        Some(served),
                    )
                }
                _ => (Money::ZERO, None, None, None),
            };
            let msg = truncate_redact(&message, key.as_deref());
            let Some(class) = class else {
                billed = billed + cost;
                charged = charged + cost;
                self.metrics
                    .spend(dest.provider.as_str(), plan.currency(), cost);
                tracing::info!(seq, provider = %dest.provider, class = "success", status, %cost, "attempt");
                self.record(
                    request_id,
                    seq,
                    status,
                    "success",
                    billing,
                    "served",
                    "a complete answer",
                    usage_in,
                    usage_out,
                    cost,
                    None,
                    Some(finish(
                        ledger::Outcome::Served,
                        Some(dest.provider.to_string()),
                        None,
                        billed,
                        charged,
                    )),
                )
                .await?;
                return Ok(Served {
                    request_id: request_id.to_string(),
                    policy: policy.id.to_string(),
                    reply: served_body.unwrap_or(Reply::Complete(Value::Null)),
                    provider: dest.provider.to_string(),
                    attempts: seq as usize,
                    cost: billed,
                    fallback: on_alternate,
                    clamped_to: sel.clamped_from.map(|_| sel.bounds.output),
                });
            };
            if billing == Billing::MaybeBilled {
                charged = charged + worst;
            }
            reports.push(AttemptReport {
                provider: dest.provider.to_string(),
                model: dest.upstream_model.clone(),
                class: class.to_string(),
                status,
                message: msg.clone(),
            });
            let alternate = match (&sel.alternate, on_alternate) {
                (_, true) => AlternateState::AlreadyUsed,
                (None, false) => AlternateState::None,
                (Some(a), false) => AlternateState::Available {
                    same_upstream: plan
                        .provider(&a.destination.provider)
                        .is_some_and(|ap| ap.same_upstream(provider)),
                    fits_ceiling: a.fits,
                },
            };
            let credential_changed = class == FailureClass::Auth
                && !retried
                && self.credentials.refresh(provider, key.as_deref());
            let decision = decide::decide(
                class,
                &decide::Context {
                    mode: policy.ceiling.mode,
                    earlier_billing,
                    alternate,
                    credential_changed,
                    already_retried: retried,
                },
            );
            // Refuse and stop end the request: recorded with its last attempt.
            let closing = match decision.action {
                Action::Refuse => Some(ledger::Outcome::Refused),
                Action::Stop => Some(ledger::Outcome::Failed),
                Action::RetrySame | Action::FailOver => None,
            }
            .map(|outcome| finish(outcome, None, Some(class.as_str().into()), billed, charged));
            self.record(
                request_id,
                seq,
                status,
                class.as_str(),
                billing,
                decision.action.as_str(),
                &decision.reason(),
                None,
                None,
                Money::ZERO,
                Some(msg.clone()),
                closing,
            )
            .await?;
            earlier_billing = earlier_billing.max(billing);
            tracing::info!(seq, provider = %dest.provider, class = class.as_str(), status, decision = decision.action.as_str(), reason = %decision.reason(), "attempt");
            match decision.action {
                Action::RetrySame => {
                    retried = true;
                }
                Action::FailOver => {
                    let Some(a) = &sel.alternate else { break };
                    self.metrics.failover(
                        dest.provider.as_str(),
                        a.destination.provider.as_str(),
                        class.as_str(),
                    );
                    dest = a.destination.clone();
                    worst = a.worst_case;
                    on_alternate = true;
                    retried = false;
                }
                Action::Refuse | Action::Stop => {
                    if decision.action == Action::Refuse {
                        self.metrics.refusal(class.as_str());
                    }
                    let summary = reports
                        .iter()
                        .map(|r| format!("{} → {}", r.provider, r.class))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(GatewayError::Upstream {
                        class,
                        provider: dest.provider.to_string(),
                        status,
                        message: format!(
                            "{} (provider {}, class {class}; {} attempt(s): {summary}; {})",
                            msg,
                            dest.provider,
                            reports.len(),
                            decision.reason()
                        ),
                        attempts: reports,
                        request_id: request_id.to_string(),
                    });
                }
            }
        }
        Err(GatewayError::LedgerUnavailable(
            "decision loop ended without an outcome".into(),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    async fn record(
        &self,
        request_id: &str,
        seq: u32,
        status: Option<u16>,
        class: &str,
        billing: Billing,
        decision: &str,
        reason: &str,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cost: Money,
        message: Option<String>,
        closing: Option<RequestResult>,
    ) -> Result<(), GatewayError> {
        let a = AttemptResult {
            request_id: request_id.to_string(),
            seq,
            finished_at: self.clock.wall(),
            status,
            class: class.to_string(),
            billing,
            decision: decision.to_string(),
            reason: reason.to_string(),
            input_tokens,
            output_tokens,
            cost,
            message,
        };
        match closing {
            Some(r) => self.ledger.finish(a, r).await,
            None => self.ledger.finish_attempt(a).await,
        }
        .map_err(|e| GatewayError::LedgerUnavailable(e.to_string()))
    }

    /// One attempt: breaker, credential, call, classification.
    async fn attempt(
        &self,
        provider: &Provider,
        dest: &Destination,
        req: &ChatRequest,
        breakers: &Breakers,
        force_open: bool,
    ) -> (
        Classified,
        Option<u16>,
        String,
        Option<String>,
        Option<Answer>,
    ) {
        let breaker = breakers.get(&provider.id);
        let permit = match breaker {
            Some(_) if force_open => Permit::Rejected,
            Some(b) => b.acquire(breakers.now_ms()),
            None => Permit::Call,
        };
        if permit == Permit::Rejected {
            let o = Classified::Failure {
                class: FailureClass::CircuitOpen,
                reason: "circuit open: no call made".into(),
            };
            return (
                o,
                None,
                format!("circuit of {} is open; no call was made", provider.id),
                None,
                None,
            );
        }
        let key = match self.credentials.get(provider) {
            Ok(k) => k,
            Err(e) => {
                let o = Classified::Failure {
                    class: FailureClass::Auth,
                    reason: "credential unavailable".into(),
                };
                return (o, None, e.to_string(), None, None);
            }
        };
        let prepared =
            upstream::prepare(provider.api, dest, &provider.base_url, key.as_deref(), req);
        let (outcome, status, message, answer) = if req.stream {
            match upstream::open_stream(&self.http, prepared, provider.timeout()).await {
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
            let obs = upstream::send(&self.http, prepared, provider.timeout()).await;
            observe(provider.api, obs)
        };
        if let Some(b) = breaker {
            b.record(outcome.class(), breakers.now_ms());
        }
        (outcome, status, message, key, answer)
    }
}
