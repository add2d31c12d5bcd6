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
use crate::ingress::{ApiError, Ingress};
use crate::reload::Reloader;

mod admin;
pub mod audit;
mod page;

pub use audit::AdminToken;

/// The listening socket for the gateway, whose queue of connections not yet accepted
/// holds `backlog` (the kernel caps it at `net.core.somaxconn`). tokio's own `bind`
/// asks for 128 (mio's, the standard library's); when more clients than the queue holds
/// connect at once (agents opening their connections together, a load balancer's
/// burst) while the one request thread is busy, the kernel drops the SYNs beyond it and
/// each client waits for its one-second retransmission: at c=1024 on a 200 ms upstream,
/// 250 to 850 dropped per burst and 4-16% of the benchmark's throughput lost
/// (`ListenOverflows`, issue #23). `serve` asks for as many as it serves at once.
pub fn listener(
    addr: std::net::SocketAddr,
    backlog: usize,
) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As tokio's `bind` does on Unix: a restarted gateway can listen again at once on
    // the address its predecessor's closing connections still name.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    // The kernel caps it at `somaxconn`.
    socket.listen(u32::try_from(backlog).unwrap_or(u32::MAX))
}

/// Default request body limit (10 MiB).
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;

/// What one chat request in flight costs in memory, measured (benches: PSS of
/// `purser serve` at c=1024 on a 200 ms upstream, minus its PSS idle, over 1024), for a
/// request of the benchmark's size (a few hundred bytes of prompt): 73 KB, of which the
/// stack's own connections and buffers, measured the same way on the proxy floor, are
/// 67 KB. It grows with the body: about 270 KB with a 64 kB prompt (the floor: about
/// 220 KB), for the prompt is held as parsed (for a failover) and as sent, and the
/// connections' buffers hold it too. Rounded up here from the first measurement (87 KB,
/// before connections shared one router), so the default limit keeps some room.
pub const BYTES_PER_REQUEST_IN_FLIGHT: usize = 96 * 1024;

/// The memory the default limit lets requests in flight take, at the cost above.
pub const IN_FLIGHT_MEMORY_BUDGET: usize = 256 * 1024 * 1024;

/// Default limit of chat requests in the gateway at once: the budget over the cost of
/// one (2,730). LLM calls last seconds to minutes, so a team's ordinary load is
/// thousands of requests in flight; at c=1024 on a 200 ms upstream the old default of
/// 256 turned three requests in four away. Bodies larger than the benchmark's cost more
/// each (see `BYTES_PER_REQUEST_IN_FLIGHT`); every body is read only after the client's
/// key is checked and a permit taken, so only known clients can fill the limit, and
/// `--max-in-flight` lowers it where prompts are large or memory is tight.
pub const DEFAULT_MAX_IN_FLIGHT: usize = IN_FLIGHT_MEMORY_BUDGET / BYTES_PER_REQUEST_IN_FLIGHT;

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
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses))
        .route("/v1/messages/count_tokens", post(count_tokens))
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
                Ingress::Chat,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "authentication_error",
                "/metrics needs `Authorization: Bearer <PURSER_METRICS_TOKEN>`",
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
        Err(e) => error_response(Ingress::Chat, None, &e),
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
            Ingress::Chat,
            StatusCode::NOT_FOUND,
            "model_not_found",
            "invalid_request_error",
            &format!("The model `{id}` does not exist or you do not have access to it."),
            Some("model"),
        ),
        Err(e) => error_response(Ingress::Chat, None, &e),
    }
}

async fn chat(State(state): State<AppState>, req: Request) -> Response {
    serve(state, req, Ingress::Chat).await
}

/// `POST /v1/messages` (Claude Code adds `?beta=true`, which changes nothing here).
async fn messages(State(state): State<AppState>, req: Request) -> Response {
    serve(state, req, Ingress::Messages).await
}

