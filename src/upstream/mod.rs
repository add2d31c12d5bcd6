//! The only code that calls providers: credentials, one HTTP call per attempt, and the
//! per-API translations (each adapter a pair of pure functions).

pub mod anthropic;
pub mod bound;
pub mod fields;
pub mod from_messages;
pub mod from_responses;
pub mod gemini;
pub mod json;
pub mod openai;
#[cfg(test)]
mod pool_tests;
pub mod stream;
#[cfg(test)]
mod usage_tests;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

use crate::failure::TransportFailure;
use crate::ids::ProviderId;
use crate::policy::plan::{Api, Credential, Destination, Endpoint, Endpoints, Provider};
use from_messages::Untranslatable;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The credential source yielded nothing. `Display` is what a client may read: it
    /// names the provider only, because the variable's name or the file's path tells
    /// an outsider where the operator keeps secrets. `operator_detail` has the rest.
    #[error(
        "provider `{provider}` has no usable credential; the operator has been told in the log"
    )]
    Credential { provider: String, detail: String },
    /// The HTTP client for upstream calls could not be built (TLS backend, system
    /// configuration); no call is possible without it.
    #[error("cannot build the HTTP client for upstream calls: {0}")]
    Client(String),
}

impl UpstreamError {
    /// What only the operator should read, for the log: which environment variable is
    /// unset or which file cannot be read, and why.
    pub fn operator_detail(&self) -> String {
        match self {
            UpstreamError::Credential { provider, detail } => {
                format!("provider `{provider}`: credential unavailable: {detail}")
            }
            UpstreamError::Client(e) => e.clone(),
        }
    }
}

/// The client every upstream call goes through. It never follows a redirect: a
/// vendor API does not redirect, and following one would send the key and the prompt
/// wherever `Location` points (and the redirect policy cost 1% CPU per request). A
/// build failure is an error, never a fallback to a default client, which follows
/// redirects.
///
/// Its pool keeps every connection a call opened, until it has been idle for reqwest's
/// 90 seconds (its reaper runs that often, so up to 180): a host's pool holds about as
/// many as calls to it were in flight at the recent peak, which `--max-in-flight`
/// bounds. A cap below that limit (256 here before) closed, at each wave of more
/// concurrent calls to an HTTP/1.1 upstream (a self-hosted model server, a relay, the
/// benchmark's mock), the connections beyond it, and the next wave opened them again
/// (at c=1024 on a 200 ms upstream, up to 768 a wave, five waves a second). (Vendors over
/// TLS usually speak HTTP/2, where calls share connections.)
pub fn http_client() -> Result<reqwest::Client, UpstreamError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| UpstreamError::Client(e.to_string()))
}

/// A request in purser's internal (OpenAI) shape, ready to translate.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The client's body as received (unknown fields pass through to OpenAI-compatible).
    pub body: Value,
    /// Output bound to send as max_tokens (may be clamped).
    pub max_tokens: u64,
    /// Ask the upstream to stream (the client asked for `stream: true`).
    pub stream: bool,
    /// The client API it came in by: a Messages body goes to Anthropic as it is.
    pub ingress: crate::ingress::Ingress,
    /// Client headers a native pass-through forwards (`anthropic-beta`, `-version`).
    pub headers: Vec<(String, String)>,
    /// A Messages or Responses body as chat completions, translated on first need and
    /// kept: the checks, the bound and the call each translated it anew (four times a
    /// request, 37% of a 9 kB Messages request's instructions). Filled from `body`,
    /// which must not change once it is.
    pub chat: OnceLock<Result<Value, Untranslatable>>,
    /// The bytes `body` was parsed from, where the client's request gave them: while a
    /// call runs the request is parked (`park`), its parsed body (2 to 7 times these
    /// bytes) and translation dropped, and parsed again only if a later attempt needs
    /// them (`unpark`). `None`: the body has no bytes to return to, and stays parsed.
    pub raw: Option<bytes::Bytes>,
}

/// A parked request's bytes no longer parse (they did when it was received).
#[derive(Debug, thiserror::Error)]
#[error("the request's body could not be read again for another attempt: {0}")]
pub struct Unparked(serde_json::Error);

impl ChatRequest {
    pub fn new(
        body: Value,
        max_tokens: u64,
        stream: bool,
        ingress: crate::ingress::Ingress,
        headers: Vec<(String, String)>,
    ) -> ChatRequest {
        ChatRequest {
            body,
            max_tokens,
            stream,
            ingress,
            headers,
            chat: OnceLock::new(),
            raw: None,
        }
    }

    /// Drop the parsed body and its translation while a call runs (seconds to minutes),
    /// keeping the bytes they came from. A request without bytes stays as it is. Only
    /// `unpark` makes the body readable again: a parked body reads as `null`.
    pub fn park(&mut self) {
        if self.raw.is_some() {
            self.body = Value::Null;
            self.chat = OnceLock::new();
        }
    }

