//! The classifier: reads a failure class off an upstream answer. Pure functions: no
//! I/O, no clock, never a panic.
//!
//! Status first; the body decides only what the status leaves open — except an
//! explicit content-policy marker, which wins over any status so that a 403 or a
//! relay's 429 cannot launder a refusal into a failover.

use std::borrow::Cow;

use serde_json::Value;

use super::FailureClass;
use crate::policy::plan::Api;

/// What the classifier concluded, and why (recorded in the ledger and shown in errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure {
        class: FailureClass,
        reason: Cow<'static, str>,
    },
}

impl Outcome {
    fn fail(class: FailureClass, reason: impl Into<Cow<'static, str>>) -> Outcome {
        Outcome::Failure {
            class,
            reason: reason.into(),
        }
    }

    pub fn class(&self) -> Option<FailureClass> {
        match self {
            Outcome::Success => None,
            Outcome::Failure { class, .. } => Some(*class),
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            Outcome::Success => "a complete answer",
            Outcome::Failure { reason, .. } => reason,
        }
    }
}

/// A failure below HTTP: what the transport observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// DNS, refused, TLS, or a reset before the request was fully sent.
    Connect,
    /// No connection within the connect timeout: nothing was sent.
    ConnectTimeout,
    /// The request was sent and no (complete) answer came within the attempt's timeout.
    ResponseTimeout,
    /// The connection closed after the request was sent, before a complete answer.
    Dropped,
}

pub fn classify_transport(t: TransportFailure) -> (FailureClass, &'static str) {
    match t {
        TransportFailure::Connect => (FailureClass::Connect, "could not connect; nothing was sent"),
        TransportFailure::ConnectTimeout => (
            FailureClass::Connect,
            "connect timed out before the request was sent",
        ),
        TransportFailure::ResponseTimeout => (
            FailureClass::Timeout,
            "no complete answer within the attempt's timeout after the request was sent",
        ),
        TransportFailure::Dropped => (
            FailureClass::Dropped,
            "the connection closed after the request was sent, before a complete answer",
        ),
    }
}

// ---------------------------------------------------------------- body reading

/// The error fields of a JSON error body, in whichever envelope the vendor used.
#[derive(Default, Debug)]
struct ErrorFields {
    /// `error.type`, `error.code`, `error.status`, `code`, `type`, lower-cased.
    tags: Vec<String>,
    /// Every message text found, lower-cased.
    text: String,
}

fn push_tag(out: &mut Vec<String>, v: Option<&Value>) {
    match v {
        Some(Value::String(s)) => out.push(s.to_ascii_lowercase()),
        Some(Value::Number(n)) => out.push(n.to_string()),
        _ => {}
    }
}

fn error_fields(v: &Value) -> ErrorFields {
    let mut f = ErrorFields::default();
    // Gemini's OpenAI-compatible endpoint wraps the error in an array.
    let v = if let Value::Array(items) = v {
        items.first().unwrap_or(v)
    } else {
        v
    };
    let err = v.get("error");
    for obj in [Some(v), err].into_iter().flatten() {
        for k in ["type", "code", "status"] {
            push_tag(&mut f.tags, obj.get(k));
        }
        if let Some(inner) = obj.get("innererror") {
            push_tag(&mut f.tags, inner.get("code"));
        }
        for k in ["message", "error"] {
            if let Some(Value::String(s)) = obj.get(k) {
                f.text.push_str(&s.to_lowercase());
                f.text.push(' ');
            }
        }
    }
    if let Some(Value::Array(errs)) = err.and_then(|e| e.get("errors")) {
        for e in errs {
            if let Some(Value::String(s)) = e.get("message") {
                f.text.push_str(&s.to_lowercase());
                f.text.push(' ');
            }
        }
    }
    f
}

