//! The client's body as the ceiling sees it: how much may come back (the output bound,
//! times `n`), the service tier it asks for, and which fields add billed work no bound
//! can count. Every top-level field's bearing on cost is one row of `FIELDS`. The input
//! bound is not counted here: it is computed per destination over the body as that
//! destination receives it (`upstream::bound`), so no field or part escapes it.

use serde_json::{Map, Value};

use super::GatewayError;
use crate::policy::plan::ServiceTier;
use crate::selection::TierAsk;

/// How one top-level request field bears on what the call can cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bearing {
    /// Costs nothing by itself (sampling settings, identifiers, the stream flag).
    Neutral,
    /// Sent to the model: counted in the input bound, which is over the whole body
    /// as sent (so a field not listed here that is sent is counted too).
    Input,
    /// An output cap: the bound the ceiling is proved with, one of them forwarded.
    OutputCap,
    /// Multiplies the output bound: each of `n` choices may reach the cap.
    Choices,
    /// A price tier: bounded at a destination whose model entry declares the tier's
    /// rates (`service_tiers`), unbounded elsewhere.
    Tier,
    /// Adds billed work that no bound here counts (audio output, search fees, a
    /// price tier, predicted-output tokens): refused under a hard ceiling, a named
    /// risk under a soft one.
    Unbounded(&'static str),
}

/// Every OpenAI chat-completions field purser knows, and its bearing on cost. A field
/// not listed is unknown: its cost cannot be bounded either.
pub const FIELDS: &[(&str, Bearing)] = &[
    ("model", Bearing::Neutral),
    ("messages", Bearing::Input),
    ("stream", Bearing::Neutral),
    ("stream_options", Bearing::Neutral),
    ("temperature", Bearing::Neutral),
    ("top_p", Bearing::Neutral),
    ("presence_penalty", Bearing::Neutral),
    ("frequency_penalty", Bearing::Neutral),
    ("logit_bias", Bearing::Neutral),
    ("logprobs", Bearing::Neutral),
    ("top_logprobs", Bearing::Neutral),
    ("seed", Bearing::Neutral),
    ("user", Bearing::Neutral),
    ("safety_identifier", Bearing::Neutral),
    ("prompt_cache_key", Bearing::Neutral),
    ("metadata", Bearing::Neutral),
    ("store", Bearing::Neutral),
    ("parallel_tool_calls", Bearing::Neutral),
    // Reasoning tokens are output tokens, inside the output cap.
    ("reasoning_effort", Bearing::Neutral),
    ("verbosity", Bearing::Neutral),
    ("stop", Bearing::Input),
    ("tools", Bearing::Input),
    ("tool_choice", Bearing::Input),
    ("functions", Bearing::Input),
    ("function_call", Bearing::Input),
    ("response_format", Bearing::Input),
    ("max_tokens", Bearing::OutputCap),
    ("max_completion_tokens", Bearing::OutputCap),
    ("n", Bearing::Choices),
    (
        "modalities",
        Bearing::Unbounded("audio output is billed per audio token at its own rate"),
    ),
    (
        "audio",
        Bearing::Unbounded("audio output is billed per audio token at its own rate"),
    ),
    (
        "prediction",
        Bearing::Unbounded("rejected predicted tokens are billed as output beyond the cap"),
    ),
    (
        "web_search_options",
        Bearing::Unbounded("web search adds a per-call fee"),
    ),
    ("service_tier", Bearing::Tier),
];

/// The bearing of a top-level field; `None` for a field purser does not know.
pub fn bearing(field: &str) -> Option<Bearing> {
    bearing_in(FIELDS, field)
}

/// The bearing of `field` in an ingress's table; `None` for a field it does not list.
pub fn bearing_in(table: &[(&str, Bearing)], field: &str) -> Option<Bearing> {
    table.iter().find(|(f, _)| *f == field).map(|(_, b)| *b)
}

