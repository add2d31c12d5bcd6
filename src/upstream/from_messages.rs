//! An Anthropic Messages request sent to an OpenAI chat-completions destination, where
//! the translation is faithful, and the answer brought back in the Messages shape (a
//! message, or its stream events). What has no faithful form in chat completions is
//! refused with the field named, never dropped:
//! - `thinking` (other than `disabled`) and thinking blocks in the history: their
//!   signatures verify Anthropic's own reasoning, which no other vendor can take back;
//! - `top_k`, `output_config`, `context_management`, `service_tier`, `container`,
//!   `mcp_servers`: settings or server-side work chat completions has no field for;
//! - typed (server or Anthropic-defined) tools, documents, images inside tool results,
//!   more than 4 stop sequences.
//!
//! Dropped, because dropping them is faithful and price-safe:
//! - `cache_control` marks: they ask Anthropic to write a cache, which is billed above
//!   the input rate; OpenAI caches prompts by itself and bills no writes, and the bound
//!   prices every input token at the destination's dearest input rate anyway, so a
//!   dropped mark can only lower what the call costs;
//! - `metadata` (an end-user id for Anthropic's abuse checks) and a tool result's
//!   `is_error` flag (the result's text still says what failed).

use serde_json::{Map, Value, json};

use super::Usage;

/// A part of a Messages body with no faithful form in chat completions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untranslatable {
    pub param: String,
    pub why: &'static str,
}

fn no(param: impl Into<String>, why: &'static str) -> Untranslatable {
    Untranslatable {
        param: param.into(),
        why,
    }
}

/// Top-level fields that have no chat-completions form, with why.
const REFUSED: [(&str, &str); 6] = [
    ("top_k", "chat completions has no top-k sampling"),
    (
        "output_config",
        "its effort and output format have no chat-completions field that means the same",
    ),
    (
        "context_management",
        "clearing earlier context is done by Anthropic's server; chat completions has no such step",
    ),
    ("service_tier", "Anthropic's service tiers are not OpenAI's"),
    (
        "container",
        "a code-execution container exists only at Anthropic",
    ),
    (
        "mcp_servers",
        "remote MCP servers are called by Anthropic's server",
    ),
];

/// Top-level fields with a chat-completions form (`metadata` is dropped).
const TRANSLATED: [&str; 11] = [
    "model",
    "messages",
    "system",
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
];

/// The chat-completions body of a Messages body (without the model, the output cap
/// and the stream options, which `openai::prepare` sets as for any chat request).
pub fn chat_body(body: &Value) -> Result<Value, Untranslatable> {
    let Some(obj) = body.as_object() else {
        return Err(no("", "the body must be a JSON object"));
    };
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(f, _)| f == k) {
            return Err(no(k.clone(), why));
        }
        if !TRANSLATED.contains(&k.as_str()) && k != "thinking" {
            return Err(no(
                k.clone(),
                "purser has no chat-completions form for this field",
            ));
        }
        if k == "thinking" && v.get("type").and_then(Value::as_str) != Some("disabled") {
            return Err(no(
                k.clone(),
                "extended thinking is Anthropic's, signed by it; chat completions cannot carry it",
            ));
        }
    }
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system").filter(|s| !s.is_null()) {
        messages.push(json!({"role": "system", "content": text_content(system, "system")?}));
    }
    for (i, m) in obj
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        translate_message(m, i, &mut messages)?;
    }
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    for k in ["temperature", "top_p"] {
        if let Some(v) = obj.get(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(stop) = obj.get("stop_sequences").and_then(Value::as_array) {
        if stop.len() > 4 {
            return Err(no(
                "stop_sequences",
                "chat completions takes at most 4 stop sequences",
            ));
        }
        if !stop.is_empty() {
            out.insert("stop".into(), Value::Array(stop.clone()));
        }
    }
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let mut mapped = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            mapped.push(tool(t, i)?);
        }
        out.insert("tools".into(), Value::Array(mapped));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|c| !c.is_null()) {
        let (mapped, parallel) = tool_choice(choice)?;
        out.insert("tool_choice".into(), mapped);
        if parallel == Some(false) {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    Ok(Value::Object(out))
}

/// A `system` field or a text-only content: a string, or text blocks as text parts.
fn text_content(v: &Value, at: &str) -> Result<Value, Untranslatable> {
    match v {
        Value::String(s) => Ok(json!(s)),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                    _ => return Err(no(format!("{at}[{j}]"), "only text blocks can go here")),
                }
            }
            Ok(Value::Array(parts))
        }
        _ => Err(no(at, "must be a string or an array of text blocks")),
    }
}