    /// Parse the body again if it is parked. A client's body is a JSON object, so a
    /// `null` body with bytes behind it is a parked one.
    pub fn unpark(&mut self) -> Result<(), Unparked> {
        if let (Value::Null, Some(raw)) = (&self.body, &self.raw) {
            self.body = serde_json::from_slice(raw).map_err(Unparked)?;
        }
        Ok(())
    }

    /// The body as chat completions: the client's own for chat, else its translation,
    /// made once for the request.
    pub fn as_chat(&self) -> Result<&Value, &Untranslatable> {
        use crate::ingress::Ingress;
        match self.ingress {
            Ingress::Chat => Ok(&self.body),
            Ingress::Messages => self
                .chat
                .get_or_init(|| from_messages::chat_body(&self.body))
                .as_ref(),
            Ingress::Responses => self
                .chat
                .get_or_init(|| from_responses::chat_body(&self.body))
                .as_ref(),
        }
    }
}

/// One HTTP call, ready to send.
pub struct Prepared {
    pub url: Endpoint,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
}

/// A call's body: a tree an adapter built, or the client's own body with purser's
/// edits, serialized straight from the borrowed original (see [`overlay`]).
#[derive(Debug)]
pub enum Body {
    Json(Value),
    Bytes(Vec<u8>),
}

impl Body {
    /// The body as a tree: borrowed where it is one, parsed back where it was
    /// serialized already (never on the request path: only adapters' trees are read).
    pub fn tree(&self) -> std::borrow::Cow<'_, Value> {
        match self {
            Body::Json(v) => std::borrow::Cow::Borrowed(v),
            Body::Bytes(b) => {
                std::borrow::Cow::Owned(serde_json::from_slice(b).unwrap_or(Value::Null))
            }
        }
    }

    /// The bytes that are sent.
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            Body::Bytes(bytes) => bytes,
            Body::Json(tree) => json::to_vec(&tree),
        }
    }

    /// The body as an owned tree, for tests.
    #[cfg(test)]
    pub fn to_value(&self) -> Value {
        self.tree().into_owned()
    }
}

/// The client's `body` as a pass-through sends it: `set` laid over its fields and
/// `remove` taken out, serialized in one pass over the borrowed body. Copying the
/// client's tree to edit a handful of top-level fields cost more than serializing it.
/// The keys come out in the order the edited tree's would (sorted), so the bytes are
/// those the tree would have serialized to. A body that is not an object passes as it is.
pub(crate) fn overlay(body: &Value, set: &[(&'static str, Value)], remove: &[&str]) -> Body {
    let Some(o) = body.as_object() else {
        return Body::Json(body.clone());
    };
    let mut fields: std::collections::BTreeMap<&str, &Value> =
        o.iter().map(|(k, v)| (k.as_str(), v)).collect();
    for k in remove {
        fields.remove(k);
    }
    for (k, v) in set {
        fields.insert(k, v);
    }
    Body::Bytes(json::fields_to_vec(fields.iter().map(|(k, v)| (*k, *v))))
}

/// What an attempt observed.
#[derive(Debug)]
pub enum Observation {
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    Transport(TransportFailure, String),
}

/// What the vendor reported for one call, by billed token class, in one shape for all
/// three APIs: totals with the specially priced parts broken out of them.
///
/// `None` means the answer did not carry the figure, which is not the same as a
/// reported 0: `pricing::charge` charges a missing total at its bound and prices a
/// missing breakdown at the dearest rate it could hide. A class the vendor's API never
/// bills is `Some(0)`, not `None`, but for OpenAI's cache writes: a compatible server or
/// relay may bill them after a `cache_control` mark, so an unreported count is `None`
/// and `pricing::charge` decides (a structural 0 unless the request was marked).
///
/// How each vendor's figures map:
/// - OpenAI: `input` = `prompt_tokens` (cached included), `cached_input` =
///   `prompt_tokens_details.cached_tokens`, `cache_write` = what a relay reports
///   (`prompt_tokens_details.cache_write_tokens` or `.cache_creation_input_tokens`,
///   `cache_creation_input_tokens`), else `None`, `output` = `completion_tokens`
///   (reasoning included), `reasoning` =
///   `completion_tokens_details.reasoning_tokens`.
/// - Anthropic: `input_tokens` excludes the cache, so `input` = `input_tokens` +
///   `cache_read_input_tokens` + `cache_creation_input_tokens`; `cached_input` = the
///   reads, `cache_write` = the creations; `output` = `output_tokens` (extended
///   thinking included, not broken out, so `reasoning` is `None`).
/// - Gemini: `promptTokenCount` includes `cachedContentTokenCount` but not
///   `toolUsePromptTokenCount`, and `candidatesTokenCount` excludes
///   `thoughtsTokenCount`, which is billed as output: `input` = prompt + tool-use
///   prompt, `cached_input` = cached content, `cache_write` = 0 (cache storage is billed
///   by the hour, outside the call), `output` = candidates + thoughts, `reasoning` =
///   thoughts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every input token billed, cache reads and writes included.
    pub input: Option<u64>,
    /// Of `input`, read from the vendor's prompt cache.
    pub cached_input: Option<u64>,
    /// Of `input`, written to the vendor's prompt cache.
    pub cache_write: Option<u64>,
    /// Every output token billed, reasoning included.
    pub output: Option<u64>,
    /// Of `output`, reasoning or thought tokens (same rate; shown to the client).
    pub reasoning: Option<u64>,
    /// Of `input`, audio tokens (OpenAI's `audio_tokens`, Gemini's `AUDIO` modality):
    /// billed at the entry's audio rate.
    pub audio_input: Option<u64>,
    /// Of `cache_write`, written to Anthropic's 1-hour cache (dearer than the
    /// 5-minute one). `None` where the vendor did not break writes down: priced at the
    /// dearer rate where the destination bills 1-hour writes.
    pub cache_write_1h: Option<u64>,
    /// The service tier the answer says it was served at (OpenAI `service_tier`).
    /// `None`: not said; the tier the request asked for is charged.
    pub served_tier: Option<ServedTier>,
    /// The answer reports billed work in a class purser has no rate for (audio or
    /// image tokens, predicted-output tokens, per-call server tools): priced at the
    /// rates it has, and marked `estimated`.
    pub unpriced: bool,
    /// Where the answer says its inference ran, where that sets the price (Anthropic's
    /// `usage.inference_geo`). `None`: not said.
    pub geo: Option<InferenceGeo>,
}

/// Where an answer says its inference ran, as its price reads it. Ordered: a reading
/// of one region outranks one of anywhere (`Usage::largest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum InferenceGeo {
    /// Wherever the vendor chose (`global`), or a model with no such choice
    /// (`not_available`): the listed rates.
    Anywhere,
    /// Kept in one region (`us`, or any other named): the regional premium.
    Region,
}

