//! Reads every signal an error answer carries: the vendor's structured fields, its
//! prose, and the same again for any error relayed inside a message (a proxy that
//! quotes the vendor's JSON body in its own `message`). Only failures are read this
//! way; a plain success never pays for it.

use serde_json::Value;

use super::FailureClass;
use super::dialects::{DIALECTS, Field, Pat, Says, words};

/// How many relay envelopes are opened, at most. Four covers the deepest chain seen
/// in the corpus (a client in front of a new-api relay in front of LiteLLM in front of
/// a vendor) and keeps a hostile body from making the classifier recurse without end.
pub const MAX_DEPTH: u8 = 4;

/// Longest message text searched for an embedded error: relayed bodies are small, and
/// a megabyte of HTML need not be parsed three times.
const MAX_EMBEDDED: usize = 64 * 1024;

/// How many values are judged at most, and how many bytes of them: every value costs
/// a pass of every dialect row, so a hostile body of 100,000 `errors[]` or exception
/// keys must not cost seconds (it did: 10–27 s in release). Real error bodies carry a
/// few dozen values and a few kilobytes of prose; what is past the budget is not read.
const MAX_VALUES: usize = 512;
const MAX_BYTES: usize = 64 * 1024;

/// How many items of one list (`errors[]`, `details[]`, `metadata.reasons`, FastAPI's
/// `detail[]`, exception keys) are read: enough for any real body, and a padded list
/// cannot spend the whole budget before the message beside it is read.
const MAX_ITEMS: usize = 32;

/// One signal found: a dialect row matched a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub class: FailureClass,
    /// The dialect table whose row matched.
    pub dialect: &'static str,
    /// Where the row comes from (its own source, else its dialect's).
    pub basis: &'static str,
    pub field: Field,
    /// The vendor's value (structured) or the phrase that matched (prose).
    pub value: String,
    /// 0 for the answer itself, n for an error relayed n envelopes deep.
    pub depth: u8,
    /// Whether the row names a cause or only a family (see `Says`).
    pub says: Says,
    /// Read by the vocabulary of code words rather than a vendor's exact value: a
    /// vendor's own row for the same value is believed first (Cloudflare's
    /// `connection_timeout` never reached the origin: not a timeout of the model).
    pub by_words: bool,
}

impl Hit {
    /// A structured field that names the cause: decides before prose and status.
    pub fn structured_cause(&self) -> bool {
        self.field.is_structured() && self.says == Says::Cause
    }
}

/// A value read from the answer, before the dialect tables judge it.
struct Seen {
    field: Field,
    value: String,
    /// The word form of a structured value (`words`); empty for prose.
    words: String,
    depth: u8,
}

/// Every signal in an error answer. `json` is the parsed body when it is JSON; `raw`
/// is read as prose when it is not.
pub fn read(headers: &[(String, String)], json: Option<&Value>, raw: &str) -> Vec<Hit> {
    judge(&collect(headers, json, raw))
}

/// How much of an answer the reader keeps to judge: values, and bytes of their text.
/// Judging costs every dialect row per value, so these two numbers bound the work a
/// body can make (`MAX_VALUES`, `MAX_BYTES`); `cargo bench --bench classify` prints
/// what hostile bodies cost in time.
pub fn kept(headers: &[(String, String)], json: Option<&Value>, raw: &str) -> (usize, usize) {
    let seen = collect(headers, json, raw);
    (seen.len(), spent(&seen))
}

/// The bound `kept` is held to.
pub const BOUND: (usize, usize) = (MAX_VALUES, MAX_BYTES);

