//! OpenAI and OpenAI-compatible servers (vLLM, Groq, Together, Azure OpenAI): the
//! client's body passes through, with the upstream model id and the output bound.

use serde_json::{Value, json};

use super::{ChatRequest, Prepared, Usage, count, overlay};
use crate::policy::plan::{CapField, Destination, EndpointPath, Endpoints};

pub fn prepare(
    dest: &Destination,
    base: &Endpoints,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    let body = match req.ingress {
        crate::ingress::Ingress::Responses => return responses(dest, base, key, req),
        // Checked before any call (`gateway::ingress::check`): a body that has no
        // faithful chat form never gets here.
        crate::ingress::Ingress::Messages => match req.as_chat() {
            Ok(chat) => {
                let (set, remove) = edits(dest, base, req, chat);
                overlay(chat, &set, &remove)
            }
            Err(_) => {
                let chat = json!({"messages": []});
                let (set, remove) = edits(dest, base, req, &chat);
                overlay(&chat, &set, &remove)
            }
        },
        crate::ingress::Ingress::Chat => {
            let (set, remove) = edits(dest, base, req, &req.body);
            overlay(&req.body, &set, &remove)
        }
    };
    let mut headers = vec![];
    if let Some(k) = key {
        headers.push(("authorization", format!("Bearer {k}")));
    }
    Prepared {
        url: base.at(EndpointPath::ChatCompletions),
        headers,
        body,
    }
}