/// A response the vendor stored for a later turn to continue from (OpenAI Responses
/// API, `previous_response_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The vendor's id of the response.
    pub id: String,
    /// How many output items it holds (messages, reasoning, tool calls): each is framed
    /// as a message when a later turn reads it back as input.
    pub output_items: u64,
}

/// The service tier an answer says was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedTier {
    /// The standard rates (`default`, `auto`).
    Standard,
    Tier(crate::policy::plan::ServiceTier),
    /// A tier purser has no name for (`scale`, a new one): charged at the dearest
    /// declared rates and marked estimated.
    Unlisted,
}

impl ServedTier {
    /// An answer's `service_tier` value.
    pub fn parse(s: &str) -> ServedTier {
        match s {
            "default" | "auto" | "standard" => ServedTier::Standard,
            other => crate::policy::plan::ServiceTier::parse(other)
                .map_or(ServedTier::Unlisted, ServedTier::Tier),
        }
    }
}

/// A token count at this JSON pointer; `null`, absent or not a count is `None`.
pub(crate) fn count(v: &Value, pointer: &str) -> Option<u64> {
    // `Value::pointer` unescapes every segment into a new String (two `replace` calls
    // each): 3.5% of a request's instructions for the five usage figures. Purser's own
    // pointers carry no escapes, so they are walked in place; any other goes the long way.
    if pointer.contains('~') {
        return v.pointer(pointer).and_then(Value::as_u64);
    }
    let mut at = v;
    for seg in pointer.split('/').skip(1) {
        at = match at {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => return None,
        };
    }
    at.as_u64()
}

/// The largest of the readings reported; `None` when none was. Usage is read at its
/// largest reading (DESIGN 5): each figure a vendor sends implies a least count.
pub(crate) fn largest<const N: usize>(readings: [Option<u64>; N]) -> Option<u64> {
    readings.into_iter().flatten().max()
}

impl Usage {
    /// Two readings of one answer's usage (a stream may report it more than once):
    /// each figure at its largest, so a later, smaller or zeroed report never lowers
    /// what was billed. The served tier is the last one said.
    pub fn largest(self, other: Usage) -> Usage {
        Usage {
            input: largest([self.input, other.input]),
            cached_input: largest([self.cached_input, other.cached_input]),
            cache_write: largest([self.cache_write, other.cache_write]),
            output: largest([self.output, other.output]),
            reasoning: largest([self.reasoning, other.reasoning]),
            cache_write_1h: largest([self.cache_write_1h, other.cache_write_1h]),
            audio_input: largest([self.audio_input, other.audio_input]),
            served_tier: other.served_tier.or(self.served_tier),
            unpriced: self.unpriced || other.unpriced,
            geo: self.geo.max(other.geo),
        }
    }

