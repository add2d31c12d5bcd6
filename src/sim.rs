//! Simulated providers on loopback, speaking the OpenAI, Anthropic and Gemini shapes,
//! with per-provider scripts (statuses, bodies, delays, key checks). Used by
//! `purser demo` and by the integration tests.

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
    calls: HashMap<String, usize>,
    keys: HashMap<String, Vec<String>>,
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

    /// Calls `provider` has received.
    pub fn calls(&self, provider: &str) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .calls
            .get(provider)
            .copied()
            .unwrap_or(0)
    }

    /// Keys `provider` has been sent, in order.
    pub fn keys_seen(&self, provider: &str) -> Vec<String> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys
            .get(provider)
            .cloned()
            .unwrap_or_default()
    }

    pub fn reset(&self) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Inner::default();
    }

    fn next(&self, provider: &str, key: String) -> Script {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *g.calls.entry(provider.to_string()).or_default() += 1;
        g.keys.entry(provider.to_string()).or_default().push(key);
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
) -> Response {
    let key = key_of(api, &headers);
    match sim.next(&provider, key.clone()) {
        Script::Ok => axum::Json(ok_body(api, &provider, &model)).into_response(),
        Script::Delay(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            axum::Json(ok_body(api, &provider, &model)).into_response()
        }
        Script::Status(s, body) => (
            StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Script::RequireKey(k) if k == key => {
            axum::Json(ok_body(api, &provider, &model)).into_response()
        }
        Script::RequireKey(_) => (
            StatusCode::UNAUTHORIZED,
            [("content-type", "application/json")],
            auth_body(api),
        )
            .into_response(),
    }
}

/// The model a JSON request body names.
fn model_of(body: &Value) -> String {
    body.get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

async fn openai(
    State(sim): State<Sim>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    answer(sim, Api::Openai, provider, headers, model_of(&body)).await
}

async fn anthropic(
    State(sim): State<Sim>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    answer(sim, Api::Anthropic, provider, headers, model_of(&body)).await
}

async fn gemini(
    State(sim): State<Sim>,
    Path((provider, rest)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let model = rest.split(':').next().unwrap_or("").to_string();
    answer(sim, Api::Gemini, provider, headers, model).await
}
