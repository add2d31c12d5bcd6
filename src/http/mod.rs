//! HTTP edge: routes, extraction and the single error → response mapping. Handlers
//! stay thin: extract, call the engine, map the result.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::gateway::{Engine, Failed, GatewayError, Reply, Served};
use crate::reload::Reloader;

mod admin;
pub mod audit;
mod page;

pub use audit::AdminToken;

/// Default request body limit (10 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;

/// Default limit of chat requests in the gateway at once. Each may hold a body of up
/// to `body_limit` and an upstream connection (the client keeps up to 256 idle ones
/// per host), so 256 bounds request bodies in memory near 2.5 GiB; it is four times
/// the benchmark's highest concurrency (c=64), so a healthy gateway with slow
/// upstreams does not shed load.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Seconds a client shed for overload is told to wait (`Retry-After`).
const RETRY_AFTER_S: &str = "1";

/// A request refused before its body is read (401, 413, 503 overloaded) has the rest
/// of its body read and dropped, at most this many bytes for at most `LINGER_TIME`, as
/// nginx's lingering close does: closing a socket with unread bytes makes the kernel
/// reset the connection, and a client still sending sees a broken pipe instead of
/// its answer. The bounds keep a stranger from holding the gateway's reads.
const LINGER_BYTES: usize = 64 * 1024 * 1024;
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Where `/metrics` is served and who may read it. It shows every policy's remaining
/// budget, which is not for every client of the gateway.
#[derive(Clone, Default)]
pub enum MetricsAccess {
    /// On this listener, to anyone (the default, as Prometheus expects).
    #[default]
    Open,
    /// On this listener, with `Authorization: Bearer <token>`.
    Token(AdminToken),
    /// Not on this listener: served on its own address by [`metrics_router`].
    Elsewhere,
}

/// How the HTTP edge is set up around the engine.
#[derive(Clone)]
pub struct Options {
    pub body_limit: usize,
    /// Enables the audit and admin APIs; `None` keeps them off.
    pub admin_token: Option<AdminToken>,
    /// Where `POST /admin/v1/reload` recompiles from.
    pub reloader: Option<Arc<Reloader>>,
    /// Chat requests handled at once; beyond it a client gets 503 `overloaded`.
    pub max_in_flight: usize,
    pub metrics: MetricsAccess,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            body_limit: DEFAULT_BODY_LIMIT,
            admin_token: None,
            reloader: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            metrics: MetricsAccess::Open,
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub admin: Option<AdminToken>,
    pub reloader: Option<Arc<Reloader>>,
    /// One permit per chat request in the gateway.
    pub in_flight: Arc<tokio::sync::Semaphore>,
    pub metrics_token: Option<AdminToken>,
    /// Largest chat request body read.
    pub body_limit: usize,
}

pub fn router(engine: Arc<Engine>, opts: Options) -> Router {
    let metrics_token = match &opts.metrics {
        MetricsAccess::Token(t) => Some(t.clone()),
        MetricsAccess::Open | MetricsAccess::Elsewhere => None,
    };
    let state = AppState {
        engine,
        admin: opts.admin_token,
        reloader: opts.reloader,
        in_flight: Arc::new(tokio::sync::Semaphore::new(opts.max_in_flight)),
        metrics_token,
        body_limit: opts.body_limit,
    };
    let r = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready));
    let r = match opts.metrics {
        MetricsAccess::Open | MetricsAccess::Token(_) => r.route("/metrics", get(metrics)),
        MetricsAccess::Elsewhere => r,
    };
    r.route("/audit/v1/requests", get(audit::requests))
        .route("/audit/v1/requests/{id}", get(audit::request))
        .route("/audit/v1/spend", get(audit::spend))
        .route("/audit/v1/attempts.csv", get(audit::attempts_csv))
        .route("/audit/v1/budgets", get(audit::budgets))
        .route("/audit/v1/spend/series", get(audit::series))
        .route("/audit/v1/failures", get(audit::failures))
        .route("/audit/v1/focus.csv", get(audit::focus_csv))
        .route("/audit/", get(page::index))
        .route("/audit", get(page::to_index))
        .route("/audit/assets/{name}", get(page::asset))
        .route("/admin/v1/plan", get(admin::plan))
        .route("/admin/v1/reload", post(admin::reload))
        .layer(DefaultBodyLimit::max(opts.body_limit))
        .with_state(state)
}