/// The parts of the client's body the engine reads.
#[derive(Debug)]
pub struct Parsed {
    pub model: String,
    pub stream: bool,
    /// The tighter of the two output caps the client set, per choice.
    pub max_tokens: Option<u64>,
    /// Choices asked for (`n`), at least 1.
    pub choices: u64,
    /// The service tier asked for.
    pub tier: TierAsk,
    /// Fields whose cost no bound counts, with why (unknown fields included).
    pub unbounded: Vec<(String, &'static str)>,
}

pub(crate) fn bad(message: impl Into<String>, param: &str) -> GatewayError {
    GatewayError::invalid(message, Some(param))
}

/// The body as a JSON object: every ingress's first check.
pub(crate) fn body_object(body: &Value) -> Result<&Map<String, Value>, GatewayError> {
    body.as_object()
        .ok_or_else(|| GatewayError::invalid("the body must be a JSON object", None))
}

/// The requested model: a non-empty string, in every ingress.
pub(crate) fn model_name(obj: &Map<String, Value>) -> Result<String, GatewayError> {
    match obj.get("model") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(bad("`model` must be a non-empty string", "model")),
        None => Err(bad("missing required field `model`", "model")),
    }
}

/// The `stream` flag: absent or null is false.
pub(crate) fn stream_flag(obj: &Map<String, Value>) -> Result<bool, GatewayError> {
    match obj.get("stream") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad("`stream` must be a boolean", "stream")),
    }
}

pub fn parse(body: &Value) -> Result<Parsed, GatewayError> {
    let obj = body_object(body)?;
    let model = model_name(obj)?;
    let messages = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty", "messages")),
        Some(_) => return Err(bad("`messages` must be an array", "messages")),
        None => return Err(bad("missing required field `messages`", "messages")),
    };
    check_messages(messages)?;
    let mut unbounded = Vec::new();
    for (k, v) in obj {
        match bearing(k) {
            Some(Bearing::Unbounded(why)) if !v.is_null() && !neutral_value(k, v) => {
                unbounded.push((k.clone(), why))
            }
            Some(_) => {}
            None => unbounded.push((k.clone(), "purser does not know what this field costs")),
        }
    }
    // A tool that runs on the vendor's side (web search, a browser, code execution:
    // any type but a function the client runs) may bill per call beyond tokens.
    if let Some(Value::Array(tools)) = obj.get("tools") {
        for (i, t) in tools.iter().enumerate() {
            if !matches!(
                t.get("type").and_then(Value::as_str),
                Some("function" | "custom")
            ) {
                unbounded.push((
                    format!("tools[{i}]"),
                    "a built-in tool runs on the vendor's side and may bill per call",
                ));
            }
        }
    }
    let tier = tier_ask(obj, "default", &mut unbounded)?;
    let max_tokens = match (cap(obj, "max_completion_tokens")?, cap(obj, "max_tokens")?) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let choices = match obj.get("n") {
        None | Some(Value::Null) => 1,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=128).contains(n))
            .ok_or_else(|| bad("`n` must be an integer from 1 to 128", "n"))?,
    };
    let stream = stream_flag(obj)?;
    Ok(Parsed {
        model,
        stream,
        max_tokens,
        choices,
        tier,
        unbounded,
    })
}

/// A value that asks for nothing billed: text-only modalities.
fn neutral_value(field: &str, v: &Value) -> bool {
    match field {
        "modalities" => v
            .as_array()
            .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text"))),
        _ => false,
    }
}

/// An output cap: absent, null, or a positive integer.
pub(crate) fn cap(obj: &Map<String, Value>, k: &str) -> Result<Option<u64>, GatewayError> {
    match obj.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| bad(format!("`{k}` must be a positive integer"), k)),
    }
}