    /// The client-facing usage block, in OpenAI's shape: `prompt_tokens` counts cached
    /// input and `completion_tokens` reasoning, with the parts in the `_details` OpenAI
    /// defines where the vendor reported them. A total the vendor did not report shows
    /// as 0 (OpenAI clients expect numbers); the cost purser recorded covers it.
    pub fn to_openai(&self) -> Value {
        let prompt = self.input.unwrap_or(0);
        let completion = self.output.unwrap_or(0);
        let mut u = serde_json::json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt.saturating_add(completion),
        });
        if let Some(n) = self.cached_input {
            u["prompt_tokens_details"] = serde_json::json!({"cached_tokens": n});
        }
        if let Some(n) = self.reasoning {
            u["completion_tokens_details"] = serde_json::json!({"reasoning_tokens": n});
        }
        u
    }
}

pub fn prepare(
    api: Api,
    dest: &Destination,
    base: &Endpoints,
    key: Option<&str>,
    req: &ChatRequest,
) -> Prepared {
    match api {
        Api::Openai => openai::prepare(dest, base, key, req),
        Api::Anthropic => anthropic::prepare(dest, base, key, req),
        Api::Gemini => gemini::prepare(dest, base, key, req),
    }
}

/// Translate a successful answer to the OpenAI chat.completion shape, with usage.
pub fn translate(api: Api, dest: &Destination, body: Value) -> (Value, Usage) {
    match api {
        Api::Openai => openai::translate(body),
        Api::Anthropic => anthropic::translate(dest, &body),
        Api::Gemini => gemini::translate(dest, &body),
    }
}

/// The usage in a complete answer of `api`, success or not: "usage found anywhere in
/// it is priced" (DESIGN 5), so an error body is searched too: the vendor's usage
/// object at the top, else the first one nested in the body (a relay puts it inside its
/// error), read at its largest reading like any other.
pub fn usage(api: Api, body: &Value) -> Usage {
    let key = match api {
        Api::Openai | Api::Anthropic => "usage",
        Api::Gemini => "usageMetadata",
    };
    let Some(u) = find_key(body, key, 4) else {
        return Usage::default();
    };
    match api {
        Api::Openai => openai::usage_block(u),
        Api::Anthropic => anthropic::usage(u),
        Api::Gemini => gemini::usage(u, true),
    }
}

/// The first object under `key`, breadth first, at most `depth` levels down.
fn find_key<'v>(v: &'v Value, key: &str, depth: usize) -> Option<&'v Value> {
    let mut level = vec![v];
    for _ in 0..=depth {
        let mut next = Vec::new();
        for v in level {
            match v {
                Value::Object(m) => {
                    if let Some(u) = m.get(key).filter(|u| u.is_object()) {
                        return Some(u);
                    }
                    next.extend(m.values());
                }
                Value::Array(a) => next.extend(a.iter()),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
            }
        }
        level = next;
    }
    None
}

/// Credentials per provider: read once, re-read on an auth failure so a rotated key
/// is picked up without a restart.
#[derive(Default)]
pub struct Credentials {
    cache: Mutex<HashMap<ProviderId, String>>,
}

fn read_source(p: &Provider) -> Result<Option<String>, UpstreamError> {
    let err = |detail: String| UpstreamError::Credential {
        provider: p.id.to_string(),
        detail,
    };
    match &p.credential {
        None => Ok(None),
        Some(Credential::Env(var)) => std::env::var(var)
            .map(Some)
            .map_err(|_| err(format!("environment variable {var} is not set"))),
        Some(Credential::File(path)) => std::fs::read_to_string(path)
            .map(|s| Some(s.trim().to_string()))
            .map_err(|e| err(format!("cannot read {path}: {e}"))),
    }
}

impl Credentials {
    pub fn get(&self, p: &Provider) -> Result<Option<String>, UpstreamError> {
        if p.credential.is_none() {
            return Ok(None);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&p.id) {
            return Ok(Some(k.clone()));
        }
        let k = read_source(p)?;
        if let Some(k) = &k {
            cache.insert(p.id.clone(), k.clone());
        }
        Ok(k)
    }

    /// Re-read the source; true when it now yields a different secret than `used`.
    pub fn refresh(&self, p: &Provider, used: Option<&str>) -> bool {
        match read_source(p) {
            Ok(Some(new)) if Some(new.as_str()) != used => {
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(p.id.clone(), new);
                true
            }
            Ok(_) | Err(_) => false,
        }
    }
}