fn translate_message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), Untranslatable> {
    let at = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    let content = m.get("content").unwrap_or(&Value::Null);
    match role {
        // Claude Code puts a system turn among the messages: chat has the same role.
        "system" => out.push(
            json!({"role": "system", "content": text_content(content, &format!("{at}.content"))?}),
        ),
        "user" => user_message(content, &at, out)?,
        "assistant" => out.push(assistant_message(content, &at)?),
        _ => {
            return Err(no(
                format!("{at}.role"),
                "must be user, assistant or system",
            ));
        }
    }
    Ok(())
}

/// A user turn: its tool results become `tool` messages (chat wants them right after
/// the assistant's calls, where Anthropic puts them first), the rest one user message.
fn user_message(content: &Value, at: &str, out: &mut Vec<Value>) -> Result<(), Untranslatable> {
    let blocks = match content {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => {
            return Err(no(
                format!("{at}.content"),
                "must be a string or an array of blocks",
            ));
        }
    };
    let mut parts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(json!({"type": "text", "text": b.get("text")})),
            Some("image") => parts.push(image(b, &here)?),
            Some("tool_result") => {
                let id = b.get("tool_use_id").cloned().unwrap_or(Value::Null);
                let text = match b.get("content") {
                    None | Some(Value::Null) => json!(""),
                    Some(c) => text_content(c, &format!("{here}.content")).map_err(|_| {
                        no(
                            format!("{here}.content"),
                            "a chat-completions tool message carries text only",
                        )
                    })?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
            _ => {
                return Err(no(
                    here,
                    "chat completions has no form for this block type (documents, search results, server tool blocks)",
                ));
            }
        }
    }
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

/// An image block as an `image_url` part: base64 as a data URL, a URL as itself.
fn image(b: &Value, at: &str) -> Result<Value, Untranslatable> {
    let s = b.get("source").unwrap_or(&Value::Null);
    let url = match s.get("type").and_then(Value::as_str) {
        Some("base64") => format!(
            "data:{};base64,{}",
            s.get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/png"),
            s.get("data").and_then(Value::as_str).unwrap_or_default()
        ),
        Some("url") => s
            .get("url")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => {
            return Err(no(
                format!("{at}.source"),
                "an uploaded file exists only at Anthropic",
            ));
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn assistant_message(content: &Value, at: &str) -> Result<Value, Untranslatable> {
    let blocks = match content {
        Value::String(s) => return Ok(json!({"role": "assistant", "content": s})),
        Value::Array(b) => b,
        _ => {
            return Err(no(
                format!("{at}.content"),
                "must be a string or an array of blocks",
            ));
        }
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default())
            }
            Some("tool_use") => calls.push(json!({
                "id": b.get("id"),
                "type": "function",
                "function": {
                    "name": b.get("name"),
                    "arguments": b.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
                },
            })),
            Some("thinking" | "redacted_thinking") => {
                return Err(no(
                    here,
                    "a thinking block is signed by Anthropic and only Anthropic can read it back",
                ));
            }
            _ => return Err(no(here, "chat completions has no form for this block type")),
        }
    }
    let mut m = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    Ok(m)
}

/// A client tool as a function; typed tools run at Anthropic or are Anthropic-defined.
fn tool(t: &Value, i: usize) -> Result<Value, Untranslatable> {
    let at = format!("tools[{i}]");
    if t.get("type")
        .and_then(Value::as_str)
        .is_some_and(|ty| ty != "custom")
    {
        return Err(no(
            at,
            "a typed tool is Anthropic's own (server or Anthropic-defined)",
        ));
    }
    for (k, v) in t.as_object().into_iter().flatten() {
        match k.as_str() {
            "name" | "description" | "input_schema" | "type" | "cache_control" => {}
            _ if v.is_null() => {}
            _ => {
                return Err(no(
                    format!("{at}.{k}"),
                    "chat-completions functions have no such setting",
                ));
            }
        }
    }
    let mut f = json!({
        "name": t.get("name"),
        "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"})),
    });
    if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
        f["description"] = d.clone();
    }
    Ok(json!({"type": "function", "function": f}))
}

