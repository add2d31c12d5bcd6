//! Mock vendors for the integration tests: one axum server on loopback that answers as
//! OpenAI (`/{provider}/v1/chat/completions` and the Responses API's
//! `/{provider}/v1/responses`), Anthropic (`/{provider}/v1/messages`) and Gemini (`/{provider}/v1beta/models/{model}:generateContent` or
//! `:streamGenerateContent?alt=sse`), each provider following its own script; and
//! beside it a bare TCP server that hangs up on every request before answering.
//!
//! They are written here, apart from `purser::sim` (the demo's simulator), so that the
//! adapters are tested against answers they did not produce: every answer is a
//! fixture in the vendor's wire format (`tests/fixtures/vendors/`), and each call's
//! key and body are kept so a test can check what purser sent.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;

/// One scripted answer. Once a provider's script is used up it answers normally.
#[derive(Debug, Clone)]
pub enum Script {
    /// The vendor's normal answer (12 prompt and 8 completion tokens).
    Ok,
    /// This status and raw JSON body.
    Status(u16, String),
    /// Sleep this long, then answer normally (provokes the attempt timeout).
    Delay(u64),
    /// The vendor's 401 unless this key was presented; a normal answer otherwise.
    RequireKey(String),
    /// A 200 whose content the vendor blocked (filtered, refused, prompt blocked).
    Blocked,
    /// Status and headers of a 200 stream, then the connection drops before any byte.
    Drop,
    /// A streamed answer whose connection drops after this many events.
    StreamCut(usize),
    /// A stream whose first event is this error body.
    StreamError(String),
    /// This many events of a normal stream, then this error body as an event.
    StreamErrorAfter(usize, String),
    /// A normal stream with this many milliseconds between events.
    StreamSlow(u64),
    /// A 200 from the named fixture: `{name}.json`, or `{name}.sse` when the call asks
    /// for a stream (usage shapes: cached, cache writes, thoughts, none at all).
    Fixture(&'static str),
    /// A normal stream written in one write: every event, `[DONE]` included, arrives
    /// in one read, as it often does on a real link under load.
    StreamBatched,
    /// This exact SSE body, written as these pieces with a pause between them, so
    /// the reads split where a test wants them to.
    StreamPieces(Vec<Vec<u8>>),
    /// The normal stream of whichever API is called, written in pieces split at these
    /// byte offsets (each taken modulo the stream's length): for a provider that
    /// serves two APIs (chat and Responses) where the script cannot know which.
    StreamSplitAt(Vec<u64>),
    /// The normal answer (plain or streamed) with every usage figure taken out.
    NoUsage,
    /// A 302 to this URL (a vendor API never redirects; a client must not follow).
    Redirect(String),
    /// Wait for a permit from this gate (the test adds them), then answer normally:
    /// holds calls at the vendor for as long as a test needs, measured by nothing.
    Hold(Arc<tokio::sync::Semaphore>),
    /// As `Hold`, then this status and raw JSON body.
    HoldStatus(Arc<tokio::sync::Semaphore>, u16, String),
    /// The normal answer, content and usage included, ended by the vendor's own
    /// content filter (OpenAI `content_filter`, Anthropic `refusal`, Gemini `SAFETY`).
    FilterAfterContent,
    /// A stream whose first delta is reasoning (`reasoning_content`), then the normal
    /// stream; a plain answer is the normal one.
    ReasoningFirst,
}

/// The vendor's own finish reason for a filtered answer, in place of a normal one.
fn filtered(api: Api, text: &str) -> String {
    match api {
        Api::Openai => text.replace(
            r#""finish_reason":"stop""#,
            r#""finish_reason":"content_filter""#,
        ),
        Api::Anthropic => text.replace(r#""stop_reason":"end_turn""#, r#""stop_reason":"refusal""#),
        // The Responses API ends a filtered answer `incomplete`, naming the filter.
        Api::OpenaiResponses => text
            .replace("response.completed", "response.incomplete")
            .replace(
                r#""status":"completed","model""#,
                r#""status":"incomplete","incomplete_details":{"reason":"content_filter"},"model""#,
            ),
        Api::Gemini => text
            .replace(r#""finishReason": "STOP""#, r#""finishReason": "SAFETY""#)
            .replace(r#""finishReason":"STOP""#, r#""finishReason":"SAFETY""#),
    }
}

/// OpenAI's reasoning models (o1, o3, o4-mini, gpt-5…) refuse `max_tokens`.
fn reads_only_max_completion_tokens(model: &str) -> bool {
    let m = model.rsplit('/').next().unwrap_or(model);
    let mut c = m.chars();
    (c.next() == Some('o') && c.next().is_some_and(|d| d.is_ascii_digit()))
        || m.strip_prefix("gpt-")
            .and_then(|r| r.chars().next())
            .and_then(|d| d.to_digit(10))
            .is_some_and(|d| d >= 5)
}

#[derive(Clone, Copy, Debug)]
enum Api {
    /// OpenAI's chat completions.
    Openai,
    /// OpenAI's Responses API (`/v1/responses`).
    OpenaiResponses,
    Anthropic,
    Gemini,
}

impl Api {
    /// The fixtures' stem (`{name}.json`, `{name}.sse`, `{name}-blocked.json`).
    fn name(self) -> &'static str {
        match self {
            Api::Openai => "openai",
            Api::OpenaiResponses => "openai-responses",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        }
    }
}

/// What a provider was sent on one call.
#[derive(Debug, Clone)]
pub struct Call {
    pub key: String,
    pub body: Value,
    /// The `x-purser-attempt` header: which ledger attempt (`request_id/seq`) sent it.
    pub attempt: String,
}

#[derive(Default)]
struct Book {
    scripts: HashMap<String, VecDeque<Script>>,
    calls: HashMap<String, Vec<Call>>,
    /// Per provider: how many events each write of a normal stream carries, cycling
    /// through the list call by call (absent: one event per write).
    batches: HashMap<String, Vec<usize>>,
    /// Per provider: the headers of each Anthropic call, in order (names lowercase).
    headers: HashMap<String, Vec<Vec<(String, String)>>>,
}

#[derive(Clone)]
pub struct Vendors {
    book: Arc<Mutex<Book>>,
    pub addr: SocketAddr,
    /// A server that reads each request and closes the connection without a byte
    /// of answer (a crashed vendor or a proxy in between); `hangups` counts them.
    hangup: SocketAddr,
    hangups: Arc<std::sync::atomic::AtomicUsize>,
}

impl Vendors {
    pub async fn start() -> Vendors {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hangup = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let v = Vendors {
            book: Arc::default(),
            addr: listener.local_addr().unwrap(),
            hangup: hangup.local_addr().unwrap(),
            hangups: Arc::default(),
        };
        let count = v.hangups.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while let Ok((mut conn, _)) = hangup.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    // Read until the end of the headers, then hang up.
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    drop(conn);
                });
            }
        });
        let app = Router::new()
            .route("/{provider}/v1/chat/completions", post(openai))
            .route("/{provider}/v1/messages", post(anthropic))
            .route("/{provider}/v1/responses", post(openai_responses))
            .route("/{provider}/v1beta/models/{call}", post(gemini))
            .with_state(v.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        v
    }

    /// The `base_url` a provider document gives for `provider` speaking `api`.
    pub fn base_url(&self, provider: &str, api: &str) -> String {
        match api {
            "gemini" => format!("http://{}/{provider}/v1beta", self.addr),
            _ => format!("http://{}/{provider}/v1", self.addr),
        }
    }

    pub fn script(&self, provider: &str, answers: Vec<Script>) {
        self.book
            .lock()
            .unwrap()
            .scripts
            .insert(provider.into(), answers.into());
    }

    /// Make `provider`'s normal streams batch their events: call k writes its events
    /// `sizes[k % len]` at a time in one write each, as a real link coalesces them
    /// (`usize::MAX`: the whole stream in one write).
    pub fn batch_events(&self, provider: &str, sizes: Vec<usize>) {
        self.book
            .lock()
            .unwrap()
            .batches
            .insert(provider.into(), sizes);
    }

    /// How many calls `provider` received.
    pub fn calls(&self, provider: &str) -> usize {
        self.sent(provider).len()
    }

    /// Every call `provider` received, in order.
    pub fn sent(&self, provider: &str) -> Vec<Call> {
        self.book
            .lock()
            .unwrap()
            .calls
            .get(provider)
            .cloned()
            .unwrap_or_default()
    }

    /// The keys `provider` was sent, in order.
    /// The headers of each call `provider` received on its Anthropic Messages route.
    pub fn headers_seen(&self, provider: &str) -> Vec<Vec<(String, String)>> {
        self.book
            .lock()
            .unwrap()
            .headers
            .get(provider)
            .cloned()
            .unwrap_or_default()
    }

    pub fn keys_seen(&self, provider: &str) -> Vec<String> {
        self.sent(provider).into_iter().map(|c| c.key).collect()
    }

    /// The `base_url` of a vendor that hangs up on every call.
    pub fn hangup_url(&self) -> String {
        format!("http://{}/v1", self.hangup)
    }

    /// Calls the hanging-up vendor received.
    pub fn hangups(&self) -> usize {
        self.hangups.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Forget every script and call.
    pub fn reset(&self) {
        *self.book.lock().unwrap() = Book::default();
    }

    /// The script for this call, and how many events each write of it carries.
    fn take_batched(&self, provider: &str, call: Call) -> (Script, usize) {
        let mut book = self.book.lock().unwrap();
        let calls = book.calls.entry(provider.into()).or_default();
        calls.push(call);
        let n = calls.len() - 1;
        let batch = book
            .batches
            .get(provider)
            .filter(|b| !b.is_empty())
            .map_or(1, |b| b[n % b.len()].max(1));
        let script = book
            .scripts
            .get_mut(provider)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Script::Ok);
        (script, batch)
    }
}

