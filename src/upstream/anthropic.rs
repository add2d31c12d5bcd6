//! Anthropic Messages API: system lifted to the top level, roles mapped, max_tokens
//! always set, tools mapped; answers translated to the OpenAI shape.

use serde_json::{Map, Value, json};

use super::{ChatRequest, Prepared, Speaker, Usage, completion, count, stop_sequences, turns};
use crate::policy::plan::Destination;

pub fn prepare(
    dest: &Destination,
    base_url: &str,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    let (system, turns) = turns(&req.body);
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(who, text)| match who {
            Speaker::Assistant => json!({"role": "assistant", "content": text}),
            Speaker::User => json!({"role": "user", "content": text}),
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(dest.upstream_model));
    body.insert("max_tokens".into(), json!(req.max_tokens));
    body.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    for (from, to) in [("temperature", "temperature"), ("top_p", "top_p")] {
        if let Some(v) = req.body.get(from) {
            body.insert(to.into(), v.clone());
        }
    }
    if let Some(stop) = stop_sequences(&req.body) {
        body.insert("stop_sequences".into(), stop);
    }
    if req.stream {
        body.insert("stream".into(), json!(true));
    }
    if let Some(Value::Array(tools)) = req.body.get("tools") {
        let mapped: Vec<Value> = tools
            .iter()
            .filter_map(|t| t.get("function"))
            .map(|f| json!({"name": f.get("name"), "description": f.get("description"), "input_schema": f.get("parameters").cloned().unwrap_or(json!({"type": "object"}))}))
            .collect();
        body.insert("tools".into(), Value::Array(mapped));
    }
    let mut headers = vec![("anthropic-version", "2023-06-01".to_string())];
    if let Some(k) = key {
        headers.push(("x-api-key", k.to_string()));
    }
    Prepared {
        url: format!("{base_url}/messages"),
        headers,
        body: Value::Object(body),
    }
}

pub fn translate(dest: &Destination, body: &Value) -> (Value, Usage) {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => tool_calls.push(json!({
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": block.get("input").map(Value::to_string).unwrap_or_default()},
            })),
            _ => {}
        }
    }
    let finish = match body.get("stop_reason").and_then(Value::as_str) {
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        _ => "stop",
    };
    let usage = body.get("usage").map_or_else(Usage::default, usage);
    let mut message = json!({"role": "assistant", "content": text});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let id = body
        .get("id")
        .and_then(Value::as_str)
        .map(|i| format!("chatcmpl-{i}"))
        .unwrap_or_default();
    (
        completion(id, dest.model.as_str(), message, finish, usage),
        usage,
    )
}

/// An Anthropic `usage` object (a message's, or a stream's merged `message_start` and
/// `message_delta` usage). `input_tokens` excludes the cache, so the reads and writes
/// are added to make the input total.
pub fn usage(u: &Value) -> Usage {
    let read = count(u, "/cache_read_input_tokens");
    let write = count(u, "/cache_creation_input_tokens");
    Usage {
        input: count(u, "/input_tokens").map(|n| {
            n.saturating_add(read.unwrap_or(0))
                .saturating_add(write.unwrap_or(0))
        }),
        cached_input: read,
        cache_write: write,
        output: count(u, "/output_tokens"),
        // Extended thinking is inside output_tokens and not broken out.
        reasoning: None,
    }
}
