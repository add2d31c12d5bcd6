//! The gateway: authenticate → parse → select → admit, then the chain (attempt →
//! classify → decide → record) until served or stopped. Knows nothing of HTTP
//! frameworks: `http` maps its results to responses.
//!
//! A request runs on a task of its own, detached from the client's connection: a
//! client that hangs up does not cut an attempt already sent, so the ledger learns
//! what the vendor billed and the reservation settles.

mod attempt;
mod chain;
mod history;
pub mod ingress;
mod recorder;
pub mod request;
mod shape;
mod stream;

use std::sync::{Arc, RwLock};

use serde::Serialize;
use serde_json::Value;
use tracing::Instrument;

use crate::breaker::Breakers;
use crate::clock::Clock;
use crate::failure::FailureClass;
use crate::ledger::{BudgetLimit, Ledger, LedgerError, NewAttempt, NewRequest};
use crate::metrics::{Metrics, MetricsError};
use crate::money::Money;
use crate::policy::plan::{ClientRef, Destination, Mode, Plan, Policy};
use crate::selection::{self, Refusal, TokenBounds, Unbounded};
use crate::upstream::bound::Undeclared;
use crate::upstream::{ChatRequest, Credentials};
use ingress::Ingress;
use recorder::{ClientWatch, InFlight, Recorder};
use request::Parsed;

/// Most bytes of an upstream message kept in the ledger and shown to clients.
const MESSAGE_LIMIT: usize = 2048;
/// Tokens a media part with no declared bound is counted at under a soft policy with
/// no budget, the only policy that may send one: a stand-in, not a bound (OpenAI's
/// high-detail 1024² image is 765 tokens, Anthropic's largest image about 1,600).
pub const SOFT_MEDIA_TOKENS: u64 = 1_600;

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
    #[error("{message}")]
    InvalidRequest {
        message: String,
        /// The request field at fault, when one is (OpenAI's `param`).
        param: Option<String>,
    },
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
    /// The ledger could not write; what that left undone depends on when.
    #[error("{}: {detail}", stage.consequence())]
    LedgerUnavailable { stage: LedgerStage, detail: String },
    /// A bug in purser, not the ledger's or the client's fault.
    #[error("internal error: {0}")]
    Internal(String),
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

/// When the ledger failed, which says what was and was not done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerStage {
    /// Admission (or a refusal's row): no upstream call was made.
    BeforeCall,
    /// The alternate's row or its reservation: the alternate was not called.
    BeforeAlternate,
    /// An attempt's end: the call was made, and restart or the sweeper recovers it.
    AfterCall,
}

impl LedgerStage {
    fn consequence(self) -> &'static str {
        match self {
            LedgerStage::BeforeCall => {
                "the ledger cannot record this request, so no upstream call was made"
            }
            LedgerStage::BeforeAlternate => {
                "the ledger could not record or reserve the failover, so the alternate was not called"
            }
            LedgerStage::AfterCall => {
                "the ledger could not record how the upstream call ended; it stays charged at its worst case until recovered"
            }
        }
    }
}