fn fixture(name: &str, provider: &str, model: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vendors/");
    std::fs::read_to_string(format!("{path}{name}"))
        .unwrap()
        .replace("{provider}", provider)
        .replace("{model}", model)
}

/// The events of a fixture stream, each sent as it stands with its blank line.
fn events(api: Api, provider: &str, model: &str) -> Vec<String> {
    fixture(&format!("{}.sse", api.name()), provider, model)
        .split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| format!("{e}\n\n"))
        .collect()
}

/// The events of the named fixture stream (`{name}.sse`).
fn named_events(name: &str, provider: &str, model: &str) -> Vec<String> {
    fixture(&format!("{name}.sse"), provider, model)
        .split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| format!("{e}\n\n"))
        .collect()
}

fn error_event(api: Api, body: &str) -> String {
    match api {
        Api::Anthropic | Api::OpenaiResponses => format!("event: error\ndata: {body}\n\n"),
        Api::Openai | Api::Gemini => format!("data: {body}\n\n"),
    }
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [("content-type", "application/json")], body).into_response()
}

/// The vendor's own 401.
fn unauthorized(api: Api) -> Response {
    let body = match api {
        Api::Openai | Api::OpenaiResponses => {
            r#"{"error":{"message":"Incorrect API key provided: sk-wrong. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#
        }
        Api::Anthropic => {
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_tests0001"}"#
        }
        Api::Gemini => {
            r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#
        }
    };
    let status = match api {
        // Gemini answers a bad key with 400 INVALID_ARGUMENT, not 401.
        Api::Gemini => StatusCode::BAD_REQUEST,
        Api::Openai | Api::OpenaiResponses | Api::Anthropic => StatusCode::UNAUTHORIZED,
    };
    json(status, body.into())
}