impl ErrorFields {
    fn tag(&self, t: &str) -> bool {
        self.tags.iter().any(|x| x == t)
    }
    fn says(&self, phrases: &[&str]) -> bool {
        phrases.iter().any(|p| self.text.contains(p))
    }
    fn is_content_policy(&self) -> bool {
        self.tag("content_policy_violation")
            || self.tag("content_filter")
            || self.tag("responsibleaipolicyviolation")
            || self.says(&[
                "content filtering policy",
                "content management policy",
                "violates usage guidelines",
                "content_policy_violation",
            ])
    }
    fn is_quota(&self) -> bool {
        self.tag("insufficient_quota")
            || self.tag("rate_limit_exceeded")
            || self.tag("rate_limit_error")
            || self.tag("resource_exhausted")
            || self.says(&[
                "credit balance is too low",
                "exceeded your current quota",
                "insufficient balance",
                "requires more credits",
                "billing",
                "rate limit",
                "tokens per min",
            ])
    }
    fn is_overloaded(&self) -> bool {
        self.tag("overloaded_error")
            || self.says(&["overloaded", "high demand", "capacity", "system resource"])
    }
    fn is_context(&self) -> bool {
        self.tag("context_length_exceeded")
            || self.says(&[
                "context length",
                "context window",
                "context limit",
                "prompt is too long",
                "input is too long",
                "input token count",
                "too many tokens",
                "reduce the length of the messages",
            ])
    }
    fn is_auth(&self) -> bool {
        self.tag("authentication_error")
            || self.tag("permission_error")
            || self.tag("invalid_api_key")
            || self.tag("permission_denied")
            || self.tag("unauthenticated")
            || self.says(&[
                "api key not valid",
                "invalid api key",
                "incorrect api key",
                "user location is not supported",
                "unsupported_country",
            ])
    }
    fn is_model_missing(&self) -> bool {
        self.tag("model_not_found")
            || self.tag("model_decommissioned")
            || (self.text.contains("model")
                && self.says(&[
                    "does not exist",
                    "not found",
                    "decommissioned",
                    "no longer supported",
                ]))
            || self.text.trim_start().starts_with("model:")
    }
}

const BLOCK_FINISH: [&str; 7] = [
    "SAFETY",
    "PROHIBITED_CONTENT",
    "BLOCKLIST",
    "SPII",
    "RECITATION",
    "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT",
];

fn is_sse(headers: &[(String, String)], body: &str) -> bool {
    headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v.contains("text/event-stream"))
        || body.trim_start().starts_with("data:")
        || body.trim_start().starts_with("event:")
}

/// The `data:` payloads of an SSE body, with the `event:` name when there is one.
pub fn sse_events(body: &str) -> Vec<(Option<&str>, &str)> {
    let mut out = Vec::new();
    let mut event = None;
    for line in body.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            event = None;
        } else if let Some(e) = line.strip_prefix("event:") {
            event = Some(e.trim());
        } else if let Some(d) = line.strip_prefix("data:") {
            out.push((event, d.trim()));
        }
    }
    out
}

/// What one stream event says, read the same way for every API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventSignal {
    /// Carries model output.
    Content,
    /// A failure: the stream is classified as this.
    Failure(FailureClass, Cow<'static, str>),
    /// Anything else (metadata, usage, stop markers).
    Neutral,
}

