//! Gemini generateContent: contents with user/model roles, system instruction,
//! generation config; answers translated to the OpenAI shape.

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
    let system: Vec<Value> = system.into_iter().map(|t| json!({"text": t})).collect();
    let contents: Vec<Value> = turns
        .into_iter()
        .map(|(who, text)| match who {
            Speaker::Assistant => json!({"role": "model", "parts": [{"text": text}]}),
            Speaker::User => json!({"role": "user", "parts": [{"text": text}]}),
        })
        .collect();
    let mut config = Map::new();
    config.insert("maxOutputTokens".into(), json!(req.max_tokens));
    for (from, to) in [("temperature", "temperature"), ("top_p", "topP")] {
        if let Some(v) = req.body.get(from) {
            config.insert(to.into(), v.clone());
        }
    }
    if let Some(stop) = stop_sequences(&req.body) {
        config.insert("stopSequences".into(), stop);
    }
    let mut body = json!({"contents": contents, "generationConfig": config});
    if !system.is_empty() {
        body["systemInstruction"] = json!({"parts": system});
    }
    if let Some(Value::Array(tools)) = req.body.get("tools") {
        let functions: Vec<Value> = tools
            .iter()
            .filter_map(|t| t.get("function"))
            .map(|f| {
                let mut d = json!({"name": f.get("name"), "description": f.get("description")});
                if let Some(p) = f.get("parameters") {
                    d["parameters"] = p.clone();
                }
                d
            })
            .collect();
        if !functions.is_empty() {
            body["tools"] = json!([{"functionDeclarations": functions}]);
        }
    }
    let mut headers = vec![];
    if let Some(k) = key {
        headers.push(("x-goog-api-key", k.to_string()));
    }
    let method = if req.stream {
        "streamGenerateContent?alt=sse"
    } else {
        "generateContent"
    };
    Prepared {
        url: format!("{base_url}/models/{}:{method}", dest.upstream_model),
        headers,
        body,
    }
}

pub fn translate(dest: &Destination, body: &Value) -> (Value, Usage) {
    let cand = body.pointer("/candidates/0");
    let text: String = cand
        .and_then(|c| c.pointer("/content/parts"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        // A thought summary (`thought: true`) is not the answer; its tokens are billed
        // through thoughtsTokenCount.
        .filter(|p| p.get("thought").and_then(Value::as_bool) != Some(true))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    let finish = match cand
        .and_then(|c| c.get("finishReason"))
        .and_then(Value::as_str)
    {
        Some("MAX_TOKENS") => "length",
        _ => "stop",
    };
    let usage = body
        .get("usageMetadata")
        .map_or_else(Usage::default, |m| usage(m, true));
    let calls: Vec<Value> = cand
        .and_then(|c| c.pointer("/content/parts"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("functionCall"))
        .enumerate()
        .map(|(i, c)| json!({"id": format!("call_{i}"), "type": "function",
            "function": {"name": c.get("name"), "arguments": c.get("args").map(Value::to_string).unwrap_or_else(|| "{}".into())}}))
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    let finish = if calls.is_empty() {
        finish
    } else {
        message["tool_calls"] = Value::Array(calls);
        "tool_calls"
    };
    (
        completion(
            format!("chatcmpl-{}", ulid::Ulid::generate()),
            dest.model.as_str(),
            message,
            finish,
            usage,
        ),
        usage,
    )
}

/// A Gemini `usageMetadata` object. `complete`: it closes the answer (a whole answer,
/// or a stream's chunk carrying the finish reason); a stream's earlier chunks carry
/// running counts, so their output is not yet a figure to charge.
///
/// Gemini's JSON omits counts that are zero (proto3), so within a closing block an
/// absent part (cached, tool-use, thoughts) is 0. The output total is also derived
/// from `totalTokenCount`, which counts prompt, tool-use prompt, candidates and
/// thoughts, and the larger reading is kept: an omitted `candidatesTokenCount` or
/// `thoughtsTokenCount` cannot hide billed output.
pub fn usage(m: &Value, complete: bool) -> Usage {
    let prompt = count(m, "/promptTokenCount");
    let tool_use = count(m, "/toolUsePromptTokenCount").unwrap_or(0);
    let candidates = count(m, "/candidatesTokenCount");
    let thoughts = count(m, "/thoughtsTokenCount");
    let total = count(m, "/totalTokenCount");
    let parts = candidates.map(|c| c.saturating_add(thoughts.unwrap_or(0)));
    let derived = match (total, prompt) {
        (Some(t), Some(p)) => Some(t.saturating_sub(p).saturating_sub(tool_use)),
        _ => None,
    };
    let output = match (parts, derived) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    Usage {
        input: prompt.map(|p| p.saturating_add(tool_use)),
        cached_input: prompt.map(|_| count(m, "/cachedContentTokenCount").unwrap_or(0)),
        // Gemini bills cache storage by the hour, never a write inside a call.
        cache_write: prompt.map(|_| 0),
        output: output.filter(|_| complete),
        reasoning: thoughts.or(output.map(|_| 0)).filter(|_| complete),
    }
}