/// `/metrics` alone, for its own listen address (`--metrics-listen`), optionally
/// behind a token as well.
pub fn metrics_router(engine: Arc<Engine>, token: Option<AdminToken>) -> Router {
    let state = AppState {
        engine,
        admin: None,
        reloader: None,
        // No chat route here: nothing takes a permit.
        in_flight: Arc::new(tokio::sync::Semaphore::new(0)),
        metrics_token: token,
        body_limit: 0,
    };
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

async fn ready(State(AppState { engine, .. }): State<AppState>) -> Response {
    let plan_id = engine.plan().id().to_string();
    // After a failed write, ask the ledger to write one small row: its success makes
    // the node ready again by itself, even when no request arrives (a drained node).
    if !engine.ledger.writable() {
        let _ = engine.ledger.probe().await;
    }
    if !engine.ledger.writable() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: the ledger could not write its last group (plan {plan_id})"),
        )
            .into_response();
    }
    match engine.ledger.readable().await {
        Ok(()) => (StatusCode::OK, format!("ready: plan {plan_id}")).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}")).into_response(),
    }
}

/// Prometheus text. Budget gauges are read from the ledger at scrape time; when the
/// ledger cannot be read they are left as last seen rather than failing the scrape.
async fn metrics(
    State(AppState {
        engine,
        metrics_token,
        ..
    }): State<AppState>,
    headers: HeaderMap,
) -> Response {
    if let Some(token) = &metrics_token {
        // Constant-time, as the admin token: a scrape must not leak the token's prefix.
        if !bearer(&headers).is_some_and(|given| token.matches(given)) {
            return envelope(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "authentication_error",
                "/metrics needs `Authorization: Bearer <PURSER_METRICS_TOKEN>`",
                None,
                None,
                &[],
                None,
            );
        }
    }
    let budgets = engine.current_budgets().await.unwrap_or_default();
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        engine.render_metrics(&budgets),
    )
        .into_response()
}

/// One model object as OpenAI lists it. `created` is when this gateway started
/// serving: purser has no training date to give, and a stable value keeps clients'
/// caches quiet.
fn model_object(id: &str, created: i64) -> Value {
    json!({"id": id, "object": "model", "created": created, "owned_by": "purser"})
}

/// When this process started serving, in Unix seconds.
fn started() -> i64 {
    static STARTED: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| time::OffsetDateTime::now_utc().unix_timestamp())
}

