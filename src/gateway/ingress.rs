//! What differs by ingress before the chain runs: how a body is read into the parts
//! the ceiling needs (`Parsed`), and which provider APIs can take it. Everything after
//! (selection, admission, the chain, the ledger) is shared.
//!
//! The Anthropic Messages body passes through natively to `api: anthropic`
//! destinations, is translated to chat completions for `api: openai` ones where that is
//! faithful (`upstream::from_messages`, which names what is not), and is refused for
//! `api: gemini`, naming the API. The Responses body passes through natively to
//! `api: openai` destinations and is translated to chat completions for the others
//! (`upstream::from_responses`), then through the chat translation table.

use serde_json::Value;

use super::GatewayError;
use super::request::{self, Bearing, Parsed, bad};
pub use crate::ingress::Ingress;
use crate::policy::plan::Api;
use crate::upstream::ChatRequest;
use crate::upstream::from_messages::Untranslatable;

/// Every Anthropic Messages field purser knows, and its bearing on cost. A field not
/// listed is unknown: its cost cannot be bounded, so a hard ceiling refuses it.
pub const MESSAGES_FIELDS: &[(&str, Bearing)] = &[
    ("model", Bearing::Neutral),
    ("messages", Bearing::Input),
    ("system", Bearing::Input),
    ("max_tokens", Bearing::OutputCap),
    ("metadata", Bearing::Neutral),
    ("stop_sequences", Bearing::Input),
    ("stream", Bearing::Neutral),
    ("temperature", Bearing::Neutral),
    ("top_p", Bearing::Neutral),
    ("top_k", Bearing::Neutral),
    // Tools are input (their bytes are counted); server tools are refused below.
    ("tools", Bearing::Input),
    ("tool_choice", Bearing::Input),
    // Extended thinking (fixed budget or adaptive) is billed inside `max_tokens`.
    ("thinking", Bearing::Neutral),
    // Clearing edits (`clear_*`) drop earlier context: they can only lower the input
    // the bound already counts. Every other edit is checked below.
    ("context_management", Bearing::Neutral),
    // Effort and output format: the format's schema is sent, so counted as input.
    ("output_config", Bearing::Input),
    ("service_tier", Bearing::Tier),
    // Automatic caching: one `cache_control` mark on the last cacheable block, as a
    // client may put inline. The worst case already prices every input token at the
    // dearest input-side rate (cache writes, 1-hour ones included).
    ("cache_control", Bearing::Neutral),
    // Asks only for a cache-miss explanation in the answer.
    ("diagnostics", Bearing::Neutral),
    // `standard` is the rate the model entry lists; `fast` is checked below.
    ("speed", Bearing::Neutral),
    (
        "inference_geo",
        Bearing::Unbounded(
            "inference pinned to a region can be billed at a regional premium the model entry does not price",
        ),
    ),
    (
        "container",
        Bearing::Unbounded("a code-execution container is billed by the hour it runs"),
    ),
    (
        "mcp_servers",
        Bearing::Unbounded(
            "remote MCP tools run inside the call: their results are input the bound does not see",
        ),
    ),
];

/// Anthropic-defined tools the client runs (bash, text editor, computer use, memory):
/// only their definitions are sent, counted like any tool. Every other typed tool runs
/// on Anthropic's side inside the call (web search, web fetch, code execution, tool
/// search, and any named later), adding input the bound cannot see and, for some, a
/// per-use fee: a rule over unlisted tools, not a list of the billed ones.
const CLIENT_TOOL_PREFIXES: [&str; 4] = ["bash_", "text_editor_", "computer_", "memory_"];

/// The client's body as the ceiling sees it, read by its ingress's rules.
pub fn parse(ingress: Ingress, body: &Value) -> Result<Parsed, GatewayError> {
    match ingress {
        Ingress::Chat => request::parse(body),
        Ingress::Messages => parse_messages(body),
        Ingress::Responses => parse_responses(body),
    }
}

