//! Anthropic Messages API: system lifted to the top level, roles mapped, max_tokens
//! always set, tools, tool calls, tool results and images mapped (the rows of
//! `fields::TABLE`); answers translated to the OpenAI shape.

use serde_json::{Map, Value, json};

use super::{
    ChatRequest, InferenceGeo, Part, Prepared, Speaker, Turn, Usage, completion, count, data_url,
    stop_sequences, turns,
};
use crate::ingress::Ingress;
use crate::policy::plan::{Destination, EndpointPath, Endpoints};

pub fn prepare(
    dest: &Destination,
    base: &Endpoints,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    match req.ingress {
        Ingress::Messages => native(dest, base, key, req),
        Ingress::Chat => translated(dest, base, key, req),
        // Responses → chat completions → Messages: the chat adapter does the rest.
        Ingress::Responses => {
            translated(dest, base, key, &super::from_responses::chat_request(req))
        }
    }
}

/// A Messages API body, passed through: every field kept as the client sent it, but
/// the model is the destination's upstream id and `max_tokens` the proved bound (the
/// one cap that reaches the vendor). The client's `anthropic-version` and
/// `anthropic-beta` headers go with it; purser's key replaces the client's.
fn native(dest: &Destination, base: &Endpoints, key: Option<&str>, req: &ChatRequest) -> Prepared {
    let body = super::overlay(
        &req.body,
        &[
            ("model", json!(dest.upstream_model)),
            ("max_tokens", json!(req.max_tokens)),
        ],
        &[],
    );
    let mut headers: Vec<(&'static str, String)> = Vec::new();
    let mut version = None;
    for (k, v) in &req.headers {
        match k.as_str() {
            "anthropic-version" => version = Some(v.clone()),
            "anthropic-beta" => headers.push(("anthropic-beta", v.clone())),
            // Only the two above are collected by the HTTP edge.
            _ => {}
        }
    }
    headers.insert(
        0,
        (
            "anthropic-version",
            version.unwrap_or_else(|| "2023-06-01".to_string()),
        ),
    );
    if let Some(k) = key {
        headers.push(("x-api-key", k.to_string()));
    }
    Prepared {
        url: base.at(EndpointPath::Messages),
        headers,
        body,
    }
}

/// A chat-completions body translated to the Messages API.
fn translated(
    dest: &Destination,
    base: &Endpoints,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    let (system, turns) = turns(&req.body);
    let messages: Vec<Value> = turns.iter().map(message).collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(dest.upstream_model));
    body.insert("max_tokens".into(), json!(req.max_tokens));
    body.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    for (from, to) in [("temperature", "temperature"), ("top_p", "top_p")] {
        if let Some(v) = req.body.get(from).filter(|v| !v.is_null()) {
            body.insert(to.into(), v.clone());
        }
    }
    if let Some(stop) = stop_sequences(&req.body) {
        body.insert("stop_sequences".into(), stop);
    }
    if req.stream {
        body.insert("stream".into(), json!(true));
    }
    if let Some(user) = req.body.get("user").and_then(Value::as_str) {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    let tools = req.body.get("tools").and_then(Value::as_array);
    if let Some(tools) = tools {
        let mapped: Vec<Value> = tools
            .iter()
            .filter_map(|t| t.get("function"))
            .map(|f| {
                let mut t = json!({"name": f.get("name"), "input_schema": f.get("parameters").cloned().unwrap_or(json!({"type": "object"}))});
                if let Some(d) = f.get("description").filter(|d| !d.is_null()) {
                    t["description"] = d.clone();
                }
                t
            })
            .collect();
        body.insert("tools".into(), Value::Array(mapped));
    }
    if let Some(choice) = tool_choice(&req.body, tools.is_some()) {
        body.insert("tool_choice".into(), choice);
    }
    let mut headers = vec![("anthropic-version", "2023-06-01".to_string())];
    if let Some(k) = key {
        headers.push(("x-api-key", k.to_string()));
    }
    Prepared {
        url: base.at(EndpointPath::Messages),
        headers,
        body: super::Body::Json(Value::Object(body)),
    }
}

/// OpenAI `tool_choice` and `parallel_tool_calls` as Anthropic's one `tool_choice`.
fn tool_choice(body: &Value, has_tools: bool) -> Option<Value> {
    let mut choice = match body.get("tool_choice") {
        Some(Value::String(s)) => match s.as_str() {
            "none" => json!({"type": "none"}),
            "required" => json!({"type": "any"}),
            _ => json!({"type": "auto"}),
        },
        Some(v @ Value::Object(_)) => {
            json!({"type": "tool", "name": v.pointer("/function/name")})
        }
        _ => Value::Null,
    };
    let parallel = body.get("parallel_tool_calls").and_then(Value::as_bool);
    if let (Some(parallel), true) = (parallel, has_tools) {
        if choice.is_null() {
            choice = json!({"type": "auto"});
        }
        // `none` has no such switch: with no call allowed there is nothing to serialise.
        if choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(!parallel);
        }
    }
    (!choice.is_null()).then_some(choice)
}

