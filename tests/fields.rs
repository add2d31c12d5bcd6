//! The request-field table (`purser::upstream::fields::TABLE`) against what vendors
//! receive: for every row, requests go through a real gateway to each vendor API's mock,
//! and the test asserts what the mock received (passed and translated rows) or that
//! the client got a 400 `invalid_request` whose `param` names the field and whose
//! message names the vendor, with no call made (refused rows). A row without a case
//! here, or a case that contradicts its row, fails the test; so does
//! `docs/compatibility.md` when it differs from the table.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use common::{provider, sha};
use purser::policy::plan::Api;
use purser::upstream::fields::{Rule, TABLE};
use serde_json::{Value, json};

const KEY: &str = "key-fields";

/// What one vendor API should make of a case.
enum E {
    /// Served, and the vendor's body has these values at these JSON pointers
    /// (`null` expected: the pointer is absent).
    Sent(Vec<(&'static str, Value)>),
    /// Served: what the row says is in the URL, not the body (Gemini's model and method).
    Served,
    /// 400 `invalid_request` with this `param`, and no call.
    Refused(&'static str),
}

use E::{Refused, Sent, Served};

struct Case {
    rows: &'static [&'static str],
    /// Merged into `{"model", "messages": [user "hello"]}`.
    patch: Value,
    openai: E,
    anthropic: E,
    gemini: E,
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
}

fn refused_rows(field: &'static str, value: Value) -> Case {
    let ptr: &'static str = Box::leak(format!("/{field}").into_boxed_str());
    Case {
        rows: Box::leak(vec![field].into_boxed_slice()),
        patch: json!({ field: value.clone() }),
        openai: Sent(vec![(ptr, value)]),
        anthropic: Refused(field),
        gemini: Refused(field),
    }
}

fn cases() -> Vec<Case> {
    let hello = json!([{"role": "user", "content": "hello"}]);
    let tool_round = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\":21}"}
    ]);
    let mut c = vec![
        Case {
            rows: &["model", "messages", "messages[].role=user"],
            patch: json!({}),
            openai: Sent(vec![
                ("/model", json!("m-openai")),
                ("/messages", hello.clone()),
            ]),
            anthropic: Sent(vec![
                ("/model", json!("m-anthropic")),
                ("/messages", hello.clone()),
            ]),
            gemini: Sent(vec![(
                "/contents",
                json!([{"role": "user", "parts": [{"text": "hello"}]}]),
            )]),
        },
        Case {
            rows: &["messages[].role=system/developer"],
            patch: json!({"messages": [{"role": "developer", "content": "be brief"}, {"role": "system", "content": "and kind"}, {"role": "user", "content": "hello"}]}),
            openai: Sent(vec![("/messages/0/role", json!("developer"))]),
            anthropic: Sent(vec![
                ("/system", json!("be brief\n\nand kind")),
                ("/messages", hello.clone()),
            ]),
            gemini: Sent(vec![(
                "/systemInstruction",
                json!({"parts": [{"text": "be brief"}, {"text": "and kind"}]}),
            )]),
        },
        Case {
            rows: &["messages[].role=assistant"],
            patch: json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "again"}]}),
            openai: Sent(vec![("/messages/1/content", json!("hello there"))]),
            anthropic: Sent(vec![(
                "/messages/1",
                json!({"role": "assistant", "content": "hello there"}),
            )]),
            gemini: Sent(vec![(
                "/contents/1",
                json!({"role": "model", "parts": [{"text": "hello there"}]}),
            )]),
        },
        Case {
            rows: &[
                "messages[].tool_calls",
                "messages[].role=tool",
                "messages[].tool_call_id",
            ],
            patch: json!({"messages": tool_round, "tools": [weather_tool()]}),
            openai: Sent(vec![
                ("/messages/1/tool_calls/0/id", json!("call_1")),
                ("/messages/2/tool_call_id", json!("call_1")),
            ]),
            anthropic: Sent(vec![
                (
                    "/messages/1",
                    json!({"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]}),
                ),
                (
                    "/messages/2",
                    json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "{\"temp\":21}"}]}),
                ),
            ]),
            gemini: Sent(vec![
                (
                    "/contents/1",
                    json!({"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]}),
                ),
                (
                    "/contents/2",
                    json!({"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 21}}}]}),
                ),
            ]),
        },
        Case {
            rows: &["messages[].role=function"],
            patch: json!({"messages": [{"role": "user", "content": "hi"}, {"role": "function", "name": "f", "content": "x"}]}),
            openai: Sent(vec![("/messages/1/role", json!("function"))]),
            anthropic: Refused("messages[1].role"),
            gemini: Refused("messages[1].role"),
        },
        Case {
            rows: &["messages[].name"],
            patch: json!({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}),
            openai: Sent(vec![("/messages/0/name", json!("bob"))]),
            anthropic: Refused("messages[0].name"),
            gemini: Refused("messages[0].name"),
        },
        Case {
            rows: &["messages[].content[].type=text"],
            patch: json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
            openai: Sent(vec![("/messages/0/content/1/text", json!("b"))]),
            anthropic: Sent(vec![(
                "/messages/0/content",
                json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
            )]),
            gemini: Sent(vec![(
                "/contents/0/parts",
                json!([{"text": "a"}, {"text": "b"}]),
            )]),
        },
        Case {
            rows: &[
                "messages[].content[].type=image_url",
                "messages[].content[].image_url.detail",
            ],
            patch: json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"}}]}]}),
            openai: Sent(vec![(
                "/messages/0/content/1/image_url/detail",
                json!("high"),
            )]),
            anthropic: Sent(vec![(
                "/messages/0/content/1",
                json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}),
            )]),
            gemini: Sent(vec![(
                "/contents/0/parts/1",
                json!({"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}),
            )]),
        },
        Case {
            rows: &["messages[].content[].type=image_url"],
            patch: json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}]}),
            openai: Sent(vec![(
                "/messages/0/content/0/image_url/url",
                json!("https://example.com/cat.jpg"),
            )]),
            anthropic: Sent(vec![(
                "/messages/0/content/0",
                json!({"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}),
            )]),
            gemini: Sent(vec![(
                "/contents/0/parts/0",
                json!({"fileData": {"fileUri": "https://example.com/cat.jpg", "mimeType": "image/jpeg"}}),
            )]),
        },
        Case {
            rows: &["messages[].content[].type"],
            patch: json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]}),
            openai: Sent(vec![("/messages/0/content/0/type", json!("input_audio"))]),
            anthropic: Refused("messages[0].content[0].type"),
            gemini: Refused("messages[0].content[0].type"),
        },
        Case {
            rows: &["messages[].*"],
            patch: json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "audio": {"id": "audio_1"}}, {"role": "user", "content": "again"}]}),
            openai: Sent(vec![("/messages/1/audio/id", json!("audio_1"))]),
            anthropic: Refused("messages[1].audio"),
            gemini: Refused("messages[1].audio"),
        },
        Case {
            rows: &["max_tokens"],
            patch: json!({"max_tokens": 50}),
            openai: Sent(vec![
                ("/max_tokens", json!(50)),
                ("/max_completion_tokens", Value::Null),
            ]),
            anthropic: Sent(vec![("/max_tokens", json!(50))]),
            gemini: Sent(vec![("/generationConfig/maxOutputTokens", json!(50))]),
        },
        Case {
            rows: &["max_completion_tokens"],
            patch: json!({"max_tokens": 60, "max_completion_tokens": 40}),
            // The tighter cap, in the field this model reads (`m-openai` is not a
            // reasoning model: `max_tokens`), whichever field the client used.
            openai: Sent(vec![
                ("/max_tokens", json!(40)),
                ("/max_completion_tokens", Value::Null),
            ]),
            anthropic: Sent(vec![
                ("/max_tokens", json!(40)),
                ("/max_completion_tokens", Value::Null),
            ]),
            gemini: Sent(vec![("/generationConfig/maxOutputTokens", json!(40))]),
        },
        Case {
            rows: &["stream"],
            patch: json!({"stream": true}),
            openai: Sent(vec![("/stream", json!(true))]),
            anthropic: Sent(vec![("/stream", json!(true))]),
            gemini: Served,
        },
        Case {
            rows: &["stream_options"],
            patch: json!({"stream": true, "stream_options": {"include_obfuscation": true}}),
            openai: Sent(vec![(
                "/stream_options",
                json!({"include_obfuscation": true, "include_usage": true}),
            )]),
            anthropic: Sent(vec![("/stream_options", Value::Null)]),
            gemini: Sent(vec![("/stream_options", Value::Null)]),
        },
        Case {
            rows: &["temperature"],
            patch: json!({"temperature": 0.5}),
            openai: Sent(vec![("/temperature", json!(0.5))]),
            anthropic: Sent(vec![("/temperature", json!(0.5))]),
            gemini: Sent(vec![("/generationConfig/temperature", json!(0.5))]),
        },
        Case {
            rows: &["temperature"],
            patch: json!({"temperature": 1.5}),
            openai: Sent(vec![("/temperature", json!(1.5))]),
            anthropic: Refused("temperature"),
            gemini: Sent(vec![("/generationConfig/temperature", json!(1.5))]),
        },
        Case {
            rows: &["top_p"],
            patch: json!({"top_p": 0.9}),
            openai: Sent(vec![("/top_p", json!(0.9))]),
            anthropic: Sent(vec![("/top_p", json!(0.9))]),
            gemini: Sent(vec![("/generationConfig/topP", json!(0.9))]),
        },
        Case {
            rows: &["stop"],
            patch: json!({"stop": "END"}),
            openai: Sent(vec![("/stop", json!("END"))]),
            anthropic: Sent(vec![("/stop_sequences", json!(["END"]))]),
            gemini: Sent(vec![("/generationConfig/stopSequences", json!(["END"]))]),
        },
        Case {
            rows: &["n"],
            patch: json!({"n": 1}),
            openai: Sent(vec![("/n", json!(1))]),
            anthropic: Sent(vec![("/n", Value::Null)]),
            gemini: Sent(vec![("/generationConfig/candidateCount", Value::Null)]),
        },
        Case {
            rows: &["n"],
            patch: json!({"n": 2}),
            openai: Sent(vec![("/n", json!(2))]),
            anthropic: Refused("n"),
            gemini: Refused("n"),
        },
        Case {
            rows: &["seed"],
            patch: json!({"seed": 7}),
            openai: Sent(vec![("/seed", json!(7))]),
            anthropic: Refused("seed"),
            gemini: Sent(vec![("/generationConfig/seed", json!(7))]),
        },
        Case {
            rows: &["presence_penalty"],
            patch: json!({"presence_penalty": 0.5}),
            openai: Sent(vec![("/presence_penalty", json!(0.5))]),
            anthropic: Refused("presence_penalty"),
            gemini: Sent(vec![("/generationConfig/presencePenalty", json!(0.5))]),
        },
        Case {
            rows: &["frequency_penalty"],
            patch: json!({"frequency_penalty": 0.5}),
            openai: Sent(vec![("/frequency_penalty", json!(0.5))]),
            anthropic: Refused("frequency_penalty"),
            gemini: Sent(vec![("/generationConfig/frequencyPenalty", json!(0.5))]),
        },
        Case {
            rows: &["logprobs"],
            patch: json!({"logprobs": false}),
            openai: Sent(vec![("/logprobs", json!(false))]),
            anthropic: Sent(vec![("/logprobs", Value::Null)]),
            gemini: Sent(vec![("/generationConfig/responseLogprobs", Value::Null)]),
        },
        Case {
            rows: &["logprobs"],
            patch: json!({"logprobs": true}),
            openai: Sent(vec![("/logprobs", json!(true))]),
            anthropic: Refused("logprobs"),
            gemini: Refused("logprobs"),
        },
        Case {
            rows: &["top_logprobs"],
            patch: json!({"top_logprobs": 0}),
            openai: Sent(vec![("/top_logprobs", json!(0))]),
            anthropic: Sent(vec![("/top_logprobs", Value::Null)]),
            gemini: Sent(vec![("/generationConfig/logprobs", Value::Null)]),
        },
        Case {
            rows: &["top_logprobs"],
            patch: json!({"top_logprobs": 2}),
            openai: Sent(vec![("/top_logprobs", json!(2))]),
            anthropic: Refused("top_logprobs"),
            gemini: Refused("top_logprobs"),
        },
        Case {
            rows: &["tools"],
            patch: json!({"tools": [weather_tool()]}),
            openai: Sent(vec![("/tools/0", weather_tool())]),
            anthropic: Sent(vec![(
                "/tools",
                json!([{"name": "get_weather", "description": "Weather in a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]),
            )]),
            gemini: Sent(vec![(
                "/tools",
                json!([{"functionDeclarations": [{"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}]),
            )]),
        },
        Case {
            rows: &["tools"],
            patch: json!({"tools": [{"type": "custom", "custom": {"name": "grammar"}}]}),
            openai: Sent(vec![("/tools/0/type", json!("custom"))]),
            anthropic: Refused("tools"),
            gemini: Refused("tools"),
        },
        Case {
            rows: &["tools[].function.strict"],
            patch: json!({"tools": [{"type": "function", "function": {"name": "f", "strict": false}}]}),
            openai: Sent(vec![("/tools/0/function/strict", json!(false))]),
            anthropic: Sent(vec![(
                "/tools",
                json!([{"name": "f", "input_schema": {"type": "object"}}]),
            )]),
            gemini: Sent(vec![(
                "/tools",
                json!([{"functionDeclarations": [{"name": "f"}]}]),
            )]),
        },
        Case {
            rows: &["tools[].function.strict"],
            patch: json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true}}]}),
            openai: Sent(vec![("/tools/0/function/strict", json!(true))]),
            anthropic: Refused("tools[0].function.strict"),
            gemini: Refused("tools[0].function.strict"),
        },
        Case {
            rows: &["tool_choice"],
            patch: json!({"tools": [weather_tool()], "tool_choice": "required"}),
            openai: Sent(vec![("/tool_choice", json!("required"))]),
            anthropic: Sent(vec![("/tool_choice", json!({"type": "any"}))]),
            gemini: Sent(vec![(
                "/toolConfig",
                json!({"functionCallingConfig": {"mode": "ANY"}}),
            )]),
        },
        Case {
            rows: &["tool_choice"],
            patch: json!({"tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
            openai: Sent(vec![("/tool_choice/function/name", json!("get_weather"))]),
            anthropic: Sent(vec![(
                "/tool_choice",
                json!({"type": "tool", "name": "get_weather"}),
            )]),
            gemini: Sent(vec![(
                "/toolConfig",
                json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}}),
            )]),
        },
        Case {
            rows: &["tool_choice"],
            patch: json!({"tools": [weather_tool()], "tool_choice": "none"}),
            openai: Sent(vec![("/tool_choice", json!("none"))]),
            anthropic: Sent(vec![("/tool_choice", json!({"type": "none"}))]),
            gemini: Sent(vec![(
                "/toolConfig",
                json!({"functionCallingConfig": {"mode": "NONE"}}),
            )]),
        },
        Case {
            rows: &["tool_choice"],
            patch: json!({"tools": [weather_tool()], "tool_choice": "sometimes"}),
            openai: Sent(vec![("/tool_choice", json!("sometimes"))]),
            anthropic: Refused("tool_choice"),
            gemini: Refused("tool_choice"),
        },
        Case {
            rows: &["parallel_tool_calls"],
            patch: json!({"tools": [weather_tool()], "parallel_tool_calls": true}),
            openai: Sent(vec![("/parallel_tool_calls", json!(true))]),
            anthropic: Sent(vec![(
                "/tool_choice",
                json!({"type": "auto", "disable_parallel_tool_use": false}),
            )]),
            gemini: Sent(vec![("/toolConfig", Value::Null)]),
        },
        Case {
            rows: &["parallel_tool_calls"],
            patch: json!({"tools": [weather_tool()], "parallel_tool_calls": false}),
            openai: Sent(vec![("/parallel_tool_calls", json!(false))]),
            anthropic: Sent(vec![(
                "/tool_choice",
                json!({"type": "auto", "disable_parallel_tool_use": true}),
            )]),
            gemini: Refused("parallel_tool_calls"),
        },
        Case {
            rows: &["response_format"],
            patch: json!({"response_format": {"type": "text"}}),
            openai: Sent(vec![("/response_format/type", json!("text"))]),
            anthropic: Sent(vec![("/response_format", Value::Null)]),
            gemini: Sent(vec![("/generationConfig/responseMimeType", Value::Null)]),
        },
        Case {
            rows: &["response_format"],
            patch: json!({"response_format": {"type": "json_object"}}),
            openai: Sent(vec![("/response_format/type", json!("json_object"))]),
            anthropic: Refused("response_format"),
            gemini: Sent(vec![(
                "/generationConfig/responseMimeType",
                json!("application/json"),
            )]),
        },
        Case {
            rows: &["response_format"],
            patch: json!({"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": false}}}}),
            openai: Sent(vec![("/response_format/json_schema/name", json!("city"))]),
            anthropic: Refused("response_format"),
            gemini: Sent(vec![
                (
                    "/generationConfig/responseMimeType",
                    json!("application/json"),
                ),
                (
                    "/generationConfig/responseJsonSchema",
                    json!({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": false}),
                ),
            ]),
        },
        Case {
            rows: &["response_format"],
            patch: json!({"response_format": {"type": "json_schema", "json_schema": {"name": "no-schema"}}}),
            openai: Sent(vec![(
                "/response_format/json_schema/name",
                json!("no-schema"),
            )]),
            anthropic: Refused("response_format"),
            gemini: Refused("response_format"),
        },
        Case {
            rows: &["user"],
            patch: json!({"user": "u-1"}),
            openai: Sent(vec![("/user", json!("u-1"))]),
            anthropic: Sent(vec![("/metadata", json!({"user_id": "u-1"}))]),
            gemini: Refused("user"),
        },
        Case {
            rows: &["store"],
            patch: json!({"store": false}),
            openai: Sent(vec![("/store", json!(false))]),
            anthropic: Sent(vec![("/store", Value::Null)]),
            gemini: Sent(vec![("/store", Value::Null)]),
        },
        Case {
            rows: &["store"],
            patch: json!({"store": true}),
            openai: Sent(vec![("/store", json!(true))]),
            anthropic: Refused("store"),
            gemini: Refused("store"),
        },
        Case {
            rows: &["modalities"],
            patch: json!({"modalities": ["text"]}),
            openai: Sent(vec![("/modalities", json!(["text"]))]),
            anthropic: Sent(vec![("/modalities", Value::Null)]),
            gemini: Sent(vec![("/modalities", Value::Null)]),
        },
        Case {
            rows: &["modalities"],
            patch: json!({"modalities": ["text", "audio"]}),
            openai: Sent(vec![("/modalities", json!(["text", "audio"]))]),
            anthropic: Refused("modalities"),
            gemini: Refused("modalities"),
        },
    ];
    for (field, value) in [
        ("logit_bias", json!({"50256": -100})),
        ("metadata", json!({"team": "search"})),
        ("audio", json!({"format": "wav", "voice": "alloy"})),
        ("reasoning_effort", json!("low")),
        ("verbosity", json!("low")),
        ("service_tier", json!("flex")),
        ("prediction", json!({"type": "content", "content": "draft"})),
        ("web_search_options", json!({"search_context_size": "low"})),
        (
            "functions",
            json!([{"name": "f", "parameters": {"type": "object"}}]),
        ),
        ("function_call", json!("none")),
        ("moderation", json!({"model": "m"})),
        ("prompt_cache_key", json!("k-1")),
        ("prompt_cache_options", json!({"mode": "implicit"})),
        ("prompt_cache_retention", json!("in_memory")),
        ("safety_identifier", json!("s-1")),
    ] {
        c.push(refused_rows(field, value));
    }
    c.push(Case {
        rows: &["*"],
        patch: json!({"frobnicate": 1}),
        openai: Sent(vec![("/frobnicate", json!(1))]),
        anthropic: Refused("frobnicate"),
        gemini: Refused("frobnicate"),
    });
    c
}