/// An Anthropic Messages body.
pub fn parse_messages(body: &Value) -> Result<Parsed, GatewayError> {
    let obj = request::body_object(body)?;
    let model = request::model_name(obj)?;
    match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => {
            for (i, m) in a.iter().enumerate() {
                if m.get("role").and_then(Value::as_str).is_none() {
                    let p = format!("messages[{i}].role");
                    return Err(bad(format!("{p} must be a string"), &p));
                }
            }
        }
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty", "messages")),
        Some(_) => return Err(bad("`messages` must be an array", "messages")),
        None => return Err(bad("missing required field `messages`", "messages")),
    }
    let mut unbounded = Vec::new();
    for (k, v) in obj {
        match request::bearing_in(MESSAGES_FIELDS, k) {
            Some(Bearing::Unbounded(why)) if !v.is_null() => unbounded.push((k.clone(), why)),
            Some(_) => {}
            None => unbounded.push((k.clone(), "purser does not know what this field costs")),
        }
    }
    match obj.get("speed") {
        None | Some(Value::Null) => {}
        Some(v) if v == "standard" => {}
        Some(_) => unbounded.push((
            "speed".into(),
            "fast mode is billed at premium rates the model entry does not list",
        )),
    }
    for (i, t) in obj
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let server_side = match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => false,
            Some(ty) => !CLIENT_TOOL_PREFIXES.iter().any(|p| ty.starts_with(p)),
        };
        if server_side {
            unbounded.push((
                format!("tools[{i}]"),
                "a server tool runs inside the call: its results are input the bound does not see, and some are billed per use",
            ));
        }
    }
    context_edits(obj.get("context_management"), &mut unbounded);
    let tier = super::request::tier_ask(obj, "standard_only", &mut unbounded)?;
    let max_tokens = request::cap(obj, "max_tokens")?;
    let stream = request::stream_flag(obj)?;
    Ok(Parsed {
        model,
        stream,
        max_tokens,
        // The Messages API has no `n`: one answer per call.
        choices: 1,
        tier,
        unbounded,
    })
}

/// Anthropic context edits: one that clears (`clear_tool_uses_…`, `clear_thinking_…`)
/// only removes input the bound already counts. Any other (server-side compaction,
/// which runs an extra pass over the whole input, and any edit named later) is billed
/// beyond what the bound sees: a rule by meaning, not a list of the billed ones.
fn context_edits(cm: Option<&Value>, unbounded: &mut Vec<(String, &'static str)>) {
    let edits = cm.and_then(|c| c.get("edits")).and_then(Value::as_array);
    for (i, e) in edits.into_iter().flatten().enumerate() {
        let clears = e
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with("clear_"));
        if !clears {
            unbounded.push((
                format!("context_management.edits[{i}]"),
                "a context edit that does not only clear (e.g. compaction) runs extra passes over the input the bound does not see",
            ));
        }
    }
}

/// Every OpenAI Responses field purser knows, and its bearing on cost.
pub const RESPONSES_FIELDS: &[(&str, Bearing)] = &[
    ("model", Bearing::Neutral),
    // Every input item is sent: messages, tool calls and outputs, reasoning items
    // (their encrypted content too), Codex's `additional_tools`.
    ("input", Bearing::Input),
    ("instructions", Bearing::Input),
    ("max_output_tokens", Bearing::OutputCap),
    ("stream", Bearing::Neutral),
    ("stream_options", Bearing::Neutral),
    ("tools", Bearing::Input),
    ("tool_choice", Bearing::Input),
    ("parallel_tool_calls", Bearing::Neutral),
    ("max_tool_calls", Bearing::Neutral),
    // Reasoning tokens are output tokens, inside `max_output_tokens`.
    ("reasoning", Bearing::Neutral),
    // Verbosity and the output format, whose schema is sent.
    ("text", Bearing::Input),
    ("include", Bearing::Neutral),
    ("prompt_cache_key", Bearing::Neutral),
    ("prompt_cache_retention", Bearing::Neutral),
    // Storing costs nothing by itself; a later turn that continues from the stored
    // response through purser is bounded by the ledger, which records its id and
    // tokens (`gateway::history`); one that bypasses purser is not purser's spend.
    ("store", Bearing::Neutral),
    ("safety_identifier", Bearing::Neutral),
    ("user", Bearing::Neutral),
    ("metadata", Bearing::Neutral),
    // Codex's own identifiers, which OpenAI accepts and ignores.
    ("client_metadata", Bearing::Neutral),
    ("temperature", Bearing::Neutral),
    ("top_p", Bearing::Neutral),
    ("top_logprobs", Bearing::Neutral),
    // `auto` drops input that does not fit: it can only lower what the bound counts.
    ("truncation", Bearing::Neutral),
    ("service_tier", Bearing::Tier),
    // Bounded only by the ledger's record of the earlier turn (`gateway::history`),
    // which takes this field off the unbounded list when it finds it.
    (
        "previous_response_id",
        Bearing::Unbounded(
            "the conversation before it is stored at the vendor and billed as input the gateway cannot see",
        ),
    ),
    (
        "conversation",
        Bearing::Unbounded("a stored conversation is billed as input the gateway cannot see"),
    ),
    (
        "prompt",
        Bearing::Unbounded("a stored prompt's text is billed as input the gateway cannot see"),
    ),
    (
        "background",
        Bearing::Unbounded("a background response is billed after the gateway's call has ended"),
    ),
];

