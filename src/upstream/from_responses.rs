//! An OpenAI Responses request sent to an `api: anthropic` or `api: gemini`
//! destination: translated to a chat-completions body where that is faithful, which
//! then goes through the existing chat → Anthropic and chat → Gemini adapters (and
//! their field table, `fields::check`); the answer comes back as a Responses `response`
//! object, or as Responses stream events. What has no faithful form is refused with the
//! field named, never dropped:
//! - reasoning items carrying `encrypted_content`: only OpenAI can read them back;
//! - hosted tools (web search, file search, code interpreter…), custom tools and
//!   Codex's `additional_tools` items: they run at OpenAI or have no function form;
//! - `previous_response_id`, `conversation`, `prompt`, `background`, `store: true`,
//!   `include`, `reasoning`, `text.verbosity`, `truncation: auto`, service tiers and
//!   any field purser does not know: server-side state or settings chat has no field for.
//!
//! Dropped, because dropping them is faithful and price-safe: `metadata` (kept by
//! OpenAI with a stored response, which a translated call never is),
//! `prompt_cache_key` and `safety_identifier` (hints to OpenAI's cache and abuse
//! checks; the bound prices every input token at the dearest input rate anyway), and
//! reasoning items without encrypted content (a summary of earlier thinking, which
//! chat has no slot for and which only lowers what the call costs when left out).

use serde_json::{Map, Value, json};

pub use super::from_messages::Untranslatable;
use super::{ChatRequest, Usage};

/// The chat request a Responses request becomes for the chat → Anthropic and chat →
/// Gemini adapters: the translated body, the same proved cap and stream flag.
/// Checked before any call (`gateway::ingress::check`): a body with no faithful chat
/// form never gets here, and would go as an empty conversation if it did.
pub fn chat_request(req: &ChatRequest) -> ChatRequest {
    ChatRequest::new(
        req.as_chat()
            .cloned()
            .unwrap_or_else(|_| json!({"messages": []})),
        req.max_tokens,
        req.stream,
        crate::ingress::Ingress::Chat,
        Vec::new(),
    )
}

fn no(param: impl Into<String>, why: &'static str) -> Untranslatable {
    Untranslatable {
        param: param.into(),
        why,
    }
}

/// Top-level fields that have no chat-completions form, with why.
const REFUSED: [(&str, &str); 9] = [
    (
        "previous_response_id",
        "the earlier turns are stored at OpenAI; another vendor cannot read them",
    ),
    (
        "conversation",
        "a conversation is stored at OpenAI; another vendor cannot read it",
    ),
    ("prompt", "a stored prompt template exists only at OpenAI"),
    (
        "background",
        "a background response is run and kept by OpenAI's server",
    ),
    (
        "include",
        "it asks OpenAI for extra output (encrypted reasoning, search results) other vendors do not produce",
    ),
    (
        "reasoning",
        "reasoning effort and summaries have no chat-completions field the other adapters carry",
    ),
    (
        "service_tier",
        "OpenAI's service tiers are not another vendor's",
    ),
    (
        "max_tool_calls",
        "chat completions has no cap on tool calls",
    ),
    (
        "top_logprobs",
        "the other adapters carry no log probabilities",
    ),
];

/// Top-level fields with a chat-completions form (or dropped as price-safe).
const TRANSLATED: [&str; 17] = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "stream",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "store",
    "truncation",
    "user",
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
];

