//! Gemini generateContent: contents with user/model roles, system instruction,
//! generation config, function declarations and calls, images (the rows of
//! `fields::TABLE`); answers translated to the OpenAI shape.

use serde_json::{Map, Value, json};

use super::{
    ChatRequest, Part, Prepared, Speaker, Usage, completion, count, data_url, mime_from_url,
    stop_sequences, turns,
};
use crate::policy::plan::{Destination, Endpoint, Endpoints};

pub fn prepare(
    dest: &Destination,
    base: &Endpoints,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    // Responses → chat completions → generateContent: the chat adapter does the rest.
    if req.ingress == crate::ingress::Ingress::Responses {
        return prepare(dest, base, key, &super::from_responses::chat_request(req));
    }
    let (system, turns) = turns(&req.body);
    let system: Vec<Value> = system.into_iter().map(|t| json!({"text": t})).collect();
    let contents: Vec<Value> = turns
        .iter()
        .map(|t| {
            let role = match t.speaker {
                Speaker::Assistant => "model",
                Speaker::User => "user",
            };
            let parts: Vec<Value> = t
                .parts
                .iter()
                .filter(|p| !(t.parts.len() > 1 && matches!(p, Part::Text(s) if s.is_empty())))
                .map(part)
                .collect();
            json!({"role": role, "parts": parts})
        })
        .collect();
    let b = &req.body;
    let mut config = Map::new();
    config.insert("maxOutputTokens".into(), json!(req.max_tokens));
    // A thinking model is held to the budget its output bound counts beyond the cap;
    // left to itself it thinks as long as it likes.
    if let Some(budget) = dest.reasoning_budget() {
        config.insert("thinkingConfig".into(), json!({"thinkingBudget": budget}));
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ] {
        if let Some(v) = b.get(from).filter(|v| !v.is_null()) {
            config.insert(to.into(), v.clone());
        }
    }
    if let Some(stop) = stop_sequences(b) {
        config.insert("stopSequences".into(), stop);
    }
    match b.pointer("/response_format/type").and_then(Value::as_str) {
        Some("json_object") => {
            config.insert("responseMimeType".into(), json!("application/json"));
        }
        Some("json_schema") => {
            config.insert("responseMimeType".into(), json!("application/json"));
            // responseJsonSchema takes JSON Schema as clients write it; the older
            // responseSchema takes an OpenAPI subset that refuses common keywords.
            if let Some(schema) = b.pointer("/response_format/json_schema/schema") {
                config.insert("responseJsonSchema".into(), schema.clone());
            }
        }
        _ => {}
    }
    let mut body = json!({"contents": contents, "generationConfig": config});
    if !system.is_empty() {
        body["systemInstruction"] = json!({"parts": system});
    }
    if let Some(Value::Array(tools)) = b.get("tools") {
        let functions: Vec<Value> = tools
            .iter()
            .filter_map(|t| t.get("function"))
            .map(|f| {
                let mut d = json!({"name": f.get("name")});
                for k in ["description", "parameters"] {
                    if let Some(v) = f.get(k).filter(|v| !v.is_null()) {
                        d[k] = v.clone();
                    }
                }
                d
            })
            .collect();
        if !functions.is_empty() {
            body["tools"] = json!([{"functionDeclarations": functions}]);
        }
    }
    let calling = match b.get("tool_choice") {
        Some(Value::String(s)) => match s.as_str() {
            "none" => Some(json!({"mode": "NONE"})),
            "required" => Some(json!({"mode": "ANY"})),
            _ => Some(json!({"mode": "AUTO"})),
        },
        Some(v @ Value::Object(_)) => {
            Some(json!({"mode": "ANY", "allowedFunctionNames": [v.pointer("/function/name")]}))
        }
        _ => None,
    };
    if let Some(c) = calling {
        body["toolConfig"] = json!({"functionCallingConfig": c});
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
        url: Endpoint::Text(format!(
            "{}/models/{}:{method}",
            base.base(),
            dest.upstream_model
        )),
        headers,
        body: super::Body::Json(body),
    }
}

