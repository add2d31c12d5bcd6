//! Simulated providers on loopback, speaking the OpenAI, Anthropic and Gemini shapes,
//! with per-provider scripts (statuses, bodies, delays, key checks), for `purser demo`.
//! (The integration tests have mock vendors of their own, `tests/common/vendors.rs`,
//! so that the adapters are not tested against this module's idea of each API.)

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Script {
    /// A normal answer with usage (12 prompt, 8 completion tokens).
    Ok,
    /// This status and raw body.
    Status(u16, String),
    /// Sleep this long, then answer normally (provokes the attempt timeout).
    Delay(u64),
    /// 401 unless the key presented is this one; a normal answer otherwise.
    RequireKey(String),
}

#[derive(Default)]
struct Inner {
    scripts: HashMap<String, VecDeque<Script>>,
}

/// Handle to a running simulator.
#[derive(Clone, Default)]
pub struct Sim {
    inner: Arc<Mutex<Inner>>,
    pub addr: Option<SocketAddr>,
}

#[derive(Clone, Copy)]
enum Api {
    Openai,
    Anthropic,
    Gemini,
}

impl Sim {
    /// Start on 127.0.0.1 (port 0 picks a free one).
    pub async fn start(port: u16) -> std::io::Result<Sim> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let sim = Sim {
            addr: Some(listener.local_addr()?),
            ..Sim::default()
        };
        let app = Router::new()
            .route("/{provider}/v1/chat/completions", post(openai))
            .route("/{provider}/v1/messages", post(anthropic))
            .route("/{provider}/v1/responses", post(responses))
            .route("/{provider}/v1beta/models/{rest}", post(gemini))
            .with_state(sim.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(sim)
    }

    /// Base URL for a provider of `api` ("openai" | "anthropic" | "gemini").
    pub fn base_url(&self, provider: &str, api: &str) -> String {
        let addr = self.addr.map(|a| a.to_string()).unwrap_or_default();
        match api {
            "gemini" => format!("http://{addr}/{provider}/v1beta"),
            _ => format!("http://{addr}/{provider}/v1"),
        }
    }

    /// Queue answers for `provider`; once used up it answers normally.
    pub fn script(&self, provider: &str, answers: Vec<Script>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.scripts.insert(provider.to_string(), answers.into());
    }

    fn next(&self, provider: &str) -> Script {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.scripts
            .get_mut(provider)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Script::Ok)
    }
}

fn key_of(api: Api, h: &HeaderMap) -> String {
    let name = match api {
        Api::Openai => "authorization",
        Api::Anthropic => "x-api-key",
        Api::Gemini => "x-goog-api-key",
    };
    let v = h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    v.strip_prefix("Bearer ").unwrap_or(v).to_string()
}

fn ok_body(api: Api, provider: &str, model: &str) -> Value {
    let text = format!("Hello from {provider}.");
    match api {
        Api::Openai => json!({
            "id": "chatcmpl-sim", "object": "chat.completion", "created": 1_764_000_000, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
        }),
        Api::Anthropic => json!({
            "id": "msg_sim", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 12, "output_tokens": 8}
        }),
        Api::Gemini => json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 8, "totalTokenCount": 20}
        }),
    }
}

fn auth_body(api: Api) -> String {
    match api {
        Api::Openai => r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#.into(),
        Api::Anthropic => r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#.into(),
        Api::Gemini => r#"{"error":{"code":401,"message":"API key not valid. Please pass a valid API key.","status":"UNAUTHENTICATED"}}"#.into(),
    }
}