/// An SSE answer: `cut_after` drops the connection after that many events (the cut
/// waits a moment so the events before it reach the client first); `gap_ms` spaces
/// the events.
fn sse(events: Vec<String>, cut_after: Option<usize>, gap_ms: u64) -> Response {
    let body = async_stream(events, cut_after, gap_ms);
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Events joined `per_write` at a time, so each write carries several.
fn batched(events: Vec<String>, per_write: usize) -> Vec<String> {
    events.chunks(per_write).map(|c| c.concat()).collect()
}

fn async_stream(
    events: Vec<String>,
    cut_after: Option<usize>,
    gap_ms: u64,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for (i, e) in events.into_iter().enumerate() {
            if cut_after == Some(i) {
                break;
            }
            if gap_ms > 0 && i > 0 {
                tokio::time::sleep(Duration::from_millis(gap_ms)).await;
            }
            if tx.send(Ok(bytes::Bytes::from(e))).await.is_err() {
                return; // the client went away
            }
        }
        if cut_after.is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = tx.send(Err(std::io::Error::other("connection cut"))).await;
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

async fn answer(
    v: Vendors,
    api: Api,
    provider: String,
    (key, attempt): (String, String),
    body: Value,
    model: String,
    stream: bool,
) -> Response {
    let refuses_cap = matches!(api, Api::Openai)
        && reads_only_max_completion_tokens(&model)
        && body.get("max_tokens").is_some();
    let (script, batch) = v.take_batched(
        &provider,
        Call {
            key: key.clone(),
            body,
            attempt,
        },
    );
    if refuses_cap {
        return json(
            StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}"#.into(),
        );
    }
    let normal = |provider: &str, model: &str| {
        if stream {
            sse(batched(events(api, provider, model), batch), None, 0)
        } else {
            json(
                StatusCode::OK,
                fixture(&format!("{}.json", api.name()), provider, model),
            )
        }
    };
    match script {
        Script::Ok => normal(&provider, &model),
        Script::Status(status, body) => json(StatusCode::from_u16(status).unwrap(), body),
        Script::Delay(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            normal(&provider, &model)
        }
        Script::RequireKey(k) if k == key => normal(&provider, &model),
        Script::RequireKey(_) => unauthorized(api),
        Script::Blocked => json(
            StatusCode::OK,
            fixture(&format!("{}-blocked.json", api.name()), &provider, &model),
        ),
        Script::Drop => sse(vec![], Some(0), 0),
        Script::StreamCut(n) => sse(events(api, &provider, &model), Some(n), 0),
        Script::StreamError(body) => sse(vec![error_event(api, &body)], None, 0),
        Script::StreamErrorAfter(n, body) => {
            let mut evs: Vec<String> = events(api, &provider, &model).into_iter().take(n).collect();
            evs.push(error_event(api, &body));
            sse(evs, None, 0)
        }
        Script::StreamSlow(ms) => sse(events(api, &provider, &model), None, ms),
        Script::Fixture(name) if stream => sse(named_events(name, &provider, &model), None, 0),
        Script::Fixture(name) => json(
            StatusCode::OK,
            fixture(&format!("{name}.json"), &provider, &model),
        ),
        Script::StreamBatched => sse(vec![events(api, &provider, &model).concat()], None, 0),
        Script::StreamPieces(pieces) => pieces_response(pieces),
        Script::StreamSplitAt(offsets) => {
            let body = events(api, &provider, &model).concat().into_bytes();
            pieces_response(split_at(&body, &offsets))
        }
        Script::NoUsage if stream => {
            let evs = events(api, &provider, &model)
                .into_iter()
                .filter_map(|e| without_usage_event(&e))
                .collect();
            sse(evs, None, 0)
        }
        Script::NoUsage => {
            let mut v: Value =
                serde_json::from_str(&fixture(&format!("{}.json", api.name()), &provider, &model))
                    .unwrap();
            strip_usage(&mut v);
            json(StatusCode::OK, v.to_string())
        }
        Script::Redirect(to) => (StatusCode::FOUND, [("location", to)], "").into_response(),
        Script::Hold(gate) => {
            if let Ok(p) = gate.acquire().await {
                p.forget();
            }
            normal(&provider, &model)
        }
        Script::HoldStatus(gate, status, body) => {
            if let Ok(p) = gate.acquire().await {
                p.forget();
            }
            json(StatusCode::from_u16(status).unwrap(), body)
        }
        Script::FilterAfterContent if stream => sse(
            events(api, &provider, &model)
                .into_iter()
                .map(|e| filtered(api, &e))
                .collect(),
            None,
            0,
        ),
        Script::FilterAfterContent => json(
            StatusCode::OK,
            filtered(
                api,
                &fixture(&format!("{}.json", api.name()), &provider, &model),
            ),
        ),
        Script::ReasoningFirst if stream && matches!(api, Api::Openai) => {
            let mut evs = vec![format!(
                "data: {{\"id\":\"chatcmpl-r\",\"object\":\"chat.completion.chunk\",\"created\":1764547200,\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"reasoning_content\":\"Thinking it over.\"}},\"finish_reason\":null}}]}}\n\n"
            )];
            evs.extend(events(api, &provider, &model));
            sse(evs, None, 0)
        }
        Script::ReasoningFirst => normal(&provider, &model),
    }
}

fn header(h: &HeaderMap, name: &str) -> String {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn openai(
    State(v): State<Vendors>,
    Path(provider): Path<String>,
    h: HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let key = header(&h, "authorization")
        .trim_start_matches("Bearer ")
        .to_string();
    let who = (key, header(&h, "x-purser-attempt"));
    answer_named_in_body(v, Api::Openai, provider, who, body.0).await
}

async fn anthropic(
    State(v): State<Vendors>,
    Path(provider): Path<String>,
    h: HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let who = (header(&h, "x-api-key"), header(&h, "x-purser-attempt"));
    let seen: Vec<(String, String)> = h
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    v.book
        .lock()
        .unwrap()
        .headers
        .entry(provider.clone())
        .or_default()
        .push(seen);
    answer_named_in_body(v, Api::Anthropic, provider, who, body.0).await
}

/// OpenAI's Responses API: the normal answer is `openai-responses.json` (or `.sse`
/// for a stream), and every script plays as it does for the other APIs, in the
/// Responses API's own shapes (its error events, its `incomplete` end for a filter).
async fn openai_responses(
    State(v): State<Vendors>,
    Path(provider): Path<String>,
    h: HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let key = header(&h, "authorization")
        .trim_start_matches("Bearer ")
        .to_string();
    let who = (key, header(&h, "x-purser-attempt"));
    answer_named_in_body(v, Api::OpenaiResponses, provider, who, body.0).await
}

/// OpenAI and Anthropic name the model and ask for a stream in the body.
async fn answer_named_in_body(
    v: Vendors,
    api: Api,
    provider: String,
    who: (String, String),
    body: Value,
) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let stream = body["stream"].as_bool().unwrap_or(false);
    answer(v, api, provider, who, body, model, stream).await
}

/// Gemini names the model and the method in the path: `{model}:generateContent`.
async fn gemini(
    State(v): State<Vendors>,
    Path((provider, call)): Path<(String, String)>,
    h: HeaderMap,
    body: axum::Json<Value>,
) -> Response {
    let who = (header(&h, "x-goog-api-key"), header(&h, "x-purser-attempt"));
    let (model, method) = call.split_once(':').unwrap_or((&call, ""));
    let stream = match method {
        "streamGenerateContent" => true,
        "generateContent" => false,
        other => {
            return json(
                StatusCode::NOT_FOUND,
                format!(
                    r#"{{"error":{{"code":404,"message":"unknown method {other}","status":"NOT_FOUND"}}}}"#
                ),
            );
        }
    };
    answer(
        v,
        Api::Gemini,
        provider,
        who,
        body.0,
        model.to_string(),
        stream,
    )
    .await
}

/// The normal stream of `api` as the vendor writes it, placeholders filled.
pub fn stream_body(api: &str, provider: &str, model: &str) -> Vec<u8> {
    fixture(&format!("{api}.sse"), provider, model)
        .split("\n\n")
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| format!("{e}\n\n"))
        .collect::<String>()
        .into_bytes()
}

