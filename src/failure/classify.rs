//! The classifier: reads a failure class off an upstream answer. Pure functions: no
//! I/O, no clock, never a panic.
//!
//! # The precedence rule (DESIGN 4)
//!
//! A 2xx is read as an answer (a block reason with no content is a refusal, an error
//! object inside it is read as below with no status). Any other answer is read for
//! *signals*: each vendor dialect in `dialects` is a table of (field, value) → class,
//! matched against the vendor's structured fields (`error.code`, `error.type`,
//! `error.status`, `details[].reason`, `metadata.reasons`, Azure `innererror`,
//! Bedrock exception names) and its prose. An error relayed inside another error's
//! message (one-api, OpenRouter, LiteLLM…) is opened, up to `MAX_DEPTH` envelopes,
//! and only the innermost envelope that carries any signal is believed. Then, first
//! match wins:
//!
//! 1. an explicit content-policy signal, at any depth, whatever the status — so a 403
//!    or a relay's 429 cannot launder a refusal into a failover;
//! 2. an explicit auth or account signal;
//! 3. a quota, credit or rate-limit signal;
//! 4. a context-length signal;
//! 5. a model-not-found signal;
//!
//!    (within 2–5, a structured field outranks prose, then the order above);
//! 6. the status family: 401/403 auth, 402 rate_limited, 408/504/524 timeout; 429,
//!    503/529 and other 5xx are provider faults that a family signal ("overloaded",
//!    a timeout code) may refine within the family; 400, 404, 413, 422 and unknown
//!    4xx leave the class open;
//! 7. for an open status, the family signal (structured before prose) — e.g. a 498
//!    saying "capacity" is overloaded — else the family default: `malformed` for 4xx
//!    (a 413 saying "too large" is `context_length`);
//! 8. `unclassified` (1xx, 3xx, an unrecognised error inside a 2xx).
//!
//! Every verdict names the signal that decided it (`explain`), so `purser classify
//! --explain` and the ledger can say why.

use std::borrow::Cow;

use serde_json::Value;

use super::FailureClass;
use super::dialects::{is_explicit, rank};
use super::evidence::{self, Hit};
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

/// The piece of evidence that decided a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    /// Where it was read: a field (`error.code`, `details[].reason`, `message`, …),
    /// `status`, or an answer field (`finish_reason`, `promptFeedback.blockReason`).
    pub source: Cow<'static, str>,
    /// What it held: the vendor's value, the phrase that matched, or the status.
    pub value: Cow<'static, str>,
    /// How many relay envelopes were opened to reach it (0: the answer itself).
    pub depth: u8,
    /// Where the vocabulary row that matched comes from (empty for the status or an
    /// answer field).
    pub basis: &'static str,
}

impl Signal {
    // Both sides are static on the success path, so a plain answer allocates nothing.
    fn new(source: impl Into<Cow<'static, str>>, value: impl Into<Cow<'static, str>>) -> Signal {
        Signal {
            source: source.into(),
            value: value.into(),
            depth: 0,
            basis: "",
        }
    }

    fn status(status: u16) -> Signal {
        Signal::new("status", status.to_string())
    }

    fn of(hit: &Hit) -> Signal {
        Signal {
            source: format!("{} ({})", hit.field.name(), hit.dialect).into(),
            value: hit.value.clone().into(),
            depth: hit.depth,
            basis: hit.basis,
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.depth > 0 {
            write!(f, "relayed (depth {}) ", self.depth)?;
        }
        write!(f, "{}={}", self.source, self.value)
    }
}

/// A verdict with the signal that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    pub outcome: Outcome,
    pub signal: Signal,
}