async fn answer(
    sim: Sim,
    api: Api,
    provider: String,
    headers: HeaderMap,
    model: String,
    stream: bool,
) -> Response {
    let key = key_of(api, &headers);
    let ok = |api, provider: &str, model: &str| {
        if stream {
            sse_response(ok_events(api, provider, model))
        } else {
            axum::Json(ok_body(api, provider, model)).into_response()
        }
    };
    match sim.next(&provider) {
        Script::Ok => ok(api, &provider, &model),
        Script::Delay(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ok(api, &provider, &model)
        }
        Script::Status(s, body) => (
            StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Script::RequireKey(k) if k == key => ok(api, &provider, &model),
        Script::RequireKey(_) => (
            StatusCode::UNAUTHORIZED,
            [("content-type", "application/json")],
            auth_body(api),
        )
            .into_response(),
    }
}

/// The events of a normal streamed answer in `api`'s own shape (same text and usage
/// as `ok_body`), each a complete SSE block.
fn ok_events(api: Api, provider: &str, model: &str) -> Vec<String> {
    let parts = ["Hello from ", &format!("{provider}.")].map(str::to_string);
    let data = |v: Value| format!("data: {v}\n\n");
    match api {
        Api::Openai => {
            let chunk = |delta: Value, finish: Value| {
                data(
                    json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 1_764_000_000, "model": model,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                )
            };
            vec![
                chunk(
                    json!({"role": "assistant", "content": parts[0]}),
                    Value::Null,
                ),
                chunk(json!({"content": parts[1]}), Value::Null),
                chunk(json!({}), json!("stop")),
                data(
                    json!({"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 1_764_000_000, "model": model,
                            "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}}),
                ),
                "data: [DONE]\n\n".to_string(),
            ]
        }
        Api::Anthropic => {
            let ev = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
            vec![
                ev(
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_sim", "type": "message", "role": "assistant", "model": model, "content": [], "usage": {"input_tokens": 12, "output_tokens": 1}}}),
                ),
                ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": parts[0]}}),
                ),
                ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": parts[1]}}),
                ),
                ev(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                ev(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 8}}),
                ),
                ev("message_stop", json!({"type": "message_stop"})),
            ]
        }
        Api::Gemini => vec![
            data(
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": parts[0]}]}, "index": 0}]}),
            ),
            data(
                json!({"candidates": [{"content": {"role": "model", "parts": [{"text": parts[1]}]}, "finishReason": "STOP", "index": 0}],
                        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 8, "totalTokenCount": 20}}),
            ),
        ],
    }
}

/// An SSE response of `events`.
fn sse_response(events: Vec<String>) -> Response {
    let body = futures_util::stream::iter(
        events
            .into_iter()
            .map(|e| Ok::<_, std::io::Error>(bytes::Bytes::from(e))),
    );
    (
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// The model a JSON request body names.
fn model_of(body: &Value) -> String {
    body.get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Whether a JSON request body asks for a stream.
fn wants_stream(body: &Value) -> bool {
    body.get("stream").and_then(Value::as_bool).unwrap_or(false)
}

async fn openai(
    State(sim): State<Sim>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    answer(
        sim,
        Api::Openai,
        provider,
        headers,
        model_of(&body),
        wants_stream(&body),
    )
    .await
}

async fn anthropic(
    State(sim): State<Sim>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let stream = wants_stream(&body);
    answer(
        sim,
        Api::Anthropic,
        provider,
        headers,
        model_of(&body),
        stream,
    )
    .await
}

/// OpenAI's Responses API: the same text and usage as the other answers, in the
/// Responses shape (a `response` object, or its typed events).
async fn responses(
    State(sim): State<Sim>,
    Path(provider): Path<String>,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let model = model_of(&body);
    let text = format!("Hello from {provider}.");
    let message = json!({"type": "message", "id": "msg_sim", "status": "completed", "role": "assistant",
                         "content": [{"type": "output_text", "text": text, "annotations": []}]});
    let response = json!({"id": "resp_sim", "object": "response", "created_at": 1_764_000_000,
        "status": "completed", "model": model, "output": [message],
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20}});
    match sim.next(&provider) {
        Script::Status(s, err) => (
            StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [("content-type", "application/json")],
            err,
        )
            .into_response(),
        Script::Ok | Script::Delay(_) | Script::RequireKey(_) if wants_stream(&body) => {
            let ev = |v: Value| {
                let name = v["type"].as_str().unwrap_or_default().to_string();
                format!("event: {name}\ndata: {v}\n\n")
            };
            sse_response(vec![
                ev(json!({"type": "response.created", "sequence_number": 0,
                          "response": {"id": "resp_sim", "object": "response", "status": "in_progress", "model": model, "output": []}})),
                ev(
                    json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_sim",
                          "output_index": 0, "content_index": 0, "delta": text}),
                ),
                ev(
                    json!({"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": message}),
                ),
                ev(
                    json!({"type": "response.completed", "sequence_number": 3, "response": response}),
                ),
            ])
        }
        Script::Ok | Script::Delay(_) | Script::RequireKey(_) => {
            axum::Json(response).into_response()
        }
    }
}

async fn gemini(
    State(sim): State<Sim>,
    Path((provider, rest)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let (model, method) = rest.split_once(':').unwrap_or((&rest, ""));
    let stream = method.starts_with("streamGenerateContent");
    answer(
        sim,
        Api::Gemini,
        provider,
        headers,
        model.to_string(),
        stream,
    )
    .await
}