/// What purser changes in a chat body on its way to the vendor: fields set, fields
/// removed.
fn edits(
    dest: &Destination,
    base: &Endpoints,
    req: &ChatRequest,
    chat: &Value,
) -> (Vec<(&'static str, Value)>, Vec<&'static str>) {
    // Exactly one cap reaches the vendor: the bound purser proved the cost with, in
    // the field this model reads (its entry's `cap_field`, else by family: OpenAI's
    // reasoning models refuse `max_tokens`), whichever field the client used; the
    // other is removed.
    let (keep, drop) = match dest.cap_field() {
        CapField::MaxCompletionTokens => ("max_completion_tokens", "max_tokens"),
        CapField::MaxTokens => ("max_tokens", "max_completion_tokens"),
    };
    let mut set = vec![
        ("model", json!(dest.upstream_model)),
        (keep, json!(req.max_tokens)),
    ];
    let mut remove = vec![drop];
    if let Some(pin) = pinned_tier(dest, base, chat) {
        set.push(pin);
    }
    if req.stream {
        set.push(("stream", json!(true)));
        // Usage in the last chunk is how a stream's exact cost becomes known: added
        // to the client's options, whose others (include_obfuscation, …) are kept.
        let mut options = match chat.get("stream_options") {
            Some(Value::Object(m)) => m.clone(),
            _ => serde_json::Map::new(),
        };
        options.insert("include_usage".into(), json!(true));
        set.push(("stream_options", Value::Object(options)));
    } else {
        remove.extend(["stream", "stream_options"]);
    }
    (set, remove)
}

/// The tier a request that names none is pinned to: on a platform where the project's
/// settings would pick it (`Endpoints::project_picks_tier`), for a model whose entry
/// declares no `priority` rates, the standard one (`default`), the dearest its worst
/// case can have been proved at (a declared `flex` is cheaper). An entry that declares
/// `priority` proves a request naming none at it, and the project's pick (priority, or
/// Scale Tier's prepaid `auto`) is kept. Nothing elsewhere: compatible servers name
/// their tiers otherwise (Groq's `on_demand`) or refuse fields they do not know.
fn pinned_tier(
    dest: &Destination,
    base: &Endpoints,
    body: &Value,
) -> Option<(&'static str, Value)> {
    // `null` and `auto` leave the pick to the project as absence does, by the rule the
    // bound read the request with.
    let vendor_picks = crate::gateway::request::vendor_picks_tier(body.get("service_tier"));
    let priority_proved = dest
        .terms
        .service_tiers
        .contains_key(&crate::policy::plan::ServiceTier::Priority);
    (base.project_picks_tier() && !priority_proved && vendor_picks)
        .then(|| ("service_tier", json!("default")))
}

/// A Responses API body, passed through: the upstream model id, and the proved output
/// bound in `max_output_tokens`, set whatever the client sent (Codex sends none).
fn responses(
    dest: &Destination,
    base: &Endpoints,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    let mut set = vec![
        ("model", json!(dest.upstream_model)),
        ("max_output_tokens", json!(req.max_tokens)),
    ];
    if let Some(pin) = pinned_tier(dest, base, &req.body) {
        set.push(pin);
    }
    let body = overlay(&req.body, &set, &[]);
    let mut headers = vec![];
    if let Some(k) = key {
        headers.push(("authorization", format!("Bearer {k}")));
    }
    Prepared {
        url: base.at(EndpointPath::Responses),
        headers,
        body,
    }
}

/// Whether a Responses request has the vendor store its response, so that a later turn
/// may continue from it (`previous_response_id`): unless it says `store: false`, the
/// API's default being to store.
pub fn stores(req: &ChatRequest) -> bool {
    req.ingress == crate::ingress::Ingress::Responses
        && req.body.get("store") != Some(&Value::Bool(false))
}

/// A Responses API answer (`response` object) the vendor stored for a later turn, if
/// the request had it stored and the answer does not say it was not; `items_seen`: the
/// output items a stream announced, should the answer list fewer.
/// `stores`: what [`stores`] said of the request (read before its body was parked).
pub fn stored(stores: bool, response: &Value, items_seen: u64) -> Option<super::StoredResponse> {
    if !stores || response.get("store") == Some(&Value::Bool(false)) {
        return None;
    }
    let listed = response
        .get("output")
        .and_then(Value::as_array)
        .map_or(0, |a| a.len() as u64);
    Some(super::StoredResponse {
        id: response.get("id").and_then(Value::as_str)?.to_string(),
        output_items: listed.max(items_seen),
    })
}

/// Already the OpenAI shape: handed back as it is, with its usage read.
pub fn translate(body: Value) -> (Value, Usage) {
    let usage = usage(&body);
    (body, usage)
}

/// The usage of an OpenAI chat.completion (its `usage` block).
pub fn usage(body: &Value) -> Usage {
    Usage {
        served_tier: served_tier(body),
        ..body.get("usage").map_or_else(Usage::default, usage_block)
    }
}

/// The tier an answer (or a stream chunk) says it was served at.
pub fn served_tier(body: &Value) -> Option<super::ServedTier> {
    body.get("service_tier")
        .and_then(Value::as_str)
        .map(super::ServedTier::parse)
}

/// An OpenAI `usage` object, as in a chat.completion or a stream's usage chunk.
///
/// Output is taken at its largest reading: `completion_tokens`, `total_tokens` minus
/// `prompt_tokens`, and `reasoning_tokens` (a part of the output) each imply a least
/// output, and the vendor billed at least the largest (a reading larger than the truth
/// needs a vendor that over-reports, which costs the client; one smaller lets output
/// through unpaid). Relays and compatible servers
/// have been seen to send `completion_tokens: 0` beside a total and reasoning count
/// that say otherwise. Reasoning is read where OpenAI puts it and where some
/// compatible servers do (`reasoning_tokens` at the top level).
///
/// Both APIs' names are read (chat completions' and the Responses API's, whose usage a
/// response or its `response.completed` event carries), whichever API the answer came
/// from, and each figure taken at the larger: the names do not overlap, and a body
/// whose shape is not the one the request's API implies (an error body of a Responses
/// call, a relay that answers in the other dialect) still has its usage priced. A
/// non-zero count of any class in the `_details` purser does not price apart (image
/// tokens, or a class added later) marks the cost estimated.
pub fn usage_block(u: &Value) -> Usage {
    read(u, &CHAT).largest(read(u, &RESPONSES))
}

/// Where one of OpenAI's APIs puts each usage figure. Chat completions and the
/// Responses API name them apart; relays and compatible servers put extra readings in
/// both (a cache write under Anthropic's name, reasoning at the top level). One rule
/// (`read`) reads both, so a reading seen in one dialect is read in the other too.
struct Names {
    input: &'static str,
    output: &'static str,
    cached: &'static str,
    reasoning: &'static str,
    /// Cache writes inside the input's `_details` (OpenRouter's `cache_write_tokens`,
    /// Alibaba's `cache_creation_input_tokens`).
    writes: [&'static str; 2],
    /// The `_details` objects, input's then output's (`unpriced_in`).
    details: [&'static str; 2],
}

const CHAT: Names = Names {
    input: "/prompt_tokens",
    output: "/completion_tokens",
    cached: "/prompt_tokens_details/cached_tokens",
    reasoning: "/completion_tokens_details/reasoning_tokens",
    writes: [
        "/prompt_tokens_details/cache_write_tokens",
        "/prompt_tokens_details/cache_creation_input_tokens",
    ],
    details: ["prompt_tokens_details", "completion_tokens_details"],
};

const RESPONSES: Names = Names {
    input: "/input_tokens",
    output: "/output_tokens",
    cached: "/input_tokens_details/cached_tokens",
    reasoning: "/output_tokens_details/reasoning_tokens",
    writes: [
        "/input_tokens_details/cache_write_tokens",
        "/input_tokens_details/cache_creation_input_tokens",
    ],
    details: ["input_tokens_details", "output_tokens_details"],
};

/// A usage object under `names`, each figure at its largest reading (see
/// `usage_block`). The top-level extras (`total_tokens`, `reasoning_tokens`, LiteLLM's
/// `cache_creation_input_tokens`) are the same in both dialects.
fn read(u: &Value, names: &Names) -> Usage {
    let input = count(u, names.input);
    let cached = count(u, names.cached);
    let reasoning = super::largest([count(u, names.reasoning), count(u, "/reasoning_tokens")]);
    let from_total = match (count(u, "/total_tokens"), input) {
        (Some(t), Some(p)) => Some(t.saturating_sub(p)),
        _ => None,
    };
    Usage {
        // Cache reads are part of the prompt: a prompt count below them is read at them.
        input: input.map(|p| p.max(cached.unwrap_or(0))),
        cached_input: cached,
        // Cache writes, where a relay or compatible server reports them, at the
        // largest; `None` when none is. `pricing::charge` decides what that means: a
        // structural 0 where no write can be billed (OpenAI writes its cache for
        // free), unknown where the request asked for one.
        cache_write: super::largest([
            count(u, names.writes[0]),
            count(u, names.writes[1]),
            count(u, "/cache_creation_input_tokens"),
        ]),
        // Reasoning alone is a part, not a total: with no total reported the output
        // stays unreported (charged at its bound), never read as the part.
        output: super::largest([count(u, names.output), from_total])
            .map(|o| o.max(reasoning.unwrap_or(0))),
        reasoning,
        // Audio input, billed at its own rate where the entry lists one.
        audio_input: count(u, &format!("/{}/audio_tokens", names.details[0])),
        // Perplexity's search work beside the tokens: billed apart, not priced here.
        unpriced: unpriced_in(u, names.details)
            || ["/citation_tokens", "/num_search_queries"]
                .iter()
                .any(|p| count(u, p).is_some_and(|n| n > 0)),
        ..Usage::default()
    }
}

/// Whether a usage block breaks out a non-zero count of a class purser does not price
/// apart (anything in the named `_details` but cached and reasoning tokens): a rule,
/// so a class OpenAI adds next is caught too.
fn unpriced_in(u: &Value, details: [&str; 2]) -> bool {
    // The classes `pricing::charge` prices apart: input's cache reads, cache writes
    // (where the destination bills them; elsewhere free, so plain input) and audio (at
    // the entry's audio rate, or marked estimated there); output's reasoning.
    let priced: [&[&str]; 2] = [
        &[
            "cached_tokens",
            "cache_write_tokens",
            "cache_creation_input_tokens",
            "audio_tokens",
        ],
        &["reasoning_tokens"],
    ];
    details.iter().zip(priced).any(|(d, priced)| {
        u.get(*d)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .any(|(k, v)| !priced.contains(&k.as_str()) && v.as_u64().is_some_and(|n| n > 0))
    })
}