/// Tool types the client runs: only their definitions are sent (a namespace holds
/// more of them). Every other type runs at the vendor inside the call (web search,
/// file search, code interpreter, image generation, remote MCP, and any named later),
/// billed per call or adding input the bound cannot see.
const CLIENT_TOOL_TYPES: [&str; 6] = [
    "function",
    "custom",
    "namespace",
    "local_shell",
    "shell",
    "apply_patch",
];

/// Hosted tools among `tools`, at any depth of namespaces, as (path, type).
fn hosted_tools(tools: &[Value], at: &str, out: &mut Vec<String>) {
    for (i, t) in tools.iter().enumerate() {
        let here = format!("{at}[{i}]");
        match t.get("type").and_then(Value::as_str) {
            // A shell whose environment is not the client's machine (a container the
            // vendor starts, or one it already runs) executes at the vendor.
            Some("shell") if !runs_locally(t) => out.push(here.clone()),
            Some(ty) if CLIENT_TOOL_TYPES.contains(&ty) => {}
            _ => out.push(here.clone()),
        }
        if let Some(Value::Array(inner)) = t.get("tools") {
            hosted_tools(inner, &format!("{here}.tools"), out);
        }
    }
}

/// Whether a `shell` tool runs on the client: no environment, or a `local` one. Any
/// other environment (`container_auto`, `container_reference`, and any named later)
/// is hosted: a rule over unlisted environments, not a list of the billed ones.
fn runs_locally(tool: &Value) -> bool {
    match tool.get("environment") {
        None | Some(Value::Null) => true,
        Some(env) => env.get("type").and_then(Value::as_str) == Some("local"),
    }
}

/// Fields of an input item that identify it or its place, and carry none of the
/// content the model reads.
const ITEM_IDENTITY_FIELDS: [&str; 5] = ["type", "id", "status", "role", "call_id"];

/// Why an input item is billed for content the bound never sees, if it is: it names
/// stored content by `id` and carries none of its own (an `item_reference`, a bare
/// `{"id": …}`, a reasoning item or image generation call reduced to its id), so
/// OpenAI expands it from its store. A rule over what an item carries, not a list of
/// item types. A reasoning item is billed for its reasoning, which only its
/// `encrypted_content` carries (a summary is not it): with an id and without that, the
/// stored reasoning is what is billed.
fn by_reference_item(item: &Value) -> Option<&'static str> {
    let Value::Object(o) = item else {
        return None;
    };
    if o.get("id").is_none_or(Value::is_null) {
        return None;
    }
    let carries = |v: &Value| match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        Value::Bool(_) | Value::Number(_) => true,
    };
    if o.get("type").and_then(Value::as_str) == Some("reasoning") {
        return match o.get("encrypted_content") {
            Some(v) if carries(v) => None,
            _ => Some(
                "a reasoning item without its `encrypted_content` is expanded by id from the vendor's store and billed as input the gateway cannot see",
            ),
        };
    }
    let own = o
        .iter()
        .any(|(k, v)| !ITEM_IDENTITY_FIELDS.contains(&k.as_str()) && carries(v));
    (!own).then_some(
        "an input item that names stored content by id and carries none of its own is billed as input the gateway cannot see",
    )
}