impl GatewayError {
    /// The ledger failed at `stage`.
    pub fn ledger(stage: LedgerStage, e: impl std::fmt::Display) -> GatewayError {
        GatewayError::LedgerUnavailable {
            stage,
            detail: e.to_string(),
        }
    }

    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> GatewayError {
        GatewayError::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_string),
        }
    }

    /// `model` is not one `policy` allows; the error lists those it does.
    fn model_not_allowed(policy: &Policy, model: String) -> GatewayError {
        GatewayError::ModelNotAllowed {
            model,
            policy: policy.id.to_string(),
            allowed: policy
                .routes
                .keys()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The request field at fault, if any.
    pub fn param(&self) -> Option<&str> {
        match self {
            GatewayError::InvalidRequest { param, .. } => param.as_deref(),
            GatewayError::Unauthorized
            | GatewayError::ModelNotAllowed { .. }
            | GatewayError::NoDestination { .. }
            | GatewayError::CeilingExceeded(_)
            | GatewayError::BudgetExhausted(_)
            | GatewayError::LedgerUnavailable { .. }
            | GatewayError::Internal(_)
            | GatewayError::Upstream { .. } => None,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Unauthorized => "unauthorized",
            GatewayError::InvalidRequest { .. } => "invalid_request",
            GatewayError::ModelNotAllowed { .. } => "model_not_allowed",
            GatewayError::NoDestination { .. } => "no_destination",
            GatewayError::CeilingExceeded(_) => "ceiling_exceeded",
            GatewayError::BudgetExhausted(_) => "budget_exhausted",
            GatewayError::LedgerUnavailable { .. } => "ledger_unavailable",
            GatewayError::Internal(_) => "internal",
            GatewayError::Upstream { class, .. } => class.as_str(),
        }
    }
}

/// One client call as the HTTP edge hands it over: which API it came in by, its body,
/// and the client headers a native pass-through keeps (Anthropic's version and betas).
#[derive(Debug, Clone)]
pub struct Call {
    pub ingress: Ingress,
    pub body: Value,
    pub headers: Vec<(String, String)>,
    /// The bytes `body` was parsed from, kept so that the parsed body need not be while
    /// a call runs (`ChatRequest::park`); `None` keeps it parsed.
    pub raw: Option<bytes::Bytes>,
}

/// An admitted request: what its chain runs on, and nothing of what admitting it took.
struct Admitted<'p> {
    policy: &'p Policy,
    request_id: String,
    selected: selection::Selected,
    /// Boxed: the chain keeps it for the whole call (parked), and an async fn holds a
    /// value it is given in two slots, the argument's and its own.
    req: Box<ChatRequest>,
    /// What the chain needs of the request once its body is parked (`chain::Chain`).
    ingress: Ingress,
    stores: bool,
    rec: Recorder,
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
    /// Bytes of the longest model name any policy allows: a request naming a longer
    /// one is refused before it costs a ledger row.
    longest_model: usize,
}

impl Active {
    fn new(plan: Plan, breakers: Breakers) -> Active {
        let longest_model = plan
            .policies()
            .flat_map(|p| p.routes.keys())
            .map(|m| m.as_str().len())
            .max()
            .unwrap_or(0);
        Active {
            plan: Arc::new(plan),
            breakers: Arc::new(breakers),
            longest_model,
        }
    }
}