fn collect(headers: &[(String, String)], json: Option<&Value>, raw: &str) -> Vec<Seen> {
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
    seen
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
        let ascii = s.value.is_ascii();
        for d in DIALECTS {
            for rule in d.rules {
                if rule.field.reads(s.field)
                    && (rule.ascii || !ascii)
                    && rule.pat.matches(&s.value, &s.words)
                {
                    // A code read by its words shows the code and the word that decided.
                    let value = match (s.field.is_structured(), rule.pat) {
                        (true, Pat::Word(w)) => format!("{} ~ {w}", s.value),
                        (true, _) => s.value.clone(),
                        (false, _) => rule.pat.shown(&s.value),
                    };
                    hits.push(Hit {
                        class: rule.class,
                        dialect: d.name,
                        basis: if rule.src.is_empty() {
                            d.source
                        } else {
                            rule.src
                        },
                        field: s.field,
                        value,
                        depth: s.depth,
                        says: rule.says,
                        by_words: matches!(rule.pat, Pat::Word(_)),
                    });
                }
            }
        }
    }
    hits
}

/// Whether the budget (`MAX_VALUES`, `MAX_BYTES`) is spent.
fn full(seen: &[Seen]) -> bool {
    seen.len() >= MAX_VALUES || spent(seen) >= MAX_BYTES
}

fn spent(seen: &[Seen]) -> usize {
    seen.iter().map(|s| s.value.len()).sum()
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character boundary.
fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn push(seen: &mut Vec<Seen>, field: Field, value: &str, depth: u8) {
    if seen.len() >= MAX_VALUES {
        return;
    }
    let left = MAX_BYTES.saturating_sub(spent(seen));
    // Prose is read in its spaced form too, so it costs twice its length.
    let value = prefix(value.trim(), left / 2);
    if value.is_empty() {
        return;
    }
    let lower = value.to_lowercase();
    // The same words read twice add nothing: the generic pass meets again what the
    // named fields already read.
    if seen
        .iter()
        .any(|s| s.depth == depth && s.field == field && s.value == lower)
    {
        return;
    }
    if field.is_structured() {
        seen.push(Seen {
            field,
            words: words(value),
            value: lower,
            depth,
        });
        return;
    }
    // Prose also in its spaced form, so a name written as code inside a sentence
    // ("blocked: prompt: BlockedReasonProhibitedContent", "policy_violation") is read
    // by the same vocabulary as the words it joins.
    let spaced = spaced(value);
    seen.push(Seen {
        field,
        value: lower,
        words: String::new(),
        depth,
    });
    if let Some(spaced) = spaced {
        seen.push(Seen {
            field,
            value: spaced,
            words: String::new(),
            depth,
        });
    }
}

/// Prose with its code-like names split into words, lower-cased: `_` becomes a
/// space, and so does each hump of a name of three or more (`ContentPolicyViolation`,
/// `BlockedReasonProhibitedContent`). A two-part name is a product's
/// (`OpenGuardrails`, echoed back by a server that serves it) more often than a code,
/// and stays whole. None when nothing changes. Hyphens stay: the vocabulary's
/// exceptions are written with them ("time-sensitive").
fn spaced(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len() + 8);
    let mut changed = false;
    for (i, token) in s.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let humps = token
            .chars()
            .zip(token.chars().skip(1))
            .filter(|(a, b)| a.is_lowercase() && b.is_uppercase())
            .count();
        let mut prev_lower = false;
        for ch in token.chars() {
            if ch == '_' {
                out.push(' ');
                changed = true;
                prev_lower = false;
                continue;
            }
            if humps >= 2 && ch.is_uppercase() && prev_lower {
                out.push(' ');
                changed = true;
            }
            prev_lower = ch.is_lowercase();
            out.extend(ch.to_lowercase());
        }
    }
    changed.then_some(out)
}