/// An OpenAI Responses body.
pub fn parse_responses(body: &Value) -> Result<Parsed, GatewayError> {
    let obj = request::body_object(body)?;
    let model = request::model_name(obj)?;
    match obj.get("input") {
        None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
        Some(_) => {
            return Err(bad(
                "`input` must be a string or an array of items",
                "input",
            ));
        }
    }
    let mut unbounded = Vec::new();
    for (k, v) in obj {
        match request::bearing_in(RESPONSES_FIELDS, k) {
            Some(Bearing::Unbounded(why)) if !v.is_null() => unbounded.push((k.clone(), why)),
            Some(_) => {}
            None => unbounded.push((k.clone(), "purser does not know what this field costs")),
        }
    }
    let mut hosted = Vec::new();
    if let Some(Value::Array(tools)) = obj.get("tools") {
        hosted_tools(tools, "tools", &mut hosted);
    }
    for (i, item) in obj
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(Value::Array(tools)) = item.get("tools") {
            hosted_tools(tools, &format!("input[{i}].tools"), &mut hosted);
        }
        if let Some(why) = by_reference_item(item) {
            unbounded.push((format!("input[{i}]"), why));
        }
    }
    for h in hosted {
        unbounded.push((
            h,
            "a hosted tool runs at the vendor inside the call: billed per call, its results input the bound does not see",
        ));
    }
    let tier = super::request::tier_ask(obj, "default", &mut unbounded)?;
    let max_tokens = request::cap(obj, "max_output_tokens")?;
    let stream = request::stream_flag(obj)?;
    Ok(Parsed {
        model,
        stream,
        max_tokens,
        choices: 1,
        tier,
        unbounded,
    })
}

/// Why a destination's API cannot take a request of this ingress.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{param}`: a {} request passes through natively only to `api: {}` destinations, and purser has no faithful translation of it to provider API `{}` yet",
    ingress.as_str(),
    native.as_str(),
    api.as_str()
)]
pub struct NotNative {
    pub ingress: Ingress,
    pub native: Api,
    pub api: Api,
    pub param: String,
}

/// Whether a destination speaking `api` can take this request: the chat translation
/// table for chat (`upstream::fields`); for Messages, native pass-through to Anthropic
/// or the faithful translation to chat completions; for Responses, native to OpenAI or
/// translated to chat completions and checked against the chat table of the API.
pub fn check(ingress: Ingress, api: Api, body: &Value) -> Result<(), (String, String)> {
    match (ingress, api) {
        (Ingress::Chat, _) => chat(api, body),
        (Ingress::Messages, Api::Openai) => translated(
            ingress,
            api,
            crate::upstream::from_messages::chat_body(body).as_ref(),
        ),
        (Ingress::Messages, Api::Anthropic | Api::Gemini) => native(ingress, Api::Anthropic, api),
        (Ingress::Responses, Api::Openai) => Ok(()),
        (Ingress::Responses, Api::Anthropic | Api::Gemini) => translated(
            ingress,
            api,
            crate::upstream::from_responses::chat_body(body).as_ref(),
        ),
    }
}

/// [`check`] for a request on its way: a translation to chat completions is the one
/// the request keeps, made once however many destinations are checked.
pub fn check_request(req: &ChatRequest, api: Api) -> Result<(), (String, String)> {
    match (req.ingress, api) {
        (Ingress::Chat, _) => chat(api, &req.body),
        (Ingress::Messages, Api::Openai) | (Ingress::Responses, Api::Anthropic | Api::Gemini) => {
            translated(req.ingress, api, req.as_chat())
        }
        (Ingress::Messages, Api::Anthropic | Api::Gemini) => {
            native(req.ingress, Api::Anthropic, api)
        }
        (Ingress::Responses, Api::Openai) => Ok(()),
    }
}

fn chat(api: Api, body: &Value) -> Result<(), (String, String)> {
    crate::upstream::fields::check(api, body).map_err(|r| (r.param.clone(), r.to_string()))
}

/// A body that reaches `api` translated to chat completions: a Messages body needs a
/// faithful translation; a Responses body, one the chat table of the API then takes.
fn translated(
    ingress: Ingress,
    api: Api,
    chat_body: Result<&Value, &Untranslatable>,
) -> Result<(), (String, String)> {
    let untranslatable = |u: &Untranslatable| {
        let why = format!(
            "`{}`: a {} request to provider API `{}` is translated to chat completions, where this has no faithful form: {}",
            u.param,
            ingress.as_str(),
            api.as_str(),
            u.why
        );
        (u.param.clone(), why)
    };
    match ingress {
        Ingress::Chat => chat(api, chat_body.map_err(untranslatable)?),
        Ingress::Messages => chat_body.map(|_| ()).map_err(untranslatable),
        // Responses → chat completions, then the chat translation table of the API.
        Ingress::Responses => {
            let body = chat_body.map_err(untranslatable)?;
            crate::upstream::fields::check(api, body).map_err(|r| {
                // The chat table names a chat field; a function's setting is one level
                // up in the flat Responses tool shape.
                let param = r.param.replace(".function.", ".");
                let why = format!(
                    "a responses request is translated to chat completions for provider API `{}`: {r}",
                    api.as_str()
                );
                (param, why)
            })
        }
    }
}