/// The call, with the body serialized here and its `Value` dropped before anything is
/// awaited: a request in flight holds its body as sent, not the translated tree too
/// (with a 64 kB prompt, the tree and the serializer's doubled buffer were 40% of what
/// a request in flight held while it waited on the upstream).
fn request(client: &reqwest::Client, prepared: Prepared) -> reqwest::RequestBuilder {
    let Prepared { url, headers, body } = prepared;
    let mut rb = match url {
        Endpoint::Parsed(u) => client.post(u),
        Endpoint::Text(t) => client.post(t),
    };
    let mut bytes = body.into_bytes();
    // Sized from the tree, the buffer is over by a few bytes a number; escapes in a
    // long string can leave it up to twice what it holds while the call waits.
    if bytes.capacity() - bytes.len() > bytes.len() / 8 {
        bytes.shrink_to_fit();
    }
    rb = rb.header("content-type", "application/json").body(bytes);
    for (k, v) in headers {
        rb = rb.header(k, v);
    }
    rb
}

/// Send one prepared call with the attempt's timeout.
pub async fn send(client: &reqwest::Client, prepared: Prepared, timeout: Duration) -> Observation {
    let rb = request(client, prepared).timeout(timeout);
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return Observation::Transport(transport_kind(&e), e.to_string()),
    };
    let status = resp.status().as_u16();
    let headers = header_list(&resp);
    match body_text(resp).await {
        Ok(body) => Observation::Answer {
            status,
            headers,
            body,
        },
        Err(e) => Observation::Transport(transport_kind(&e), e.to_string()),
    }
}

/// A streamed call's first answer: either a complete (error) answer to classify as
/// usual, or a 2xx whose body is read event by event.
pub enum Opened {
    Complete(Observation),
    Streaming {
        status: u16,
        headers: Vec<(String, String)>,
        body: reqwest::Response,
    },
}

/// Send a streaming call. The provider's timeout bounds the wait for the answer's
/// head here and each gap between events later, not the whole generation.
pub async fn open_stream(
    client: &reqwest::Client,
    prepared: Prepared,
    timeout: Duration,
) -> Opened {
    let rb = request(client, prepared);
    let resp = match tokio::time::timeout(timeout, rb.send()).await {
        Err(_) => {
            return Opened::Complete(Observation::Transport(
                TransportFailure::ResponseTimeout,
                format!("no answer within {} ms", timeout.as_millis()),
            ));
        }
        Ok(Err(e)) => {
            return Opened::Complete(Observation::Transport(transport_kind(&e), e.to_string()));
        }
        Ok(Ok(r)) => r,
    };
    let status = resp.status().as_u16();
    let headers = header_list(&resp);
    if !resp.status().is_success() {
        return Opened::Complete(match tokio::time::timeout(timeout, body_text(resp)).await {
            Ok(Ok(body)) => Observation::Answer {
                status,
                headers,
                body,
            },
            Ok(Err(e)) => Observation::Transport(transport_kind(&e), e.to_string()),
            Err(_) => Observation::Transport(
                TransportFailure::ResponseTimeout,
                "the error body did not arrive in time".into(),
            ),
        });
    }
    Opened::Streaming {
        status,
        headers,
        body: resp,
    }
}

/// The answer's body as text, replacing invalid UTF-8 as `Response::text` does.
/// `text()` runs every body through the lossy decoder, which costs more than the check
/// of a valid one (1.5% of a request's instructions).
async fn body_text(resp: reqwest::Response) -> Result<String, reqwest::Error> {
    let bytes = resp.bytes().await?;
    Ok(match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    })
}

fn header_list(resp: &reqwest::Response) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .filter_map(|(k, v)| {
            v.to_str()
                .ok()
                .map(|v| (k.as_str().to_string(), v.to_string()))
        })
        .collect()
}

/// Connect errors happen before any byte of the request is sent; anything else after
/// the connection was made (a reset, a cut body) may have reached the model.
pub(crate) fn transport_kind(e: &reqwest::Error) -> TransportFailure {
    if e.is_connect() {
        if e.is_timeout() {
            TransportFailure::ConnectTimeout
        } else {
            TransportFailure::Connect
        }
    } else if e.is_timeout() {
        TransportFailure::ResponseTimeout
    } else {
        TransportFailure::Dropped
    }
}

/// Who spoke a conversational turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaker {
    User,
    Assistant,
}

/// One piece of a turn, in a vendor-neutral form the adapters render.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// An image by URL: a `data:` URL carries the bytes, any other is a reference.
    Image(String),
    /// An assistant's call of a function; `arguments` parsed from OpenAI's JSON text
    /// (kept as a string when it is not JSON, so the vendor objects, not purser).
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
    },
    /// A `tool` message answering the call `id`; `name` is that call's function.
    ToolResult {
        id: String,
        name: String,
        content: String,
    },
}