impl Explained {
    fn new(outcome: Outcome, signal: Signal) -> Explained {
        Explained { outcome, signal }
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

// ---------------------------------------------------------------- error answers

/// What a status alone says (step 6 of the rule).
#[derive(Debug, Clone, Copy)]
enum Meaning {
    /// The status names the class; only an explicit signal overrides it.
    Fixed(FailureClass),
    /// A provider fault; a family signal may refine it (a 429 saying overloaded).
    Provider(FailureClass),
    /// The status leaves the class open; family signals decide, else the default.
    Open(FailureClass),
    /// 413: too large is an over-long input, otherwise a malformed request.
    TooLarge,
    /// 404: the model when the body names one (DESIGN 4: "404" is model_not_found),
    /// otherwise a path that does not exist (malformed).
    NotFound,
    /// 3xx: no answer at all, whatever a body's family tag restates.
    Redirect,
}

fn meaning(status: Option<u16>) -> Meaning {
    use FailureClass as C;
    match status {
        None => Meaning::Open(C::Unclassified),
        Some(401 | 403) => Meaning::Fixed(C::Auth),
        Some(402) => Meaning::Fixed(C::RateLimited),
        Some(408 | 504 | 524) => Meaning::Fixed(C::Timeout),
        Some(413) => Meaning::TooLarge,
        Some(404) => Meaning::NotFound,
        Some(300..=399) => Meaning::Redirect,
        Some(429) => Meaning::Provider(C::RateLimited),
        Some(503 | 529) => Meaning::Provider(C::Overloaded),
        Some(500..=599) => Meaning::Provider(C::ServerError),
        Some(400..=499) => Meaning::Open(C::Malformed),
        Some(_) => Meaning::Open(C::Unclassified),
    }
}

/// The best hit among those `keep` accepts: innermost first, structured before prose,
/// then the precedence order of classes.
fn best(hits: &[Hit], keep: impl Fn(&Hit) -> bool) -> Option<&Hit> {
    hits.iter().filter(|h| keep(h)).min_by_key(|h| {
        (
            u8::MAX - h.depth,
            !h.field.is_structured(),
            h.by_words,
            rank(h.class),
        )
    })
}

/// Whether a hit names a cause: a structured field's cause row, or explicit prose
/// (a credential, an account, quota, context, a missing model).
fn names_cause(h: &Hit) -> bool {
    h.structured_cause() || (!h.field.is_structured() && is_explicit(h.class))
}

/// The class of an error answer (or of an error inside a 2xx when `status` is None).
fn decide(status: Option<u16>, hits: &[Hit], raw: &str) -> (FailureClass, Signal) {
    let at = |s: Option<u16>| match s {
        Some(s) => format!("HTTP {s}"),
        None => "an error inside a 2xx".to_string(),
    };
    let refusal = |h: &Hit| h.class == FailureClass::ContentRefusal;
    // 1. A structured content-policy signal at any depth: nothing may launder it.
    if let Some(h) = best(hits, |h| refusal(h) && h.field.is_structured()) {
        return (h.class, Signal::of(h));
    }
    // 1b. Moderation words in prose, at any depth, are a refusal too: a refusal must
    // never become a failover, and no status, family tag or other code says otherwise
    // (xAI sends its refusals as `permission-denied`).
    if let Some(h) = best(hits, |h| refusal(h) && !h.field.is_structured()) {
        return (h.class, Signal::of(h));
    }
    // 2–5. The innermost signal that names a cause: a vendor's code before its prose,
    // prose before the status.
    if let Some(h) = best(hits, |h| !refusal(h) && names_cause(h)) {
        return (h.class, Signal::of(h));
    }
    // Family signals: only the innermost envelope that says anything is believed.
    let depth = hits.iter().map(|h| h.depth).max().unwrap_or(0);
    let family = |h: &Hit| h.depth == depth && !refusal(h) && !names_cause(h);
    // Within the provider family, "overloaded" (or a timeout code) names the fault
    // more closely than a generic server_error / api_error tag, so it refines it: a
    // body saying overloaded is overloaded (DESIGN 4). A prose "timed out" is too
    // vague to turn a not-billed fault into a maybe-billed one.
    let refines = |h: &Hit| {
        family(h)
            && (h.class == FailureClass::Overloaded
                || (h.class == FailureClass::Timeout && h.field.is_structured()))
    };
    // When the status decides although the body carries a code, the code was read and
    // overruled (a relay's `api_error` around a 404 on a path): say so.
    let overruled = best(hits, |h| h.field.is_structured() && !refusal(h));
    let status_signal = || match (status, overruled) {
        (Some(s), Some(h)) => Signal {
            source: format!("status (over {} ({}))", h.field.name(), h.dialect).into(),
            value: format!("{s} over {}", h.value).into(),
            depth: 0,
            basis: "DESIGN 4: the status family decides what a family tag only restates",
        },
        (Some(s), None) => Signal::status(s),
        (None, _) => Signal::new("status", at(status)),
    };
    // 400, 404, 413 and 422 say the vendor judged the request (DESIGN 4 names them
    // malformed): a relay's "internal error" tag around a vendor's validation error does
    // not make it the provider's fault. Unknown 4xx (Bedrock's 424) stay open to it.
    let opens = |h: &Hit| {
        family(h)
            && !(h.class == FailureClass::ServerError
                && matches!(status, Some(400 | 404 | 413 | 422)))
    };
    // 6–8. The status family, refined or opened by family signals. A family tag that
    // agrees with the status is named as the signal: it was read, and it says so.
    let agrees = |c: FailureClass| {
        move |h: &Hit| !refusal(h) && !names_cause(h) && h.field.is_structured() && h.class == c
    };
    match meaning(status) {
        Meaning::Fixed(c) => match best(hits, agrees(c)) {
            Some(h) => (c, Signal::of(h)),
            None => (c, status_signal()),
        },
        // A relay's provider fault around a vendor's own provider-family tag (a 500
        // quoting Anthropic's `rate_limit_error`) is the vendor's fault as the vendor
        // named it: the innermost words decide, as for every relayed signal.
        Meaning::Provider(c) => match best(hits, refines)
            .or_else(|| {
                best(hits, |h| {
                    family(h) && h.depth > 0 && provider_class(h.class)
                })
            })
            .or_else(|| best(hits, agrees(c)))
        {
            Some(h) => (h.class, Signal::of(h)),
            None => (c, status_signal()),
        },
        Meaning::Open(c) => match best(hits, refines).or_else(|| best(hits, opens)) {
            Some(h) => (h.class, Signal::of(h)),
            None => (c, status_signal()),
        },
        Meaning::NotFound => {
            let names_model = names_a_model(raw);
            match best(hits, refines) {
                Some(h) => (h.class, Signal::of(h)),
                None if names_model => (
                    FailureClass::ModelNotFound,
                    Signal {
                        source: "message under a 404".into(),
                        value: "404 naming a model".into(),
                        depth: 0,
                        basis: "DESIGN 4: a 404 is model_not_found; one on a path is malformed",
                    },
                ),
                None => match best(hits, opens) {
                    Some(h) => (h.class, Signal::of(h)),
                    None => (FailureClass::Malformed, status_signal()),
                },
            }
        }
        Meaning::Redirect => (FailureClass::Unclassified, status_signal()),
        Meaning::TooLarge => {
            let lower = raw.to_lowercase();
            match ["too large", "exceeds the maximum"]
                .into_iter()
                .find(|p| lower.contains(p))
            {
                Some(p) => (FailureClass::ContextLength, Signal::new("message", p)),
                None => (FailureClass::Malformed, status_signal()),
            }
        }
    }
}

/// Whether a 404's text names a model: the word `model` (or `models`, `model's`,
/// `model:`, `models/gemini-pro`) in its words, not inside a URL path or markup. "Unknown request URL: POST
/// /v1/models/chat" and an HTML page linking to `/models` are a path that does not
/// exist (malformed), not a model the account lacks.
fn names_a_model(raw: &str) -> bool {
    raw.split(|c: char| c.is_whitespace() || c == '"' || c == ',')
        .filter(|t| !(t.starts_with('/') || t.contains("://") || t.contains(['<', '>', '='])))
        .any(|t| {
            t.trim_start_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
                .starts_with("model")
        })
}

/// The classes of a provider's fault that a status of the provider family may carry.
fn provider_class(c: FailureClass) -> bool {
    match c {
        FailureClass::RateLimited
        | FailureClass::Overloaded
        | FailureClass::ServerError
        | FailureClass::Timeout => true,
        FailureClass::Connect
        | FailureClass::Dropped
        | FailureClass::CircuitOpen
        | FailureClass::Auth
        | FailureClass::ModelNotFound
        | FailureClass::ContextLength
        | FailureClass::ContentRefusal
        | FailureClass::Malformed
        | FailureClass::Unclassified => false,
    }
}

/// Words for the ledger: what decided, in a sentence.
fn reason_for(status: Option<u16>, class: FailureClass, signal: &Signal) -> String {
    let at = match status {
        Some(s) => format!("HTTP {s}"),
        None => "an error event".to_string(),
    };
    if signal.source == "status" {
        return format!("{at}: {}", class.as_str());
    }
    format!("{at} classed {} by {signal}", class.as_str())
}

fn classify_error(
    status: Option<u16>,
    headers: &[(String, String)],
    json: Option<&Value>,
    raw: &str,
) -> Explained {
    let mut hits = evidence::read(headers, json, raw);
    // A Gemini block reason on a non-2xx (its candidates or its prompt feedback) is an
    // explicit content-policy signal like any other.
    if let Some((source, value)) = json.and_then(gemini_block) {
        hits.push(Hit {
            class: FailureClass::ContentRefusal,
            dialect: "google",
            basis: "https://ai.google.dev/api/generate-content#BlockReason",
            field: super::dialects::Field::Block,
            value: format!("{source}={value}"),
            depth: 0,
            says: super::dialects::Says::Cause,
            by_words: false,
        });
    }
    let (class, signal) = decide(status, &hits, raw);
    Explained::new(
        Outcome::fail(class, reason_for(status, class, &signal)),
        signal,
    )
}

/// The status an error inside a 2xx says it would have had: `error.code`
/// (OpenRouter mid-stream), or a top-level `status` / `statusCode` / `status_code` /
/// `code` (GigaChat answers `{"status": 429, "message": "Too many requests"}` under a
/// 200). Only a number of the error families counts.
fn own_status(v: &Value) -> Option<u16> {
    [
        "/error/code",
        "/status",
        "/statusCode",
        "/status_code",
        "/code",
    ]
    .iter()
    .filter_map(|p| v.pointer(p))
    .find_map(|c| match c {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    })
    .and_then(|c| u16::try_from(c).ok())
    .filter(|c| (400..600).contains(c))
}

/// An error object that is not a whole answer: a stream's error event, or an error
/// inside a 2xx. No status speaks for it.
fn classify_error_value(v: &Value) -> Explained {
    let hits = evidence::read_value(v);
    // An error sent inside a 2xx (OpenRouter mid-stream, proxies) often carries the
    // status it would have had as `error.code`: read it as that status.
    let status = own_status(v);
    let (class, signal) = decide(status, &hits, "");
    let signal = match (status, signal.source.as_ref()) {
        (Some(_), "status") => Signal::new("error.code", signal.value),
        (Some(_) | None, _) => signal,
    };
    Explained::new(
        Outcome::fail(class, reason_for(None, class, &signal)),
        signal,
    )
}

// ---------------------------------------------------------------- answers and streams

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
    event(api, name, v).0
}

/// An event that carries an error: a failure, as the same error would be as an answer
/// (DESIGN 4), and never a success, whatever the error says.
fn error_event(v: &Value, what: &'static str) -> (EventSignal, Option<Signal>) {
    let e = classify_error_value(v);
    let signal = match e.outcome {
        Outcome::Failure { class, reason } => EventSignal::Failure(class, reason),
        Outcome::Success => EventSignal::Failure(FailureClass::Unclassified, what.into()),
    };
    (signal, Some(e.signal))
}

/// `classify_event`, with the signal that decided a failure.
fn event(api: Api, name: Option<&str>, v: &Value) -> (EventSignal, Option<Signal>) {
    let ty = v.get("type").and_then(Value::as_str);
    // The Responses API ends a failed stream with `response.failed`, its error inside
    // the response object: read like the same error sent as an answer.
    if (name == Some("response.failed") || ty == Some("response.failed"))
        && let Some(r) = v
            .get("response")
            .filter(|r| r.get("error").is_some_and(|e| !e.is_null()))
    {
        return error_event(r, "response.failed");
    }
    if name == Some("error")
        || ty == Some("error")
        || (v.get("error").is_some_and(|e| !e.is_null()) && v.get("choices").is_none())
        || is_aws_exception_event(v)
    {
        return error_event(v, "error event");
    }
    let refusal = |source: &'static str, value: &str, reason: String| {
        (
            EventSignal::Failure(FailureClass::ContentRefusal, reason.into()),
            Some(Signal::new(source, value.to_string())),
        )
    };
    match api {
        Api::Anthropic => {
            let stop = v
                .pointer("/delta/stop_reason")
                .or_else(|| v.pointer("/message/stop_reason"));
            if stop.and_then(Value::as_str) == Some("refusal") {
                return refusal(
                    "stop_reason",
                    "refusal",
                    "anthropic stop_reason: refusal".into(),
                );
            }
            match v.pointer("/delta/text").and_then(Value::as_str) {
                Some(t) if !t.is_empty() => (EventSignal::Content, None),
                _ if v.pointer("/delta/partial_json").is_some() => (EventSignal::Content, None),
                _ => (EventSignal::Neutral, None),
            }
        }
        Api::Gemini => match gemini_block(v) {
            Some((source, value)) => {
                let reason = format!("gemini {source}: {value}");
                refusal(source, &value, reason)
            }
            None if gemini_has_content(v) => (EventSignal::Content, None),
            None => (EventSignal::Neutral, None),
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
                        return refusal(
                            "finish_reason",
                            "content_filter",
                            "finish_reason: content_filter with no content".into(),
                        );
                    }
                    Some("insufficient_system_resource") if !content => {
                        return (
                            EventSignal::Failure(
                                FailureClass::Overloaded,
                                "finish_reason: insufficient_system_resource".into(),
                            ),
                            Some(Signal::new("finish_reason", "insufficient_system_resource")),
                        );
                    }
                    _ => {}
                }
            }
            if content {
                (EventSignal::Content, None)
            } else {
                (EventSignal::Neutral, None)
            }
        }
    }
}

