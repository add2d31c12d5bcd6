//! The input bound of one call, computed over the request **as it will be sent** to a
//! destination: the translated body, whatever field or part carries its text, plus
//! that API's documented overheads (`OVERHEADS`, one row per overhead with its source).
//!
//! Why bytes bound tokens: no tokenizer purser speaks to emits more tokens than the
//! UTF-8 bytes of the text it reads (byte-level BPE and SentencePiece with byte
//! fallback make at most one token per byte). The body's serialized JSON contains
//! every string the vendor renders and every number and key; what a template renders
//! as JSON again (tool schemas, tool results, a call's arguments, which servers parse
//! and re-render) counts as the largest such rendering (`json_len`), so the count
//! bounds the text. What a vendor adds around it (role markers,
//! reply priming, tool framing, the tool-use system prompt) is an overhead row.
//!
//! A part whose tokens cannot be read from its bytes (image, audio, video, file, a
//! remote URL) is counted at the bound its model entry declares (`media_tokens`), or
//! cannot be bounded: `Unbounded` names it. Knows nothing of policies: whether that
//! refuses the request is the gateway's call.

use serde_json::Value;

use super::ChatRequest;
use crate::ingress::Ingress;
use crate::policy::plan::{Api, Destination, Endpoints, MediaKind};

/// What an overhead is counted per.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// Once per call: reply priming, BOS, the generation prompt.
    Request,
    /// Each message: role markers and turn framing.
    Message,
    /// Each tool (function) declared: the framing its rendering adds.
    Tool,
    /// Once when any tool is declared: the vendor's tool-use system prompt.
    ToolUsePrompt,
    /// Each tool whose definition the vendor writes, not the client (a typed tool the
    /// client runs: Anthropic's bash, text editor, computer, memory; OpenAI's shell,
    /// apply_patch): the body carries its type name, the prompt carries the vendor's
    /// definition of it, and any system prompt that comes with it.
    DefinedTool,
}

/// One documented overhead: tokens `api` adds `per` something, and where the figure is
/// from. Where the vendor documents none, the row says so and carries a margin.
#[derive(Debug, Clone, Copy)]
pub struct Overhead {
    pub api: Api,
    pub per: Per,
    pub tokens: u64,
    pub source: &'static str,
}

/// Every overhead purser counts. One row per (API, per): `overhead` sums the rows.
pub static OVERHEADS: &[Overhead] = &[
    Overhead {
        api: Api::Openai,
        per: Per::Request,
        tokens: 64,
        source: "OpenAI cookbook, How to count tokens with tiktoken: every reply is primed with 3 tokens; OpenAI-compatible chat templates (Llama 3, Qwen, Mistral) add a BOS and a generation prompt of under 10. 64 covers both",
    },
    Overhead {
        api: Api::Openai,
        per: Per::Message,
        tokens: 32,
        source: "OpenAI cookbook, How to count tokens with tiktoken: 3 tokens per message, 1 more with a name; chat templates of OpenAI-compatible servers frame a turn in under 10 (Llama 3 header and end-of-turn tokens). 32 covers both",
    },
    Overhead {
        api: Api::Openai,
        per: Per::Tool,
        tokens: 32,
        source: "OpenAI cookbook, How to call functions with chat models / token counting: 7 tokens to open a function and 12 to close the list; the properties' own text is in the body's bytes, which are longer than OpenAI's TypeScript-like rendering of them",
    },
    Overhead {
        api: Api::Openai,
        per: Per::ToolUsePrompt,
        tokens: 256,
        source: "OpenAI documents none beyond the per-function tokens; chat templates of OpenAI-compatible servers wrap tools in an instruction (Hermes/Qwen 2.5 `# Tools` preamble, Llama 3.1 `Environment: ipython` prompt), about 100-150 tokens: 256",
    },
    Overhead {
        api: Api::Anthropic,
        per: Per::Request,
        tokens: 64,
        source: "not documented by Anthropic; the same reply-priming margin as OpenAI's",
    },
    Overhead {
        api: Api::Anthropic,
        per: Per::Message,
        tokens: 32,
        source: "not documented by Anthropic; the same turn-framing margin as OpenAI's",
    },
    Overhead {
        api: Api::Anthropic,
        per: Per::Tool,
        tokens: 32,
        source: "Anthropic, Tool use pricing: tool names, descriptions and schemas are billed as input (their bytes are counted); 32 per tool for their framing",
    },
    Overhead {
        api: Api::Anthropic,
        per: Per::ToolUsePrompt,
        tokens: 530,
        source: "Anthropic, Tool use pricing and tokens (docs.anthropic.com/en/docs/tool-use-pricing-and-tokens): a tool-use system prompt is added when `tools` is present; the largest figure listed is 530 (Claude 3 Opus, tool_choice auto; Claude 4 models 346)",
    },
    Overhead {
        api: Api::Gemini,
        per: Per::Request,
        tokens: 64,
        source: "not documented by Google; the same reply-priming margin as OpenAI's",
    },
    Overhead {
        api: Api::Gemini,
        per: Per::Message,
        tokens: 32,
        source: "not documented by Google; the same turn-framing margin as OpenAI's",
    },
    Overhead {
        api: Api::Gemini,
        per: Per::Tool,
        tokens: 32,
        source: "Gemini, Function calling: declarations are billed as input (their bytes are counted); 32 per declaration for their framing",
    },
    Overhead {
        api: Api::Gemini,
        per: Per::ToolUsePrompt,
        tokens: 256,
        source: "not documented by Google (usageMetadata.toolUsePromptTokenCount counts tool results, which purser adds to input); the OpenAI-compatible margin: 256",
    },
    Overhead {
        api: Api::Openai,
        per: Per::DefinedTool,
        tokens: 1_280,
        source: "OpenAI documents no token count for the definitions of its typed tools (shell, apply_patch, local_shell); Anthropic's figures for the same kind of tool are the margin: 1,280",
    },
    Overhead {
        api: Api::Anthropic,
        per: Per::DefinedTool,
        tokens: 1_280,
        source: "Anthropic, Computer use / Text editor / Bash tool docs: the tool's definition adds 735 (computer), 700 (text editor), 245 (bash) input tokens, and computer use adds a system prompt of 466-499: the largest tool with its prompt, 1,234, rounded up to 1,280",
    },
    Overhead {
        api: Api::Gemini,
        per: Per::DefinedTool,
        tokens: 1_280,
        source: "Gemini takes no typed client tools (a typed tool reaches it refused or as a function); the same margin as the other APIs: 1,280",
    },
];

/// Tokens `api` adds per `per`: the sum of its rows.
pub fn overhead(api: Api, per: Per) -> u64 {
    OVERHEADS
        .iter()
        .filter(|o| o.api == api && o.per == per)
        .map(|o| o.tokens)
        .sum()
}

