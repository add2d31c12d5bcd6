//! Reads every signal an error answer carries: the vendor's structured fields, its
//! prose, and the same again for any error relayed inside a message (a proxy that
//! quotes the vendor's JSON body in its own `message`). Only failures are read this
//! way; a plain success never pays for it.

use serde_json::Value;

use super::FailureClass;
use super::dialects::{DIALECTS, Field};

/// How many relay envelopes are opened, at most. Three covers the deepest chain seen
/// in the corpus (a client proxy in front of LiteLLM in front of a vendor) and keeps a
/// hostile body from making the classifier recurse without end.
pub const MAX_DEPTH: u8 = 3;

/// Longest message text searched for an embedded error: relayed bodies are small, and
/// a megabyte of HTML need not be parsed three times.
const MAX_EMBEDDED: usize = 64 * 1024;

/// One signal found: a dialect row matched a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub class: FailureClass,
    /// The dialect table whose row matched.
    pub dialect: &'static str,
    pub field: Field,
    /// The vendor's value (structured) or the phrase that matched (prose).
    pub value: String,
    /// 0 for the answer itself, n for an error relayed n envelopes deep.
    pub depth: u8,
}

/// A value read from the answer, before the dialect tables judge it.
struct Seen {
    field: Field,
    value: String,
    depth: u8,
}

/// Every signal in an error answer. `json` is the parsed body when it is JSON; `raw`
/// is read as prose when it is not.
pub fn read(headers: &[(String, String)], json: Option<&Value>, raw: &str) -> Vec<Hit> {
    let mut seen = Vec::new();
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("x-amzn-errortype") {
            // "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"
            let name = v.split(':').next().unwrap_or(v);
            push(&mut seen, Field::AwsType, name, 0);
        }
    }
    match json {
        Some(v) => walk(v, 0, &mut seen),
        None => text(raw, 0, &mut seen),
    }
    judge(&seen)
}

/// Every signal of an error value that is not a whole answer (a stream's error event).
pub fn read_value(v: &Value) -> Vec<Hit> {
    let mut seen = Vec::new();
    walk(v, 0, &mut seen);
    judge(&seen)
}

fn judge(seen: &[Seen]) -> Vec<Hit> {
    let mut hits = Vec::new();
    for s in seen {
        for d in DIALECTS {
            for rule in d.rules {
                if rule.field == s.field && rule.pat.matches(&s.value) {
                    let value = if s.field.is_structured() {
                        s.value.clone()
                    } else {
                        rule.pat.shown(&s.value)
                    };
                    hits.push(Hit {
                        class: rule.class,
                        dialect: d.name,
                        field: s.field,
                        value,
                        depth: s.depth,
                    });
                }
            }
        }
    }
    hits
}

fn push(seen: &mut Vec<Seen>, field: Field, value: &str, depth: u8) {
    let value = value.trim();
    if !value.is_empty() {
        seen.push(Seen {
            field,
            value: value.to_lowercase(),
            depth,
        });
    }
}

/// Message text: prose, and possibly a relayed error inside it.
fn text(s: &str, depth: u8, seen: &mut Vec<Seen>) {
    push(seen, Field::Message, s, depth);
    if depth < MAX_DEPTH
        && s.len() <= MAX_EMBEDDED
        && let Some(inner) = embedded(s)
    {
        walk(&inner, depth + 1, seen);
    }
}

/// The first JSON object quoted inside a message, if any. Relays quote the vendor's
/// body after a prefix ("litellm.RateLimitError: AnthropicException - {...}",
/// "upstream error: {...}"); some quote a Python dict repr, which is tried too.
fn embedded(s: &str) -> Option<Value> {
    for (i, _) in s.match_indices('{').take(3) {
        let tail = s.get(i..)?;
        if let Some(v) = first_object(tail) {
            return Some(v);
        }
        if tail.starts_with("{'") {
            let pythonish = tail
                .replace('\'', "\"")
                .replace(": None", ": null")
                .replace(": True", ": true")
                .replace(": False", ": false");
            if let Some(v) = first_object(&pythonish) {
                return Some(v);
            }
        }
    }
    None
}

fn first_object(s: &str) -> Option<Value> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match it.next() {
        Some(Ok(v @ Value::Object(_))) => Some(v),
        Some(Ok(_) | Err(_)) | None => None,
    }
}