/// Classify one parsed stream event of `api`.
pub fn classify_event(api: Api, name: Option<&str>, v: &Value) -> EventSignal {
    let ty = v.get("type").and_then(Value::as_str);
    if name == Some("error")
        || ty == Some("error")
        || (v.get("error").is_some_and(|e| !e.is_null()) && v.get("choices").is_none())
    {
        return match classify_error_body(v) {
            Outcome::Failure { class, reason } => EventSignal::Failure(class, reason),
            Outcome::Success => {
                EventSignal::Failure(FailureClass::Unclassified, "error event".into())
            }
        };
    }
    match api {
        Api::Anthropic => {
            let stop = v
                .pointer("/delta/stop_reason")
                .or_else(|| v.pointer("/message/stop_reason"));
            if stop.and_then(Value::as_str) == Some("refusal") {
                return EventSignal::Failure(
                    FailureClass::ContentRefusal,
                    "anthropic stop_reason: refusal".into(),
                );
            }
            match v.pointer("/delta/text").and_then(Value::as_str) {
                Some(t) if !t.is_empty() => EventSignal::Content,
                _ if v.pointer("/delta/partial_json").is_some() => EventSignal::Content,
                _ => EventSignal::Neutral,
            }
        }
        Api::Gemini => match gemini_block(v) {
            Some(reason) => EventSignal::Failure(FailureClass::ContentRefusal, reason.into()),
            None if gemini_has_content(v) => EventSignal::Content,
            None => EventSignal::Neutral,
        },
        Api::Openai => {
            let choices = v.get("choices").and_then(Value::as_array);
            let mut content = false;
            for c in choices.into_iter().flatten() {
                let delta = c.get("delta").or_else(|| c.get("message"));
                if delta.is_some_and(has_openai_content) {
                    content = true;
                }
                match c.get("finish_reason").and_then(Value::as_str) {
                    Some("content_filter") if !content => {
                        return EventSignal::Failure(
                            FailureClass::ContentRefusal,
                            "finish_reason: content_filter with no content".into(),
                        );
                    }
                    Some("insufficient_system_resource") if !content => {
                        return EventSignal::Failure(
                            FailureClass::Overloaded,
                            "finish_reason: insufficient_system_resource".into(),
                        );
                    }
                    _ => {}
                }
            }
            if content {
                EventSignal::Content
            } else {
                EventSignal::Neutral
            }
        }
    }
}

fn has_openai_content(m: &Value) -> bool {
    let text = m
        .get("content")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    let tools = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let refusal = m
        .get("refusal")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    text || tools || refusal
}

fn gemini_block(v: &Value) -> Option<String> {
    if let Some(r) = v
        .pointer("/promptFeedback/blockReason")
        .and_then(Value::as_str)
    {
        return Some(format!("gemini promptFeedback.blockReason: {r}"));
    }
    for c in v
        .get("candidates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = c.get("finishReason").and_then(Value::as_str)
            && BLOCK_FINISH.contains(&r)
        {
            return Some(format!("gemini finishReason: {r}"));
        }
    }
    None
}

fn gemini_has_content(v: &Value) -> bool {
    v.get("candidates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| {
            c.pointer("/content/parts")
                .and_then(Value::as_array)
                .is_some_and(|p| !p.is_empty())
        })
}

/// Classify a JSON error payload whose status says nothing (a stream's error event, an
/// error object inside a 2xx).
fn classify_error_body(v: &Value) -> Outcome {
    let f = error_fields(v);
    if f.is_content_policy() {
        Outcome::fail(
            FailureClass::ContentRefusal,
            "explicit content-policy marker",
        )
    } else if f.is_context() {
        Outcome::fail(
            FailureClass::ContextLength,
            "error says the input is too long",
        )
    } else if f.is_overloaded() {
        Outcome::fail(
            FailureClass::Overloaded,
            "error says the provider is overloaded",
        )
    } else if f.is_quota() {
        Outcome::fail(
            FailureClass::RateLimited,
            "error says a rate limit or quota is exhausted",
        )
    } else if f.tag("server_error")
        || f.tag("api_error")
        || f.tag("internal")
        || f.tag("unavailable")
    {
        Outcome::fail(
            FailureClass::ServerError,
            "error event of type server_error",
        )
    } else if f.is_auth() {
        Outcome::fail(
            FailureClass::Auth,
            "error says the credential is not accepted",
        )
    } else if f.is_model_missing() {
        Outcome::fail(
            FailureClass::ModelNotFound,
            "error says the model does not exist",
        )
    } else if f.tag("invalid_request_error") || f.tag("invalid_argument") {
        Outcome::fail(FailureClass::Malformed, "error says the request is invalid")
    } else {
        Outcome::fail(
            FailureClass::Unclassified,
            "an error event purser does not recognise",
        )
    }
}

/// Classify a complete upstream answer. `headers` are (name, value) pairs.
pub fn classify(api: Api, status: u16, headers: &[(String, String)], body: &str) -> Outcome {
    classify_answer(api, status, headers, body).0
}

