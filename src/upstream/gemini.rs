//! Gemini generateContent: contents with user/model roles, system instruction,
//! generation config; answers translated to the OpenAI shape.

use serde_json::{Map, Value, json};

use super::{ChatRequest, Prepared, Usage, content_text};
use crate::policy::plan::Destination;

pub fn prepare(
    dest: &Destination,
    base_url: &str,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    let mut system = Vec::new();
    let mut contents = Vec::new();
    for m in req
        .body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let text = content_text(m.get("content").unwrap_or(&Value::Null));
        match role {
            "system" | "developer" => system.push(json!({"text": text})),
            "assistant" => contents.push(json!({"role": "model", "parts": [{"text": text}]})),
            _ => contents.push(json!({"role": "user", "parts": [{"text": text}]})),
        }
    }
    let mut config = Map::new();
    config.insert("maxOutputTokens".into(), json!(req.max_tokens));
    for (from, to) in [("temperature", "temperature"), ("top_p", "topP")] {
        if let Some(v) = req.body.get(from) {
            config.insert(to.into(), v.clone());
        }
    }
    match req.body.get("stop") {
        Some(Value::String(s)) => {
            config.insert("stopSequences".into(), json!([s]));
        }
        Some(Value::Array(a)) => {
            config.insert("stopSequences".into(), Value::Array(a.clone()));
        }
        _ => {}
    }
    let mut body = json!({"contents": contents, "generationConfig": config});
    if !system.is_empty() {
        body["systemInstruction"] = json!({"parts": system});
    }
    let mut headers = vec![];
    if let Some(k) = key {
        headers.push(("x-goog-api-key", k.to_string()));
    }
    Prepared {
        url: format!("{base_url}/models/{}:generateContent", dest.upstream_model),
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
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    let finish = match cand
        .and_then(|c| c.get("finishReason"))
        .and_then(Value::as_str)
    {
        Some("MAX_TOKENS") => "length",
        _ => "stop",
    };
    let usage = Usage {
        prompt_tokens: body
            .pointer("/usageMetadata/promptTokenCount")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        completion_tokens: body
            .pointer("/usageMetadata/candidatesTokenCount")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    };
    (
        json!({
            "id": format!("chatcmpl-{}", ulid::Ulid::generate()),
            "object": "chat.completion",
            "created": time::OffsetDateTime::now_utc().unix_timestamp(),
            "model": dest.model.as_str(),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens, "total_tokens": usage.prompt_tokens + usage.completion_tokens},
        }),
        usage,
    )
}