/// The chat-completions body of a Responses body (without the model and the output
/// cap, which the destination's adapter sets from the proved bound, as for any chat
/// request). The input items are translated first: the part a client most often sends
/// that has no faithful form (Codex's `additional_tools`) is named before any setting.
pub fn chat_body(body: &Value) -> Result<Value, Untranslatable> {
    let Some(obj) = body.as_object() else {
        return Err(no("", "the body must be a JSON object"));
    };
    let mut messages = Vec::new();
    if let Some(i) = obj.get("instructions").filter(|v| !v.is_null()) {
        match i {
            Value::String(s) => messages.push(json!({"role": "system", "content": s})),
            _ => return Err(no("instructions", "must be a string")),
        }
    }
    match obj.get("input") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                translate_item(item, i, &mut messages)?;
            }
        }
        Some(_) => return Err(no("input", "must be a string or an array of items")),
    }
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(f, _)| f == k) {
            // An empty `include` asks for nothing.
            if !(k == "include" && v.as_array().is_some_and(Vec::is_empty)) {
                return Err(no(k.clone(), why));
            }
        }
        if !TRANSLATED.contains(&k.as_str()) && !REFUSED.iter().any(|(f, _)| f == k) {
            return Err(no(
                k.clone(),
                "purser has no chat-completions form for this field",
            ));
        }
    }
    if obj.get("store") == Some(&Value::Bool(true)) {
        return Err(no(
            "store",
            "a stored response is kept by OpenAI for later turns; another vendor keeps nothing",
        ));
    }
    if obj
        .get("truncation")
        .and_then(Value::as_str)
        .is_some_and(|t| t != "disabled")
    {
        return Err(no(
            "truncation",
            "dropping earlier input to fit the context is done by OpenAI's server",
        ));
    }
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    for k in ["temperature", "top_p", "parallel_tool_calls", "user"] {
        if let Some(v) = obj.get(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(text) = obj.get("text").filter(|t| !t.is_null())
        && let Some(format) = text_format(text)?
    {
        out.insert("response_format".into(), format);
    }
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let mut mapped = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            mapped.push(tool(t, i)?);
        }
        if !mapped.is_empty() {
            out.insert("tools".into(), Value::Array(mapped));
        }
    }
    if let Some(choice) = obj.get("tool_choice").filter(|c| !c.is_null()) {
        out.insert("tool_choice".into(), tool_choice(choice)?);
    }
    Ok(Value::Object(out))
}

/// One input item, appended to the chat messages.
fn translate_item(item: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), Untranslatable> {
    let at = format!("input[{i}]");
    // An item with a role and no type is a message (the "easy" input form).
    let ty = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or(if item.get("role").is_some() {
            "message"
        } else {
            ""
        });
    match ty {
        "message" => message_item(item, &at, out),
        "function_call" => {
            let call = json!({
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments").cloned().unwrap_or(json!("{}"))},
            });
            // Calls made in one turn are one assistant message in chat, after its text.
            match out.last_mut() {
                Some(last) if last.get("role").and_then(Value::as_str) == Some("assistant") => {
                    match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    }
                }
                _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
            Ok(())
        }
        "function_call_output" => {
            let content = match item.get("output") {
                Some(Value::String(s)) => json!(s),
                Some(Value::Array(parts)) => {
                    let mut text = Vec::with_capacity(parts.len());
                    for (j, p) in parts.iter().enumerate() {
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("input_text" | "output_text"), Some(Value::String(t))) => {
                                text.push(json!({"type": "text", "text": t}));
                            }
                            _ => {
                                return Err(no(
                                    format!("{at}.output[{j}]"),
                                    "a chat-completions tool message carries text only",
                                ));
                            }
                        }
                    }
                    Value::Array(text)
                }
                _ => return Err(no(format!("{at}.output"), "must be a string or text parts")),
            };
            out.push(
                json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": content}),
            );
            Ok(())
        }
        "reasoning" => {
            if item.get("encrypted_content").is_some_and(|e| !e.is_null()) {
                return Err(no(
                    format!("{at}.encrypted_content"),
                    "encrypted reasoning is OpenAI's; no other vendor can read it back",
                ));
            }
            Ok(())
        }
        "additional_tools" => Err(no(
            at,
            "an additional_tools item declares tools inside the input (namespaced ones, a custom tool with a grammar), which chat completions cannot carry",
        )),
        _ => Err(no(
            at,
            "chat completions has no form for this item type (hosted tool calls, custom tool calls, item references)",
        )),
    }
}

