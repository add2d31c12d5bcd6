//! The request-field table: for every OpenAI chat-completions field, what each
//! destination API does with it — passed as it is, translated (into what), or refused
//! with `invalid_request` naming the field and the vendor. Nothing is dropped silently:
//! a field this table does not know passes to an OpenAI-compatible server (which knows
//! its own extensions) and is refused for Anthropic and Gemini.
//!
//! The table is data: [`check`] reads it to refuse before any upstream call, the
//! adapters' `prepare` functions implement its "translated" rows, `docs/compatibility.md`
//! is rendered from it by [`markdown`], and `tests/fields.rs` sends one request per row
//! through the gateway and asserts what the mock vendor received.
//!
//! A field set to `null` means "the default" and is not sent to Anthropic or Gemini.

use serde_json::Value;

use crate::policy::plan::Api;

/// What one API does with one field.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Sent as the client wrote it.
    Passed,
    /// Sent, rewritten into the vendor's form; the text says into what.
    Translated(&'static str),
    /// Translated for the values `accept` allows, refused for the others.
    Values {
        /// Into what, for the accepted values.
        translated: &'static str,
        /// Why the other values are refused.
        refused: &'static str,
        accept: fn(&Value) -> bool,
    },
    /// Refused: the text says why.
    Refused(&'static str),
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The OpenAI field, as a path: `messages[].tool_calls`, `messages[].content[].type=image_url`.
    pub field: &'static str,
    pub openai: Rule,
    pub anthropic: Rule,
    pub gemini: Rule,
}

impl Row {
    pub fn rule(&self, api: Api) -> Rule {
        match api {
            Api::Openai => self.openai,
            Api::Anthropic => self.anthropic,
            Api::Gemini => self.gemini,
        }
    }
}

/// A field the destination's API cannot take: refused before any upstream call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{param}` is not supported when the {} is {} (provider API `{}`): {why}", if *alternate { "policy's alternate destination" } else { "destination" }, vendor(*api), api.as_str())]
pub struct FieldRefusal {
    /// True when the alternate's API refused (the primary's took the request).
    pub alternate: bool,
    /// The table row that refused.
    pub field: &'static str,
    /// Where in this request: the row's path with indices filled in (OpenAI's `param`).
    pub param: String,
    pub api: Api,
    pub why: &'static str,
}

fn vendor(api: Api) -> &'static str {
    match api {
        Api::Openai => "an OpenAI-compatible server",
        Api::Anthropic => "Anthropic",
        Api::Gemini => "Gemini",
    }
}

use Rule::{Passed as P, Refused as R, Translated as T, Values};

/// Accepted when the value is `false`: asking for the vendor's default behaviour.
fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}

fn is_true(v: &Value) -> bool {
    v == &Value::Bool(true)
}

fn is_one(v: &Value) -> bool {
    v.as_u64() == Some(1)
}

fn is_zero(v: &Value) -> bool {
    v.as_u64() == Some(0)
}

fn at_most_one(v: &Value) -> bool {
    v.as_f64().is_some_and(|t| (0.0..=1.0).contains(&t))
}

fn text_only(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|m| m.iter().all(|x| x.as_str() == Some("text")))
}