/// The running gateway: the active plan and everything the loop needs.
pub struct Engine {
    active: RwLock<Arc<Active>>,
    /// Serialises plan swaps so breaker state carried across reloads is never lost.
    swap: std::sync::Mutex<()>,
    /// A request holds the read side from taking its `received_at` (which names its
    /// budget windows) until its admission is in the ledger (or it is refused); a
    /// reload that adds budgets holds the write side while it counts their windows and
    /// swaps the plan (`pause_admissions`). So no admission under the old budgets
    /// reaches the ledger after the count: such a one holds nothing in an added window,
    /// and the window would never count it. Nor is one received in the period before
    /// the count's admitted after it, into a window the count did not look at.
    admissions: tokio::sync::RwLock<()>,
    pub ledger: Ledger,
    pub metrics: Metrics,
    clock: Arc<dyn Clock>,
    http: reqwest::Client,
    credentials: Credentials,
    inflight: Arc<InFlight>,
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

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Upstream(#[from] crate::upstream::UpstreamError),
}

impl Engine {
    pub fn new(plan: Plan, ledger: Ledger, clock: Arc<dyn Clock>) -> Result<Engine, EngineError> {
        let breakers = Breakers::for_plan(&plan, clock.clone(), None);
        // Never the default client on failure: it follows redirects (see http_client).
        let http = crate::upstream::http_client()?;
        let metrics = Metrics::new()?;
        metrics.set_plan(plan.id());
        Ok(Engine {
            active: RwLock::new(Arc::new(Active::new(plan, breakers))),
            swap: std::sync::Mutex::new(()),
            admissions: tokio::sync::RwLock::new(()),
            ledger,
            metrics,
            clock,
            http,
            credentials: Credentials::default(),
            inflight: Arc::new(InFlight::new()),
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

    /// Wait, at most `patience`, for the admissions under way to reach the ledger, and
    /// hold new ones back until the guard is dropped: a reload counts the windows it
    /// adds and swaps the plan while it holds it, so every admission either is in the
    /// count or checks the new plan's budgets against the counted windows. `None` when
    /// they did not reach it in time (a stalled ledger): new admissions wait behind a
    /// pending pause, so the wait is bounded rather than left to the stall.
    pub async fn pause_admissions(
        &self,
        patience: std::time::Duration,
    ) -> Option<tokio::sync::RwLockWriteGuard<'_, ()>> {
        tokio::time::timeout(patience, self.admissions.write())
            .await
            .ok()
    }

    /// Swap in a new plan atomically; requests already running keep theirs. Breaker
    /// state of destinations that survive the change carries over.
    pub fn replace_plan(&self, plan: Plan) -> Arc<Plan> {
        let _one_at_a_time = self.swap.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.active();
        let breakers = Breakers::for_plan(&plan, self.clock.clone(), Some(&old.breakers));
        self.metrics.set_plan(plan.id());
        *self.active.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(Active::new(plan, breakers));
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

    /// `POST /v1/messages/count_tokens`: the input-token bound of sending this body to
    /// the model's Anthropic destinations, the largest of them. An upper bound, not a
    /// count: bytes plus the overhead table, the bound every ceiling is proved with.
    /// Nothing is called and nothing is charged (Anthropic does not bill counting).
    pub fn count_tokens(&self, key: Option<&str>, body: Value) -> Result<u64, GatewayError> {
        let plan = self.plan();
        let who = key
            .and_then(|k| self.authenticate(&plan, k))
            .ok_or(GatewayError::Unauthorized)?;
        let policy = plan
            .policy(who.policy.as_str())
            .ok_or(GatewayError::Unauthorized)?;
        let model = match body.get("model") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            _ => {
                return Err(GatewayError::invalid(
                    "missing required field `model`",
                    Some("model"),
                ));
            }
        };
        let route = policy
            .routes
            .get(model.as_str())
            .ok_or_else(|| GatewayError::model_not_allowed(policy, model.clone()))?;
        let req = ChatRequest {
            body,
            max_tokens: 0,
            stream: false,
            ingress: Ingress::Messages,
            headers: Vec::new(),
            chat: Default::default(),
            raw: None,
        };
        let undeclared = if policy.needs_proof() {
            Undeclared::Refuse
        } else {
            Undeclared::StandIn(SOFT_MEDIA_TOKENS)
        };
        let mut most: Option<u64> = None;
        for d in route
            .pool
            .iter()
            .chain(&route.accounts)
            .chain(&route.alternate)
            .filter(|d| d.api == crate::policy::plan::Api::Anthropic)
        {
            let n = crate::upstream::bound::input_tokens(d, &req, undeclared).map_err(|u| {
                GatewayError::invalid(
                    format!("`{}` cannot be bounded: {}", u.param, u.what),
                    Some(&u.param),
                )
            })?;
            most = Some(most.map_or(n, |m| m.max(n)));
        }
        most.ok_or_else(|| GatewayError::NoDestination {
            model,
            policy: policy.id.to_string(),
            hint: ". count_tokens is answered for models with an `api: anthropic` destination"
                .into(),
        })
    }

    /// Nonzero while a request's task runs or an admitted request is not yet finished in
    /// the ledger (shutdown waits for zero; a request counts from its task's start, so
    /// one whose client hung up before its admission is waited for too). An admitted
    /// request whose task still runs counts twice: read it as zero or not.
    pub fn in_flight(&self) -> usize {
        self.inflight.count()
    }

    /// Wait until every request's task has ended and every admitted request has
    /// finished recording.
    pub async fn drained(&self) {
        self.inflight.drained().await
    }

    /// Handle one chat completion on a task of its own: if the caller stops waiting
    /// (the client hung up), the request still runs to its end and is recorded, with
    /// `client_disconnected` as its error code.
    /// `hold` (the HTTP edge's concurrency permit) is kept until the request's end is
    /// recorded, however long it outlives its connection.
    pub async fn chat(
        self: &Arc<Self>,
        key: Option<&str>,
        body: Value,
        hold: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<Served, Failed> {
        let call = Call {
            ingress: Ingress::Chat,
            body,
            headers: Vec::new(),
            raw: None,
        };
        self.call(key, call, hold).await
    }

    /// Handle one call of any ingress, as `chat` does.
    pub async fn call(
        self: &Arc<Self>,
        key: Option<&str>,
        body: Call,
        hold: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<Served, Failed> {
        let watch = ClientWatch::new(hold);
        let waiting = watch.guard();
        let engine = Arc::clone(self);
        let key = key.map(str::to_string);
        let running = self.inflight.running();
        // Boxed, as the admitted request is below: each layer of the request's task
        // (this block, `chat_traced`, `chat_inner`) keeps a slot for what it was given
        // for the task's whole life, though `admit` moves the call out at once.
        let body = Box::new(body);
        let task = tokio::spawn(async move {
            let _running = running;
            engine.chat_traced(key.as_deref(), body, watch).await
        });
        let result = match task.await {
            Ok(r) => r,
            Err(e) => Err(Failed {
                request_id: None,
                policy: None,
                error: GatewayError::Internal(format!(
                    "the request's task ended abnormally ({e}); it is recorded as interrupted"
                )),
            }),
        };
        waiting.answered();
        result
    }

    /// The whole request, recorded, traced and counted.
    async fn chat_traced(
        self: &Arc<Self>,
        key: Option<&str>,
        body: Box<Call>,
        watch: ClientWatch,
    ) -> Result<Served, Failed> {
        let span = tracing::info_span!(
            "request",
            request_id = tracing::field::Empty,
            policy = tracing::field::Empty,
            client = tracing::field::Empty,
            model = tracing::field::Empty,
            ingress = body.ingress.as_str(),
        );
        let ingress = body.ingress;
        let result = self
            .chat_inner(key, body, watch)
            .instrument(span.clone())
            .await;
        let _entered = span.enter();
        match &result {
            Ok(s) => {
                self.metrics.request(ingress, &s.policy, "served");
                tracing::info!(provider = %s.provider, attempts = s.attempts, cost = %s.cost, fallback = s.fallback, "served");
            }
            Err(f) => {
                let code = f.error.code();
                self.metrics
                    .request(ingress, f.policy.as_deref().unwrap_or("-"), code);
                match &f.error {
                    // Upstream refusals are counted by class where they are decided.
                    GatewayError::Upstream { .. }
                    | GatewayError::LedgerUnavailable { .. }
                    | GatewayError::Internal(_) => {}
                    GatewayError::Unauthorized
                    | GatewayError::InvalidRequest { .. }
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

    /// The admission (`admit`), then the chain until the request is served or stops.
    async fn chat_inner(
        self: &Arc<Self>,
        key: Option<&str>,
        call: Box<Call>,
        watch: ClientWatch,
    ) -> Result<Served, Failed> {
        let active = self.active();
        let (plan, breakers) = (&active.plan, &*active.breakers);
        // Boxed: what authentication, parsing, selection and the admission hold (the
        // parsed view, the history, the new rows, 1.8-3.8 kB of future) is freed once
        // the request is admitted, and the request's task holds only what the chain
        // needs while it waits on the vendor, for seconds or minutes.
        let Admitted {
            policy,
            request_id,
            selected,
            req,
            ingress,
            stores,
            rec,
        } = Box::pin(self.admit(&active, key, call, watch)).await?;
        let running_plan = || self.plan();
        chain::Chain {
            plan,
            policy,
            sel: &selected,
            ingress,
            stores,
            deps: chain::Deps {
                ledger: &self.ledger,
                metrics: &self.metrics,
                clock: &*self.clock,
                caller: attempt::Caller {
                    http: &self.http,
                    credentials: &self.credentials,
                    breakers,
                },
                running_plan: &running_plan,
            },
        }
        .run(rec, req)
        .await
        .map_err(|error| Failed {
            request_id: Some(request_id),
            policy: Some(policy.id.to_string()),
            error,
        })
    }

    /// Authenticate, parse, select and admit: the request's row, its first attempt's
    /// and its reservation written ahead of any call, or the refusal recorded.
    async fn admit<'p>(
        self: &Arc<Self>,
        active: &'p Active,
        key: Option<&str>,
        call: Box<Call>,
        watch: ClientWatch,
    ) -> Result<Admitted<'p>, Failed> {
        let Call {
            ingress,
            body,
            headers,
            raw,
        } = *call;
        let (plan, breakers) = (&*active.plan, &*active.breakers);
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
        let refused = |error| Failed {
            request_id: None,
            policy: Some(policy.id.to_string()),
            error,
        };
        let mut parsed = ingress::parse(ingress, &body).map_err(refused)?;
        // A name longer than any configured one can only be refused: it is, before it
        // costs a ledger row (a 1 MB model name is not worth writing 1 MB for).
        if parsed.model.len() > active.longest_model {
            return Err(refused(GatewayError::model_not_allowed(
                policy,
                format!(
                    "{}… ({} bytes, longer than any configured model name)",
                    parsed.model.chars().take(64).collect::<String>(),
                    parsed.model.len()
                ),
            )));
        }
        // A continued Responses conversation: its history bounded from the ledger, or
        // refused where a proof is needed and the ledger does not hold it.
        let history = history::resolve(&self.ledger, policy, ingress, &body, &mut parsed)
            .await
            .map_err(refused)?;
        let request_id = ulid::Ulid::generate().to_string();
        span.record("request_id", request_id.as_str());
        span.record("model", parsed.model.as_str());
        let with_id = |error| Failed {
            request_id: Some(request_id.clone()),
            policy: Some(policy.id.to_string()),
            error,
        };

        // From the instant that names the request's budget windows (`received_at`) until
        // its admission is in the ledger: a reload that adds a budget counts the windows
        // only once no such request is on its way (`pause_admissions`), whichever period
        // it was received in.
        let admitting = self.admissions.read().await;
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
            ingress,
            shape: None,
        };

        // Selection: a refusal here is recorded, and no upstream is called.
        // The primary's API decides which fields it can take (`upstream::fields`),
        // checked before any admission or call. A failover checks the alternate's API
        // before its call (`fields::check`).
        // The request as every destination's translation starts from it; the output
        // cap is set once selection has proved it.
        let mut req = ChatRequest {
            body,
            max_tokens: 0,
            stream: parsed.stream,
            ingress,
            headers,
            chat: Default::default(),
            raw,
        };
        let selected = match self
            .select(plan, breakers, policy, &parsed, &req, history.as_ref())
            .and_then(|s| {
                ingress::check_request(&req, s.primary.api)
                    .map_err(|(param, why)| {
                        (
                            GatewayError::invalid(why, Some(&param)),
                            Some(s.bounds.input),
                        )
                    })
                    .map(|()| s)
            }) {
            Ok(mut s) => {
                // Which candidates were weighed is for `purser explain`; a request in
                // flight need not hold a copy of each destination for its whole life.
                s.considered = Vec::new();
                s
            }
            Err((e, input)) => {
                new_request.shape = Some(shape::of(&parsed, &req.body, ingress, input, None));
                self.ledger
                    .record_refusal(new_request, e.code())
                    .await
                    .map_err(|l| with_id(GatewayError::ledger(LedgerStage::BeforeCall, l)))?;
                return Err(with_id(e));
            }
        };
        new_request.worst_case = selected.worst_case;
        new_request.shape = Some(shape::of(
            &parsed,
            &req.body,
            ingress,
            Some(selected.bounds.input),
            Some(selected.bounds.output),
        ));
        // The running plan's limits, not this request's snapshot's: a reload that lowered
        // a budget while the request was being parsed and selected binds it too.
        let budgets = current_limits(&self.plan(), policy);
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
        let admitted = self
            .ledger
            .admit_with_attempt(new_request, budgets, first)
            .await;
        drop(admitting);
        match admitted {
            Ok(()) => {}
            Err(e @ LedgerError::BudgetExhausted { .. }) => {
                return Err(with_id(GatewayError::BudgetExhausted(e.to_string())));
            }
            Err(e) => return Err(with_id(GatewayError::ledger(LedgerStage::BeforeCall, e))),
        }
        let pending = self.inflight.admit(&request_id, &self.ledger);
        let rec = Recorder::new(
            Arc::clone(self),
            &request_id,
            plan.currency(),
            pending,
            watch,
        );
        req.max_tokens = selected.bounds.output;
        Ok(Admitted {
            policy,
            request_id,
            selected,
            ingress,
            stores: crate::upstream::openai::stores(&req),
            req: Box::new(req),
            rec,
        })
    }

    /// Selection, or the refusal with the smallest input bound any candidate had (what
    /// the ledger records of a refused request's shape; `None` where none was bounded).
    fn select(
        &self,
        plan: &Plan,
        breakers: &Breakers,
        policy: &Policy,
        parsed: &Parsed,
        req: &ChatRequest,
        history: Option<&history::History>,
    ) -> Result<selection::Selected, (GatewayError, Option<u64>)> {
        let Some(route) = policy.routes.get(parsed.model.as_str()) else {
            return Err((
                GatewayError::model_not_allowed(policy, parsed.model.clone()),
                None,
            ));
        };
        // The bound must be a proof wherever money is held to it.
        let strict = policy.needs_proof();
        if let (true, Some((field, why))) = (strict, parsed.unbounded.first()) {
            return Err((
                GatewayError::invalid(
                    format!(
                        "`{field}` cannot be bounded ({why}); {}, so policy `{}` refuses it",
                        needs(policy),
                        policy.id
                    ),
                    Some(field),
                ),
                None,
            ));
        }
        let undeclared = if strict {
            Undeclared::Refuse
        } else {
            Undeclared::StandIn(SOFT_MEDIA_TOKENS)
        };
        let output = parsed.max_tokens.unwrap_or(policy.max_output_tokens);
        // Looked for once: every candidate's bounds need it.
        let marked = crate::upstream::bound::request_marks(req);
        let bounds_of = |d: &Destination| -> Result<TokenBounds, Unbounded> {
            if strict && d.unpriced_call_fee() {
                return Err(selection::unpriced_call_fee());
            }
            // A destination that cannot take this ingress natively is never chosen.
            if let Err((param, what)) = ingress::check_request(req, d.api)
                && req.ingress != Ingress::Chat
            {
                return Err(Unbounded { param, what });
            }
            if let (true, selection::TierAsk::Tier(t)) = (strict, parsed.tier)
                && !d.terms.service_tiers.contains_key(&t)
            {
                return Err(Unbounded {
                    param: "service_tier".into(),
                    what: format!(
                        "the `{}` service tier has no rates in the model entry (`service_tiers.{}`)",
                        t.as_str(),
                        t.as_str()
                    ),
                });
            }
            // The continued history: bounded where the response is stored; elsewhere
            // (or with its usage unknown) unbounded, a risk only a policy that needs
            // no proof takes.
            let continued = match history.map(|h| h.tokens_at(d)) {
                Some(Ok(n)) => n,
                Some(Err(u)) if strict => return Err(u),
                Some(Err(_)) | None => 0,
            };
            Ok(TokenBounds {
                input: crate::upstream::bound::input_tokens(d, req, undeclared)?
                    .saturating_add(continued),
                output,
                reasoning: d.reasoning_budget().unwrap_or(0),
                choices: parsed.choices,
                tier: parsed.tier,
                cache_marked: crate::upstream::bound::cache_marked_for(d, marked),
                audio: crate::upstream::bound::sends_audio(d, req),
            })
        };
        selection::select(route, &policy.ceiling, bounds_of, |d| {
            breakers.is_open(&d.provider)
        })
        .map_err(|r| {
            let input = match &r {
                Refusal::DoesNotFit { considered, .. } => considered
                    .iter()
                    .filter_map(|c| c.bounds.map(|b| b.input))
                    .min(),
                Refusal::NoDestination | Refusal::Unbounded(_) => None,
            };
            (refusal_error(plan, policy, parsed, r), input)
        })
    }
}

/// Why a policy needs a provable bound, for the refusal a client reads.
fn needs(policy: &Policy) -> &'static str {
    match policy.ceiling.mode {
        Mode::Hard => "a hard ceiling needs a provable bound",
        Mode::Soft => "a policy with a budget needs a provable bound",
    }
}

/// The error a client reads for a selection refusal.
fn refusal_error(plan: &Plan, policy: &Policy, parsed: &Parsed, r: Refusal) -> GatewayError {
    match r {
        Refusal::NoDestination => GatewayError::NoDestination {
            model: parsed.model.clone(),
            policy: policy.id.to_string(),
            hint: plan
                .no_destination_hint()
                .map(|h| format!(". {h}"))
                .unwrap_or_default(),
        },
        Refusal::Unbounded(u) => GatewayError::invalid(
            format!(
                "`{}` cannot be bounded at any destination of model `{}`: {}; {}, so policy `{}` refuses it",
                u.param,
                parsed.model,
                u.what,
                needs(policy),
                policy.id
            ),
            Some(&u.param),
        ),
        Refusal::DoesNotFit { considered, .. } => {
            GatewayError::CeilingExceeded(selection::does_not_fit_message(
                policy.ceiling.per_request,
                plan.currency(),
                &considered,
            ))
        }
    }
}

/// The budgets an admission or a top-up is checked against: the running plan's for the
/// request's policy (a reload may have lowered one since the request took its
/// snapshot), or the request's own when the running plan no longer has that policy.
pub(crate) fn current_limits(running: &Plan, admitted_under: &Policy) -> Vec<BudgetLimit> {
    running
        .policy(admitted_under.id.as_str())
        .unwrap_or(admitted_under)
        .budgets
        .iter()
        .map(|b| BudgetLimit {
            period: b.period,
            limit: b.limit,
        })
        .collect()
}