/// `POST /v1/messages/count_tokens`: purser's input bound for the body, an upper bound
/// of what Anthropic would count (see `Engine::count_tokens`); free, like Anthropic's.
async fn count_tokens(State(state): State<AppState>, req: Request) -> Response {
    let ingress = Ingress::Messages;
    let key = client_key(ingress, req.headers()).map(str::to_string);
    let body = match read_body(req, state.body_limit).await {
        Ok(b) => b,
        Err(BodyRefusal::TooLarge(rest)) => {
            linger(rest);
            return envelope(
                ingress,
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "invalid_request_error",
                "the request body is larger than this gateway accepts",
                None,
            );
        }
        Err(BodyRefusal::Unreadable(e)) => {
            let e = GatewayError::invalid(format!("the request body could not be read: {e}"), None);
            return error_response(ingress, None, &e);
        }
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let e = GatewayError::invalid(format!("the body is not valid JSON: {e}"), None);
            return error_response(ingress, None, &e);
        }
    };
    match state.engine.count_tokens(key.as_deref(), value) {
        Ok(n) => axum::Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(ingress, None, &e),
    }
}

/// `POST /v1/responses` (OpenAI Responses, as Codex CLI speaks it).
async fn responses(State(state): State<AppState>, req: Request) -> Response {
    serve(state, req, Ingress::Responses).await
}

/// The client key: `Authorization: Bearer` for every ingress; Anthropic's clients may
/// send it as `x-api-key` instead (`ANTHROPIC_API_KEY`).
fn client_key(ingress: Ingress, headers: &HeaderMap) -> Option<&str> {
    match ingress {
        Ingress::Messages => bearer(headers).or_else(|| {
            headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        }),
        Ingress::Chat | Ingress::Responses => bearer(headers),
    }
}

/// The client's headers a native pass-through keeps: Anthropic's version and betas
/// (a beta can change what the model does and what it bills, so none is dropped).
fn forwarded_headers(ingress: Ingress, headers: &HeaderMap) -> Vec<(String, String)> {
    match ingress {
        Ingress::Messages => ["anthropic-version", "anthropic-beta"]
            .into_iter()
            .flat_map(|name| {
                headers
                    .get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .map(move |v| (name.to_string(), v.to_string()))
            })
            .collect(),
        Ingress::Chat | Ingress::Responses => Vec::new(),
    }
}