fn format_type(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

fn format_text(v: &Value) -> bool {
    format_type(v) == Some("text")
}

fn format_gemini(v: &Value) -> bool {
    match format_type(v) {
        Some("text" | "json_object") => true,
        Some("json_schema") => v.pointer("/json_schema/schema").is_some(),
        _ => false,
    }
}

fn function_tools(v: &Value) -> bool {
    v.as_array().is_some_and(|tools| {
        tools.iter().all(|t| {
            t.get("type").and_then(Value::as_str) == Some("function")
                && t.pointer("/function/name")
                    .and_then(Value::as_str)
                    .is_some()
        })
    })
}

fn known_tool_choice(v: &Value) -> bool {
    match v {
        Value::String(s) => matches!(s.as_str(), "none" | "auto" | "required"),
        Value::Object(_) => {
            format_type(v) == Some("function")
                && v.pointer("/function/name")
                    .and_then(Value::as_str)
                    .is_some()
        }
        _ => false,
    }
}

const NO_SEED: &str = "the vendor has no seed";
const OPENAI_ONLY: &str = "an OpenAI feature the vendor has no equivalent for";
const BILLED_EXTRA: &str =
    "it adds work the vendor bills differently and purser's translation does not carry";

/// The table. Order is the order of `docs/compatibility.md`.
pub static TABLE: &[Row] = &[
    Row {
        field: "model",
        openai: T("the provider's own model id (`upstream`)"),
        anthropic: T("`model`: the provider's own model id"),
        gemini: T("the URL path `models/{id}:generateContent`"),
    },
    Row {
        field: "messages",
        openai: P,
        anthropic: T("`messages`; consecutive turns of one role are sent as they are"),
        gemini: T("`contents`"),
    },
    Row {
        field: "messages[].role=system/developer",
        openai: P,
        anthropic: T("lifted to the top-level `system` text (joined by a blank line)"),
        gemini: T("lifted to `systemInstruction.parts`"),
    },
    Row {
        field: "messages[].role=user",
        openai: P,
        anthropic: T("a `user` message"),
        gemini: T("a `user` content"),
    },
    Row {
        field: "messages[].role=assistant",
        openai: P,
        anthropic: T("an `assistant` message"),
        gemini: T("a `model` content"),
    },
    Row {
        field: "messages[].tool_calls",
        openai: P,
        anthropic: T("`tool_use` blocks `{id, name, input}` (arguments parsed as JSON)"),
        gemini: T("`functionCall` parts `{name, args}` (arguments parsed as JSON)"),
    },
    Row {
        field: "messages[].role=tool",
        openai: P,
        anthropic: T("a `user` message with a `tool_result` block `{tool_use_id, content}`"),
        gemini: T(
            "a `user` content with a `functionResponse` part `{name, response}`; the name is the matching tool call's, the response the result (JSON object as it is, other text as `{\"content\": text}`)",
        ),
    },
    Row {
        field: "messages[].tool_call_id",
        openai: P,
        anthropic: T("`tool_result.tool_use_id`"),
        gemini: T("finds the function name of the matching call"),
    },
    Row {
        field: "messages[].role=function",
        openai: P,
        anthropic: R("the deprecated `function` role; send `tool` messages"),
        gemini: R("the deprecated `function` role; send `tool` messages"),
    },
    Row {
        field: "messages[].name",
        openai: P,
        anthropic: R("the vendor has no per-message author name"),
        gemini: R("the vendor has no per-message author name"),
    },
    Row {
        field: "messages[].content[].type=text",
        openai: P,
        anthropic: T("a `text` block"),
        gemini: T("a `text` part"),
    },
    Row {
        field: "messages[].content[].type=image_url",
        openai: P,
        anthropic: T(
            "an `image` block: a `base64` source for a `data:` URL, a `url` source otherwise",
        ),
        gemini: T(
            "an `inlineData` part for a `data:` URL, a `fileData` part otherwise (with the `mimeType` of the URL's extension, video and audio included); the input bound counts it as an image, video, audio or file by that type, a URL of unknown type as the largest declared kind",
        ),
    },
    Row {
        field: "messages[].content[].image_url.detail",
        openai: P,
        anthropic: T("not sent (no-op): the vendor sizes images itself"),
        gemini: T("not sent (no-op): the vendor sizes images itself"),
    },
    Row {
        field: "messages[].content[].type",
        openai: P,
        anthropic: R(
            "only `text` and `image_url` parts are translated (audio, files and refusals are not)",
        ),
        gemini: R(
            "only `text` and `image_url` parts are translated (audio, files and refusals are not)",
        ),
    },
    Row {
        field: "messages[].*",
        openai: P,
        anthropic: R("a message field purser's translation does not carry"),
        gemini: R("a message field purser's translation does not carry"),
    },
    Row {
        field: "max_tokens",
        openai: T(
            "the bound the ceiling was proved with, in the field the model reads whichever the client used: the model entry's `cap_field`, else `max_completion_tokens` for OpenAI reasoning models (`o1`, `o3`, `o4-mini`, `gpt-5` and later) and `max_tokens` otherwise; the other cap field is removed",
        ),
        anthropic: T("`max_tokens`: the bound the ceiling was proved with"),
        gemini: T(
            "`generationConfig.maxOutputTokens`: the bound the ceiling was proved with; a thinking model (the entry's `reasoning_budget`, else `gemini-2.5` but not flash-lite, `gemini-3` and later: 8192) also gets `generationConfig.thinkingConfig.thinkingBudget`, counted in the output bound",
        ),
    },
    Row {
        field: "max_completion_tokens",
        openai: T(
            "the bound the ceiling was proved with, in the field the model reads whichever the client used: the model entry's `cap_field`, else `max_completion_tokens` for OpenAI reasoning models (`o1`, `o3`, `o4-mini`, `gpt-5` and later) and `max_tokens` otherwise; the other cap field is removed",
        ),
        anthropic: T("`max_tokens`: the bound the ceiling was proved with"),
        gemini: T(
            "`generationConfig.maxOutputTokens`: the bound the ceiling was proved with; a thinking model (the entry's `reasoning_budget`, else `gemini-2.5` but not flash-lite, `gemini-3` and later: 8192) also gets `generationConfig.thinkingConfig.thinkingBudget`, counted in the output bound",
        ),
    },
    Row {
        field: "stream",
        openai: P,
        anthropic: T("`stream`; events translated to OpenAI chunks"),
        gemini: T("the `streamGenerateContent?alt=sse` method; events translated to OpenAI chunks"),
    },
    Row {
        field: "stream_options",
        openai: T(
            "merged: `include_usage: true` is added (purser needs the usage chunk to know the cost), every other option is kept",
        ),
        anthropic: T(
            "not sent (no-op): the vendor always streams usage; purser's last chunk carries it",
        ),
        gemini: T(
            "not sent (no-op): the vendor always streams usage; purser's last chunk carries it",
        ),
    },
    Row {
        field: "temperature",
        openai: P,
        anthropic: Values {
            translated: "`temperature`",
            refused: "values above 1: the vendor's range is 0 to 1",
            accept: at_most_one,
        },
        gemini: T("`generationConfig.temperature`"),
    },
    Row {
        field: "top_p",
        openai: P,
        anthropic: T("`top_p`"),
        gemini: T("`generationConfig.topP`"),
    },
    Row {
        field: "stop",
        openai: P,
        anthropic: T("`stop_sequences` (a string becomes a one-item list)"),
        gemini: T("`generationConfig.stopSequences` (a string becomes a one-item list)"),
    },
    Row {
        field: "n",
        openai: P,
        anthropic: Values {
            translated: "not sent when 1 (no-op: the vendor gives one choice)",
            refused: "n > 1: the vendor gives one choice per call",
            accept: is_one,
        },
        // Gemini can answer several candidates, but purser translates one back: asking
        // for more would bill choices the client never sees.
        gemini: Values {
            translated: "not sent when 1 (no-op: one candidate)",
            refused: "n > 1: purser translates one candidate back",
            accept: is_one,
        },
    },
    Row {
        field: "seed",
        openai: P,
        anthropic: R(NO_SEED),
        gemini: T("`generationConfig.seed`"),
    },
    Row {
        field: "presence_penalty",
        openai: P,
        anthropic: R("the vendor has no presence penalty"),
        gemini: T("`generationConfig.presencePenalty`"),
    },
    Row {
        field: "frequency_penalty",
        openai: P,
        anthropic: R("the vendor has no frequency penalty"),
        gemini: T("`generationConfig.frequencyPenalty`"),
    },
    Row {
        field: "logprobs",
        openai: P,
        anthropic: Values {
            translated: "not sent when false (no-op)",
            refused: "true: the vendor returns no log probabilities",
            accept: is_false,
        },
        gemini: Values {
            translated: "not sent when false (no-op)",
            refused: "true: purser does not translate the vendor's log probabilities back",
            accept: is_false,
        },
    },
    Row {
        field: "top_logprobs",
        openai: P,
        anthropic: Values {
            translated: "not sent when 0 (no-op)",
            refused: "the vendor returns no log probabilities",
            accept: is_zero,
        },
        gemini: Values {
            translated: "not sent when 0 (no-op)",
            refused: "purser does not translate the vendor's log probabilities back",
            accept: is_zero,
        },
    },
    Row {
        field: "logit_bias",
        openai: P,
        anthropic: R("the vendor has no logit bias"),
        gemini: R("the vendor has no logit bias"),
    },
    Row {
        field: "tools",
        openai: P,
        anthropic: Values {
            translated: "`tools`: `{name, description, input_schema}` per function",
            refused: "only `function` tools are translated",
            accept: function_tools,
        },
        gemini: Values {
            translated: "`tools[0].functionDeclarations`: `{name, description, parameters}` per function",
            refused: "only `function` tools are translated",
            accept: function_tools,
        },
    },
    Row {
        field: "tools[].function.strict",
        openai: P,
        anthropic: Values {
            translated: "not sent when false (no-op)",
            refused: "true: purser's translation does not carry strict schema adherence",
            accept: is_false,
        },
        gemini: Values {
            translated: "not sent when false (no-op)",
            refused: "true: the vendor has no strict schema adherence for functions",
            accept: is_false,
        },
    },
    Row {
        field: "tool_choice",
        openai: P,
        anthropic: Values {
            translated: "`tool_choice`: `none` → `{type: none}`, `auto` → `{type: auto}`, `required` → `{type: any}`, a named function → `{type: tool, name}`",
            refused: "an unknown tool_choice",
            accept: known_tool_choice,
        },
        gemini: Values {
            translated: "`toolConfig.functionCallingConfig`: `none` → `NONE`, `auto` → `AUTO`, `required` → `ANY`, a named function → `ANY` with `allowedFunctionNames: [name]`",
            refused: "an unknown tool_choice",
            accept: known_tool_choice,
        },
    },
    Row {
        field: "parallel_tool_calls",
        openai: P,
        anthropic: T(
            "`tool_choice.disable_parallel_tool_use` = not the value (with `tool_choice` `{type: auto}` when the client gave none); not sent without tools",
        ),
        gemini: Values {
            translated: "not sent when true (no-op: the vendor may return several calls)",
            refused: "false: the vendor cannot be held to one call",
            accept: is_true,
        },
    },
    Row {
        field: "response_format",
        openai: P,
        anthropic: Values {
            translated: "not sent for `{type: text}` (no-op)",
            refused: "`json_object` and `json_schema`: the vendor has no JSON output mode purser translates to",
            accept: format_text,
        },
        gemini: Values {
            translated: "`{type: text}` not sent (no-op); `json_object` → `generationConfig.responseMimeType: application/json`; `json_schema` → that and `generationConfig.responseJsonSchema` (the schema as given)",
            refused: "an unknown format, or a `json_schema` without `schema`",
            accept: format_gemini,
        },
    },
    Row {
        field: "user",
        openai: P,
        anthropic: T("`metadata.user_id`"),
        gemini: R("the vendor has no end-user field"),
    },
    Row {
        field: "metadata",
        openai: P,
        anthropic: R("the vendor's metadata takes only a user id (send `user`)"),
        gemini: R("the vendor has no request metadata"),
    },
    Row {
        field: "store",
        openai: P,
        anthropic: Values {
            translated: "not sent when false (no-op)",
            refused: "true: stored completions are an OpenAI feature",
            accept: is_false,
        },
        gemini: Values {
            translated: "not sent when false (no-op)",
            refused: "true: stored completions are an OpenAI feature",
            accept: is_false,
        },
    },
    Row {
        field: "modalities",
        openai: P,
        anthropic: Values {
            translated: "not sent when `[\"text\"]` (no-op)",
            refused: "audio output is not translated",
            accept: text_only,
        },
        gemini: Values {
            translated: "not sent when `[\"text\"]` (no-op)",
            refused: "audio output is not translated",
            accept: text_only,
        },
    },
    Row {
        field: "audio",
        openai: P,
        anthropic: R("audio output is not translated"),
        gemini: R("audio output is not translated"),
    },
    Row {
        field: "reasoning_effort",
        openai: P,
        anthropic: R("the vendor's thinking budget is not translated"),
        gemini: R("the vendor's thinking budget is not translated"),
    },
    Row {
        field: "verbosity",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "service_tier",
        openai: P,
        anthropic: R(BILLED_EXTRA),
        gemini: R(BILLED_EXTRA),
    },
    Row {
        field: "prediction",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "web_search_options",
        openai: P,
        anthropic: R(BILLED_EXTRA),
        gemini: R(BILLED_EXTRA),
    },
    Row {
        field: "functions",
        openai: P,
        anthropic: R("the deprecated `functions`; send `tools`"),
        gemini: R("the deprecated `functions`; send `tools`"),
    },
    Row {
        field: "function_call",
        openai: P,
        anthropic: R("the deprecated `function_call`; send `tool_choice`"),
        gemini: R("the deprecated `function_call`; send `tool_choice`"),
    },
    Row {
        field: "moderation",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "prompt_cache_key",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "prompt_cache_options",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "prompt_cache_retention",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "safety_identifier",
        openai: P,
        anthropic: R(OPENAI_ONLY),
        gemini: R(OPENAI_ONLY),
    },
    Row {
        field: "*",
        openai: P,
        anthropic: R("a field purser's Anthropic translation does not know"),
        gemini: R("a field purser's Gemini translation does not know"),
    },
];

/// The row for `field`; the catch-all `*` row for a top-level field the table lacks.
pub fn row(field: &str) -> &'static Row {
    let find = |f: &str| TABLE.iter().find(|r| r.field == f);
    match find(field) {
        Some(r) => r,
        // A nested path falls back to its own catch-all; a top-level one to `*`.
        None if field.starts_with("messages[].content[]") => {
            find("messages[].content[].type").unwrap_or(&CATCH_ALL)
        }
        None if field.starts_with("messages[]") => find("messages[].*").unwrap_or(&CATCH_ALL),
        None => find("*").unwrap_or(&CATCH_ALL),
    }
}