fn message_item(item: &Value, at: &str, out: &mut Vec<Value>) -> Result<(), Untranslatable> {
    let role = match item.get("role").and_then(Value::as_str) {
        // A developer message is the system prompt of newer OpenAI models.
        Some("system" | "developer") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        _ => {
            return Err(no(
                format!("{at}.role"),
                "must be user, assistant, system or developer",
            ));
        }
    };
    let content = match item.get("content") {
        Some(Value::String(s)) => json!(s),
        Some(Value::Array(parts)) => {
            let mut mapped = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                mapped.push(part(p, role, &format!("{at}.content[{j}]"))?);
            }
            // An assistant's text goes back as a string: its tool calls may follow.
            if role == "assistant" {
                json!(
                    mapped
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<String>()
                )
            } else {
                Value::Array(mapped)
            }
        }
        _ => {
            return Err(no(
                format!("{at}.content"),
                "must be a string or an array of parts",
            ));
        }
    };
    out.push(json!({"role": role, "content": content}));
    Ok(())
}

fn part(p: &Value, role: &str, at: &str) -> Result<Value, Untranslatable> {
    match (p.get("type").and_then(Value::as_str), role) {
        (Some("input_text" | "output_text"), _) => match p.get("text") {
            Some(Value::String(t)) => Ok(json!({"type": "text", "text": t})),
            _ => Err(no(format!("{at}.text"), "must be a string")),
        },
        (Some("input_image"), "user") => {
            if p.get("file_id").is_some_and(|f| !f.is_null()) {
                return Err(no(
                    format!("{at}.file_id"),
                    "an uploaded file exists only at OpenAI",
                ));
            }
            let Some(url) = p.get("image_url").and_then(Value::as_str) else {
                return Err(no(format!("{at}.image_url"), "must be a URL or a data URL"));
            };
            let mut image = json!({"url": url});
            if let Some(d) = p.get("detail").filter(|d| !d.is_null()) {
                image["detail"] = d.clone();
            }
            Ok(json!({"type": "image_url", "image_url": image}))
        }
        (Some("refusal"), "assistant") => match p.get("refusal") {
            Some(Value::String(t)) => Ok(json!({"type": "text", "text": t})),
            _ => Err(no(format!("{at}.refusal"), "must be a string")),
        },
        _ => Err(no(
            at,
            "chat completions has no form for this part here (files, audio, or an image outside a user turn)",
        )),
    }
}

/// `text.format` as a `response_format`; `text.verbosity` has no chat form.
fn text_format(text: &Value) -> Result<Option<Value>, Untranslatable> {
    for (k, v) in text.as_object().into_iter().flatten() {
        match k.as_str() {
            "format" => {}
            _ if v.is_null() => {}
            _ => {
                return Err(no(
                    format!("text.{k}"),
                    "chat completions has no such output setting",
                ));
            }
        }
    }
    let Some(f) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for k in ["name", "schema", "description", "strict"] {
                if let Some(v) = f.get(k).filter(|v| !v.is_null()) {
                    schema.insert(k.into(), v.clone());
                }
            }
            Ok(Some(
                json!({"type": "json_schema", "json_schema": Value::Object(schema)}),
            ))
        }
        _ => Err(no(
            "text.format",
            "not an output format chat completions has",
        )),
    }
}

/// A function tool (the flat Responses shape) as a chat tool; every other type runs at
/// OpenAI (hosted tools) or is not a JSON function (custom tools with grammars).
fn tool(t: &Value, i: usize) -> Result<Value, Untranslatable> {
    let at = format!("tools[{i}]");
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(no(
            at,
            "only function tools have a chat-completions form; hosted tools run at OpenAI and custom tools take free text",
        ));
    }
    let mut f = Map::new();
    for (k, v) in t.as_object().into_iter().flatten() {
        match k.as_str() {
            "type" => {}
            "name" | "description" | "parameters" | "strict" => {
                if !v.is_null() {
                    f.insert(k.clone(), v.clone());
                }
            }
            _ if v.is_null() => {}
            _ => {
                return Err(no(
                    format!("{at}.{k}"),
                    "chat-completions functions have no such setting",
                ));
            }
        }
    }
    f.entry("parameters")
        .or_insert_with(|| json!({"type": "object"}));
    Ok(json!({"type": "function", "function": Value::Object(f)}))
}

fn tool_choice(c: &Value) -> Result<Value, Untranslatable> {
    match c {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(c.clone()),
        Value::Object(_) if c.get("type").and_then(Value::as_str) == Some("function") => {
            Ok(json!({"type": "function", "function": {"name": c.get("name")}}))
        }
        _ => Err(no(
            "tool_choice",
            "not a tool choice chat completions has (allowed_tools, hosted and custom tools)",
        )),
    }
}