/// Message text: prose, and possibly a relayed error inside it.
fn text(s: &str, depth: u8, seen: &mut Vec<Seen>) {
    if full(seen) {
        return;
    }
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
/// "upstream error: {...}"), sometimes with its quotes still escaped, and Python
/// clients print it as a dict (`{'error': {'message': "it's", 'param': None}}`).
fn embedded(s: &str) -> Option<Value> {
    for (i, _) in s.match_indices('{').take(4) {
        let tail = s.get(i..)?;
        if let Some(v) = first_object(tail) {
            return Some(v);
        }
        if tail.starts_with("{\\\"") {
            let unescaped = tail.replace("\\\"", "\"").replace("\\\\", "\\");
            if let Some(v) = first_object(&unescaped) {
                return Some(v);
            }
        }
        if tail.starts_with("{'")
            && let Some(json) = python_to_json(tail)
            && let Some(v) = first_object(&json)
        {
            return Some(v);
        }
    }
    None
}

/// A Python literal (the repr of a dict) as JSON text: single- and double-quoted
/// strings, `None`, `True`, `False`. Reads up to the brace that closes the first one;
/// None when the text is not such a literal.
fn python_to_json(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    let mut level = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                out.push('"');
                let quote = c;
                loop {
                    let ch = chars.next()?;
                    match ch {
                        '\\' => {
                            let esc = chars.next()?;
                            match esc {
                                '\'' => out.push('\''),
                                '"' => out.push_str("\\\""),
                                other => {
                                    out.push('\\');
                                    out.push(other);
                                }
                            }
                        }
                        '"' if quote == '\'' => out.push_str("\\\""),
                        q if q == quote => break,
                        other => out.push(other),
                    }
                }
                out.push('"');
            }
            '{' | '[' => {
                level += 1;
                out.push(c);
            }
            '}' | ']' => {
                level = level.checked_sub(1)?;
                out.push(c);
                if level == 0 {
                    return Some(out);
                }
            }
            'N' | 'T' | 'F' => {
                let mut word = String::from(c);
                while let Some(&n) = chars.peek() {
                    if n.is_ascii_alphabetic() {
                        word.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(match word.as_str() {
                    "None" => "null",
                    "True" => "true",
                    "False" => "false",
                    _ => return None,
                });
            }
            other => out.push(other),
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
    // `Error` as well as `error`: a few gateways capitalise the envelope.
    if let Some(Value::Object(e)) = get_ci(top, "error") {
        objects.push(e);
    }
    // TencentCloud API 3.0 (Hunyuan's native API) answers every call with HTTP 200 and
    // puts a failure in `Response.Error: {Code, Message}`.
    if let Some(Value::Object(e)) = top.get("Response").and_then(|r| r.get("Error")) {
        objects.push(e);
    }
    for obj in &objects {
        relayed_status(obj, depth, seen);
    }
    for obj in objects.iter().copied() {
        // `Code` and `Message` are the TencentCloud spelling; `error_type` is Hugging
        // Face TGI's (`{"error": "...", "error_type": "generation"}`).
        for (key, field) in [
            ("code", Field::Code),
            ("Code", Field::Code),
            ("type", Field::Type),
            ("error_type", Field::Type),
            ("status", Field::Status),
        ] {
            if let Some(Value::String(s)) = obj.get(key) {
                push(seen, field, s, depth);
            }
        }
        // NAVER CLOVA Studio: `{"status": {"code": "40003", "message": "…"}}`.
        if let Some(Value::Object(st)) = obj.get("status") {
            if let Some(Value::String(c)) = st.get("code") {
                push(seen, Field::Code, c, depth);
            }
            if let Some(Value::String(m)) = st.get("message") {
                text(m, depth, seen);
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
        for (key, inner) in obj
            .iter()
            .filter(|(k, _)| k.to_ascii_lowercase().ends_with("exception"))
            .take(MAX_ITEMS)
        {
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
            for d in details.iter().take(MAX_ITEMS) {
                if let Some(Value::String(r)) = d.get("reason") {
                    push(seen, Field::Reason, r, depth);
                }
            }
        }
        if let Some(Value::Object(meta)) = obj.get("metadata") {
            if let Some(Value::Array(reasons)) = meta.get("reasons") {
                for r in reasons.iter().take(MAX_ITEMS) {
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
            // OpenRouter passes the provider's own body through, as a string or as JSON:
            // it is the vendor's answer one envelope down.
            match meta.get("raw") {
                Some(Value::String(raw)) => match first_object(raw) {
                    Some(inner) if depth < MAX_DEPTH => walk(&inner, depth + 1, seen),
                    Some(_) | None => text(raw, depth, seen),
                },
                Some(inner @ Value::Object(_)) if depth < MAX_DEPTH => {
                    walk(inner, depth + 1, seen);
                }
                Some(_) | None => {}
            }
        }
        if obj
            .get("promptFeedback")
            .and_then(|p| p.get("blockReason"))
            .is_some_and(Value::is_string)
        {
            push(seen, Field::Block, "blockreason", depth);
        }
        // MiniMax answers 200 with `base_resp: {status_code, status_msg}`.
        if let Some(Value::Object(base)) = obj.get("base_resp")
            && let Some(code) = base.get("status_code").and_then(Value::as_i64)
            && code != 0
        {
            push(seen, Field::Code, &format!("minimax:{code}"), depth);
            if let Some(Value::String(m)) = base.get("status_msg") {
                text(m, depth, seen);
            }
        }
        for key in PROSE.iter().chain(["Message"].iter()).copied() {
            match get_ci(obj, key) {
                Some(Value::String(s)) => text(s, depth, seen),
                // FastAPI-style `detail` objects, and an `error` inside `error`: a relay
                // that nests the vendor's envelope one level more.
                Some(inner @ Value::Object(_))
                    if (key != "error" || !std::ptr::eq(obj, top)) && depth < MAX_DEPTH =>
                {
                    walk(inner, depth + 1, seen);
                }
                // FastAPI's validation `detail: [{loc, msg, type}]`.
                Some(Value::Array(items)) if key == "detail" => {
                    for item in items.iter().take(MAX_ITEMS) {
                        if let Some(Value::String(m)) = item.get("msg") {
                            text(m, depth, seen);
                        }
                    }
                }
                Some(_) | None => {}
            }
        }
        if let Some(Value::Array(errs)) = obj.get("errors") {
            for e in errs.iter().take(MAX_ITEMS) {
                if let Some(Value::String(s)) = e.get("message") {
                    text(s, depth, seen);
                }
            }
        }
    }
    // Then every other field, whatever its name: a guardrail's `reason` or
    // `description`, Elasticsearch's `root_cause[].reason`, a `message_zh` beside the
    // English one, a 4xx shaped like an answer whose content is the gateway's verdict.
    // The named fields above say where each vendor puts its words; this reads what no
    // table names, so a field nobody listed still counts.
    let mut budget = REST_BUDGET;
    for (key, value) in top {
        if !named(key) {
            rest(key, value, depth, 0, &mut budget, seen);
        }
    }
    if let Some(Value::Object(e)) = get_ci(top, "error") {
        for (key, value) in e {
            if !named(key) {
                rest(key, value, depth, 0, &mut budget, seen);
            }
        }
    }
}

/// The fields `walk` reads as prose, or opens as a relay envelope one level down.
/// Coze's workflow runner puts its failure in `$error`, added after the round-4
/// held-out measure, which it had missed. (`Message` is also read when `message` is
/// there too: TencentCloud spells it so.)
const PROSE: [&str; 7] = [
    "message",
    "error",
    "detail",
    "error_message",
    "error_msg",
    "msg",
    "$error",
];

/// The other fields `walk` reads by name.
const STRUCTURED: [&str; 10] = [
    "code",
    "type",
    "status",
    "__type",
    "errors",
    "details",
    "metadata",
    "innererror",
    "inner_error",
    "base_resp",
];

/// Whether `walk` reads a field by name (the generic pass leaves it alone).
fn named(key: &str) -> bool {
    PROSE
        .iter()
        .chain(STRUCTURED.iter())
        .any(|k| key.eq_ignore_ascii_case(k))
}

/// Fields whose strings are names or echoes, not verdicts: ids, model names, the
/// request the client sent (a prompt that talks about safety is no refusal).
const NOT_PROSE: [&str; 14] = [
    "id", "model", "object", "param", "url", "path", "messages", "prompt", "input", "contents",
    "system", "tools", "request", "created",
];

/// How many values the generic pass reads at most: error bodies are small, and a
/// hostile one must not make every answer cost a megabyte's walk.
const REST_BUDGET: usize = 256;

/// Nesting the generic pass follows at most.
const REST_DEPTH: u8 = 6;

fn rest(key: &str, v: &Value, depth: u8, nest: u8, budget: &mut usize, seen: &mut Vec<Seen>) {
    if *budget == 0 || nest > REST_DEPTH {
        return;
    }
    *budget -= 1;
    let lower = key.to_ascii_lowercase();
    // `request_id`, `requestId`: names, not words.
    if NOT_PROSE.contains(&lower.as_str())
        || lower.ends_with("_id")
        || key.ends_with("Id")
        || echoes_request(&lower)
        || gives_guidance(&lower)
    {
        return;
    }
    match v {
        Value::String(s) if s.len() <= MAX_EMBEDDED => {
            if s.trim().contains(char::is_whitespace) {
                text(s, depth, seen);
            } else if code_like(&lower) {
                push(seen, Field::Nested, s, depth);
            }
        }
        Value::Object(m) => {
            for (k, inner) in m {
                rest(k, inner, depth, nest + 1, budget, seen);
            }
        }
        Value::Array(items) => {
            for inner in items {
                rest(key, inner, depth, nest + 1, budget, seen);
            }
        }
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A field whose name says it holds what the client sent (`query`, `input_text`,
/// `user_prompt`, `request_body`, `context`, a raw `body`): the client's words echoed
/// back, not the vendor's verdict. A 5xx that echoes a prompt about "harmful
/// chemicals" is still an outage, and must still fail over.
fn echoes_request(key: &str) -> bool {
    ["prompt", "input", "query", "request", "messages"]
        .iter()
        .any(|w| key.contains(w))
        || matches!(key, "context" | "body" | "question")
}

/// A field of advice rather than verdict (`help`, `hint`, `docs`, `documentation_url`,
/// `link`, `suggestion`): "see our content policy" there says where to read, not that
/// anything was refused, and must not freeze an outage into a refusal.
fn gives_guidance(key: &str) -> bool {
    [
        "doc", "help", "hint", "link", "url", "href", "suggest", "advice",
    ]
    .iter()
    .any(|w| key.contains(w))
}

/// A field whose name says its value is a code: `category`, `detector_type`,
/// `error_type`, `reason`, `kind`, `finish_reason`.
fn code_like(key: &str) -> bool {
    ["code", "type", "category", "reason", "kind", "status"]
        .iter()
        .any(|s| key.ends_with(s))
}

/// A status the envelope says it relayed: `upstream_status: 503` beside a relay's own
/// 500, or the numeric `code` / `status` of an error quoted one envelope down. The
/// answer's own status says the same of the outermost envelope, so there it is not
/// read again.
fn relayed_status(obj: &serde_json::Map<String, Value>, depth: u8, seen: &mut Vec<Seen>) {
    for (key, v) in obj {
        let k = key.to_ascii_lowercase();
        let upstream = k.contains("upstream") || k.contains("provider") || k.contains("original");
        let own =
            depth > 0 && matches!(k.as_str(), "code" | "status" | "status_code" | "statuscode");
        if !(k.contains("status") || k.contains("code")) || !(upstream || own) {
            continue;
        }
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
        };
        if let Some(n) = n.filter(|n| (400..600).contains(n)) {
            let at = if upstream {
                depth.saturating_add(1)
            } else {
                depth
            };
            push(seen, Field::Upstream, &n.to_string(), at);
        }
    }
}

/// A field by name, exactly or else in any case.
fn get_ci<'a>(obj: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
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