fn walk(v: &Value, depth: u8, seen: &mut Vec<Seen>) {
    // Gemini's OpenAI-compatible endpoint wraps the error in an array.
    let v = match v {
        Value::Array(items) => match items.first() {
            Some(first) => first,
            None => return,
        },
        Value::String(s) => {
            text(s, depth, seen);
            return;
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Object(_) => v,
    };
    let Value::Object(top) = v else { return };
    let mut objects = vec![top];
    if let Some(Value::Object(e)) = top.get("error") {
        objects.push(e);
    }
    for obj in objects {
        for (key, field) in [
            ("code", Field::Code),
            ("type", Field::Type),
            ("status", Field::Status),
        ] {
            if let Some(Value::String(s)) = obj.get(key) {
                push(seen, field, s, depth);
            }
        }
        // Cloudflare's problem+json error pages name the fault in `error_name`; their
        // prose is generic advice ("may indicate the origin is overloaded"), not a
        // verdict, so it is not read.
        if obj.get("cloudflare_error") == Some(&Value::Bool(true)) {
            if let Some(Value::String(n)) = obj.get("error_name") {
                push(seen, Field::Code, &format!("cloudflare:{n}"), depth);
            }
            continue;
        }
        if let Some(Value::String(s)) = obj.get("__type") {
            // "com.amazon.coral.validate#ValidationException"
            let name = s.rsplit('#').next().unwrap_or(s);
            push(seen, Field::AwsType, name, depth);
        }
        for (key, inner) in obj {
            // A Bedrock stream's exception event: {"throttlingException": {"message": …}}
            if key.to_ascii_lowercase().ends_with("exception")
                && let Value::Object(e) = inner
            {
                push(seen, Field::AwsType, key, depth);
                if let Some(Value::String(m)) = e.get("message") {
                    text(m, depth, seen);
                }
            }
        }
        // Azure spells it `innererror`; some of its deployments `inner_error`.
        for inner in ["innererror", "inner_error"]
            .iter()
            .filter_map(|k| obj.get(*k))
        {
            let Value::Object(inner) = inner else {
                continue;
            };
            if let Some(Value::String(c)) = inner.get("code") {
                push(seen, Field::InnerCode, c, depth);
            }
            for key in ["content_filter_result", "content_filter_results"] {
                if inner.get(key).is_some_and(any_filtered) {
                    push(seen, Field::Block, "content_filter_result", depth);
                }
            }
        }
        if let Some(Value::Array(details)) = obj.get("details") {
            for d in details {
                if let Some(Value::String(r)) = d.get("reason") {
                    push(seen, Field::Reason, r, depth);
                }
            }
        }
        if let Some(Value::Object(meta)) = obj.get("metadata") {
            if let Some(Value::Array(reasons)) = meta.get("reasons") {
                for r in reasons {
                    if let Value::String(r) = r {
                        push(seen, Field::MetadataReason, r, depth);
                    }
                }
            }
            if meta
                .get("flagged_input")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                push(seen, Field::Block, "flagged_input", depth);
            }
            // OpenRouter passes the provider's own body through as a string.
            if let Some(Value::String(raw)) = meta.get("raw") {
                text(raw, depth, seen);
            }
        }
        if obj
            .get("promptFeedback")
            .and_then(|p| p.get("blockReason"))
            .is_some_and(Value::is_string)
        {
            push(seen, Field::Block, "blockreason", depth);
        }
        for key in ["message", "error", "detail", "error_message", "msg"] {
            match obj.get(key) {
                Some(Value::String(s)) => text(s, depth, seen),
                // FastAPI-style `detail` objects and relays that nest one level more.
                Some(inner @ Value::Object(_)) if key != "error" => {
                    if depth < MAX_DEPTH {
                        walk(inner, depth + 1, seen);
                    }
                }
                Some(_) | None => {}
            }
        }
        if let Some(Value::Array(errs)) = obj.get("errors") {
            for e in errs {
                if let Some(Value::String(s)) = e.get("message") {
                    text(s, depth, seen);
                }
            }
        }
    }
}

/// Whether an Azure content-filter result marks any category as filtered.
fn any_filtered(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.values().any(|c| {
            c.get("filtered").and_then(Value::as_bool) == Some(true)
                || c.get("blocked").and_then(Value::as_bool) == Some(true)
        }),
        Value::Array(items) => items.iter().any(any_filtered),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => false,
    }
}