fn expect(case: &Case, api: Api) -> &E {
    match api {
        Api::Openai => &case.openai,
        Api::Anthropic => &case.anthropic,
        Api::Gemini => &case.gemini,
    }
}

/// Every row has a case for it, and no case contradicts its row: a refused row refuses
/// in every case, a passed or translated row in none, a by-value row in some but not all.
#[test]
fn every_row_of_the_table_has_cases_that_agree_with_it() {
    let cases = cases();
    for row in TABLE {
        let mine: Vec<&Case> = cases
            .iter()
            .filter(|c| c.rows.contains(&row.field))
            .collect();
        assert!(!mine.is_empty(), "no case exercises row `{}`", row.field);
        for api in [Api::Openai, Api::Anthropic, Api::Gemini] {
            let refused = mine
                .iter()
                .filter(|c| matches!(expect(c, api), Refused(_)))
                .count();
            match row.rule(api) {
                Rule::Refused(_) => assert_eq!(refused, mine.len(), "`{}` {api:?}", row.field),
                Rule::Passed | Rule::Translated(_) => {
                    assert_eq!(refused, 0, "`{}` {api:?}", row.field)
                }
                Rule::Values { .. } => assert!(
                    refused > 0 && refused < mine.len(),
                    "`{}` {api:?}: a by-value row needs an accepted and a refused case",
                    row.field
                ),
            }
        }
    }
    for c in &cases {
        for r in c.rows {
            assert!(
                TABLE.iter().any(|row| row.field == *r),
                "case names unknown row `{r}`"
            );
        }
    }
}