/// `classify`, also handing back the body parsed as JSON (when it is JSON, not a
/// stream) so a successful answer is not parsed twice.
pub fn classify_answer(
    api: Api,
    status: u16,
    headers: &[(String, String)],
    body: &str,
) -> (Outcome, Option<Value>) {
    let json: Option<Value> = if is_sse(headers, body) {
        None
    } else {
        serde_json::from_str(body).ok()
    };
    let outcome = classify_parsed(api, status, headers, body, json.as_ref());
    (outcome, json)
}

fn classify_parsed(
    api: Api,
    status: u16,
    headers: &[(String, String)],
    body: &str,
    json: Option<&Value>,
) -> Outcome {
    let sse = is_sse(headers, body);
    let fields = json.map(error_fields).unwrap_or_default();
    // An explicit content-policy marker wins over any status (DESIGN 4).
    if fields.is_content_policy() {
        return Outcome::fail(
            FailureClass::ContentRefusal,
            format!("HTTP {status} with an explicit content-policy marker"),
        );
    }
    if let Some(v) = json
        && let Some(r) = gemini_block(v)
        && !(200..300).contains(&status)
    {
        return Outcome::fail(FailureClass::ContentRefusal, r);
    }
    let lower_text = || body.to_lowercase();
    match status {
        200..=299 if sse => classify_sse(api, body),
        200..=299 => match json {
            Some(v) => classify_success_json(api, v),
            None => Outcome::fail(
                FailureClass::Unclassified,
                format!("HTTP {status} with a body that is not JSON"),
            ),
        },
        400 => {
            if fields.is_quota() {
                Outcome::fail(
                    FailureClass::RateLimited,
                    "HTTP 400 saying the account's quota or credit is exhausted",
                )
            } else if fields.is_context() {
                Outcome::fail(
                    FailureClass::ContextLength,
                    "HTTP 400 saying the input is too long",
                )
            } else if fields.is_auth() {
                Outcome::fail(
                    FailureClass::Auth,
                    "HTTP 400 saying the credential or account may not use this API",
                )
            } else if fields.is_model_missing() {
                Outcome::fail(
                    FailureClass::ModelNotFound,
                    "HTTP 400 saying the model does not exist",
                )
            } else {
                Outcome::fail(
                    FailureClass::Malformed,
                    "HTTP 400: the upstream rejected the request",
                )
            }
        }
        401 | 403 => Outcome::fail(
            FailureClass::Auth,
            format!("HTTP {status}: the credential was refused"),
        ),
        402 => Outcome::fail(
            FailureClass::RateLimited,
            "HTTP 402: the account's credit is exhausted",
        ),
        404 => {
            if fields.is_model_missing()
                || fields.tag("not_found_error") && fields.text.contains("model")
            {
                Outcome::fail(FailureClass::ModelNotFound, "HTTP 404 naming the model")
            } else {
                Outcome::fail(
                    FailureClass::Malformed,
                    "HTTP 404 on a path: the URL is wrong",
                )
            }
        }
        408 => Outcome::fail(FailureClass::Timeout, "HTTP 408: the upstream timed out"),
        413 => {
            if fields.is_quota() {
                Outcome::fail(
                    FailureClass::RateLimited,
                    "HTTP 413 saying a per-minute token limit was hit",
                )
            } else if fields.is_context()
                || fields.says(&["too large", "exceeds the maximum"])
                || fields.tag("request_too_large")
            {
                Outcome::fail(
                    FailureClass::ContextLength,
                    "HTTP 413 saying the input is too large",
                )
            } else {
                Outcome::fail(FailureClass::Malformed, "HTTP 413: payload too large")
            }
        }
        422 => Outcome::fail(
            FailureClass::Malformed,
            "HTTP 422: the upstream rejected the request",
        ),
        429 => {
            if fields.is_overloaded() && !fields.says(&["rate limit"]) {
                Outcome::fail(
                    FailureClass::Overloaded,
                    "HTTP 429 saying the provider is overloaded",
                )
            } else {
                Outcome::fail(FailureClass::RateLimited, "HTTP 429: rate limited")
            }
        }
        503 | 529 => Outcome::fail(
            FailureClass::Overloaded,
            format!("HTTP {status}: overloaded"),
        ),
        504 | 524 => Outcome::fail(
            FailureClass::Timeout,
            format!("HTTP {status}: gateway timeout"),
        ),
        500..=599 => {
            if fields.is_overloaded() || (json.is_none() && lower_text().contains("overloaded")) {
                Outcome::fail(
                    FailureClass::Overloaded,
                    format!("HTTP {status} saying overloaded"),
                )
            } else {
                Outcome::fail(
                    FailureClass::ServerError,
                    format!("HTTP {status}: server error"),
                )
            }
        }
        _ => Outcome::fail(
            FailureClass::Unclassified,
            format!("HTTP {status} is not an answer purser knows how to read"),
        ),
    }
}