/// A conversational turn: who spoke, and what.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub speaker: Speaker,
    pub parts: Vec<Part>,
}

/// The client's messages split the way Anthropic and Gemini want them: system text
/// lifted out, the rest as turns. A `tool` message is a user turn of one tool result;
/// consecutive tool results are kept in one turn, because both vendors want every
/// result of a round of calls in the turn that follows it. What `fields::check`
/// refuses is not rendered here.
pub fn turns(body: &Value) -> (Vec<String>, Vec<Turn>) {
    let mut system = Vec::new();
    let mut turns: Vec<Turn> = Vec::new();
    // Call id → function name, for results (Gemini names a response by its function).
    let mut called: HashMap<String, String> = HashMap::new();
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let content = m.get("content").unwrap_or(&Value::Null);
        match m.get("role").and_then(Value::as_str).unwrap_or("user") {
            "system" | "developer" => system.push(content_text(content)),
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let part = Part::ToolResult {
                    name: called.get(&id).cloned().unwrap_or_default(),
                    id,
                    content: content_text(content),
                };
                match turns.last_mut() {
                    Some(t)
                        if t.speaker == Speaker::User
                            && t.parts.iter().all(|p| matches!(p, Part::ToolResult { .. })) =>
                    {
                        t.parts.push(part)
                    }
                    _ => turns.push(Turn {
                        speaker: Speaker::User,
                        parts: vec![part],
                    }),
                }
            }
            role => {
                let speaker = if role == "assistant" {
                    Speaker::Assistant
                } else {
                    Speaker::User
                };
                let mut parts = content_parts(content);
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let text = |p: &str| {
                        c.pointer(p)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string()
                    };
                    let (id, name, args) = (
                        text("/id"),
                        text("/function/name"),
                        text("/function/arguments"),
                    );
                    called.insert(id.clone(), name.clone());
                    let arguments = if args.trim().is_empty() {
                        Value::Object(serde_json::Map::new())
                    } else {
                        serde_json::from_str(&args).unwrap_or(Value::String(args))
                    };
                    parts.push(Part::ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
                turns.push(Turn { speaker, parts });
            }
        }
    }
    (system, turns)
}