/// A Bedrock stream's exception event, decoded: `{"throttlingException": {…}}`.
fn is_aws_exception_event(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.len() == 1 && m.keys().any(|k| k.ends_with("Exception")),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_) => {
            false
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

/// A Gemini block: which field said so, and its value.
fn gemini_block(v: &Value) -> Option<(&'static str, String)> {
    if let Some(r) = v
        .pointer("/promptFeedback/blockReason")
        .and_then(Value::as_str)
    {
        return Some(("promptFeedback.blockReason", r.to_string()));
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
            return Some(("finishReason", r.to_string()));
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

/// Classify a complete upstream answer. `headers` are (name, value) pairs.
pub fn classify(api: Api, status: u16, headers: &[(String, String)], body: &str) -> Outcome {
    classify_answer(api, status, headers, body).0
}

/// `classify`, with the signal that decided it (`purser classify --explain`).
pub fn explain(api: Api, status: u16, headers: &[(String, String)], body: &str) -> Explained {
    explained_answer(api, status, headers, body).0
}

/// `classify`, also handing back the body parsed as JSON (when it is JSON, not a
/// stream) so a successful answer is not parsed twice.
pub fn classify_answer(
    api: Api,
    status: u16,
    headers: &[(String, String)],
    body: &str,
) -> (Outcome, Option<Value>) {
    let (e, json) = explained_answer(api, status, headers, body);
    (e.outcome, json)
}

fn explained_answer(
    api: Api,
    status: u16,
    headers: &[(String, String)],
    body: &str,
) -> (Explained, Option<Value>) {
    let sse = is_sse(headers, body);
    let json: Option<Value> = if sse {
        None
    } else {
        serde_json::from_str(body).ok()
    };
    let e = if (200..300).contains(&status) {
        // The success path reads no error fields unless the answer carries an error.
        if sse {
            classify_sse(api, body)
        } else {
            match &json {
                Some(v) => classify_success_json(api, v),
                None => Explained::new(
                    Outcome::fail(
                        FailureClass::Unclassified,
                        format!("HTTP {status} with a body that is not JSON"),
                    ),
                    Signal::new("body", "not JSON"),
                ),
            }
        }
    } else {
        classify_error(Some(status), headers, json.as_ref(), body)
    };
    (e, json)
}

fn classify_sse(api: Api, body: &str) -> Explained {
    let mut seen = false;
    for (name, data) in sse_events(body) {
        if data == "[DONE]" {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            // An event that is not JSON may still quote a vendor's error: a Python relay
            // that wrote the bytes' repr (`b'{"error": …}'`), a paste cut short. Its
            // words are read like any error's; with none, nothing can be said of it.
            let hits = evidence::read(&[], None, data);
            if hits.is_empty() {
                return Explained::new(
                    Outcome::fail(
                        FailureClass::Unclassified,
                        "a stream event that is not JSON",
                    ),
                    Signal::new("stream event", "not JSON"),
                );
            }
            let (class, signal) = decide(None, &hits, data);
            return Explained::new(
                Outcome::fail(class, reason_for(None, class, &signal)),
                signal,
            );
        };
        seen = true;
        match event(api, name, &v) {
            (EventSignal::Failure(class, reason), signal) => {
                return Explained::new(
                    Outcome::Failure { class, reason },
                    signal.unwrap_or_else(|| Signal::new("stream event", "error")),
                );
            }
            (EventSignal::Content | EventSignal::Neutral, _) => {}
        }
    }
    if seen {
        Explained::new(Outcome::Success, Signal::new("stream", "complete"))
    } else {
        Explained::new(
            Outcome::fail(FailureClass::Unclassified, "an empty stream"),
            Signal::new("stream", "empty"),
        )
    }
}

fn unclassified(reason: &'static str, what: &'static str) -> Explained {
    Explained::new(
        Outcome::fail(FailureClass::Unclassified, reason),
        Signal::new("answer", what),
    )
}

/// A 2xx that is no answer of its API: unclassified, unless it carries the
/// moderation vocabulary (a gateway's canned "Blocked due to policy violation." with a
/// `guardrail_info`): a refusal must never become a failover, and `unclassified` may.
fn no_answer(v: &Value, reason: &'static str, what: &'static str) -> Explained {
    let hits = evidence::read_value(v);
    match hits
        .iter()
        .filter(|h| h.class == FailureClass::ContentRefusal)
        .min_by_key(|h| (u8::MAX - h.depth, !h.field.is_structured()))
    {
        Some(h) => Explained::new(
            Outcome::fail(
                FailureClass::ContentRefusal,
                format!(
                    "a 2xx that is no answer, classed content_refusal by {}",
                    Signal::of(h)
                ),
            ),
            Signal::of(h),
        ),
        None => unclassified(reason, what),
    }
}

fn success(what: &'static str) -> Explained {
    Explained::new(Outcome::Success, Signal::new("answer", what))
}

/// Whether a value says anything: `null`, `false`, `0`, `""` and containers of only
/// such values say nothing. A gateway that adds `"error": {}` or `"error": false` to
/// every answer has reported no error, and its answer is still a success.
fn says_something(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.trim().is_empty(),
        Value::Array(items) => items.iter().any(says_something),
        Value::Object(m) => m.values().any(says_something),
    }
}

fn classify_success_json(api: Api, v: &Value) -> Explained {
    if v.get("error").is_some_and(says_something) || is_aws_exception_event(v) || names_its_error(v)
    {
        return classify_error_value(v);
    }
    match api {
        Api::Openai => {
            // The Responses API (also Azure's, which adds a `content_filters` array
            // that says `blocked: false` on every answer it let through).
            if v.get("object").and_then(Value::as_str) == Some("response") {
                return classify_response_object(v);
            }
            let Some(choices) = v.get("choices").and_then(Value::as_array) else {
                return no_answer(v, "a 2xx without `choices`", "no choices");
            };
            match event(api, None, v) {
                (EventSignal::Failure(class, reason), signal) => Explained::new(
                    Outcome::Failure { class, reason },
                    signal.unwrap_or_else(|| Signal::new("answer", "failure")),
                ),
                (EventSignal::Content | EventSignal::Neutral, _) if !choices.is_empty() => {
                    success("choices")
                }
                (EventSignal::Content | EventSignal::Neutral, _) => {
                    no_answer(v, "a 2xx with no choices", "empty choices")
                }
            }
        }
        Api::Anthropic => {
            if v.get("stop_reason").and_then(Value::as_str) == Some("refusal") {
                return Explained::new(
                    Outcome::fail(
                        FailureClass::ContentRefusal,
                        "anthropic stop_reason: refusal",
                    ),
                    Signal::new("stop_reason", "refusal"),
                );
            }
            if v.get("content").is_some_and(Value::is_array) {
                success("content")
            } else {
                no_answer(v, "a 2xx without `content`", "no content")
            }
        }
        Api::Gemini => {
            if let Some((source, value)) = gemini_block(v) {
                let reason = format!("gemini {source}: {value}");
                return Explained::new(
                    Outcome::fail(FailureClass::ContentRefusal, reason),
                    Signal::new(source, value),
                );
            }
            let candidates = v.get("candidates").and_then(Value::as_array);
            match candidates {
                Some(c) if !c.is_empty() => {
                    // A candidate that stopped for something other than a normal stop
                    // or the output cap, with no content and no block reason (`OTHER`),
                    // is no answer, and names no refusal either. Fixed after the round-4
                    // held-out measure, which had called it a success.
                    let abnormal = c.iter().any(|c| {
                        c.get("finishReason")
                            .and_then(Value::as_str)
                            .is_some_and(|r| !matches!(r, "STOP" | "MAX_TOKENS"))
                    });
                    if abnormal && !gemini_has_content(v) {
                        unclassified(
                            "a 2xx whose candidates stopped with no content and no block reason",
                            "finishReason without content",
                        )
                    } else {
                        success("candidates")
                    }
                }
                Some(_) | None => no_answer(v, "a 2xx without candidates", "no candidates"),
            }
        }
    }
}

/// A 2xx that is no answer of any API (no `choices`, `content`, `candidates` or
/// `output` with a value) but names its own failure in top-level fields. Vendors that
/// answer every error under HTTP 200: Baidu Qianfan's v1 API (`{"error_code": 110,
/// "error_msg": …}`, or `{"code": 336501, "msg": …}`), iFlytek Spark's HTTP API
/// (`{"code": 10013, "message": …}`), MiniMax (`base_resp.status_code`) and
/// TencentCloud API 3.0 (`Response.Error`). Such a body is read for its cause like any
/// error; with none, it stays `unclassified`, as a 2xx that is no answer always was. A
/// zero code (or 200, 20000: a success said as a number) and an empty message are a
/// success's, not an error. Added in round 5; the numeric `code`, `base_resp` and
/// `Response.Error` forms from the vendors' documented tables.
fn names_its_error(v: &Value) -> bool {
    let answer = ["choices", "content", "candidates", "output"]
        .iter()
        .any(|k| v.get(*k).is_some_and(|a| !a.is_null()));
    let failed = |c: &Value| match c {
        Value::Number(n) => !matches!(n.as_i64(), Some(0 | 200 | 20000)),
        Value::String(s) => !s.is_empty() && !matches!(s.as_str(), "0" | "200" | "20000"),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => false,
    };
    let said = |keys: &[&str]| {
        keys.iter()
            .filter_map(|k| v.get(*k).and_then(Value::as_str))
            .any(|m| !m.trim().is_empty())
    };
    let code = v.get("error_code").is_some_and(failed);
    let message = said(&["error_msg", "error_message"]);
    // A bare numeric `code` is only an error's when it comes with words of its own.
    let numbered =
        v.get("code").is_some_and(|c| c.is_number() && failed(c)) && said(&["message", "msg"]);
    let base_resp = v
        .pointer("/base_resp/status_code")
        .is_some_and(|c| c.is_number() && failed(c));
    let tencent = v.pointer("/Response/Error").is_some_and(Value::is_object);
    !answer && (code || message || numbered || base_resp || tencent || own_status(v).is_some())
}

/// A Responses API object: blocked when a content filter says so or the answer stopped
/// on one, a success when it completed with output.
fn classify_response_object(v: &Value) -> Explained {
    let blocked = v
        .get("content_filters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|f| f.get("blocked").and_then(Value::as_bool) == Some(true));
    let stopped_on_filter = v
        .pointer("/incomplete_details/reason")
        .and_then(Value::as_str)
        == Some("content_filter");
    let has_output = v
        .get("output")
        .and_then(Value::as_array)
        .is_some_and(|o| !o.is_empty());
    if (blocked || stopped_on_filter) && !has_output {
        let source = if blocked {
            "content_filters[].blocked"
        } else {
            "incomplete_details.reason"
        };
        return Explained::new(
            Outcome::fail(
                FailureClass::ContentRefusal,
                "a response blocked by a content filter, with no output",
            ),
            Signal::new(source, "content_filter"),
        );
    }
    if has_output {
        success("output")
    } else {
        unclassified("a response object with no output", "no output")
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
    fn a_2xx_naming_its_error_is_read_for_its_cause() {
        // Qianfan's v1 shape: the cause in error_msg decides.
        let bad_token = r#"{"error_code":111,"error_msg":"Access token expired"}"#;
        assert_eq!(
            classify(Api::Openai, 200, &[], bad_token).class(),
            Some(FailureClass::Auth)
        );
        // With no cause in it, a 2xx that is no answer stays unclassified.
        let vague = r#"{"error_code":336000,"error_msg":"Internal error"}"#;
        assert_eq!(
            classify(Api::Openai, 200, &[], vague).class(),
            Some(FailureClass::Unclassified)
        );
        // A zero code and an empty message are a success's fields, and an answer with
        // choices is an answer whatever else it carries.
        let ok = r#"{"error_code":0,"error_msg":"","choices":[{"message":{"content":"hi"}}]}"#;
        assert_eq!(classify(Api::Openai, 200, &[], ok), Outcome::Success);
        let quiet = r#"{"error_code":0,"error_msg":""}"#;
        assert!(!names_its_error(&serde_json::from_str(quiet).unwrap()));
        let answered =
            r#"{"choices":[{"message":{"content":"hi"}}],"error_msg":"access token expired"}"#;
        assert_eq!(classify(Api::Openai, 200, &[], answered), Outcome::Success);
    }

    #[test]
    fn words_in_a_field_no_table_names_still_count() {
        // A guardrail's verdict in a field nobody listed, under a 403 the family would
        // call auth.
        let body = r#"{"result":{"explanation":"blocked: the prompt contains hate speech"}}"#;
        assert_eq!(
            classify(Api::Openai, 403, &[], body).class(),
            Some(FailureClass::ContentRefusal)
        );
        // The request a gateway echoes back is the client's words, not a verdict.
        let echo = r#"{"error":{"message":"temperature must be at most 2"},"messages":[{"role":"user","content":"is this harmful?"}],"prompt":"unsafe?"}"#;
        assert_eq!(
            classify(Api::Openai, 400, &[], echo).class(),
            Some(FailureClass::Malformed)
        );
    }

    #[test]
    fn a_relayed_status_is_read_by_its_family() {
        let body = r#"{"code":"upstream_http_error","message":"the upstream failed","upstream_status":503}"#;
        assert_eq!(
            classify(Api::Openai, 500, &[], body).class(),
            Some(FailureClass::Overloaded)
        );
        // A relayed 403 is only a family: the quota prose beside it decides.
        let quota = r#"{"message":"insufficient balance","upstream_status":403}"#;
        assert_eq!(
            classify(Api::Openai, 502, &[], quota).class(),
            Some(FailureClass::RateLimited)
        );
    }

    #[test]
    fn a_404_is_the_model_when_it_names_one_else_the_path() {
        let model = r#"{"message":"model 'command-r' was removed on September 15, 2025"}"#;
        assert_eq!(
            classify(Api::Openai, 404, &[], model).class(),
            Some(FailureClass::ModelNotFound)
        );
        assert_eq!(
            classify(Api::Openai, 404, &[], "Cannot POST /v1/chat/completion").class(),
            Some(FailureClass::Malformed)
        );
        // A 3xx is no answer, whatever family tag its body restates.
        let moved = r#"{"error":{"code":302,"message":"Unknown Error.","status":"UNKNOWN"}}"#;
        assert_eq!(
            classify(Api::Gemini, 302, &[], moved).class(),
            Some(FailureClass::Unclassified)
        );
    }

    #[test]
    fn a_2xx_that_is_no_answer_is_read_for_a_refusal_or_its_own_status() {
        let canned = r#"{"content":"Blocked due to policy violation.","guardrail_info":{"type":"VIOLENCE"}}"#;
        assert_eq!(
            classify(Api::Openai, 200, &[], canned).class(),
            Some(FailureClass::ContentRefusal)
        );
        let busy = r#"{"status":429,"message":"Too many requests"}"#;
        assert_eq!(
            classify(Api::Openai, 200, &[], busy).class(),
            Some(FailureClass::RateLimited)
        );
        // A success said as a number is a success's field, and stays no answer.
        let ok = r#"{"code":200,"data":{}}"#;
        assert_eq!(
            classify(Api::Openai, 200, &[], ok).class(),
            Some(FailureClass::Unclassified)
        );
    }

    #[test]
    fn a_failed_responses_stream_is_read_like_its_error() {
        let body = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"Our servers are currently overloaded.\"}}}\n\n";
        assert_eq!(
            classify(Api::Openai, 200, &[], body).class(),
            Some(FailureClass::Overloaded)
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

    #[test]
    fn a_relayed_refusal_is_not_laundered_by_the_relays_429() {
        let inner = r#"{"error":{"code":"content_filter","message":"filtered"}}"#;
        let body = serde_json::json!({"error": {"message": format!("upstream error: {inner}"), "code": "rate_limit_exceeded"}})
            .to_string();
        let e = explain(Api::Openai, 429, &[], &body);
        assert_eq!(e.outcome.class(), Some(FailureClass::ContentRefusal));
        assert_eq!(e.signal.depth, 1);
    }

    #[test]
    fn the_innermost_envelope_decides() {
        // A relay's 500 quoting the vendor's 429 body.
        let inner =
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limited"}}"#;
        let body = serde_json::json!({"error": {"message": format!("AnthropicException - {inner}"), "type": "api_error"}})
            .to_string();
        assert_eq!(
            classify(Api::Openai, 500, &[], &body).class(),
            Some(FailureClass::RateLimited)
        );
    }

    #[test]
    fn relay_recursion_is_bounded() {
        // Each envelope doubles the escaping, so a handful of them is already deep.
        let mut body = r#"{"error":{"message":"Rate limit exceeded"}}"#.to_string();
        for _ in 0..6 {
            body =
                serde_json::json!({"error": {"message": format!("wrapped: {body}")}}).to_string();
        }
        // Too deep to open every envelope: the deepest one opened still quotes the
        // vendor's words, and they decide.
        let e = explain(Api::Openai, 502, &[], &body);
        assert_eq!(e.signal.depth, evidence::MAX_DEPTH);
        assert_eq!(e.outcome.class(), Some(FailureClass::RateLimited));
    }

    #[test]
    fn unknown_statuses_are_read_by_family_and_signals() {
        let capacity = r#"{"error":{"message":"Capacity exceeded, please try again later"}}"#;
        assert_eq!(
            classify(Api::Openai, 498, &[], capacity).class(),
            Some(FailureClass::Overloaded)
        );
        assert_eq!(
            classify(Api::Openai, 499, &[], "").class(),
            Some(FailureClass::Malformed)
        );
        for s in [520, 521, 522, 523, 525, 526, 527] {
            assert_eq!(
                classify(Api::Openai, s, &[], "error code: 520").class(),
                Some(FailureClass::ServerError),
                "{s}"
            );
        }
        assert_eq!(
            classify(Api::Openai, 524, &[], "error code: 524").class(),
            Some(FailureClass::Timeout)
        );
    }

    #[test]
    fn bedrock_exception_header_decides() {
        let h = vec![(
            "x-amzn-errortype".to_string(),
            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/".to_string(),
        )];
        let body = r#"{"message":"Too many tokens, please wait before trying again."}"#;
        let e = explain(Api::Openai, 429, &h, body);
        assert_eq!(e.outcome.class(), Some(FailureClass::RateLimited));
        assert_eq!(e.signal.source, "aws exception (bedrock)");
    }

    #[test]
    fn every_transport_failure_has_its_class() {
        use TransportFailure as T;
        for (t, c) in [
            (T::Connect, FailureClass::Connect),
            (T::ConnectTimeout, FailureClass::Connect),
            (T::ResponseTimeout, FailureClass::Timeout),
            (T::Dropped, FailureClass::Dropped),
        ] {
            assert_eq!(classify_transport(t).0, c);
        }
    }
}