fn classify_sse(api: Api, body: &str) -> Outcome {
    let mut seen = false;
    for (name, data) in sse_events(body) {
        if data == "[DONE]" {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Outcome::fail(
                FailureClass::Unclassified,
                "a stream event that is not JSON",
            );
        };
        seen = true;
        match classify_event(api, name, &v) {
            EventSignal::Failure(class, reason) => return Outcome::Failure { class, reason },
            EventSignal::Content | EventSignal::Neutral => {}
        }
    }
    if seen {
        Outcome::Success
    } else {
        Outcome::fail(FailureClass::Unclassified, "an empty stream")
    }
}

fn classify_success_json(api: Api, v: &Value) -> Outcome {
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return classify_error_body(v);
    }
    match api {
        Api::Openai => {
            let Some(choices) = v.get("choices").and_then(Value::as_array) else {
                return Outcome::fail(FailureClass::Unclassified, "a 2xx without `choices`");
            };
            match classify_event(api, None, v) {
                EventSignal::Failure(class, reason) => Outcome::Failure { class, reason },
                EventSignal::Content | EventSignal::Neutral if !choices.is_empty() => {
                    Outcome::Success
                }
                EventSignal::Content | EventSignal::Neutral => {
                    Outcome::fail(FailureClass::Unclassified, "a 2xx with no choices")
                }
            }
        }
        Api::Anthropic => {
            if v.get("stop_reason").and_then(Value::as_str) == Some("refusal") {
                return Outcome::fail(
                    FailureClass::ContentRefusal,
                    "anthropic stop_reason: refusal",
                );
            }
            if v.get("content").is_some_and(Value::is_array) {
                Outcome::Success
            } else {
                Outcome::fail(FailureClass::Unclassified, "a 2xx without `content`")
            }
        }
        Api::Gemini => {
            if let Some(r) = gemini_block(v) {
                return Outcome::fail(FailureClass::ContentRefusal, r);
            }
            if v.get("candidates")
                .and_then(Value::as_array)
                .is_some_and(|c| !c.is_empty())
            {
                Outcome::Success
            } else {
                Outcome::fail(FailureClass::Unclassified, "a 2xx without candidates")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_marker_beats_status() {
        let body = r#"{"error":{"code":"content_policy_violation","message":"no"}}"#;
        for status in [400, 403, 429, 500] {
            assert_eq!(
                classify(Api::Openai, status, &[], body).class(),
                Some(FailureClass::ContentRefusal)
            );
        }
        // A vague 5xx text is not a marker.
        let vague = r#"{"error":{"message":"The model produced invalid content."}}"#;
        assert_eq!(
            classify(Api::Openai, 500, &[], vague).class(),
            Some(FailureClass::ServerError)
        );
    }

    #[test]
    fn garbage_is_unclassified_not_success() {
        assert_eq!(
            classify(Api::Openai, 200, &[], "<html>").class(),
            Some(FailureClass::Unclassified)
        );
        assert_eq!(
            classify(Api::Gemini, 200, &[], "{}").class(),
            Some(FailureClass::Unclassified)
        );
        assert_eq!(
            classify(Api::Anthropic, 302, &[], "").class(),
            Some(FailureClass::Unclassified)
        );
    }
}