/// One client request of any ingress: key, permit, body, engine, answer.
async fn serve(state: AppState, req: Request, ingress: Ingress) -> Response {
    let AppState {
        engine,
        in_flight,
        body_limit,
        ..
    } = state;
    // The key is checked from the headers before a byte of the body is read: a
    // stranger's 10 MiB costs the gateway nothing but its headers (and, so that the
    // stranger can read its 401, a bounded drain).
    let key = client_key(ingress, req.headers()).map(str::to_string);
    let forwarded = forwarded_headers(ingress, req.headers());
    let Some(who) = key
        .as_deref()
        .and_then(|k| engine.authenticate(&engine.plan(), k))
    else {
        // Counted and logged as the engine counts its own refusals.
        engine.metrics.request(ingress, "-", "unauthorized");
        engine.metrics.refusal("unauthorized");
        tracing::info!(code = "unauthorized", "not served");
        linger(req.into_body().into_data_stream());
        return error_response(ingress, None, &GatewayError::Unauthorized);
    };
    // Taken before the body is read, so bodies in memory are bounded by the limit too.
    let Ok(permit) = in_flight.try_acquire_owned() else {
        engine
            .metrics
            .request(ingress, who.policy.as_str(), "overloaded");
        engine.metrics.refusal("overloaded");
        tracing::info!(policy = %who.policy, client = %who.client, code = "overloaded", "not served: at --max-in-flight");
        linger(req.into_body().into_data_stream());
        return overloaded(ingress);
    };
    // Boxed: reading the body (0.55 kB of future) ends before the long wait on the
    // request's task, which this future then spends the request's life in.
    let body = match Box::pin(read_body(req, body_limit)).await {
        Ok(b) => b,
        Err(BodyRefusal::TooLarge(rest)) => {
            linger(rest);
            return envelope(
                ingress,
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "invalid_request_error",
                "the request body is larger than this gateway accepts",
                None,
            );
        }
        Err(BodyRefusal::Unreadable(e)) => {
            return error_response(
                ingress,
                None,
                &GatewayError::invalid(format!("the request body could not be read: {e}"), None),
            );
        }
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error_response(
                ingress,
                None,
                &GatewayError::invalid(format!("the body is not valid JSON: {e}"), None),
            );
        }
    };
    // The permit goes with the request: it runs detached from this connection, and
    // holds its place against the limit until its end is recorded. The bytes go with
    // it: while the upstream call runs, which may take minutes, they are kept instead
    // of the parsed body, 2 to 7 times their size (`ChatRequest::park`).
    let call = crate::gateway::Call {
        ingress,
        body: value,
        headers: forwarded,
        // A chunked body grew by doubling: its spare capacity is not kept for the call.
        raw: Some(bytes::Bytes::from(body.into_boxed_slice())),
    };
    match engine.call(key.as_deref(), call, Some(permit)).await {
        Ok(served) => served_response(served),
        Err(Failed {
            request_id, error, ..
        }) => error_response(ingress, request_id.as_deref(), &error),
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
fn overloaded(ingress: Ingress) -> Response {
    let mut r = envelope(
        ingress,
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "server_error",
        "the gateway is at its limit of requests in flight; retry after the time in Retry-After",
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
    // A stream's cost is known only at its end: it is in the final usage chunk
    // (`purser_cost`) and the ledger, not in a header sent before the first byte.
    if !streamed {
        put("x-purser-cost", s.cost.to_string());
    }
    // Numbers and flags need no text made and checked on every answer.
    h.insert("x-purser-attempts", HeaderValue::from(s.attempts));
    h.insert(
        "x-purser-fallback",
        HeaderValue::from_static(if s.fallback { "true" } else { "false" }),
    );
    if let Some(n) = s.clamped_to {
        h.insert("x-purser-clamped-max-tokens", HeaderValue::from(n));
    }
    resp
}

/// An error as the ingress answers it, with purser's headers.
pub fn error_response(ingress: Ingress, request_id: Option<&str>, e: &GatewayError) -> Response {
    api_error(ApiError::new(ingress, e, request_id))
}

/// The one place an [`ApiError`] becomes an HTTP response.
pub fn api_error(a: ApiError) -> Response {
    let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(a.body())).into_response();
    if let Some(id) = a
        .request_id
        .as_deref()
        .and_then(|i| HeaderValue::from_str(i).ok())
    {
        r.headers_mut().insert("x-purser-request-id", id);
    }
    r.headers_mut()
        .insert("x-purser-attempts", HeaderValue::from(a.attempts.len()));
    r
}

/// A refusal of the edge itself, before the engine: see [`ApiError::edge`].
fn envelope(
    ingress: Ingress,
    status: StatusCode,
    code: &str,
    ty: &'static str,
    message: &str,
    param: Option<&str>,
) -> Response {
    let mut r = api_error(ApiError::edge(
        ingress,
        status.as_u16(),
        code,
        ty,
        message,
        param,
    ));
    // Nothing was attempted: no attempts header on an edge refusal.
    r.headers_mut().remove("x-purser-attempts");
    r
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// How many connections, made one after another, a listener that accepts none
    /// takes before one is not answered: its queue's (the kernel drops the SYN of the
    /// first beyond it). At most `n`; the connections are held until the count ends.
    async fn queued(backlog: usize, n: usize) -> usize {
        let l = super::listener(([127, 0, 0, 1], 0).into(), backlog).unwrap();
        let addr = l.local_addr().unwrap();
        let mut held = Vec::new();
        while held.len() < n {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(300), connect).await {
                Ok(Ok(c)) => held.push(c),
                Ok(Err(_)) | Err(_) => break,
            }
        }
        held.len()
    }

    #[tokio::test]
    async fn the_listener_queues_the_backlog_it_is_given() {
        // A queue of 8 holds 9.
        let small = queued(8, 64).await;
        assert!(
            (1..=12).contains(&small),
            "{small} connected to a backlog of 8"
        );
        // tokio's own bind (128) would hold 129.
        assert_eq!(queued(200, 160).await, 160);
    }
}