async fn models(State(AppState { engine, .. }): State<AppState>, headers: HeaderMap) -> Response {
    match engine.models_for(bearer(&headers).unwrap_or("")) {
        Ok(models) => axum::Json(json!({
            "object": "list",
            "data": models.iter().map(|m| model_object(m, started())).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => error_response(None, &e),
    }
}

/// `GET /v1/models/{id}`: the model when the caller's policy allows it, else
/// OpenAI's 404. The id is matched whole, slashes included, so an `org/model` id gets
/// the envelope rather than the router's empty 404.
async fn model(
    State(AppState { engine, .. }): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    match engine.models_for(bearer(&headers).unwrap_or("")) {
        Ok(models) if models.contains(&id) => {
            axum::Json(model_object(&id, started())).into_response()
        }
        Ok(_) => envelope(
            StatusCode::NOT_FOUND,
            "model_not_found",
            "invalid_request_error",
            &format!("The model `{id}` does not exist or you do not have access to it."),
            None,
            None,
            &[],
            Some("model"),
        ),
        Err(e) => error_response(None, &e),
    }
}

async fn chat(State(state): State<AppState>, req: Request) -> Response {
    let AppState {
        engine,
        in_flight,
        body_limit,
        ..
    } = state;
    // The key is checked from the headers before a byte of the body is read: a
    // stranger's 10 MiB costs the gateway nothing but its headers (and, so that the
    // stranger can read its 401, a bounded drain).
    let key = bearer(req.headers()).map(str::to_string);
    let Some(who) = key
        .as_deref()
        .and_then(|k| engine.authenticate(&engine.plan(), k))
    else {
        // Counted and logged as the engine counts its own refusals.
        engine.metrics.request("-", "unauthorized");
        engine.metrics.refusal("unauthorized");
        tracing::info!(code = "unauthorized", "not served");
        linger(req.into_body().into_data_stream());
        return error_response(None, &GatewayError::Unauthorized);
    };
    // Taken before the body is read, so bodies in memory are bounded by the limit too.
    let Ok(permit) = in_flight.try_acquire_owned() else {
        engine.metrics.request(who.policy.as_str(), "overloaded");
        engine.metrics.refusal("overloaded");
        tracing::info!(policy = %who.policy, client = %who.client, code = "overloaded", "not served: at --max-in-flight");
        linger(req.into_body().into_data_stream());
        return overloaded();
    };
    let body = match read_body(req, body_limit).await {
        Ok(b) => b,
        Err(BodyRefusal::TooLarge(rest)) => {
            linger(rest);
            return envelope(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "invalid_request_error",
                "the request body is larger than this gateway accepts",
                None,
                None,
                &[],
                None,
            );
        }
        Err(BodyRefusal::Unreadable(e)) => {
            return error_response(
                None,
                &GatewayError::invalid(format!("the request body could not be read: {e}"), None),
            );
        }
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                None,
                &GatewayError::invalid(format!("the body is not valid JSON: {e}"), None),
            );
        }
    };
    // The raw bytes are not needed while the upstream call runs, which may take minutes.
    drop(body);
    // The permit goes with the request: it runs detached from this connection, and
    // holds its place against the limit until its end is recorded.
    match engine.chat(key.as_deref(), value, Some(permit)).await {
        Ok(served) => served_response(served),
        Err(Failed {
            request_id, error, ..
        }) => error_response(request_id.as_deref(), &error),
    }
}

/// Why a chat body was not read whole.
enum BodyRefusal {
    /// Over the limit: the unread rest, to drain.
    TooLarge(axum::body::BodyDataStream),
    Unreadable(axum::Error),
}

/// The whole body, or a refusal once it passes `limit` bytes (a `Content-Length` over
/// it is refused before any byte is read).
async fn read_body(req: Request, limit: usize) -> Result<Vec<u8>, BodyRefusal> {
    use futures_util::StreamExt;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = req.into_body().into_data_stream();
    if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX)) {
        return Err(BodyRefusal::TooLarge(stream));
    }
    let mut body =
        Vec::with_capacity(declared.map_or(0, |n| usize::try_from(n).unwrap_or(limit).min(limit)));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BodyRefusal::Unreadable)?;
        if body.len() + chunk.len() > limit {
            return Err(BodyRefusal::TooLarge(stream));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Read and drop what is left of a refused request's body, within `LINGER_BYTES` and
/// `LINGER_TIME`, while its answer is written (see `LINGER_BYTES`).
fn linger(mut rest: axum::body::BodyDataStream) {
    use futures_util::StreamExt;
    tokio::spawn(async move {
        let mut read = 0usize;
        let drain = async {
            while let Some(Ok(chunk)) = rest.next().await {
                read += chunk.len();
                if read > LINGER_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    });
}

/// 503 for a request beyond `max_in_flight`: nothing was read, recorded or called.
fn overloaded() -> Response {
    let mut r = envelope(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "server_error",
        "the gateway is at its limit of requests in flight; retry after the time in Retry-After",
        None,
        None,
        &[],
        None,
    );
    r.headers_mut()
        .insert("retry-after", HeaderValue::from_static(RETRY_AFTER_S));
    r
}

/// The served answer.
fn served_response(s: Served) -> Response {
    let streamed = matches!(s.reply, Reply::Stream(_));
    let mut resp = match s.reply {
        Reply::Complete(v) => axum::Json(v).into_response(),
        Reply::Verbatim(body) => ([("content-type", "application/json")], body).into_response(),
        Reply::Stream(rx) => {
            let body = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
            });
            (
                [
                    ("content-type", "text/event-stream"),
                    ("cache-control", "no-cache"),
                ],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
    };
    let h = resp.headers_mut();
    let mut put = |k: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    put("x-purser-request-id", s.request_id);
    put("x-purser-provider", s.provider);
    put("x-purser-attempts", s.attempts.to_string());
    // A stream's cost is known only at its end: it is in the final usage chunk
    // (`purser_cost`) and the ledger, not in a header sent before the first byte.
    if !streamed {
        put("x-purser-cost", s.cost.to_string());
    }
    put("x-purser-fallback", s.fallback.to_string());
    if let Some(n) = s.clamped_to {
        put("x-purser-clamped-max-tokens", n.to_string());
    }
    resp
}

pub fn status_of(e: &GatewayError) -> StatusCode {
    match e {
        GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
        GatewayError::InvalidRequest { .. } | GatewayError::NoDestination { .. } => {
            StatusCode::BAD_REQUEST
        }
        GatewayError::ModelNotAllowed { .. } => StatusCode::FORBIDDEN,
        GatewayError::CeilingExceeded(_) | GatewayError::BudgetExhausted(_) => {
            StatusCode::PAYMENT_REQUIRED
        }
        GatewayError::LedgerUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        GatewayError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        GatewayError::Upstream { class, status, .. } => upstream_status(*class, *status),
    }
}

fn upstream_status(class: crate::failure::FailureClass, status: Option<u16>) -> StatusCode {
    use crate::failure::FailureClass as C;
    match class {
        // No upstream answered: purser itself has no usable credential for the
        // provider. The client's key is fine, so this is not a 401.
        C::Auth if status.is_none() => StatusCode::BAD_GATEWAY,
        // Client-side classes keep the upstream's own status so SDKs raise the same error.
        C::Auth
        | C::ModelNotFound
        | C::ContextLength
        | C::ContentRefusal
        | C::Malformed
        | C::RateLimited => status
            .and_then(|s| StatusCode::from_u16(s).ok())
            .filter(|s| !s.is_success())
            .unwrap_or(match class {
                C::RateLimited => StatusCode::TOO_MANY_REQUESTS,
                C::Auth => StatusCode::UNAUTHORIZED,
                C::ModelNotFound => StatusCode::NOT_FOUND,
                C::ContextLength | C::ContentRefusal | C::Malformed => StatusCode::BAD_REQUEST,
                // Not reached: the arm above takes only the classes listed there.
                C::Timeout
                | C::Overloaded
                | C::CircuitOpen
                | C::Connect
                | C::Dropped
                | C::ServerError
                | C::Unclassified => StatusCode::BAD_GATEWAY,
            }),
        C::Timeout => StatusCode::GATEWAY_TIMEOUT,
        C::Overloaded | C::CircuitOpen => StatusCode::SERVICE_UNAVAILABLE,
        C::Connect | C::Dropped | C::ServerError | C::Unclassified => StatusCode::BAD_GATEWAY,
    }
}

fn error_type(e: &GatewayError) -> &'static str {
    match e {
        GatewayError::Unauthorized => "authentication_error",
        GatewayError::InvalidRequest { .. }
        | GatewayError::ModelNotAllowed { .. }
        | GatewayError::NoDestination { .. } => "invalid_request_error",
        GatewayError::CeilingExceeded(_) | GatewayError::BudgetExhausted(_) => "budget_error",
        GatewayError::LedgerUnavailable { .. } | GatewayError::Internal(_) => "server_error",
        GatewayError::Upstream { .. } => "upstream_error",
    }
}

pub fn error_response(request_id: Option<&str>, e: &GatewayError) -> Response {
    let (provider, attempts) = match e {
        GatewayError::Upstream {
            provider, attempts, ..
        } => (Some(provider.as_str()), attempts.as_slice()),
        GatewayError::Unauthorized
        | GatewayError::InvalidRequest { .. }
        | GatewayError::ModelNotAllowed { .. }
        | GatewayError::NoDestination { .. }
        | GatewayError::CeilingExceeded(_)
        | GatewayError::BudgetExhausted(_)
        | GatewayError::LedgerUnavailable { .. }
        | GatewayError::Internal(_) => (None, &[][..]),
    };
    let mut r = envelope(
        status_of(e),
        e.code(),
        error_type(e),
        &e.to_string(),
        provider,
        request_id,
        attempts,
        e.param(),
    );
    if let Some(id) = request_id.and_then(|i| HeaderValue::from_str(i).ok()) {
        r.headers_mut().insert("x-purser-request-id", id);
    }
    r.headers_mut()
        .insert("x-purser-attempts", HeaderValue::from(attempts.len()));
    r
}

// Each argument is one field of the OpenAI envelope DESIGN extends.
#[allow(clippy::too_many_arguments)]
fn envelope(
    status: StatusCode,
    code: &str,
    ty: &str,
    message: &str,
    provider: Option<&str>,
    request_id: Option<&str>,
    attempts: &[crate::gateway::AttemptReport],
    param: Option<&str>,
) -> Response {
    // `param` names the request field at fault, as OpenAI's own errors do.
    let body = json!({"error": {
        "message": message,
        "type": ty,
        "param": param,
        "code": code,
        "provider": provider,
        "request_id": request_id,
        "attempts": attempts,
    }});
    (status, axum::Json(body)).into_response()
}