fn part(p: &Part) -> Value {
    match p {
        Part::Text(t) => json!({"text": t}),
        Part::Image(url) => match data_url(url) {
            Some((mime, data)) => json!({"inlineData": {"mimeType": mime, "data": data}}),
            None => {
                let mut f = json!({"fileUri": url});
                if let Some(m) = mime_from_url(url) {
                    f["mimeType"] = json!(m);
                }
                json!({"fileData": f})
            }
        },
        Part::ToolCall {
            name, arguments, ..
        } => json!({"functionCall": {"name": name, "args": arguments}}),
        Part::ToolResult { name, content, .. } => {
            // A response is an object: a JSON object result goes as it is, anything
            // else under `content`.
            let response = match serde_json::from_str::<Value>(content) {
                Ok(v @ Value::Object(_)) => v,
                _ => json!({"content": content}),
            };
            json!({"functionResponse": {"name": name, "response": response}})
        }
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
    let finish = cand
        .and_then(|c| c.get("finishReason"))
        .and_then(Value::as_str)
        .map_or("stop", finish_reason);
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

/// A Gemini `finishReason` in OpenAI's words: the one mapping, for plain answers and
/// streams alike. Every reason that says the output was blocked or cut by a filter is
/// `content_filter`; a cap is `length`; the rest (`STOP`, a malformed call, reasons
/// added later) end the answer as `stop`.
pub fn finish_reason(reason: &str) -> &'static str {
    match reason {
        "MAX_TOKENS" => "length",
        "SAFETY"
        | "PROHIBITED_CONTENT"
        | "BLOCKLIST"
        | "SPII"
        | "RECITATION"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => "content_filter",
        _ => "stop",
    }
}

/// A Gemini `usageMetadata` object. `complete`: it closes the answer (a whole answer,
/// or a stream's chunk carrying the finish reason); a stream's earlier chunks carry
/// running counts, so their output is not yet a figure to charge.
///
/// Gemini's JSON omits counts that are zero (proto3), so within a closing block an
/// absent part (cached, tool-use, thoughts) is 0. The output total is also derived
/// from `totalTokenCount`, which counts prompt, tool-use prompt, candidates and
/// thoughts, and the larger reading is kept: an omitted `candidatesTokenCount` or
/// `thoughtsTokenCount` cannot hide billed output (the same largest reading as
/// OpenAI's `usage_block`).
pub fn usage(m: &Value, complete: bool) -> Usage {
    let cached = count(m, "/cachedContentTokenCount");
    // The cached content is part of the prompt: a prompt count below it is read at it.
    let prompt = count(m, "/promptTokenCount").map(|p| p.max(cached.unwrap_or(0)));
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
        cached_input: prompt.map(|_| cached.unwrap_or(0)),
        // Gemini bills cache storage by the hour, never a write inside a call.
        cache_write: prompt.map(|_| 0),
        output: output.filter(|_| complete),
        reasoning: thoughts.or(output.map(|_| 0)).filter(|_| complete),
        // The prompt's audio not read from the cache (the cached part is priced as a
        // cache read).
        audio_input: modality_count(m, "/promptTokensDetails", "AUDIO").map(|a| {
            a.saturating_sub(modality_count(m, "/cacheTokensDetails", "AUDIO").unwrap_or(0))
        }),
        ..Usage::default()
    }
}

/// The tokens of one modality in a `…TokensDetails` list (`[{modality, tokenCount}]`),
/// summed: 0 where the list does not name it; `None` where there is no list.
fn modality_count(m: &Value, list: &str, modality: &str) -> Option<u64> {
    let list = m.pointer(list)?.as_array()?;
    Some(
        list.iter()
            .filter(|d| d.get("modality").and_then(Value::as_str) == Some(modality))
            .map(|d| d.get("tokenCount").and_then(Value::as_u64).unwrap_or(0))
            .fold(0, u64::saturating_add),
    )
}