fn pieces_response(pieces: Vec<Vec<u8>>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        for p in pieces {
            if tx.send(Ok(bytes::Bytes::from(p))).await.is_err() {
                return;
            }
            // A pause lets each piece leave as a read of its own.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(body),
    )
        .into_response()
}

/// Every usage figure a vendor sends, removed (a Responses event carries it in its
/// `response`, an Anthropic one in its `message`).
fn strip_usage(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        o.remove("usage");
        o.remove("usageMetadata");
        for inner in ["message", "response"] {
            if let Some(m) = o.get_mut(inner).and_then(Value::as_object_mut) {
                m.remove("usage");
            }
        }
    }
}

/// `body` in pieces split at `offsets` (each modulo its length).
pub fn split_at(body: &[u8], offsets: &[u64]) -> Vec<Vec<u8>> {
    let len = body.len().max(1) as u64;
    let mut cuts: Vec<usize> = offsets.iter().map(|o| (o % len) as usize).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut from = 0;
    for c in cuts.into_iter().chain([body.len()]) {
        if c > from {
            pieces.push(body[from..c].to_vec());
            from = c;
        }
    }
    pieces
}

/// One stream event without its usage; `None` for an event that carried only usage.
fn without_usage_event(e: &str) -> Option<String> {
    let mut out = Vec::new();
    for line in e.trim_end().lines() {
        match line.strip_prefix("data: ") {
            Some(d) if d.trim() != "[DONE]" => {
                let mut v: Value = serde_json::from_str(d).unwrap();
                let usage_only = v
                    .get("choices")
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty);
                if usage_only {
                    return None;
                }
                strip_usage(&mut v);
                out.push(format!("data: {v}"));
            }
            _ => out.push(line.to_string()),
        }
    }
    Some(format!("{}\n\n", out.join("\n")))
}