/// The Responses `usage` of an answer.
pub fn usage_block(u: &Usage) -> Value {
    let (input, output) = (u.input.unwrap_or(0), u.output.unwrap_or(0));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": u.cached_input.unwrap_or(0)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning.unwrap_or(0)},
        "total_tokens": input.saturating_add(output),
    })
}

/// The status and `incomplete_details` a chat finish reason means.
fn status(finish: Option<&str>) -> (&'static str, Value) {
    match finish {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        Some(_) | None => ("completed", Value::Null),
    }
}

fn envelope(id: &str, model: &str, status: &str, output: Vec<Value>) -> Value {
    json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "status": status,
        "error": null,
        "incomplete_details": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "store": false,
        "usage": null,
    })
}

fn text_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(id: &str, call_id: &Value, name: &Value, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

/// A chat.completion (as the Anthropic and Gemini adapters give it) as a Responses
/// `response` object, under the model name the client asked for.
pub fn response(chat: &Value, model: &str, usage: &Usage) -> Value {
    let id = chat.get("id").and_then(Value::as_str).unwrap_or_default();
    let msg = chat.pointer("/choices/0/message").unwrap_or(&Value::Null);
    let mut output = Vec::new();
    if let Some(t) = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        output.push(text_item(id, t, "completed"));
    }
    for (n, c) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        output.push(call_item(
            &format!("{id}_{n}"),
            c.get("id").unwrap_or(&Value::Null),
            c.pointer("/function/name").unwrap_or(&Value::Null),
            c.pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}"),
            "completed",
        ));
    }
    let (st, incomplete) = status(
        chat.pointer("/choices/0/finish_reason")
            .and_then(Value::as_str),
    );
    let mut r = envelope(id, model, st, output);
    r["incomplete_details"] = incomplete;
    r["usage"] = usage_block(usage);
    r
}

/// An output item being written: text, or a function call (with its chat index).
#[derive(Debug)]
struct Open {
    index: u64,
    call: Option<u64>,
    id: String,
    call_id: Value,
    name: Value,
    text: String,
}

/// OpenAI chat chunks written as Responses stream events: `response.created`, each
/// output item added, its deltas and their `done`, the item done, then
/// `response.completed` (or `response.incomplete`) with the usage once the answer is
/// complete. Every event carries its `sequence_number`.
#[derive(Debug, Default)]
pub struct EventWriter {
    id: Option<String>,
    seq: u64,
    open: Option<Open>,
    next: u64,
    done: Vec<Value>,
    finish: Option<String>,
}

impl EventWriter {
    fn event(&mut self, mut v: Value) -> String {
        let name = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        format!("event: {name}\ndata: {v}\n\n")
    }

    fn id(&self) -> &str {
        self.id.as_deref().unwrap_or_default()
    }

    /// `response.created` and `response.in_progress`, once.
    fn start(&mut self, id: Option<&str>, model: &str, out: &mut Vec<String>) {
        if self.id.is_some() {
            return;
        }
        self.id = Some(id.unwrap_or_default().to_string());
        let r = envelope(self.id(), model, "in_progress", Vec::new());
        let e = self.event(json!({"type": "response.created", "response": r}));
        out.push(e);
        let e = self.event(json!({"type": "response.in_progress", "response": r}));
        out.push(e);
    }

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
            if !matches!(self.open, Some(Open { call: None, .. })) {
                self.close(&mut out);
                self.open_text(&mut out);
            }
            if let Some(o) = &mut self.open {
                o.text.push_str(t);
            }
            let (id, index) = self.current();
            let e = self.event(json!({"type": "response.output_text.delta", "item_id": id,
                "output_index": index, "content_index": 0, "delta": t, "logprobs": []}));
            out.push(e);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            if self.open.as_ref().map(|o| o.call) != Some(Some(n)) {
                self.close(&mut out);
                self.open_call(n, call, &mut out);
            }
            if let Some(a) = call
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                if let Some(o) = &mut self.open {
                    o.text.push_str(a);
                }
                let (id, index) = self.current();
                let e = self.event(json!({"type": "response.function_call_arguments.delta",
                    "item_id": id, "output_index": index, "delta": a}));
                out.push(e);
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