fn native(ingress: Ingress, native: Api, api: Api) -> Result<(), (String, String)> {
    if api == native {
        return Ok(());
    }
    let r = NotNative {
        ingress,
        native,
        api,
        param: "model".into(),
    };
    Err((r.param.clone(), r.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_recorded_claude_code_body_is_all_known_fields() {
        let raw = include_str!("../../tests/fixtures/agents/claude-code-2.1.332-say-hi.json");
        let v: Value = serde_json::from_str(raw).unwrap();
        let p = parse_messages(&v["body"]).unwrap();
        assert!(p.unbounded.is_empty(), "{:?}", p.unbounded);
        assert_eq!(p.max_tokens, Some(128_000));
        assert!(p.stream);
    }

    #[test]
    fn server_tools_and_unknown_fields_are_named() {
        let p = parse_messages(&json!({
            "model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {"name": "a", "input_schema": {}},
                {"type": "bash_20250124", "name": "bash"},
                {"type": "web_search_20250305", "name": "web_search"},
            ],
            "brand_new": true,
        }))
        .unwrap();
        let mut names: Vec<_> = p.unbounded.iter().map(|(f, _)| f.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["brand_new", "tools[2]"]);
    }

    /// Clearing edits stay admitted (Claude Code sends `clear_thinking_…`); compaction
    /// and any edit that is not a clear is named by its index.
    #[test]
    fn context_edits_that_do_not_clear_are_named() {
        let p = parse_messages(&json!({
            "model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
            "context_management": {"edits": [
                {"type": "clear_tool_uses_20250919"},
                {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}},
                {"type": "clear_thinking_20251015", "keep": "all"},
                {"keep": "all"},
            ]},
        }))
        .unwrap();
        let names: Vec<_> = p.unbounded.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            names,
            ["context_management.edits[1]", "context_management.edits[3]"]
        );
    }

    /// The body of the official `anthropic` SDK's `test_method_create_with_all_params`
    /// (2.15.0, `tests/api_resources/test_messages.py`): every field but the ones whose
    /// cost no entry bounds (a code-execution container, a pinned region) is known.
    #[test]
    fn the_sdk_all_params_body_names_only_what_cannot_be_bounded() {
        let body = json!({
            "max_tokens": 1024,
            "messages": [{"content": "Hello, world", "role": "user"}],
            "model": "claude-opus-5-5",
            "cache_control": {"type": "ephemeral", "ttl": "5m"},
            "container": {"id": "id", "skills": [{"skill_id": "pdf", "type": "anthropic", "version": "latest"}]},
            "diagnostics": {"previous_message_id": "previous_message_id"},
            "inference_geo": "inference_geo",
            "metadata": {"user_id": "13803d75-b4b5-4c3e-b2a2-6f21399b021b"},
            "output_config": {"effort": "low", "format": {"schema": {"foo": "bar"}, "type": "json_schema"}},
            "service_tier": "auto",
            "speed": "standard",
            "stop_sequences": ["string"],
            "stream": false,
            "system": [{"text": "Today's date is 2024-06-01.", "type": "text",
                        "cache_control": {"type": "ephemeral", "ttl": "5m"}}],
            "thinking": {"type": "adaptive", "display": "summarized"},
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
            "tools": [{"input_schema": {"type": "object"}, "name": "name", "type": "custom",
                       "defer_loading": true, "strict": true}],
        });
        let p = parse_messages(&body).unwrap();
        let mut names: Vec<_> = p.unbounded.iter().map(|(f, _)| f.as_str()).collect();
        names.sort_unstable();
        // (`service_tier: auto` is checked at selection, against the tiers the
        // destination's entry prices.)
        assert_eq!(names, ["container", "inference_geo"], "{:?}", p.unbounded);
        let mut fast = body.clone();
        fast["speed"] = json!("fast");
        let p = parse_messages(&fast).unwrap();
        assert!(
            p.unbounded.iter().any(|(f, _)| f == "speed"),
            "{:?}",
            p.unbounded
        );
    }

    #[test]
    fn the_recorded_codex_body_is_all_known_fields_and_client_tools() {
        let raw = include_str!("../../tests/fixtures/agents/codex-0.169.0-say-hi.json");
        let v: Value = serde_json::from_str(raw).unwrap();
        let p = parse_responses(&v["body"]).unwrap();
        assert!(p.unbounded.is_empty(), "{:?}", p.unbounded);
        assert_eq!(p.max_tokens, None);
        assert!(p.stream);
    }

    #[test]
    fn server_state_and_hosted_tools_are_named() {
        let p = parse_responses(&json!({
            "model": "m", "input": "hi", "store": true, "previous_response_id": "resp_1",
            "tools": [{"type": "function", "name": "f"}, {"type": "web_search"},
                      {"type": "namespace", "name": "n", "tools": [{"type": "file_search"}]}],
        }))
        .unwrap();
        let mut names: Vec<_> = p.unbounded.iter().map(|(f, _)| f.as_str()).collect();
        names.sort_unstable();
        // Storing is not unbounded by itself: a later turn is bounded by the ledger.
        assert_eq!(
            names,
            ["previous_response_id", "tools[1]", "tools[2].tools[0]"]
        );
        for store in [true, false] {
            let p = parse_responses(&json!({"model": "m", "input": "hi", "store": store})).unwrap();
            assert!(p.unbounded.is_empty());
        }
    }

    fn unbounded_names(body: Value) -> Vec<String> {
        let p = parse_responses(&body).unwrap();
        let mut names: Vec<_> = p.unbounded.into_iter().map(|(f, _)| f).collect();
        names.sort_unstable();
        names
    }

    /// Items OpenAI expands from its store by id are named; items that carry their own
    /// content (with or without an id) are not.
    #[test]
    fn input_items_by_reference_are_named() {
        let names = unbounded_names(json!({"model": "m", "input": [
            {"type": "item_reference", "id": "msg_1"},
            {"id": "msg_2"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "image_generation_call", "id": "ig_1", "status": "completed"},
            {"type": "message", "id": "msg_3", "role": "assistant", "content": []},
            // A summary is not the reasoning that is billed.
            {"type": "reasoning", "id": "rs_2",
             "summary": [{"type": "summary_text", "text": "thought"}]},
            // Below: content of their own.
            {"type": "message", "id": "msg_4", "role": "user",
             "content": [{"type": "input_text", "text": "hi"}]},
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "gAAA"},
            {"type": "image_generation_call", "id": "ig_2", "result": "iVBORw0KGgo="},
            {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
            {"type": "reasoning", "summary": []},
        ]}));
        assert_eq!(
            names,
            [
                "input[0]", "input[1]", "input[2]", "input[3]", "input[4]", "input[5]"
            ]
        );
    }

    #[test]
    fn a_shell_is_hosted_unless_its_environment_is_local() {
        let names = unbounded_names(json!({"model": "m", "input": "hi", "tools": [
            {"type": "shell"},
            {"type": "shell", "environment": {"type": "local"}},
            {"type": "shell", "environment": {"type": "container_auto"}},
            {"type": "shell", "environment": {"type": "container_reference", "container_id": "c"}},
            {"type": "shell", "environment": {}},
            {"type": "namespace", "name": "n", "tools": [
                {"type": "shell", "environment": {"type": "container_auto"}}]},
        ]}));
        assert_eq!(
            names,
            ["tools[2]", "tools[3]", "tools[4]", "tools[5].tools[0]"]
        );
    }

    #[test]
    fn messages_go_natively_to_anthropic_and_not_to_gemini() {
        let b = json!({});
        assert!(check(Ingress::Messages, Api::Anthropic, &b).is_ok());
        let (param, why) = check(Ingress::Messages, Api::Gemini, &b).unwrap_err();
        assert_eq!(param, "model");
        assert!(why.contains("`api: anthropic`"), "{why}");
    }

    #[test]
    fn responses_are_translated_for_anthropic_and_gemini_and_checked_by_the_chat_table() {
        let ok = json!({"model": "m", "input": "hi", "store": false});
        for api in [Api::Openai, Api::Anthropic, Api::Gemini] {
            assert!(check(Ingress::Responses, api, &ok).is_ok(), "{api:?}");
        }
        let hosted = json!({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]});
        assert!(check(Ingress::Responses, Api::Openai, &hosted).is_ok());
        let (param, why) = check(Ingress::Responses, Api::Gemini, &hosted).unwrap_err();
        assert_eq!(param, "tools[0]");
        assert!(why.contains("provider API `gemini`"), "{why}");
        // The chat table's refusal, named at the Responses path.
        let strict = json!({"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "f", "parameters": {}, "strict": true}]});
        let (param, _) = check(Ingress::Responses, Api::Anthropic, &strict).unwrap_err();
        assert_eq!(param, "tools[0].strict");
    }
}