pub use crate::selection::Unbounded;

/// How parts without a declared bound are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undeclared {
    /// Refused: the bound must be a proof (hard ceilings, budgets).
    Refuse,
    /// Counted at this many tokens, a stand-in and not a bound (soft, no budget).
    StandIn(u64),
}

/// A non-text part of the client's messages, as `api` will receive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media {
    pub param: String,
    /// `None`: the kind cannot be told (a remote URL of unknown type, a part type
    /// purser does not know): every kind's bound is needed.
    pub kind: Option<MediaKind>,
}

/// Part types whose tokens are their text: counted by bytes. Every other part type is
/// media, which a rule over unlisted types must treat as unbounded until declared.
const TEXT_PARTS: [&str; 2] = ["text", "refusal"];

fn is_media_part(p: &Value) -> bool {
    !matches!(p.get("type").and_then(Value::as_str), Some(t) if TEXT_PARTS.contains(&t))
}

/// Every media part of the client's messages and its kind as `api` receives it.
pub fn media_parts(api: Api, body: &Value) -> Vec<Media> {
    let mut out = Vec::new();
    for (i, m) in messages(body).iter().enumerate() {
        // An assistant turn's `audio` names an earlier audio answer by id: the vendor
        // bills that audio as input, which its few bytes do not bound.
        if m.get("audio").is_some_and(|a| !a.is_null()) {
            out.push(Media {
                param: format!("messages[{i}].audio"),
                kind: Some(MediaKind::Audio),
            });
        }
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            if is_media_part(p) {
                out.push(Media {
                    param: format!("messages[{i}].content[{j}]"),
                    kind: kind(api, p),
                });
            }
        }
    }
    out
}

/// Every media block of an Anthropic Messages body as it is sent (natively), at any
/// depth (a tool result carries images and documents too). A block's tokens are its
/// bytes unless it carries its content by reference or encoded: a `source` object
/// (base64, URL or file), or a `file_id`. A text document (`source.type: text`) is
/// its bytes. A rule over block types, so a type purser has not seen is still judged.
fn by_reference(b: &Value) -> bool {
    b.get("file_id").is_some()
        || b.get("source")
            .filter(|s| s.is_object())
            .is_some_and(|s| s.get("type").and_then(Value::as_str) != Some("text"))
}