/// `tool_choice`, and whether parallel calls stay allowed.
fn tool_choice(c: &Value) -> Result<(Value, Option<bool>), Untranslatable> {
    let parallel = c
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|d| !d);
    let mapped = match c.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => json!({"type": "function", "function": {"name": c.get("name")}}),
        _ => return Err(no("tool_choice", "not a tool choice chat completions has")),
    };
    Ok((mapped, parallel))
}

/// Anthropic's stop reason for an OpenAI finish reason.
pub fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        Some(_) | None => "end_turn",
    }
}

/// The Messages `usage` of an answer: input without the cached part, which is its own.
pub fn usage_block(u: &Usage) -> Value {
    let cached = u.cached_input.unwrap_or(0);
    json!({
        "input_tokens": u.input.unwrap_or(0).saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": u.output.unwrap_or(0),
    })
}

/// An OpenAI chat.completion as a Messages answer, under the model name the client
/// asked for.
pub fn message(chat: &Value, model: &str, usage: &Usage) -> Value {
    let msg = chat.pointer("/choices/0/message").unwrap_or(&Value::Null);
    let mut content = Vec::new();
    if let Some(t) = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "text", "text": t}));
    }
    for c in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        content.push(json!({
            "type": "tool_use",
            "id": c.get("id"),
            "name": c.pointer("/function/name"),
            "input": arguments(c.pointer("/function/arguments")),
        }));
    }
    json!({
        "id": format!("msg_{}", chat.get("id").and_then(Value::as_str).unwrap_or_default()),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(chat.pointer("/choices/0/finish_reason").and_then(Value::as_str)),
        "stop_sequence": null,
        "usage": usage_block(usage),
    })
}

/// A call's arguments as the object Anthropic's `input` is; arguments that are not a
/// JSON object (a model's malformed output) are kept whole under `arguments`.
fn arguments(a: Option<&Value>) -> Value {
    let raw = a.and_then(Value::as_str).unwrap_or("{}");
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) | Err(_) => json!({"arguments": raw}),
    }
}

/// OpenAI chat chunks written as Anthropic stream events, in order: `message_start`,
/// each content block opened, its deltas, closed, then `message_delta` and
/// `message_stop` once the answer is complete.
#[derive(Debug, Default)]
pub struct EventWriter {
    started: bool,
    /// The open block: its index and whether it is a tool call (with its OpenAI index).
    open: Option<(u64, Option<u64>)>,
    next: u64,
    finish: Option<String>,
}

