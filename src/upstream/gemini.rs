//! Gemini generateContent: contents with user/model roles, system instruction,
//! generation config; answers translated to the OpenAI shape.

use serde_json::{Map, Value, json};

use super::{ChatRequest, Prepared, Speaker, Usage, completion, stop_sequences, turns};
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
    let usage = Usage::at(
        body,
        "/usageMetadata/promptTokenCount",
        "/usageMetadata/candidatesTokenCount",
    );
    let message = json!({"role": "assistant", "content": text});
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