/// Every media part of a Responses body's `input`, at any depth: an image, file or
/// audio part is media whether it carries its bytes or a reference, because its tokens
/// are not its bytes.
pub fn responses_media_parts(body: &Value) -> Vec<Media> {
    fn walk(v: &Value, at: &str, out: &mut Vec<Media>) {
        match v {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{at}[{i}]"), out);
                }
            }
            Value::Object(o) => {
                let kind = match o.get("type").and_then(Value::as_str) {
                    // A computer-use screenshot is an image whatever carries it.
                    Some("input_image" | "computer_screenshot") => Some(Some(MediaKind::Image)),
                    Some("input_file") => Some(Some(MediaKind::File)),
                    Some("input_audio") => Some(Some(MediaKind::Audio)),
                    _ => None,
                };
                if let Some(kind) = kind {
                    out.push(Media {
                        param: at.to_string(),
                        kind,
                    });
                    return;
                }
                for (k, inner) in o {
                    if inner.is_array() || inner.is_object() {
                        walk(inner, &format!("{at}.{k}"), out);
                    }
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }
    let mut out = Vec::new();
    if let Some(input) = body.get("input") {
        walk(input, "input", &mut out);
    }
    out
}

pub fn native_media_parts(body: &Value) -> Vec<Media> {
    fn walk(blocks: &[Value], at: &str, out: &mut Vec<Media>) {
        for (j, b) in blocks.iter().enumerate() {
            let here = format!("{at}[{j}]");
            if by_reference(b) {
                out.push(Media {
                    param: here.clone(),
                    kind: match b.get("type").and_then(Value::as_str) {
                        Some("image") => Some(MediaKind::Image),
                        Some("document") => Some(MediaKind::File),
                        _ => None,
                    },
                });
            }
            if let Some(Value::Array(inner)) = b.get("content") {
                walk(inner, &format!("{here}.content"), out);
            }
        }
    }
    let mut out = Vec::new();
    for (i, m) in messages(body).iter().enumerate() {
        if let Some(Value::Array(blocks)) = m.get("content") {
            walk(blocks, &format!("messages[{i}].content"), &mut out);
        }
    }
    out
}

fn messages(body: &Value) -> &[Value] {
    body.get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The kind of a media part at `api`. OpenAI and Anthropic read an `image_url` as an
/// image whatever it points at; Gemini receives it as `inlineData`/`fileData` and reads
/// it by its media type, so there a video or PDF URL is a video or a file.
fn kind(api: Api, p: &Value) -> Option<MediaKind> {
    match p.get("type").and_then(Value::as_str)? {
        "image_url" => match api {
            Api::Openai | Api::Anthropic => Some(MediaKind::Image),
            Api::Gemini => {
                let url = p
                    .pointer("/image_url/url")
                    .or_else(|| p.get("image_url"))
                    .and_then(Value::as_str)?;
                let mime = match super::data_url(url) {
                    Some((mime, _)) => Some(mime),
                    None => super::mime_from_url(url),
                };
                mime.and_then(kind_of_mime)
            }
        },
        "image" | "input_image" => Some(MediaKind::Image),
        "input_audio" | "audio_url" | "audio" => Some(MediaKind::Audio),
        "video_url" | "video" => Some(MediaKind::Video),
        "file" | "document" => Some(MediaKind::File),
        _ => None,
    }
}

/// The kind a media type is billed as; `None` for one purser cannot place.
pub fn kind_of_mime(mime: &str) -> Option<MediaKind> {
    let top = mime.split('/').next().unwrap_or_default();
    match top {
        "image" => Some(MediaKind::Image),
        "audio" => Some(MediaKind::Audio),
        "video" => Some(MediaKind::Video),
        "application" | "text" => Some(MediaKind::File),
        _ => None,
    }
}

/// Whether the body as it leaves for `dest` carries a `cache_control` marker anywhere:
/// it asks for a cache write, which the vendor behind the API may bill
/// (`Applied::marked`). An OpenAI-API body is the client's, marks kept (a relay
/// passes them on); a Messages body translated for it has them dropped
/// (`from_messages`). Anthropic's API bills writes whatever is sent, and Gemini's
/// translation carries no marks.
pub fn cache_marked(dest: &Destination, req: &ChatRequest) -> bool {
    cache_marked_for(dest, request_marks(req))
}

/// Whether the body an OpenAI-API destination receives for `req` carries a mark: the
/// client's (chat, Responses), not a Messages body's translation, which drops marks.
/// Found once per request (`cache_marked_for` then serves every candidate): a
/// Messages body, Claude Code's, is not walked at all.
pub fn request_marks(req: &ChatRequest) -> bool {
    match req.ingress {
        Ingress::Messages => false,
        Ingress::Chat | Ingress::Responses => marks_cache(&req.body),
    }
}

/// `cache_marked` of `dest`, with `request_marks` found once.
pub fn cache_marked_for(dest: &Destination, request_marked: bool) -> bool {
    match dest.api {
        Api::Openai => request_marked,
        Api::Anthropic | Api::Gemini => false,
    }
}

/// Whether a client's body carries a `cache_control` marker: on a message, a part, a
/// tool or the body, wherever a relay may pass it on, but not inside data a request
/// carries (a tool's parameter schema, a format, a call's arguments), where a member
/// of that name is no mark.
pub fn marks_cache(body: &Value) -> bool {
    has_key(body, "cache_control")
}

/// Whether `key` names a member of any object in `v`, data (`is_data`) left out.
fn has_key(v: &Value, key: &str) -> bool {
    match v {
        Value::Object(o) => o
            .iter()
            .any(|(k, x)| k == key || (!is_data(k) && has_key(x, key))),
        Value::Array(a) => a.iter().any(|x| has_key(x, key)),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => false,
    }
}

/// Members whose value is data the request carries, not the request's own structure:
/// JSON schemas, formats, a call's arguments. (Not `input`: the Responses API's
/// messages are there.)
fn is_data(k: &str) -> bool {
    matches!(
        k,
        "parameters"
            | "input_schema"
            | "response_format"
            | "json_schema"
            | "schema"
            | "arguments"
            | "properties"
    )
}

/// The media parts of `req` as `api` receives them.
fn media_sent(api: Api, req: &ChatRequest) -> Vec<Media> {
    match req.ingress {
        Ingress::Messages => native_media_parts(&req.body),
        Ingress::Responses => responses_media_parts(&req.body),
        Ingress::Chat => media_parts(api, &req.body),
    }
}

/// Whether a part of `kind` (`None`: one purser cannot tell) may be billed by `api` at
/// the audio rate: audio, or a part of unknown kind; on Gemini a video too (its
/// soundtrack is counted as audio). Anthropic takes no audio. The gateway, `explain`
/// and replay all ask this.
pub fn may_be_audio(api: Api, kind: Option<MediaKind>) -> bool {
    match (api, kind) {
        (Api::Anthropic, _) => false,
        (_, Some(MediaKind::Audio) | None) | (Api::Gemini, Some(MediaKind::Video)) => true,
        (Api::Openai, Some(MediaKind::Video)) | (_, Some(MediaKind::Image | MediaKind::File)) => {
            false
        }
    }
}

/// Whether `req` sends `dest` a part that may be billed at the audio rate: its input
/// is then bounded at that rate too (`TokenBounds::audio`). Walked only for an entry
/// that lists the rate (elsewhere such a part is refused under a proof).
pub fn sends_audio(dest: &Destination, req: &ChatRequest) -> bool {
    dest.terms.audio_input_per_mtok.is_some()
        && media_sent(dest.api, req)
            .iter()
            .any(|m| may_be_audio(dest.api, m.kind))
}

/// Why a part that may be audio has no bound at a destination that lists no audio rate.
pub fn audio_unpriced(param: String) -> Unbounded {
    Unbounded {
        what: "an audio part (or one that may be audio) is billed at the model's audio rate, which its entry does not declare (`audio_input_per_mtok`)".into(),
        param,
    }
}

/// The input-token bound of sending `req` to `dest`: the translated body's bytes
/// (media parts excluded), each media part at its declared bound, and the overheads.
pub fn input_tokens(
    dest: &Destination,
    req: &ChatRequest,
    undeclared: Undeclared,
) -> Result<u64, Unbounded> {
    let api = dest.api;
    let mut media_tokens = 0u64;
    for m in media_sent(api, req) {
        // Audio is billed at a rate of its own, above text: without it in the table no
        // count of audio tokens bounds the cost (a part of a kind purser cannot tell
        // may be audio).
        if may_be_audio(api, m.kind)
            && undeclared == Undeclared::Refuse
            && dest.terms.audio_input_per_mtok.is_none()
        {
            return Err(audio_unpriced(m.param));
        }
        let declared = dest.terms.media_tokens.bound(m.kind);
        let tokens = match (declared, undeclared) {
            (Some(t), _) => t,
            (None, Undeclared::StandIn(t)) => t,
            (None, Undeclared::Refuse) => {
                return Err(Unbounded {
                    what: match m.kind {
                        Some(k) => format!(
                            "a {k} part, whose tokens cannot be bounded from its bytes, has no declared bound (`media_tokens.{k}` in the model entry)",
                            k = k.as_str()
                        ),
                        None => "a part of a kind purser cannot tell (an unknown part type, or a URL of unknown media type) needs every kind in `media_tokens` declared".into(),
                    },
                    param: m.param,
                });
            }
        };
        media_tokens = media_tokens.saturating_add(tokens);
    }
    // A Messages body to a chat destination is bounded as the chat body it becomes:
    // its tool results are messages of their own there.
    let translated = match (req.ingress, api) {
        // A Responses body to Anthropic or Gemini is the chat body it becomes there,
        // framed by that adapter: counted as chat messages and tools.
        (Ingress::Messages, Api::Openai) | (Ingress::Responses, Api::Anthropic | Api::Gemini) => {
            Some(req.as_chat().map_err(|u| Unbounded {
                what: format!("it has no faithful chat-completions form: {}", u.why),
                param: u.param.clone(),
            })?)
        }
        _ => None,
    };
    let text = match translated {
        // Walked as the vendor's body (`prepare` frames the kept translation).
        Some(_) if api != Api::Openai => sent_bytes(dest, req),
        Some(chat) => content_walk(chat, "messages", "content", is_media_part)
            .saturating_add(dest.upstream_model.len() as u64)
            .saturating_add(OPENAI_EDITS),
        // Not translated here: `sent_bytes` walks (or translates) it.
        None => sent_bytes(dest, req),
    };
    let body = translated.unwrap_or(&req.body);
    let (n_messages, tools) = match (req.ingress, &translated) {
        // Each input item is framed like a message; tools may sit inside items too.
        (Ingress::Responses, None) => {
            let items = body.get("input").and_then(Value::as_array);
            let nested: u64 = items
                .into_iter()
                .flatten()
                .filter_map(|i| i.get("tools").and_then(Value::as_array))
                .map(|a| a.len() as u64)
                .sum();
            let top = body
                .get("tools")
                .and_then(Value::as_array)
                .map_or(0, |a| a.len() as u64);
            (
                items.map_or(1, |a| a.len() as u64),
                top.saturating_add(nested),
            )
        }
        (Ingress::Responses, Some(_)) | (Ingress::Chat | Ingress::Messages, _) => (
            messages(body).len() as u64,
            ["tools", "functions"]
                .iter()
                .filter_map(|k| body.get(k).and_then(Value::as_array))
                .map(|a| a.len() as u64)
                .sum::<u64>(),
        ),
    };
    let mut over = overhead(api, Per::Request)
        .saturating_add(n_messages.saturating_mul(overhead(api, Per::Message)))
        .saturating_add(tools.saturating_mul(overhead(api, Per::Tool)));
    if tools > 0 {
        over = over.saturating_add(overhead(api, Per::ToolUsePrompt));
    }
    over = over
        .saturating_add(defined_tools(&req.body).saturating_mul(overhead(api, Per::DefinedTool)));
    Ok(text.saturating_add(media_tokens).saturating_add(over))
}

/// Tools in the client's body (top level, and inside Responses input items) whose
/// definition the vendor writes: any with a `type` other than `function` or `custom`.
/// Those that run at the vendor are refused before a bound is taken; the rest run at
/// the client but are described to the model by the vendor's own text, which the
/// body's bytes do not carry.
fn defined_tools(body: &Value) -> u64 {
    let typed = |tools: &Value| {
        tools.as_array().map_or(0, |a| {
            a.iter()
                .filter(|t| {
                    t.get("type")
                        .and_then(Value::as_str)
                        .is_some_and(|ty| ty != "function" && ty != "custom")
                })
                .count() as u64
        })
    };
    let nested: u64 = body
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("tools"))
        .map(typed)
        .sum();
    body.get("tools").map_or(0, typed).saturating_add(nested)
}

/// Bytes of the body as it leaves for `dest`, media parts left out.
///
/// Anthropic and Gemini: the translated body (`prepare`), walked. OpenAI: the
/// translation is the client's body with `model`, one cap and stream options set, so
/// the client's body is walked (no copy of a large prompt per candidate) and the
/// bytes those edits can add are added: the upstream model id and `EDITS`.
pub fn sent_bytes(dest: &Destination, req: &ChatRequest) -> u64 {
    match dest.api {
        Api::Openai if req.ingress == Ingress::Messages => req.as_chat().map_or(0, |chat| {
            content_walk(chat, "messages", "content", is_media_part)
                .saturating_add(dest.upstream_model.len() as u64)
                .saturating_add(OPENAI_EDITS)
        }),
        Api::Openai => content_walk(&req.body, "messages", "content", is_media_part)
            .saturating_add(dest.upstream_model.len() as u64)
            .saturating_add(OPENAI_EDITS),
        Api::Anthropic if req.ingress == Ingress::Messages => {
            // The client's body with the model and cap rewritten: walked in place (no
            // copy of a large prompt per candidate), plus what the rewrite can add.
            content_walk(&req.body, "messages", "content", by_reference)
                .saturating_add(dest.upstream_model.len() as u64)
                .saturating_add(OPENAI_EDITS)
        }
        Api::Anthropic => {
            let p = super::anthropic::prepare(dest, &Endpoints::default(), None, req);
            content_walk(&p.body.tree(), "messages", "content", |b| {
                matches!(
                    b.get("type").and_then(Value::as_str),
                    Some("image" | "document")
                )
            })
        }
        Api::Gemini => {
            let p = super::gemini::prepare(dest, &Endpoints::default(), None, req);
            content_walk(&p.body.tree(), "contents", "parts", |p| {
                p.get("inlineData").is_some() || p.get("fileData").is_some()
            })
        }
    }
}

/// Most bytes OpenAI's edits add beyond the upstream model id: `"max_completion_tokens":`
/// and a 20-digit cap, `"stream":true`, `"stream_options":{"include_usage":true}`.
const OPENAI_EDITS: u64 = 128;

/// Serialized bytes of `body` with the parts inside `list[].container[]` for which
/// `media` holds left out. The envelope (the body, its list, the items) is counted
/// compact, as it is sent: templates render messages as text, not as JSON. Each value
/// in it counts as `json_len` renders it, but message text (`prose_path`, `prose_role`).
fn content_walk(body: &Value, list: &str, container: &str, media: impl Fn(&Value) -> bool) -> u64 {
    let Value::Object(top) = body else {
        return json_len(body);
    };
    let mut n = 2u64;
    for (k, v) in top {
        n += escaped_len(k) + 4;
        match (k == list, v) {
            (true, Value::Array(items)) => {
                n += 2;
                for item in items {
                    n += 1 + item_len(item, container, &media);
                }
            }
            _ => n += member_len(k, v, 0, prose_path(k)),
        }
    }
    n
}

fn item_len(item: &Value, container: &str, media: &impl Fn(&Value) -> bool) -> u64 {
    let Value::Object(fields) = item else {
        return json_len(item);
    };
    let prose = speaks_prose(item);
    let mut n = 2u64;
    for (k, v) in fields {
        n += escaped_len(k) + 4;
        match (k == container, v) {
            (true, Value::Array(parts)) => {
                n += 2;
                for p in parts {
                    n += 1 + if media(p) {
                        0
                    } else {
                        rendered_len(p, 0, prose)
                    };
                }
            }
            _ => n += member_len(k, v, 0, prose && prose_path(k)),
        }
    }
    n
}

/// Bytes of `v` as a chat template may render it: `tojson(indent=4)`, as Llama 3.1's
/// and 3.3's templates render tools, every element and member on a line of its own,
/// indented four spaces a level. The indentation grows with the depth, so a deeply
/// nested schema renders far larger than its compact JSON (110 levels: 330 bytes
/// compact, 48 kB rendered); counted compact, it passed a ceiling it did not fit. A
/// structure is rendered no larger than this and no smaller than compact, so the count
/// holds whichever a vendor does (agents' tool lists count about 1.3× their compact
/// bytes). Every string counts at its longest JSON rendering, because templates
/// re-render structure (tool schemas, arguments, response formats) with `tojson`, which
/// escapes control characters, HTML-sensitive characters and, by default, every
/// non-ASCII character: what the tokenizer reads is those escapes, never fewer bytes.
/// Tool-call `arguments` count at the larger of the string and the JSON it holds as
/// rendered, since servers (vLLM) parse them and render them again.
pub fn json_len(v: &Value) -> u64 {
    rendered_len(v, 0, false)
}

/// Message text only where the model reads text as text: a `content` or `text` string
/// reached from the body through message containers alone (`prose_path`), never inside
/// a tool schema, a tool call or a format, and never a tool's result.
fn prose_path(k: &str) -> bool {
    matches!(
        k,
        "messages"
            | "input"
            | "system"
            | "systemInstruction"
            | "system_instruction"
            | "contents"
            | "parts"
            | "content"
            | "text"
    )
}

/// Whether a message's text is read as text: only the roles whose text templates render
/// as it is. A tool's result is rendered as JSON, escapes and all (Llama 3.x:
/// `message.role == "tool" or message.role == "ipython"` → `message.content | tojson`),
/// and so is whatever a role purser does not know may be.
fn prose_role(role: &str) -> bool {
    matches!(
        role,
        "user" | "assistant" | "system" | "developer" | "model"
    )
}

/// `prose_role` of an object's `role`, if it has one.
fn speaks_prose(v: &Value) -> bool {
    match v.get("role") {
        None => true,
        Some(Value::String(r)) => prose_role(r),
        Some(_) => false,
    }
}

/// A line break and the indentation of a line at `depth`.
fn line(depth: u64) -> u64 {
    1 + 4 * depth
}

/// `json_len` of a value whose own line is indented at `depth`; with `prose`, its
/// `content` and `text` strings are message text, counted by their UTF-8 bytes.
fn rendered_len(v: &Value, depth: u64, prose: bool) -> u64 {
    match v {
        Value::Null => 4,
        Value::Bool(b) => {
            if *b {
                4
            } else {
                5
            }
        }
        // Up to 20 digits, a sign, a point and an exponent: 24 is never short.
        Value::Number(_) => 24,
        Value::String(s) => escaped_len(s) + 2,
        Value::Array(a) if a.is_empty() => 2,
        Value::Object(o) if o.is_empty() => 2,
        // `[`, each element on a line of its own with its comma, the closing line, `]`.
        Value::Array(a) => {
            2 + line(depth)
                + a.iter()
                    .map(|x| line(depth + 1) + rendered_len(x, depth + 1, prose) + 1)
                    .sum::<u64>()
        }
        // As an array, each member `"key": value,`.
        Value::Object(o) => {
            let prose = prose && speaks_prose(v);
            2 + line(depth)
                + o.iter()
                    .map(|(k, x)| {
                        line(depth + 1)
                            + escaped_len(k)
                            + 5
                            + member_len(k, x, depth + 1, prose && prose_path(k))
                    })
                    .sum::<u64>()
        }
    }
}

/// The bytes of the value of member `k`, on a line indented at `depth`: message text
/// (`prose`) by its bytes; `arguments` at the larger of the string and the JSON it
/// holds; anything else as `rendered_len`.
fn member_len(k: &str, v: &Value, depth: u64, prose: bool) -> u64 {
    match (k, v) {
        ("content" | "text", Value::String(t)) if prose => t.len() as u64 + 2,
        ("arguments", Value::String(t)) => {
            // An integer of more digits than an f64 keeps is read by serde as a float
            // (24 bytes here) and kept whole by Python: counted leniently too.
            let long_number = t
                .split(|c: char| !c.is_ascii_digit())
                .any(|digits| digits.len() > 20);
            let held = match serde_json::from_str::<Value>(t) {
                Ok(j) if long_number => rendered_len(&j, 0, false).max(lenient_len(t)),
                Ok(j) => rendered_len(&j, 0, false),
                Err(_) => lenient_len(t),
            };
            (escaped_len(t) + 2).max(held)
        }
        _ => rendered_len(v, depth, prose),
    }
}

/// An upper bound on `arguments` that serde cannot parse but a server's parser may
/// (Python's `json.loads` takes `NaN`, `Infinity` and `1e999`), rendered again: every
/// character that may belong to a number at 24 bytes (a re-rendered number is never
/// longer: `1e15` becomes `1000000000000000.0`, `1e999` `Infinity`), every separator or
/// bracket on a new line at its depth with a space (`tojson(indent=4)`), and every
/// other character at its escaped length.
fn lenient_len(s: &str) -> u64 {
    let (mut n, mut depth, mut quoted, mut escaped) = (2u64, 0u64, false, false);
    for c in s.chars() {
        n += if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                (false, _) => {}
            }
            escaped_len(c.encode_utf8(&mut [0; 4]))
        } else {
            match c {
                '"' => {
                    quoted = true;
                    2
                }
                '0'..='9' | '-' | '+' | '.' | 'e' | 'E' => 24,
                '[' | '{' => {
                    depth += 1;
                    2 + line(depth)
                }
                ']' | '}' => {
                    depth = depth.saturating_sub(1);
                    2 + line(depth)
                }
                ',' | ':' => 2 + line(depth),
                _ => escaped_len(c.encode_utf8(&mut [0; 4])) + 1,
            }
        };
    }
    n
}