fn event(name: &str, v: &Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

impl EventWriter {
    /// The events one OpenAI chunk makes.
    pub fn chunk(&mut self, c: &Value, model: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.start(c.get("id").and_then(Value::as_str), model, &mut out);
        let delta = c.pointer("/choices/0/delta").unwrap_or(&Value::Null);
        if let Some(t) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            if !matches!(self.open, Some((_, None))) {
                self.close(&mut out);
                let index = self.open(None);
                out.push(event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
                ));
            }
            let index = self.open.map_or(0, |(i, _)| i);
            out.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}),
            ));
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            if self.open.map(|(_, t)| t) != Some(Some(n)) {
                self.close(&mut out);
                let index = self.open(Some(n));
                out.push(event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": index, "content_block": {
                        "type": "tool_use", "id": call.get("id"),
                        "name": call.pointer("/function/name"), "input": {}}}),
                ));
            }
            if let Some(a) = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                let index = self.open.map_or(0, |(i, _)| i);
                out.push(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": a}}),
                ));
            }
        }
        if let Some(f) = c
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            self.finish = Some(f.to_string());
        }
        out
    }

    /// `message_start`, once. Chat reports usage only at the end: it goes in
    /// `message_delta`, which Anthropic's clients read too.
    fn start(&mut self, id: Option<&str>, model: &str, out: &mut Vec<String>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(event(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": format!("msg_{}", id.unwrap_or_default()),
                "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        ));
    }

    fn open(&mut self, tool: Option<u64>) -> u64 {
        let index = self.next;
        self.next += 1;
        self.open = Some((index, tool));
        index
    }

    fn close(&mut self, out: &mut Vec<String>) {
        if let Some((index, _)) = self.open.take() {
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// The end of a complete answer: the open block closed, the stop reason and usage,
    /// `message_stop`.
    pub fn end(&mut self, usage: &Usage, model: &str) -> Vec<String> {
        let mut out = Vec::new();
        // An answer with no chunk that made an event still opens with message_start.
        self.start(None, model, &mut out);
        self.close(&mut out);
        out.push(event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(self.finish.as_deref()), "stop_sequence": null},
                    "usage": usage_block(usage)}),
        ));
        out.push(event("message_stop", &json!({"type": "message_stop"})));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(out: &[String]) -> Vec<Value> {
        out.iter()
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn a_stream_of_text_then_a_tool_call_becomes_two_blocks() {
        let mut w = EventWriter::default();
        let chunks = [
            json!({"id": "c1", "choices": [{"delta": {"role": "assistant", "content": "Looking"}}]}),
            json!({"id": "c1", "choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "ls", "arguments": ""}}]}}]}),
            json!({"id": "c1", "choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"d\":1}"}}]}}]}),
            json!({"id": "c1", "choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        let mut out = Vec::new();
        for c in &chunks {
            out.extend(w.chunk(c, "m"));
        }
        out.extend(w.end(
            &Usage {
                input: Some(100),
                cached_input: Some(40),
                output: Some(7),
                ..Usage::default()
            },
            "m",
        ));
        let ev = events(&out);
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[4]["index"], 1);
        assert_eq!(ev[4]["content_block"]["name"], "ls");
        assert_eq!(ev[5]["delta"]["partial_json"], "{\"d\":1}");
        assert_eq!(ev[7]["delta"]["stop_reason"], "tool_use");
        // Anthropic's input count excludes the cache reads, which are their own.
        assert_eq!(ev[7]["usage"]["input_tokens"], 60);
        assert_eq!(ev[7]["usage"]["cache_read_input_tokens"], 40);
    }

    #[test]
    fn an_answer_without_content_still_opens_and_closes_the_message() {
        let mut w = EventWriter::default();
        let ev = events(&w.end(&Usage::default(), "m"));
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["message_start", "message_delta", "message_stop"]);
    }

    #[test]
    fn a_plain_answer_with_a_tool_call_becomes_tool_use() {
        let chat = json!({"id": "x", "choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
            {"id": "d", "type": "function", "function": {"name": "g", "arguments": "not json"}}]},
            "finish_reason": "tool_calls"}]});
        let m = message(&chat, "m", &Usage::default());
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["content"][0]["input"], json!({"a": 1}));
        assert_eq!(m["content"][1]["input"], json!({"arguments": "not json"}));
    }

    #[test]
    fn refusals_name_the_part() {
        for (body, param) in [
            (json!({"top_k": 5, "messages": []}), "top_k"),
            (
                json!({"thinking": {"type": "adaptive"}, "messages": []}),
                "thinking",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [], "tools": [{"name": "t", "input_schema": {}, "defer_loading": true}]}),
                "tools[0].defer_loading",
            ),
            (
                json!({"messages": [], "stop_sequences": ["a", "b", "c", "d", "e"]}),
                "stop_sequences",
            ),
            (json!({"messages": [], "brand_new": 1}), "brand_new"),
        ] {
            assert_eq!(chat_body(&body).unwrap_err().param, param, "{body}");
        }
        let ok = json!({"thinking": {"type": "disabled"}, "metadata": {"user_id": "u"},
                        "messages": [{"role": "user", "content": "hi"}],
                        "tool_choice": {"type": "any", "disable_parallel_tool_use": true}});
        let chat = chat_body(&ok).unwrap();
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert!(chat.get("metadata").is_none());
    }
}
