//! OpenAI and OpenAI-compatible servers (vLLM, Groq, Together, Azure OpenAI): the
//! client's body passes through, with the upstream model id and the output bound.

use serde_json::{Value, json};

use super::{ChatRequest, Prepared, Usage, count};
use crate::policy::plan::Destination;

pub fn prepare(
    dest: &Destination,
    base_url: &str,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    let mut body = req.body.clone();
    if let Some(o) = body.as_object_mut() {
        o.insert("model".into(), json!(dest.upstream_model));
        // Exactly one cap goes out: the bound purser proved the cost with, in the field
        // the client used (max_completion_tokens when it sent both).
        let field = if o.remove("max_completion_tokens").is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        o.remove("max_tokens");
        o.insert(field.into(), json!(req.max_tokens));
        if req.stream {
            // Usage in the last chunk is how a stream's exact cost becomes known.
            o.insert("stream".into(), json!(true));
            o.insert("stream_options".into(), json!({"include_usage": true}));
        } else {
            o.remove("stream");
            o.remove("stream_options");
        }
    }
    let mut headers = vec![];
    if let Some(k) = key {
        headers.push(("authorization", format!("Bearer {k}")));
    }
    Prepared {
        url: format!("{base_url}/chat/completions"),
        headers,
        body,
    }
}

/// Already the OpenAI shape: handed back as it is, with its usage read.
pub fn translate(body: Value) -> (Value, Usage) {
    let usage = usage(&body);
    (body, usage)
}

/// The usage of an OpenAI chat.completion (its `usage` block).
pub fn usage(body: &Value) -> Usage {
    body.get("usage").map_or_else(Usage::default, usage_block)
}

/// An OpenAI `usage` object, as in a chat.completion or a stream's usage chunk.
pub fn usage_block(u: &Value) -> Usage {
    let input = count(u, "/prompt_tokens");
    Usage {
        input,
        cached_input: count(u, "/prompt_tokens_details/cached_tokens"),
        // OpenAI writes its prompt cache at no charge: a structural zero, so that a
        // missing breakdown is never mistaken for unreported writes.
        cache_write: input.map(|_| 0),
        output: count(u, "/completion_tokens"),
        reasoning: count(u, "/completion_tokens_details/reasoning_tokens"),
    }
}