/// The longest a string renders as inside JSON: `"`, `\` and the controls JSON has
/// short escapes for (`\n`, `\r`, `\t`, `\b`, `\f`) as two bytes; other control
/// characters and `<`, `>`, `&`, `'` (escaped by HTML-safe renderers) as six; any
/// other non-ASCII character as a `\uXXXX` escape, twelve for one outside the BMP.
fn escaped_len(s: &str) -> u64 {
    s.chars()
        .map(|c| match c {
            // JSON's short escapes, which every renderer uses for these.
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            '\u{0}'..='\u{1f}' | '<' | '>' | '&' | '\'' => 6,
            ' '..='~' => 1,
            _ if c.len_utf16() == 2 => 12,
            _ => 6,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Jurisdiction, ModelName, ProviderId};
    use crate::money::PricePerMTok;
    use crate::policy::plan::{MediaTokens, ModelTerms, Tier};
    use serde_json::json;

    fn dest(api: Api, media: MediaTokens) -> Destination {
        Destination {
            provider: ProviderId::new("p"),
            model: ModelName::new("m"),
            upstream_model: "up-m".into(),
            api,
            jurisdiction: Jurisdiction::new("us"),
            tier: Tier::Account,
            context_window: 1_000_000,
            input_per_mtok: PricePerMTok::new("1".parse().unwrap()),
            output_per_mtok: PricePerMTok::new("1".parse().unwrap()),
            cached_input_per_mtok: None,
            cache_write_per_mtok: None,
            terms: ModelTerms {
                media_tokens: media,
                ..ModelTerms::default()
            },
        }
    }

    fn req(body: Value) -> ChatRequest {
        ChatRequest {
            body,
            max_tokens: 12_345_678_901,
            stream: true,
            ingress: crate::ingress::Ingress::Chat,
            headers: Vec::new(),
            chat: Default::default(),
            raw: None,
        }
    }

    const APIS: [Api; 3] = [Api::Openai, Api::Anthropic, Api::Gemini];

    /// What a template renders as JSON is counted so, escapes and all, wherever it sits
    /// (attack review of 51a8b07): a tool's result (Llama 3.x renders
    /// `message.content | tojson`), a `text` member inside a tool schema, and a tool
    /// call's `arguments`, which vLLM parses and renders again (`1e15` becomes
    /// `1000000000000000.0`, `[0,0]` becomes `[0, 0]`). Message text stays text.
    #[test]
    fn what_templates_render_as_json_is_counted_as_rendered() {
        let d = dest(Api::Openai, MediaTokens::default());
        let bound = |body: Value| input_tokens(&d, &req(body), Undeclared::Refuse).unwrap();
        let ctl = "\u{1}".repeat(10_000);
        let tool_result = bound(json!({"model": "m", "messages": [
            {"role": "tool", "tool_call_id": "c", "content": ctl}]}));
        assert!(tool_result >= 60_000, "{tool_result}");
        // Llama 3.x renders `ipython` as it renders `tool`; a role purser does not know
        // may be rendered so too (attack review of 070195b).
        for role in ["ipython", "function", "anything"] {
            for content in [json!(ctl), json!([{"type": "text", "text": ctl}])] {
                let n =
                    bound(json!({"model": "m", "messages": [{"role": role, "content": content}]}));
                assert!(n >= 60_000, "{role}: {n}");
            }
        }
        let as_text = bound(json!({"model": "m", "messages": [
            {"role": "user", "content": "x".repeat(10_000)}]}));
        assert!(as_text < 11_000, "{as_text}");
        let in_schema = bound(json!({"model": "m", "messages": [],
            "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "text": "\u{2039}".repeat(10_000)}}}]}));
        assert!(in_schema >= 60_000, "{in_schema}");
        let floats = format!("{{\"a\":[{}]}}", vec!["1e15"; 10_000].join(","));
        let zeros = format!("{{\"a\":[{}]}}", vec!["0"; 10_000].join(","));
        // What Python's parser takes and serde's does not (`NaN`, `1e999`), rendered by
        // Python: `1000000000000000.0, ` per element. And integers longer than an f64
        // keeps, which serde reads as floats and Python keeps whole, nested deep
        // (`indent=4` then indents every one of them).
        let mut deep = format!("[{}]", vec!["9".repeat(300); 100].join(","));
        for _ in 0..70 {
            deep = format!("[{deep}]");
        }
        let deep_rendered = 100 * (300 + 71 * 4) + 70 * 2 * (71 * 4);
        let lenient = format!("[{}NaN]", "1e15,".repeat(10_000));
        let huge = format!("[{}1e999]", "1e15,".repeat(10_000));
        for (args, rendered) in [
            (floats, 10_000 * 20),
            (zeros, 10_000 * 3),
            (lenient, 10_000 * 20),
            (huge, 10_000 * 20),
            (deep, deep_rendered),
        ] {
            let n = bound(
                json!({"model": "m", "messages": [{"role": "assistant", "content": "",
                "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "f", "arguments": args}}]}]}),
            );
            assert!(n >= rendered, "{n} < {rendered}");
        }
    }

    /// A `cache_control` mark on a part, a message or a tool asks for a write; a member
    /// of that name inside a tool's parameter schema or a call's arguments is data.
    #[test]
    fn a_cache_mark_is_read_where_relays_read_it_and_not_in_data() {
        let marked = [
            json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "t", "cache_control": {"type": "ephemeral"}}]}]}),
            json!({"messages": [], "tools": [{"type": "function", "function": {"name": "f"},
                "cache_control": {"type": "ephemeral"}}]}),
            json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "t", "cache_control": {"type": "ephemeral"}}]}]}),
        ];
        for b in marked {
            assert!(marks_cache(&b), "{b}");
        }
        let data = [
            json!({"messages": [], "tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"cache_control": {"type": "string"}}}}}]}),
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": {"cache_control": 1}}}]}]}),
            json!({"messages": [], "response_format": {"type": "json_schema", "json_schema": {
                "schema": {"properties": {"cache_control": {}}}}}}),
        ];
        for b in data {
            assert!(!marks_cache(&b), "{b}");
        }
    }

    /// The attack of issue 22's review: three Anthropic-defined tools in a 300-byte
    /// body, whose definitions Anthropic writes into the prompt (735 + 700 + 245
    /// tokens, and computer use's system prompt of up to 499, plus the tool-use prompt
    /// of 346): about 2,500 tokens billed. The bound counts each at its defined-tool
    /// overhead, so it covers them.
    #[test]
    fn tools_the_vendor_defines_are_counted_at_their_definitions() {
        let body = json!({"model": "x", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
            {"type": "bash_20250124", "name": "bash"},
        ]});
        let mut r = req(body);
        r.ingress = crate::ingress::Ingress::Messages;
        let n = input_tokens(
            &dest(Api::Anthropic, MediaTokens::default()),
            &r,
            Undeclared::Refuse,
        )
        .unwrap();
        assert!(n >= 735 + 700 + 245 + 499 + 346, "{n}");
        // A function tool alone adds no definition of the vendor's.
        let mut plain = r.clone();
        plain.body["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        let m = input_tokens(
            &dest(Api::Anthropic, MediaTokens::default()),
            &plain,
            Undeclared::Refuse,
        )
        .unwrap();
        assert!(m < 1_280, "{m}");
    }

    #[test]
    fn every_api_has_one_row_per_overhead_with_a_source() {
        for api in APIS {
            for per in [
                Per::Request,
                Per::Message,
                Per::Tool,
                Per::ToolUsePrompt,
                Per::DefinedTool,
            ] {
                let rows: Vec<_> = OVERHEADS
                    .iter()
                    .filter(|o| o.api == api && o.per == per)
                    .collect();
                assert_eq!(rows.len(), 1, "{api:?} {per:?}");
                assert!(!rows[0].source.is_empty());
            }
        }
        assert!(overhead(Api::Anthropic, Per::ToolUsePrompt) >= 530);
    }

    /// The bound holds over what is really sent: for each API, the bytes of every
    /// string of the prepared body (the vendor's tokens' text) plus overheads never
    /// exceed it.
    #[test]
    fn the_bound_covers_the_prepared_body() {
        let body = json!({"model": "m", "stop": ["END"], "temperature": 0.5,
            "tools": [{"type": "function", "function": {"name": "f", "description": "d".repeat(300), "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}],
            "messages": [
            {"role": "system", "content": "s".repeat(1000)},
            {"role": "user", "content": [{"type": "text", "text": "é".repeat(500)}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":\"yyyy\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r".repeat(700)},
            {"role": "user", "content": "again"}]});
        for api in APIS {
            let d = dest(api, MediaTokens::default());
            let r = req(body.clone());
            let body = super::super::prepare(api, &d, &Endpoints::new("http://x"), None, &r).body;
            let sent = body.to_value();
            let bound = input_tokens(&d, &r, Undeclared::Refuse).unwrap();
            let compact = serde_json::to_vec(&sent).unwrap().len() as u64;
            assert!(bound >= compact, "{api:?}: {bound} < {compact}");
            // The tools as a template may render them (`tojson(indent=4)`).
            if let Some(tools) = sent.get("tools") {
                let mut rendered = Vec::new();
                let mut ser = serde_json::Serializer::with_formatter(
                    &mut rendered,
                    serde_json::ser::PrettyFormatter::with_indent(b"    "),
                );
                serde::Serialize::serialize(tools, &mut ser).unwrap();
                assert!(json_len(tools) >= rendered.len() as u64, "{api:?}");
            }
            // The bytes that really leave, as `request` writes them.
            let exact = body.into_bytes().len() as u64;
            assert!(bound >= exact, "{api:?}: {bound} < {exact}");
        }
    }

    /// A Responses body to Anthropic or Gemini is bounded over the vendor body it
    /// becomes (translated to chat, then by the adapter), not over the client's items.
    #[test]
    fn a_translated_responses_bound_covers_the_body_sent() {
        let body = json!({"model": "m", "instructions": "i".repeat(900),
            "tools": [{"type": "function", "name": "f", "description": "d".repeat(300), "parameters": {"type": "object"}}],
            "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "s".repeat(1000)}]},
            {"role": "user", "content": [{"type": "input_text", "text": "é".repeat(500)}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":\"yyyy\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r".repeat(700)},
            {"role": "user", "content": "again"}]});
        for api in [Api::Anthropic, Api::Gemini] {
            let d = dest(api, MediaTokens::default());
            let r = ChatRequest {
                ingress: crate::ingress::Ingress::Responses,
                ..req(body.clone())
            };
            let body = super::super::prepare(api, &d, &Endpoints::new("http://x"), None, &r).body;
            let sent = body.to_value();
            assert!(sent.to_string().contains(&"r".repeat(700)), "{sent}");
            let bound = input_tokens(&d, &r, Undeclared::Refuse).unwrap();
            let exact = body.into_bytes().len() as u64;
            assert!(bound >= exact, "{api:?}: {bound} < {exact}");
        }
    }

    #[test]
    fn message_fields_no_table_lists_are_counted() {
        // vLLM renders an assistant's `reasoning_content` into the prompt.
        let plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]});
        let mut heavy = plain.clone();
        heavy["messages"][1]["reasoning_content"] = json!("r".repeat(400_000));
        let d = dest(Api::Openai, MediaTokens::default());
        let a = input_tokens(&d, &req(plain), Undeclared::Refuse).unwrap();
        let b = input_tokens(&d, &req(heavy), Undeclared::Refuse).unwrap();
        assert!(b >= a + 400_000, "{a} → {b}");
    }

    #[test]
    fn media_needs_a_declared_bound_of_its_kind() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "read this"},
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,AAAA", "filename": "a.pdf"}}]}]});
        let none = dest(Api::Openai, MediaTokens::default());
        let e = input_tokens(&none, &req(body.clone()), Undeclared::Refuse).unwrap_err();
        assert_eq!(e.param, "messages[0].content[1]");
        assert!(e.what.starts_with("a file part"), "{}", e.what);
        let soft = input_tokens(&none, &req(body.clone()), Undeclared::StandIn(1_600)).unwrap();
        let files = dest(
            Api::Openai,
            MediaTokens {
                file: Some(50_000),
                ..MediaTokens::default()
            },
        );
        let declared = input_tokens(&files, &req(body), Undeclared::Refuse).unwrap();
        assert_eq!(declared, soft - 1_600 + 50_000);
    }

    /// Audio is billed at a rate of its own (OpenAI's audio models 16× text): a
    /// declared count of its tokens is no bound without that rate, so under a proof an
    /// audio part (or a part that may be audio) is refused until the entry lists
    /// `audio_input_per_mtok`, and with it the request's input is bounded at that rate.
    #[test]
    fn audio_needs_its_rate_as_well_as_its_tokens() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "transcribe"},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]});
        let tokens = MediaTokens {
            audio: Some(10_000),
            ..MediaTokens::default()
        };
        let counted = dest(Api::Openai, tokens);
        let e = input_tokens(&counted, &req(body.clone()), Undeclared::Refuse).unwrap_err();
        assert_eq!(e.param, "messages[0].content[1]");
        assert!(e.what.contains("audio_input_per_mtok"), "{}", e.what);
        assert!(!sends_audio(&counted, &req(body.clone())));
        // Where no proof is needed the stand-in still counts it.
        assert!(input_tokens(&counted, &req(body.clone()), Undeclared::StandIn(1)).is_ok());
        let mut priced = counted.clone();
        priced.terms.audio_input_per_mtok = Some(PricePerMTok::new("40".parse().unwrap()));
        let n = input_tokens(&priced, &req(body.clone()), Undeclared::Refuse).unwrap();
        assert!(n > 10_000, "{n}");
        assert!(sends_audio(&priced, &req(body.clone())));
        let text = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert!(!sends_audio(&priced, &req(text)));
        // On Gemini a URL of unknown type may be audio: refused without the rate even
        // with every kind's count declared.
        let any = MediaTokens {
            image: Some(1),
            audio: Some(1),
            video: Some(1),
            file: Some(1),
        };
        let url = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x/blob"}}]}]});
        let gemini = dest(Api::Gemini, any);
        assert!(input_tokens(&gemini, &req(url.clone()), Undeclared::Refuse).is_err());
        let mut gemini_priced = gemini.clone();
        gemini_priced.terms.audio_input_per_mtok = Some(PricePerMTok::new("1".parse().unwrap()));
        assert!(input_tokens(&gemini_priced, &req(url.clone()), Undeclared::Refuse).is_ok());
        // Gemini counts a video's soundtrack as audio: a video needs the rate there.
        let video = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:video/mp4;base64,AAAA"}}]}]});
        assert!(input_tokens(&gemini, &req(video.clone()), Undeclared::Refuse).is_err());
        assert!(sends_audio(&gemini_priced, &req(video.clone())));
        let openai_video = dest(Api::Openai, any);
        assert!(input_tokens(&openai_video, &req(video), Undeclared::Refuse).is_ok());
        // Anthropic takes no audio: a part it cannot tell needs no audio rate there.
        let claude = dest(Api::Anthropic, any);
        assert!(input_tokens(&claude, &req(url), Undeclared::Refuse).is_ok());
    }

    /// A computer-use screenshot returned as a Responses input item is billed as an
    /// image: counted at the declared image bound, refused when none is declared.
    #[test]
    fn a_computer_screenshot_is_an_image() {
        let body = json!({"model": "m", "input": [{"type": "computer_call_output", "call_id": "c",
            "output": {"type": "computer_screenshot", "image_url": "https://x/s.png"}}]});
        let mut r = req(body);
        r.ingress = crate::ingress::Ingress::Responses;
        let none = dest(Api::Openai, MediaTokens::default());
        let e = input_tokens(&none, &r, Undeclared::Refuse).unwrap_err();
        assert_eq!(e.param, "input[0].output");
        assert!(e.what.starts_with("a image part"), "{}", e.what);
        let soft = input_tokens(&none, &r, Undeclared::StandIn(1)).unwrap();
        let images = dest(
            Api::Openai,
            MediaTokens {
                image: Some(1_600),
                ..MediaTokens::default()
            },
        );
        assert_eq!(
            input_tokens(&images, &r, Undeclared::Refuse).unwrap(),
            soft - 1 + 1_600
        );
    }

    #[test]
    fn a_native_messages_body_counts_blocks_by_bytes_and_sources_as_media() {
        let body = json!({"model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "c2ln"},
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [
                        {"type": "text", "text": "ok"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}]});
        let media = native_media_parts(&body);
        let found: Vec<(&str, Option<MediaKind>)> =
            media.iter().map(|m| (m.param.as_str(), m.kind)).collect();
        assert_eq!(
            found,
            [
                ("messages[0].content[1]", Some(MediaKind::Image)),
                ("messages[2].content[0].content[1]", Some(MediaKind::Image)),
            ]
        );
        let mut r = req(body);
        r.ingress = crate::ingress::Ingress::Messages;
        let none = dest(Api::Anthropic, MediaTokens::default());
        let e = input_tokens(&none, &r, Undeclared::Refuse).unwrap_err();
        assert_eq!(e.param, "messages[0].content[1]");
        let images = dest(
            Api::Anthropic,
            MediaTokens {
                image: Some(1_600),
                ..MediaTokens::default()
            },
        );
        let n = input_tokens(&images, &r, Undeclared::Refuse).unwrap();
        // Every byte of the body as sent is counted (less the top-level image), plus
        // two images at their bound.
        let compact = serde_json::to_vec(&r.body).unwrap().len() as u64;
        assert!(n >= compact - 100 + 3_200, "{n}");
    }

    #[test]
    fn an_audio_reference_is_media() {
        let body = json!({"model": "m", "messages": [
            {"role": "assistant", "content": null, "audio": {"id": "audio_abc"}},
            {"role": "user", "content": "and again"}]});
        let e = input_tokens(
            &dest(Api::Openai, MediaTokens::default()),
            &req(body),
            Undeclared::Refuse,
        )
        .unwrap_err();
        assert_eq!(e.param, "messages[0].audio");
    }

    #[test]
    fn gemini_reads_a_url_by_its_media_type() {
        let part = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
        let k = |url: &str| kind(Api::Gemini, &part(url));
        assert_eq!(k("https://x/cat.png"), Some(MediaKind::Image));
        assert_eq!(k("https://x/talk.mp4"), Some(MediaKind::Video));
        assert_eq!(k("https://x/paper.pdf?dl=1"), Some(MediaKind::File));
        assert_eq!(k("data:video/webm;base64,AAAA"), Some(MediaKind::Video));
        assert_eq!(k("https://x/unknown"), None);
        // OpenAI and Anthropic read it as an image, whatever it points at.
        assert_eq!(
            kind(Api::Anthropic, &part("https://x/talk.mp4")),
            Some(MediaKind::Image)
        );
        // A part of unknown kind needs every kind declared, and counts the largest.
        let all = MediaTokens {
            image: Some(1),
            audio: Some(2),
            video: Some(300),
            file: Some(4),
        };
        assert_eq!(all.bound(None), Some(300));
        let some = MediaTokens { video: None, ..all };
        assert_eq!(some.bound(None), None);
    }

    #[test]
    fn anthropic_counts_its_tool_use_system_prompt() {
        let plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let mut tools = plain.clone();
        tools["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        let d = dest(Api::Anthropic, MediaTokens::default());
        let a = input_tokens(&d, &req(plain), Undeclared::Refuse).unwrap();
        let b = input_tokens(&d, &req(tools), Undeclared::Refuse).unwrap();
        assert!(b >= a + 530, "{a} → {b}");
    }

    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        // Any Unicode, quotes and control characters included (escaped when sent).
        proptest::string::string_regex("(?s).{0,40}").unwrap()
    }

    fn any_body() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let message = (0usize..4, text(), proptest::option::of(text())).prop_map(|(role, t, extra)| {
            let role = ["system", "user", "assistant", "tool"][role];
            let mut m = json!({"role": role, "content": t});
            if role == "tool" {
                m["tool_call_id"] = json!("c1");
            }
            if let (Some(e), "assistant") = (extra, role) {
                m["tool_calls"] = json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": json!({"x": e}).to_string()}}]);
            }
            m
        });
        (
            proptest::collection::vec(message, 1..6),
            proptest::option::of(text()),
            proptest::option::of(text()),
        )
            .prop_map(|(messages, tool_doc, stop)| {
                let mut b = json!({"model": "m", "messages": messages});
                if let Some(d) = tool_doc {
                    b["tools"] = json!([{"type": "function", "function": {"name": "f", "description": d, "parameters": {"type": "object", "properties": {"x": {"type": "string", "description": d}}}}}]);
                }
                if let Some(s) = stop {
                    b["stop"] = json!(s);
                }
                b
            })
    }

    /// Every string the vendor receives, by its UTF-8 bytes: what its tokens are made of.
    fn string_bytes(v: &Value) -> u64 {
        match v {
            Value::String(s) => s.len() as u64,
            Value::Array(a) => a.iter().map(string_bytes).sum(),
            Value::Object(o) => o
                .iter()
                .map(|(k, x)| k.len() as u64 + string_bytes(x))
                .sum(),
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        }
    }

    proptest::proptest! {
        /// For any body, at every API, the bound is at least every string (and key) of
        /// the body as prepared for that API, plus the overheads it counts.
        #[test]
        fn the_bound_covers_every_string_sent(body in any_body()) {
            for api in APIS {
                let d = dest(api, MediaTokens::default());
                let r = req(body.clone());
                let sent = super::super::prepare(api, &d, &Endpoints::new("http://x"), None, &r)
                .body
                .to_value();
                let bound = input_tokens(&d, &r, Undeclared::Refuse).unwrap();
                let messages = body["messages"].as_array().unwrap().len() as u64;
                let floor = string_bytes(&sent)
                    + overhead(api, Per::Request)
                    + messages * overhead(api, Per::Message);
                proptest::prop_assert!(bound >= floor, "{api:?}: {bound} < {floor}");
            }
        }
    }
}