/// Each message has a role, and content that is a string, parts or nothing.
fn check_messages(messages: &[Value]) -> Result<(), GatewayError> {
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str).is_none() {
            return Err(bad(
                format!("messages[{i}].role must be a string"),
                &format!("messages[{i}].role"),
            ));
        }
        match m.get("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(bad(
                    format!("messages[{i}].content must be a string or an array of parts"),
                    &format!("messages[{i}].content"),
                ));
            }
        }
    }
    Ok(())
}

/// The `service_tier` a body asks for. `standard` is the API's name for the standard
/// rates (`default` for OpenAI, `standard_only` for Anthropic); a tier purser has no
/// rates for is named in `unbounded`.
pub(crate) fn tier_ask(
    obj: &Map<String, Value>,
    standard: &str,
    unbounded: &mut Vec<(String, &'static str)>,
) -> Result<TierAsk, GatewayError> {
    Ok(match obj.get("service_tier") {
        asked if vendor_picks_tier(asked) => TierAsk::VendorPicks,
        Some(Value::String(t)) if t == standard => TierAsk::Standard,
        Some(Value::String(t)) => match ServiceTier::parse(t) {
            Some(t) => TierAsk::Tier(t),
            None => {
                unbounded.push((
                    "service_tier".into(),
                    "a service tier purser has no rates for",
                ));
                TierAsk::VendorPicks
            }
        },
        Some(_) => return Err(bad("`service_tier` must be a string", "service_tier")),
        // Absent: the vendor's pick (the first arm).
        None => TierAsk::VendorPicks,
    })
}

/// Whether a body's `service_tier` leaves the tier to the vendor's (the project's)
/// pick: absent, `null` or `auto`. The bound proves such a request at the tier the
/// pick can land on, and `upstream::openai` pins it where the pick could be dearer.
pub(crate) fn vendor_picks_tier(asked: Option<&Value>) -> bool {
    match asked {
        None | Some(Value::Null) => true,
        Some(Value::String(t)) => t == "auto",
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(extra: Value) -> Value {
        let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
            o.extend(e);
        }
        b
    }

    #[test]
    fn n_is_read_and_bounded() {
        assert_eq!(parse(&body(json!({"n": 8}))).unwrap().choices, 8);
        assert_eq!(parse(&body(json!({}))).unwrap().choices, 1);
        for n in [json!(0), json!(129), json!("2"), json!(1.5)] {
            let e = parse(&body(json!({ "n": n }))).unwrap_err();
            assert_eq!(e.param(), Some("n"));
        }
    }

    #[test]
    fn the_tighter_cap_wins() {
        let p = parse(&body(
            json!({"max_tokens": 1000, "max_completion_tokens": 900}),
        ))
        .unwrap();
        assert_eq!(p.max_tokens, Some(900));
        let p = parse(&body(
            json!({"max_tokens": 100, "max_completion_tokens": 900}),
        ))
        .unwrap();
        assert_eq!(p.max_tokens, Some(100));
    }

    #[test]
    fn unbounded_and_unknown_fields_are_named() {
        let p = parse(&body(json!({
            "prediction": {"type": "content", "content": "x"},
            "modalities": ["text", "audio"],
            "web_search_options": {},
            "service_tier": "scale",
            "brand_new": 1,
        })))
        .unwrap();
        let mut names: Vec<_> = p.unbounded.iter().map(|(f, _)| f.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "brand_new",
                "modalities",
                "prediction",
                "service_tier",
                "web_search_options"
            ]
        );
        let p = parse(&body(
            json!({"modalities": ["text"], "service_tier": "auto", "user": "u"}),
        ))
        .unwrap();
        assert!(p.unbounded.is_empty(), "{:?}", p.unbounded);
        assert_eq!(p.tier, TierAsk::VendorPicks);
    }

    #[test]
    fn a_priced_tier_is_read_not_refused_here() {
        let p = parse(&body(json!({"service_tier": "priority"}))).unwrap();
        assert_eq!(p.tier, TierAsk::Tier(ServiceTier::Priority));
        assert!(p.unbounded.is_empty());
    }
}