/// Used only if the table lost its `*` row: refuse, never pass by accident.
static CATCH_ALL: Row = Row {
    field: "*",
    openai: P,
    anthropic: R("unknown field"),
    gemini: R("unknown field"),
};

/// Apply one row to one value at `param`.
fn apply(api: Api, row: &'static Row, param: String, v: &Value) -> Result<(), FieldRefusal> {
    let refuse = |why| FieldRefusal {
        alternate: false,
        field: row.field,
        param: param.clone(),
        api,
        why,
    };
    match row.rule(api) {
        Rule::Passed | Rule::Translated(_) => Ok(()),
        Rule::Refused(why) => Err(refuse(why)),
        Rule::Values {
            refused, accept, ..
        } => {
            if accept(v) {
                Ok(())
            } else {
                Err(refuse(refused))
            }
        }
    }
}

/// The check of a whole route, primary and alternate at once: for callers that want a
/// request refused unless every destination it may reach can take it. The gateway
/// checks the primary before admission and the alternate at failover instead, so an
/// alternate's limits never refuse what the primary would serve.
pub fn check_route(primary: Api, alternate: Option<Api>, body: &Value) -> Result<(), FieldRefusal> {
    check(primary, body)?;
    match alternate {
        Some(api) => check(api, body).map_err(|r| FieldRefusal {
            alternate: true,
            ..r
        }),
        None => Ok(()),
    }
}