/// A message's `content` as parts: a string is one text part; text and image parts
/// are kept in order (other part types are refused by `fields::check`).
fn content_parts(content: &Value) -> Vec<Part> {
    match content {
        Value::String(s) => vec![Part::Text(s.clone())],
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p.get("type").and_then(Value::as_str) {
                Some("text") => p
                    .get("text")
                    .and_then(Value::as_str)
                    .map(|t| Part::Text(t.into())),
                Some("image_url") => p
                    .pointer("/image_url/url")
                    .or_else(|| p.get("image_url"))
                    .and_then(Value::as_str)
                    .map(|u| Part::Image(u.into())),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A `data:` URL's media type and base64 payload.
pub fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    Some((mime, data))
}

/// A media type guessed from a URL's extension, for vendors that want one with a
/// reference (Gemini `fileData`).
pub fn mime_from_url(url: &str) -> Option<&'static str> {
    let path = url
        .split(['?', '#'])
        .next()
        .unwrap_or(url)
        .to_ascii_lowercase();
    let ext = path.rsplit('.').next()?;
    Some(match ext {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "pdf" => "application/pdf",
        // Video and audio, so Gemini receives (and the bound counts) them as what they are.
        "mp4" => "video/mp4",
        "mpeg" | "mpg" => "video/mpeg",
        "mov" => "video/quicktime",
        "webm" => "video/webm",
        "avi" => "video/x-msvideo",
        "wmv" => "video/x-ms-wmv",
        "flv" => "video/x-flv",
        "3gp" => "video/3gpp",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "aac" => "audio/aac",
        "ogg" => "audio/ogg",
        "flac" => "audio/flac",
        "aiff" => "audio/aiff",
        "txt" => "text/plain",
        "html" => "text/html",
        "csv" => "text/csv",
        _ => return None,
    })
}

/// OpenAI `stop` (a string or a list) as a list.
pub fn stop_sequences(body: &Value) -> Option<Value> {
    match body.get("stop") {
        Some(Value::String(s)) => Some(Value::Array(vec![Value::String(s.clone())])),
        Some(Value::Array(a)) => Some(Value::Array(a.clone())),
        _ => None,
    }
}

/// A translated answer in the OpenAI chat.completion shape.
pub fn completion(id: String, model: &str, message: Value, finish: &str, usage: Usage) -> Value {
    serde_json::json!({
        "id": id,
        "object": "chat.completion",
        "created": time::OffsetDateTime::now_utc().unix_timestamp(),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage.to_openai(),
    })
}

/// All text of a message's `content` (string or content parts).
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Jurisdiction, ModelName, ProviderId};
    use crate::money::PricePerMTok;
    use crate::policy::plan::Tier;
    use serde_json::json;

    fn dest(api: Api) -> Destination {
        Destination {
            provider: ProviderId::new("p"),
            model: ModelName::new("m"),
            upstream_model: "up-m".into(),
            api,
            jurisdiction: Jurisdiction::new("eu"),
            tier: Tier::Account,
            context_window: 1000,
            input_per_mtok: PricePerMTok::new("1".parse().unwrap()),
            output_per_mtok: PricePerMTok::new("1".parse().unwrap()),
            cached_input_per_mtok: None,
            cache_write_per_mtok: None,
            terms: Default::default(),
        }
    }

    /// Parked, a request keeps only its bytes; unparked, it is what it was, its
    /// translation made again on need. Without bytes it stays parsed.
    #[test]
    fn a_parked_request_is_read_again_from_its_bytes() {
        let body = json!({"model": "m", "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
        let mut r = ChatRequest::new(
            body.clone(),
            5,
            false,
            crate::ingress::Ingress::Messages,
            Vec::new(),
        );
        r.raw = Some(bytes::Bytes::from(serde_json::to_vec(&body).unwrap()));
        let chat = r.as_chat().unwrap().clone();
        r.park();
        assert_eq!(r.body, Value::Null);
        assert!(r.chat.get().is_none(), "the translation outlived the park");
        r.unpark().unwrap();
        assert_eq!(r.body, body);
        assert_eq!(r.as_chat().unwrap(), &chat);
        // Without bytes there is nothing to return to: parking keeps the body.
        let mut kept = ChatRequest::new(
            body.clone(),
            5,
            false,
            crate::ingress::Ingress::Chat,
            vec![],
        );
        kept.park();
        assert_eq!(kept.body, body);
        // Bytes that no longer parse are an error, not an empty body.
        let mut broken = ChatRequest::new(body, 5, false, crate::ingress::Ingress::Chat, vec![]);
        broken.raw = Some(bytes::Bytes::from_static(b"{not json"));
        broken.park();
        assert!(broken.unpark().is_err());
    }

    fn req() -> ChatRequest {
        ChatRequest {
            body: json!({"model": "m", "stop": "END", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"}]}),
            max_tokens: 77,
            stream: false,
            ingress: crate::ingress::Ingress::Chat,
            headers: Vec::new(),
            chat: Default::default(),
            raw: None,
        }
    }

    #[test]
    fn anthropic_lifts_system_and_always_sets_max_tokens() {
        let p = prepare(
            Api::Anthropic,
            &dest(Api::Anthropic),
            &Endpoints::new("http://x/v1"),
            Some("k"),
            &req(),
        );
        assert_eq!(p.url, "http://x/v1/messages");
        assert_eq!(p.body.to_value()["system"], "be brief");
        assert_eq!(p.body.to_value()["max_tokens"], 77);
        assert_eq!(p.body.to_value()["model"], "up-m");
        assert_eq!(p.body.to_value()["messages"].as_array().unwrap().len(), 3);
        assert_eq!(p.body.to_value()["stop_sequences"], json!(["END"]));
        let (v, u) = translate(
            Api::Anthropic,
            &dest(Api::Anthropic),
            json!({"id": "msg_1", "content": [{"type": "text", "text": "ok"}], "stop_reason": "max_tokens", "usage": {"input_tokens": 5, "output_tokens": 2}}),
        );
        assert_eq!((u.input, u.output), (Some(5), Some(2)));
        assert_eq!(v["choices"][0]["message"]["content"], "ok");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn gemini_maps_roles_and_generation_config() {
        let p = prepare(
            Api::Gemini,
            &dest(Api::Gemini),
            &Endpoints::new("http://x/v1beta"),
            Some("k"),
            &req(),
        );
        assert_eq!(p.url, "http://x/v1beta/models/up-m:generateContent");
        assert_eq!(
            p.body.to_value()["systemInstruction"]["parts"][0]["text"],
            "be brief"
        );
        assert_eq!(p.body.to_value()["contents"][1]["role"], "model");
        assert_eq!(p.body.to_value()["generationConfig"]["maxOutputTokens"], 77);
        assert_eq!(
            p.body.to_value()["generationConfig"]["stopSequences"],
            json!(["END"])
        );
        let (v, u) = translate(
            Api::Gemini,
            &dest(Api::Gemini),
            json!({"candidates": [{"content": {"parts": [{"text": "a"}, {"text": "b"}]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4}}),
        );
        assert_eq!((u.input, u.output), (Some(3), Some(4)));
        assert_eq!(v["choices"][0]["message"]["content"], "ab");
    }

    #[test]
    fn a_missing_credential_tells_the_client_nothing_about_where_secrets_live() {
        for (source, secret_place) in [
            (
                Credential::Env("PURSER_TEST_SURELY_UNSET_VAR".into()),
                "PURSER_TEST_SURELY_UNSET_VAR",
            ),
            (
                Credential::File("/run/secrets/purser-test-absent".into()),
                "/run/secrets/purser-test-absent",
            ),
        ] {
            let p = Provider {
                id: ProviderId::new("openai-us"),
                api: Api::Openai,
                base_url: "https://api.openai.com/v1".into(),
                jurisdiction: Jurisdiction::new("us"),
                tier: Tier::Account,
                credential: Some(source),
                timeout_ms: 1000,
                circuit: Default::default(),
                models: Default::default(),
                endpoints: Endpoints::new("https://api.openai.com/v1"),
            };
            let e = Credentials::default().get(&p).unwrap_err();
            let shown = e.to_string();
            assert!(shown.contains("openai-us"), "{shown}");
            assert!(!shown.contains(secret_place), "{shown}");
            assert!(!shown.contains('/'), "{shown}");
            assert!(e.operator_detail().contains(secret_place));
        }
    }

    /// On OpenAI's platform a request naming no tier is pinned to the standard one, so
    /// the project's settings cannot pick `priority` for it; a tier the client named is
    /// kept, and nothing is added elsewhere.
    #[test]
    fn openai_pins_an_unset_tier_only_where_the_project_would_pick_it() {
        let tier = |base: &str, body: Value, ingress: crate::ingress::Ingress| {
            let mut r = req();
            r.body = body;
            r.ingress = ingress;
            prepare(
                Api::Openai,
                &dest(Api::Openai),
                &Endpoints::new(base),
                None,
                &r,
            )
            .body
            .to_value()
            .get("service_tier")
            .cloned()
        };
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let responses = json!({"model": "m", "input": "hi"});
        for (body, ingress) in [
            (chat.clone(), crate::ingress::Ingress::Chat),
            (responses, crate::ingress::Ingress::Responses),
        ] {
            assert_eq!(
                tier("https://api.openai.com/v1", body.clone(), ingress),
                Some(json!("default"))
            );
            assert_eq!(
                tier("https://eu.api.openai.com/v1", body.clone(), ingress),
                Some(json!("default"))
            );
            assert_eq!(
                tier("https://api.openai.com./v1", body.clone(), ingress),
                Some(json!("default"))
            );
            assert_eq!(tier("http://x/v1", body.clone(), ingress), None);
            assert_eq!(tier("https://api.groq.com/openai/v1", body, ingress), None);
        }
        // `null` and `auto` leave the pick to the project as absence does.
        for asked in [json!(null), json!("auto")] {
            let mut b = chat.clone();
            b["service_tier"] = asked;
            assert_eq!(
                tier(
                    "https://api.openai.com/v1",
                    b,
                    crate::ingress::Ingress::Chat
                ),
                Some(json!("default"))
            );
        }
        let mut flex = chat.clone();
        flex["service_tier"] = json!("flex");
        assert_eq!(
            tier(
                "https://api.openai.com/v1",
                flex,
                crate::ingress::Ingress::Chat
            ),
            Some(json!("flex"))
        );
        // An entry that declares only `flex` proved a request naming none at the
        // standard rates: still pinned (the project may pick priority). One that
        // declares `priority` proved it at that: the project's pick is left alone.
        for (declared, pinned) in [
            (
                crate::policy::plan::ServiceTier::Flex,
                Some(json!("default")),
            ),
            (crate::policy::plan::ServiceTier::Priority, None),
        ] {
            let mut d = dest(Api::Openai);
            let rates = crate::policy::plan::Rates {
                input_per_mtok: d.input_per_mtok,
                output_per_mtok: d.output_per_mtok,
                cached_input_per_mtok: None,
            };
            d.terms.service_tiers.insert(declared, rates);
            let mut r = req();
            r.body = chat.clone();
            let base = Endpoints::new("https://api.openai.com/v1");
            let sent = prepare(Api::Openai, &d, &base, None, &r).body.to_value();
            assert_eq!(sent.get("service_tier").cloned(), pinned, "{declared:?}");
        }
    }

    #[test]
    fn openai_passes_through_with_the_proven_bound() {
        let p = prepare(
            Api::Openai,
            &dest(Api::Openai),
            &Endpoints::new("http://x/v1"),
            Some("k"),
            &req(),
        );
        assert_eq!(p.body.to_value()["max_tokens"], 77);
        assert_eq!(p.body.to_value()["model"], "up-m");
        assert_eq!(p.headers, vec![("authorization", "Bearer k".to_string())]);
    }
}