/// One turn as a Messages API message: plain text stays a string (as most clients
/// send it), anything else is a list of content blocks.
fn message(turn: &Turn) -> Value {
    let role = match turn.speaker {
        Speaker::Assistant => "assistant",
        Speaker::User => "user",
    };
    if let [Part::Text(t)] = turn.parts.as_slice() {
        return json!({"role": role, "content": t});
    }
    // An empty text beside a tool call (`content: ""`) is not a block Anthropic takes.
    let blocks: Vec<Value> = turn
        .parts
        .iter()
        .filter(|p| !matches!(p, Part::Text(t) if t.is_empty()))
        .map(block)
        .collect();
    json!({"role": role, "content": blocks})
}

fn block(part: &Part) -> Value {
    match part {
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Image(url) => match data_url(url) {
            Some((mime, data)) => {
                json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}})
            }
            None => json!({"type": "image", "source": {"type": "url", "url": url}}),
        },
        Part::ToolCall {
            id,
            name,
            arguments,
        } => json!({"type": "tool_use", "id": id, "name": name, "input": arguments}),
        Part::ToolResult { id, content, .. } => {
            json!({"type": "tool_result", "tool_use_id": id, "content": content})
        }
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
    let finish = finish_reason(body.get("stop_reason").and_then(Value::as_str));
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

/// An Anthropic `stop_reason` in OpenAI's words, for plain answers and streams alike:
/// a refusal is the vendor's filter (`content_filter`), a cap `length`, a tool call
/// `tool_calls`; the rest end the answer (`stop`).
pub fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        Some(_) | None => "stop",
    }
}

/// An Anthropic `usage` object (a message's, or a stream's merged `message_start` and
/// `message_delta` usage). `input_tokens` excludes the cache, so the reads and writes
/// are added to make the input total. Anthropic reports no total and no breakdown of
/// the output, so there is no second reading to cross-check `output_tokens` against;
/// a stream's placeholder count is dropped by the translator until the final one.
///
/// Server-side compaction bills each pass it runs: the answer lists them in
/// `usage.iterations`, and the top-level figures may count only the last. Each figure
/// is read at its largest: the top-level one, or the iterations' sum where that is more.
pub fn usage(u: &Value) -> Usage {
    let top = one_usage(u);
    let Some(iterations) = u.get("iterations").and_then(Value::as_array) else {
        return top;
    };
    let sum = iterations
        .iter()
        .map(one_usage)
        .fold(Usage::default(), |a, b| Usage {
            input: add(a.input, b.input),
            cached_input: add(a.cached_input, b.cached_input),
            cache_write: add(a.cache_write, b.cache_write),
            output: add(a.output, b.output),
            cache_write_1h: add(a.cache_write_1h, b.cache_write_1h),
            unpriced: a.unpriced || b.unpriced,
            geo: a.geo.max(b.geo),
            ..Usage::default()
        });
    top.largest(sum)
}

/// Two counts summed, where either was reported.
fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

/// One usage object's own figures (the top level, or one compaction pass).
fn one_usage(u: &Value) -> Usage {
    let read = count(u, "/cache_read_input_tokens");
    // The writes at their largest reading: the total, or its split by lifetime where
    // that says more (a relay that zeroes the total must not hide the parts).
    let long = count(u, "/cache_creation/ephemeral_1h_input_tokens");
    let short = count(u, "/cache_creation/ephemeral_5m_input_tokens");
    let split = match (short, long) {
        (None, None) => None,
        (s, l) => Some(s.unwrap_or(0).saturating_add(l.unwrap_or(0))),
    };
    let write = super::largest([count(u, "/cache_creation_input_tokens"), split]);
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
        // The split of writes by cache lifetime, where the answer gives it.
        cache_write_1h: long,
        audio_input: None,
        served_tier: None,
        // Server tools (web search, web fetch) bill per request beyond tokens.
        unpriced: u
            .get("server_tool_use")
            .and_then(Value::as_object)
            .is_some_and(|o| o.values().any(|v| v.as_u64().is_some_and(|n| n > 0))),
        geo: u.get("inference_geo").and_then(geo),
    }
}

/// Where an answer's `usage.inference_geo` says its inference ran: `global` (the
/// vendor chose) and `not_available` (a model without the choice) at the listed rates;
/// any region it names (`us`, and one added later) at the regional premium.
pub fn geo(v: &Value) -> Option<InferenceGeo> {
    match v.as_str()? {
        "global" | "not_available" => Some(InferenceGeo::Anywhere),
        "" => None,
        _ => Some(InferenceGeo::Region),
    }
}