/// Refuse what `api` cannot take, before any upstream call: the first field at fault.
/// Pure; an OpenAI-compatible destination refuses nothing.
pub fn check(api: Api, body: &Value) -> Result<(), FieldRefusal> {
    if api == Api::Openai {
        return Ok(());
    }
    let Some(obj) = body.as_object() else {
        return Ok(());
    };
    for (k, v) in obj {
        if v.is_null() {
            continue;
        }
        apply(api, row(k), k.clone(), v)?;
        match k.as_str() {
            "messages" => check_messages(api, v)?,
            "tools" => {
                for (i, t) in v.as_array().into_iter().flatten().enumerate() {
                    if let Some(s) = t.pointer("/function/strict").filter(|s| !s.is_null()) {
                        apply(
                            api,
                            row("tools[].function.strict"),
                            format!("tools[{i}].function.strict"),
                            s,
                        )?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_messages(api: Api, messages: &Value) -> Result<(), FieldRefusal> {
    for (i, m) in messages.as_array().into_iter().flatten().enumerate() {
        let Some(m) = m.as_object() else { continue };
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let role_row = match role {
            "system" | "developer" => "messages[].role=system/developer",
            "user" => "messages[].role=user",
            "assistant" => "messages[].role=assistant",
            "tool" => "messages[].role=tool",
            _ => "messages[].role=function",
        };
        apply(
            api,
            row(role_row),
            format!("messages[{i}].role"),
            &Value::Null,
        )?;
        for (k, v) in m {
            if v.is_null() || matches!(k.as_str(), "role" | "content") {
                continue;
            }
            apply(
                api,
                row(&format!("messages[].{k}")),
                format!("messages[{i}].{k}"),
                v,
            )?;
        }
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
            let param = format!("messages[{i}].content[{j}].type");
            match ty {
                "text" => apply(api, row("messages[].content[].type=text"), param, p)?,
                // Images are user input; an assistant or system turn has none to send.
                "image_url" if role == "user" => {
                    apply(api, row("messages[].content[].type=image_url"), param, p)?
                }
                _ => apply(api, row("messages[].content[].type"), param, p)?,
            }
        }
    }
    Ok(())
}

/// One cell of the rendered table.
fn cell(rule: Rule) -> String {
    match rule {
        Rule::Passed => "passed".into(),
        Rule::Translated(into) => format!("translated: {into}"),
        Rule::Refused(why) => format!("**refused**: {why}"),
        Rule::Values {
            translated,
            refused,
            ..
        } => format!("translated: {translated}; **refused**: {refused}"),
    }
}

/// `docs/compatibility.md`, rendered from the table (a test keeps the file equal to it).
pub fn markdown() -> String {
    let mut s = String::from(
        "# Request compatibility: what each vendor receives\n\n\
         Generated from `src/upstream/fields.rs` by `purser::upstream::fields::markdown()`;\n\
         `tests/fields.rs` fails when this file differs from the table, and sends one request\n\
         per row through the gateway to check what the vendor receives.\n\n\
         Every OpenAI chat-completions request field is **passed** as it is, **translated**\n\
         (into what is said), or **refused** before any upstream call with a 400\n\
         `invalid_request` whose `param` names the field and whose message names the vendor.\n\
         Nothing is dropped silently: a field not in this table passes to an\n\
         OpenAI-compatible server and is refused for Anthropic and Gemini (row `*`). A field\n\
         set to `null` means the default and is not sent to Anthropic or Gemini.\n\n\
         The primary destination's API is checked before admission. An alternate of\n\
         another API is checked when the request fails over to it, before its call.\n\n\
         | field | OpenAI-compatible | Anthropic | Gemini |\n|---|---|---|---|\n",
    );
    for r in TABLE {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            r.field,
            cell(r.openai).replace('|', "\\|"),
            cell(r.anthropic).replace('|', "\\|"),
            cell(r.gemini).replace('|', "\\|"),
        ));
    }
    s.push_str(
        "\n## What the input bound counts\n\n\
         Whatever is sent is counted: the input bound of a destination is computed over the\n\
         body as that destination's API receives it (`src/upstream/bound.rs`), every\n\
         string, key and number of it by its UTF-8 bytes (no tokenizer makes more tokens\n\
         than bytes), plus the overheads below. A part whose tokens cannot be read from its\n\
         bytes (any part type but `text` and `refusal`: images, audio, video, files, remote\n\
         URLs; an assistant turn's `audio` reference) counts at the bound its model entry\n\
         declares in `media_tokens`, or is\n\
         refused with `invalid_request` naming it under a hard ceiling and under any policy\n\
         with a budget.\n\n\
         | API | per | tokens | source |\n|---|---|---|---|\n",
    );
    for o in super::bound::OVERHEADS {
        let per = match o.per {
            super::bound::Per::Request => "request",
            super::bound::Per::Message => "message",
            super::bound::Per::Tool => "tool",
            super::bound::Per::ToolUsePrompt => "request with tools (tool-use prompt)",
            super::bound::Per::DefinedTool => "tool the vendor defines (typed client tool)",
        };
        s.push_str(&format!(
            "| {} | {per} | {} | {} |\n",
            o.api.as_str(),
            o.tokens,
            o.source.replace('|', "\\|")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_refuses_nothing_and_the_others_refuse_the_unknown() {
        let body = json!({"model": "m", "messages": [], "frobnicate": 1});
        assert_eq!(check(Api::Openai, &body), Ok(()));
        for api in [Api::Anthropic, Api::Gemini] {
            let e = check(api, &body).unwrap_err();
            assert_eq!((e.field, e.param.as_str()), ("*", "frobnicate"));
        }
    }

    #[test]
    fn values_rows_accept_the_default_and_refuse_the_rest() {
        let ok = json!({"n": 1, "logprobs": false, "store": false, "modalities": ["text"], "response_format": {"type": "text"}});
        assert_eq!(check(Api::Anthropic, &ok), Ok(()));
        let e = check(Api::Anthropic, &json!({"n": 2})).unwrap_err();
        assert_eq!(e.param, "n");
        assert!(e.to_string().contains("Anthropic"), "{e}");
        assert_eq!(check(Api::Gemini, &json!({"n": 3})).unwrap_err().param, "n");
    }

    #[test]
    fn nested_paths_name_the_message_and_part() {
        let body = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}]}]});
        let e = check(Api::Gemini, &body).unwrap_err();
        assert_eq!(e.param, "messages[1].content[1].type");
        let e = check(
            Api::Anthropic,
            &json!({"messages": [{"role": "user", "content": "x", "name": "bob"}]}),
        )
        .unwrap_err();
        assert_eq!(
            (e.field, e.param.as_str()),
            ("messages[].name", "messages[0].name")
        );
    }

    #[test]
    fn every_row_is_rendered() {
        let md = markdown();
        for r in TABLE {
            assert!(md.contains(&format!("| `{}` |", r.field)), "{}", r.field);
        }
    }
}