#[test]
fn docs_compatibility_md_is_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/compatibility.md");
    let want = purser::upstream::fields::markdown();
    if std::env::var("PURSER_BLESS").is_ok() {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/compatibility.md differs from src/upstream/fields.rs; regenerate it with PURSER_BLESS=1 cargo test --test fields"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_each_vendor_receives_is_what_its_row_says() {
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "to-openai", "openai", "us", &[("m-openai", "0.15", "0.60")]),
            provider(vendors, "to-anthropic", "anthropic", "us", &[("m-anthropic", "0.15", "0.60")]),
            provider(vendors, "to-gemini", "gemini", "us", &[("m-gemini", "0.15", "0.60")]),
            // Soft, so the rows are seen apart from what a hard ceiling refuses as unbounded.
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [m-openai, m-anthropic, m-gemini]\njurisdictions: [us]\nceiling: {{ per_request: \"5.00\", mode: soft }}\nmax_output_tokens: 256\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    let http = reqwest::Client::new();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (i, case) in cases().iter().enumerate() {
        for api in [Api::Openai, Api::Anthropic, Api::Gemini] {
            let (name, model) = (
                format!("to-{}", api.as_str()),
                format!("m-{}", api.as_str()),
            );
            let mut body =
                json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
            for (k, v) in case.patch.as_object().unwrap() {
                body[k] = v.clone();
            }
            let before = g.vendors.calls(&name);
            let r = http
                .post(g.url("/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            let sent = g.vendors.sent(&name);
            let label = format!("case {i} {:?} → {}", case.rows, api.as_str());
            checked += 1;
            match expect(case, api) {
                Refused(param) => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    let vendor = match api {
                        Api::Openai => "OpenAI",
                        Api::Anthropic => "Anthropic",
                        Api::Gemini => "Gemini",
                    };
                    let ok = status == 400
                        && v["error"]["code"] == "invalid_request"
                        && v["error"]["param"] == *param
                        && v["error"]["message"]
                            .as_str()
                            .unwrap_or("")
                            .contains(vendor)
                        && sent.len() == before;
                    if !ok {
                        wrong.push(format!("{label}: want 400 naming `{param}` and {vendor}, no call; got {status} {text}"));
                    }
                }
                Served | Sent(_) if status != 200 || sent.len() != before + 1 => {
                    wrong.push(format!(
                        "{label}: want served with one call; got {status} {text}"
                    ));
                }
                Served => {}
                Sent(checks) => {
                    let got = &sent[before].body;
                    for (ptr, want) in checks {
                        let have = got.pointer(ptr);
                        let ok = match want {
                            Value::Null => have.is_none(),
                            w => have == Some(w),
                        };
                        if !ok {
                            wrong.push(format!(
                                "{label}: at {ptr} want {want}, the vendor got {}",
                                have.map_or("nothing".into(), Value::to_string)
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked} checks wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The primary's API is what admission checks: a field the primary (OpenAI-compatible)
/// takes is served even when the alternate (Anthropic) could not take it; a failover
/// checks the alternate's API before its call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_checks_the_primarys_api() {
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "primary", "openai", "us", &[("m", "0.15", "0.60")]),
            provider(vendors, "alt", "anthropic", "us", &[("m", "1.50", "6.00")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"5.00\", mode: soft }}\nmax_output_tokens: 256\nalternates:\n  m: alt/m\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    let r = reqwest::Client::new()
        .post(g.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(g.vendors.sent("primary")[0].body["seed"], 7);
    assert_eq!(g.vendors.calls("alt"), 0);
    // The whole-route check, for callers that want it, names the alternate.
    let e = purser::upstream::fields::check_route(
        Api::Openai,
        Some(Api::Anthropic),
        &json!({"seed": 7}),
    )
    .unwrap_err();
    assert!(
        e.alternate && e.param == "seed" && e.to_string().contains("alternate"),
        "{e}"
    );
}

/// Tool calls survive translation both ways: the vendor's own call (Anthropic
/// `tool_use`, Gemini `functionCall`) reaches the client as OpenAI `tool_calls`, and
/// when the client sends that message back with the `tool` result, the vendor receives
/// its own call and a result naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_results_survive_the_round_trip() {
    use common::vendors::Script;
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "to-anthropic", "anthropic", "us", &[("m-anthropic", "0.15", "0.60")]),
            provider(vendors, "to-gemini", "gemini", "us", &[("m-gemini", "0.15", "0.60")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [m-anthropic, m-gemini]\njurisdictions: [us]\nceiling: {{ per_request: \"5.00\", mode: soft }}\nmax_output_tokens: 256\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    g.vendors.script(
        "to-anthropic",
        vec![Script::Status(
            200,
            r#"{"id":"msg_1","type":"message","role":"assistant","model":"m-anthropic","content":[{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris"}}],"stop_reason":"tool_use","usage":{"input_tokens":20,"output_tokens":9}}"#.into(),
        )],
    );
    g.vendors.script(
        "to-gemini",
        vec![Script::Status(
            200,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_weather","args":{"city":"Paris"}}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":20,"candidatesTokenCount":9}}"#.into(),
        )],
    );
    let http = reqwest::Client::new();
    for api in ["anthropic", "gemini"] {
        let model = format!("m-{api}");
        let mut messages = vec![json!({"role": "user", "content": "Weather in Paris?"})];
        let ask = |messages: &Vec<Value>| {
            http.post(g.url("/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&json!({"model": model, "messages": messages, "tools": [weather_tool()]}))
                .send()
        };
        let first: Value = ask(&messages).await.unwrap().json().await.unwrap();
        let message = first["choices"][0]["message"].clone();
        let call = &message["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{api}: {first}");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}), "{api}");
        let id = call["id"].as_str().unwrap().to_string();
        messages.push(message);
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "{\"temp\":21}"}));
        let second = ask(&messages).await.unwrap();
        assert_eq!(second.status().as_u16(), 200, "{api}");
        let sent = g.vendors.sent(&format!("to-{api}"));
        let body = &sent[1].body;
        if api == "anthropic" {
            assert_eq!(
                body["messages"][1]["content"],
                json!([{"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]),
                "{body}"
            );
            assert_eq!(
                body["messages"][2]["content"],
                json!([{"type": "tool_result", "tool_use_id": "toolu_01", "content": "{\"temp\":21}"}]),
                "{body}"
            );
        } else {
            assert_eq!(
                body["contents"][1]["parts"],
                json!([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]),
                "{body}"
            );
            assert_eq!(
                body["contents"][2],
                json!({"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 21}}}]}),
                "{body}"
            );
        }
    }
}