    fn current(&self) -> (String, u64) {
        self.open
            .as_ref()
            .map_or((String::new(), 0), |o| (o.id.clone(), o.index))
    }

    fn open_text(&mut self, out: &mut Vec<String>) {
        let index = self.next;
        self.next += 1;
        let id = format!("msg_{}_{index}", self.id());
        let added = json!({"type": "response.output_item.added", "output_index": index,
            "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}});
        let e = self.event(added);
        out.push(e);
        let e = self.event(json!({"type": "response.content_part.added", "item_id": id,
            "output_index": index, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}));
        out.push(e);
        self.open = Some(Open {
            index,
            call: None,
            id,
            call_id: Value::Null,
            name: Value::Null,
            text: String::new(),
        });
    }

    fn open_call(&mut self, n: u64, call: &Value, out: &mut Vec<String>) {
        let index = self.next;
        self.next += 1;
        let id = format!("fc_{}_{index}", self.id());
        let call_id = call.get("id").cloned().unwrap_or(Value::Null);
        let name = call
            .pointer("/function/name")
            .cloned()
            .unwrap_or(Value::Null);
        let e = self.event(
            json!({"type": "response.output_item.added", "output_index": index,
            "item": {"type": "function_call", "id": id, "call_id": call_id, "name": name,
                     "arguments": "", "status": "in_progress"}}),
        );
        out.push(e);
        self.open = Some(Open {
            index,
            call: Some(n),
            id,
            call_id,
            name,
            text: String::new(),
        });
    }

    /// The open item's `done` events; the item is kept for the final response.
    fn close(&mut self, out: &mut Vec<String>) {
        let Some(o) = self.open.take() else {
            return;
        };
        let item = match o.call {
            None => {
                let e = self.event(json!({"type": "response.output_text.done", "item_id": o.id,
                    "output_index": o.index, "content_index": 0, "text": o.text, "logprobs": []}));
                out.push(e);
                let e = self.event(
                    json!({"type": "response.content_part.done", "item_id": o.id,
                    "output_index": o.index, "content_index": 0,
                    "part": {"type": "output_text", "text": o.text, "annotations": []}}),
                );
                out.push(e);
                let mut item = text_item("", &o.text, "completed");
                item["id"] = json!(o.id);
                item
            }
            Some(_) => {
                let e = self.event(json!({"type": "response.function_call_arguments.done",
                    "item_id": o.id, "output_index": o.index, "arguments": o.text}));
                out.push(e);
                let mut item = call_item("", &o.call_id, &o.name, &o.text, "completed");
                item["id"] = json!(o.id);
                item
            }
        };
        let e = self.event(
            json!({"type": "response.output_item.done", "output_index": o.index, "item": item}),
        );
        out.push(e);
        self.done.push(item);
    }

    /// The end of a complete answer: the open item closed, then `response.completed`
    /// (or `response.incomplete` when the cap or a filter cut it) with the usage.
    pub fn end(&mut self, usage: &Usage, model: &str) -> Vec<String> {
        let mut out = Vec::new();
        // An answer with no chunk that made an event still opens with response.created.
        self.start(None, model, &mut out);
        self.close(&mut out);
        let (st, incomplete) = status(self.finish.as_deref());
        let done = std::mem::take(&mut self.done);
        let mut r = envelope(self.id(), model, st, done);
        r["incomplete_details"] = incomplete;
        r["usage"] = usage_block(usage);
        let ty = match st {
            "completed" => "response.completed",
            _ => "response.incomplete",
        };
        let e = self.event(json!({"type": ty, "response": r}));
        out.push(e);
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
    fn items_become_chat_messages() {
        let body = json!({
            "instructions": "be brief",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
                {"role": "user", "content": [{"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{\"d\":1}"},
                {"type": "function_call", "call_id": "c2", "name": "pwd", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a b"},
                {"type": "function_call_output", "call_id": "c2", "output": "/"},
                {"type": "reasoning", "summary": []}
            ],
            "tools": [{"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}, "strict": false}],
            "tool_choice": {"type": "function", "name": "ls"},
            "max_output_tokens": 100, "temperature": 0.5, "store": false,
            "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
        });
        let chat = chat_body(&body).unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6, "{chat}");
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1]["role"], "system");
        assert_eq!(
            m[2]["content"][1]["image_url"]["url"],
            "data:image/png;base64,AAAA"
        );
        assert_eq!(m[3]["content"], "calling");
        assert_eq!(m[3]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[3]["tool_calls"][1]["function"]["name"], "pwd");
        assert_eq!(
            m[4],
            json!({"role": "tool", "tool_call_id": "c1", "content": "a b"})
        );
        assert_eq!(chat["tools"][0]["function"]["name"], "ls");
        assert_eq!(chat["tools"][0]["function"]["strict"], false);
        assert_eq!(chat["tool_choice"]["function"]["name"], "ls");
        assert_eq!(chat["response_format"]["json_schema"]["name"], "o");
        assert_eq!(chat["temperature"], 0.5);
        assert!(chat.get("max_output_tokens").is_none());
    }

    #[test]
    fn refusals_name_the_field() {
        for (body, param) in [
            (
                json!({"input": "hi", "previous_response_id": "r"}),
                "previous_response_id",
            ),
            (
                json!({"input": "hi", "include": ["reasoning.encrypted_content"]}),
                "include",
            ),
            (json!({"input": "hi", "store": true}), "store"),
            (
                json!({"input": "hi", "tools": [{"type": "web_search"}]}),
                "tools[0]",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "custom", "name": "apply_patch"}]}),
                "tools[0]",
            ),
            (
                json!({"input": "hi", "text": {"verbosity": "low"}}),
                "text.verbosity",
            ),
            (json!({"input": "hi", "brand_new": 1}), "brand_new"),
            (
                json!({"input": [{"type": "reasoning", "encrypted_content": "gAAA"}]}),
                "input[0].encrypted_content",
            ),
            (
                json!({"input": [{"type": "additional_tools", "tools": []}]}),
                "input[0]",
            ),
            (json!({"input": [{"type": "web_search_call"}]}), "input[0]"),
        ] {
            assert_eq!(chat_body(&body).unwrap_err().param, param, "{body}");
        }
        assert!(chat_body(&json!({"input": "hi", "include": []})).is_ok());
    }

    #[test]
    fn a_plain_answer_with_text_and_a_call_becomes_two_items() {
        let chat = json!({"id": "x", "choices": [{"message": {"content": "ok", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            "finish_reason": "tool_calls"}]});
        let usage = Usage {
            input: Some(10),
            output: Some(4),
            ..Usage::default()
        };
        let r = response(&chat, "m", &usage);
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output"][0]["content"][0]["text"], "ok");
        assert_eq!(r["output"][1]["call_id"], "c");
        assert_eq!(r["output"][1]["arguments"], "{\"a\":1}");
        assert_eq!(r["usage"]["total_tokens"], 14);
    }

    #[test]
    fn a_stream_of_text_then_a_call_becomes_two_items() {
        let mut w = EventWriter::default();
        let chunks = [
            json!({"id": "c1", "choices": [{"delta": {"role": "assistant", "content": "Look"}}]}),
            json!({"id": "c1", "choices": [{"delta": {"content": "ing"}}]}),
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
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(ev[6]["text"], "Looking");
        assert_eq!(ev[12]["item"]["arguments"], "{\"d\":1}");
        let done = &ev[13]["response"];
        assert_eq!(done["output"].as_array().unwrap().len(), 2);
        assert_eq!(done["usage"]["total_tokens"], 107);
        for (i, e) in ev.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
    }

    #[test]
    fn a_capped_stream_ends_incomplete() {
        let mut w = EventWriter::default();
        let mut out = w.chunk(
            &json!({"id": "c", "choices": [{"delta": {"content": "a"}, "finish_reason": "length"}]}),
            "m",
        );
        out.extend(w.end(&Usage::default(), "m"));
        let ev = events(&out);
        let last = ev.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }
}
