//! Usage as each vendor reports it, read from the vendors' own wire formats (the mock
//! vendors' fixtures), in plain answers and in streams cut at every event.

use serde_json::{Value, json};

use super::stream::{ChunkTranslator, SseDecoder, SseEvent};
use super::{InferenceGeo, Usage, translate};
use crate::ids::{Jurisdiction, ModelName, ProviderId};
use crate::money::PricePerMTok;
use crate::policy::plan::{Api, Destination, Tier};

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/vendors/", $name))
    };
}

fn dest(api: Api) -> Destination {
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
        terms: Default::default(),
    }
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn usage(input: u64, cached: u64, write: u64, output: u64, reasoning: Option<u64>) -> Usage {
    Usage {
        input: Some(input),
        cached_input: Some(cached),
        cache_write: Some(write),
        output: Some(output),
        reasoning,
        ..Usage::default()
    }
}

/// Where Anthropic's fixtures say their inference ran (`global`).
const ANYWHERE: Option<InferenceGeo> = Some(InferenceGeo::Anywhere);

fn events(sse: &str) -> Vec<SseEvent> {
    let mut d = SseDecoder::default();
    let mut out = d.push(sse.as_bytes()).unwrap();
    out.extend(d.finish());
    out
}

/// The translator's usage after the first `n` events of a stream.
fn after(api: Api, evs: &[SseEvent], n: usize) -> Usage {
    let mut t = ChunkTranslator::new(api, &dest(api));
    for e in &evs[..n] {
        t.event(e);
    }
    t.usage()
}

/// The client-facing usage of a translated answer.
fn client_usage(api: Api, body: &str) -> (Value, Usage) {
    let (v, u) = translate(api, &dest(api), json_of(body));
    (v["usage"].clone(), u)
}

#[test]
fn openai_cached_and_reasoning_tokens_are_parts_of_the_totals() {
    let (_, u) = client_usage(Api::Openai, fixture!("openai-usage-detail.json"));
    // The fixture says it was served at the standard tier.
    // OpenAI reports no cache writes (it bills none): unreported, which pricing reads
    // as a structural 0 where no write can be billed.
    assert_eq!(
        u,
        Usage {
            served_tier: Some(super::ServedTier::Standard),
            cache_write: None,
            audio_input: Some(0),
            ..usage(2000, 1536, 0, 300, Some(256))
        }
    );
    let (_, u) = client_usage(Api::Openai, fixture!("openai.json"));
    assert_eq!(
        u,
        Usage {
            served_tier: Some(super::ServedTier::Standard),
            cache_write: None,
            audio_input: Some(0),
            ..usage(12, 0, 0, 8, Some(0))
        }
    );
}

#[test]
fn an_openai_compatible_answer_without_details_leaves_the_split_unreported() {
    let u = super::openai::usage(&json!({"usage": {"prompt_tokens": 5, "completion_tokens": 2}}));
    assert_eq!(
        u,
        Usage {
            input: Some(5),
            cached_input: None,
            cache_write: None,
            output: Some(2),
            reasoning: None,
            ..Usage::default()
        }
    );
}

#[test]
fn missing_usage_is_not_zero_usage() {
    for (api, body) in [
        (Api::Openai, fixture!("openai-no-usage.json")),
        (Api::Anthropic, fixture!("anthropic-no-usage.json")),
        (Api::Gemini, fixture!("gemini-no-usage.json")),
    ] {
        let (client, u) = client_usage(api, body);
        assert_eq!(u, Usage::default(), "{api:?}");
        if api != Api::Openai {
            // Shown as 0 (clients expect numbers), without details that would claim more.
            assert_eq!(
                client,
                json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
            );
        }
    }
    // A count that is null or not a count is not reported either.
    let u =
        super::openai::usage(&json!({"usage": {"prompt_tokens": null, "completion_tokens": "8"}}));
    assert_eq!((u.input, u.output), (None, None));
}

#[test]
fn anthropic_cache_reads_and_writes_are_added_to_input_tokens() {
    let (client, u) = client_usage(Api::Anthropic, fixture!("anthropic-cache.json"));
    // The fixture splits writes by lifetime: none of them 1-hour. Its inference ran
    // anywhere (`global`), as every fixture of Anthropic's says.
    assert_eq!(
        u,
        Usage {
            cache_write_1h: Some(0),
            geo: ANYWHERE,
            ..usage(4012, 3000, 1000, 8, None)
        }
    );
    assert_eq!(
        client,
        json!({"prompt_tokens": 4012, "completion_tokens": 8, "total_tokens": 4020,
               "prompt_tokens_details": {"cached_tokens": 3000}})
    );
    let (_, u) = client_usage(Api::Anthropic, fixture!("anthropic.json"));
    assert_eq!(
        u,
        Usage {
            geo: ANYWHERE,
            ..usage(12, 0, 0, 8, None)
        }
    );
}

#[test]
fn anthropic_without_cache_counts_leaves_them_unreported() {
    let u = super::anthropic::usage(
        &json!({"input_tokens": 7, "cache_read_input_tokens": null, "output_tokens": 3}),
    );
    assert_eq!(
        u,
        Usage {
            input: Some(7),
            cached_input: None,
            cache_write: None,
            output: Some(3),
            reasoning: None,
            ..Usage::default()
        }
    );
}

#[test]
fn gemini_thoughts_are_output_and_cached_content_is_part_of_the_prompt() {
    let (client, u) = client_usage(Api::Gemini, fixture!("gemini-thoughts.json"));
    // Its breakdown by modality names no audio: none.
    assert_eq!(
        u,
        Usage {
            audio_input: Some(0),
            ..usage(1200, 1024, 0, 128, Some(120))
        }
    );
    assert_eq!(
        client,
        json!({"prompt_tokens": 1200, "completion_tokens": 128, "total_tokens": 1328,
               "prompt_tokens_details": {"cached_tokens": 1024},
               "completion_tokens_details": {"reasoning_tokens": 120}})
    );
    // The thought summary is not part of the answer.
    let (v, _) = translate(
        Api::Gemini,
        &dest(Api::Gemini),
        json_of(fixture!("gemini-thoughts.json")),
    );
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Hello from {provider}."
    );
    let (_, u) = client_usage(Api::Gemini, fixture!("gemini.json"));
    assert_eq!(
        u,
        Usage {
            audio_input: Some(0),
            ..usage(12, 0, 0, 8, Some(0))
        }
    );
}

#[test]
fn gemini_tool_use_prompt_is_input_and_the_total_catches_omitted_counts() {
    let m = json!({"promptTokenCount": 100, "toolUsePromptTokenCount": 50, "candidatesTokenCount": 10, "totalTokenCount": 160});
    assert_eq!(
        super::gemini::usage(&m, true),
        usage(150, 0, 0, 10, Some(0))
    );
    // proto3 JSON omits zero counts; the total still says how much output there was.
    let m = json!({"promptTokenCount": 100, "totalTokenCount": 130});
    assert_eq!(super::gemini::usage(&m, true).output, Some(30));
    // The blocked answer: prompt only, no output.
    let (_, u) = client_usage(Api::Gemini, fixture!("gemini-blocked.json"));
    assert_eq!((u.input, u.output), (Some(12), Some(0)));
    // Neither candidates nor total: the output is not reported.
    let m = json!({"promptTokenCount": 100});
    assert_eq!(super::gemini::usage(&m, true).output, None);
}

#[test]
fn streams_report_the_same_usage_as_plain_answers() {
    for (api, sse, want) in [
        (
            Api::Openai,
            fixture!("openai.sse"),
            // This fixture's usage chunk has no details: the split is unreported.
            Usage {
                cached_input: None,
                cache_write: None,
                ..usage(12, 0, 0, 8, None)
            },
        ),
        (
            Api::Openai,
            fixture!("openai-usage-detail.sse"),
            Usage {
                cache_write: None,
                audio_input: Some(0),
                ..usage(2000, 1536, 0, 300, Some(256))
            },
        ),
        (
            Api::Anthropic,
            fixture!("anthropic.sse"),
            Usage {
                geo: ANYWHERE,
                ..usage(12, 0, 0, 8, None)
            },
        ),
        (
            Api::Anthropic,
            fixture!("anthropic-cache.sse"),
            // As the plain answer: writes split by cache lifetime, none for an hour.
            Usage {
                cache_write_1h: Some(0),
                geo: ANYWHERE,
                ..usage(4012, 3000, 1000, 8, None)
            },
        ),
        (
            Api::Gemini,
            fixture!("gemini.sse"),
            usage(12, 0, 0, 8, Some(0)),
        ),
        (
            Api::Gemini,
            fixture!("gemini-thoughts.sse"),
            usage(1200, 1024, 0, 128, Some(120)),
        ),
    ] {
        let evs = events(sse);
        assert_eq!(after(api, &evs, evs.len()), want, "{api:?}");
    }
}

#[test]
fn a_stream_cut_before_its_closing_usage_reports_no_output() {
    for (api, sse) in [
        (Api::Openai, fixture!("openai.sse")),
        (Api::Openai, fixture!("openai-usage-detail.sse")),
        (Api::Anthropic, fixture!("anthropic.sse")),
        (Api::Anthropic, fixture!("anthropic-cache.sse")),
        (Api::Gemini, fixture!("gemini.sse")),
        (Api::Gemini, fixture!("gemini-thoughts.sse")),
    ] {
        let evs = events(sse);
        // The event that closes the usage: OpenAI's usage chunk, Anthropic's
        // message_delta, Gemini's chunk with the finish reason.
        let closing = evs
            .iter()
            .position(|e| {
                e.data.contains("\"usage\":{\"prompt")
                    || e.data.contains("message_delta")
                    || e.data.contains("finishReason")
            })
            .unwrap();
        for n in 0..=closing {
            let u = after(api, &evs, n);
            assert_eq!(u.output, None, "{api:?} after {n} events: {u:?}");
            assert_eq!(u.reasoning, None, "{api:?} after {n} events");
        }
        assert!(after(api, &evs, closing + 1).output.is_some(), "{api:?}");
    }
}

#[test]
fn anthropic_input_is_known_from_message_start() {
    let evs = events(fixture!("anthropic-cache.sse"));
    let u = after(Api::Anthropic, &evs, 1);
    assert_eq!(
        (u.input, u.cached_input, u.cache_write),
        (Some(4012), Some(3000), Some(1000))
    );
}

#[test]
fn anthropic_message_delta_counts_are_cumulative_and_override() {
    let start = SseEvent {
        event: Some("message_start".into()),
        data: json!({"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 10, "output_tokens": 1}}}).to_string(),
    };
    let delta = SseEvent {
        event: Some("message_delta".into()),
        data: json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                     "usage": {"input_tokens": 10, "cache_read_input_tokens": 20, "cache_creation_input_tokens": null, "output_tokens": 5}}).to_string(),
    };
    let mut t = ChunkTranslator::new(Api::Anthropic, &dest(Api::Anthropic));
    t.event(&start);
    t.event(&delta);
    let u = t.usage();
    assert_eq!(
        (u.input, u.cached_input, u.cache_write, u.output),
        (Some(30), Some(20), None, Some(5))
    );
}

#[test]
fn the_closing_usage_chunk_reports_the_parts() {
    let evs = events(fixture!("gemini-thoughts.sse"));
    let mut t = ChunkTranslator::new(Api::Gemini, &dest(Api::Gemini));
    let mut text = String::new();
    for e in &evs {
        for c in t.event(e) {
            text.push_str(
                c.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            );
        }
    }
    assert_eq!(
        text, "Hello from {provider}.",
        "thought summaries are not streamed"
    );
    let chunk = t.usage_chunk("0.01");
    assert_eq!(
        chunk["usage"],
        json!({"prompt_tokens": 1200, "completion_tokens": 128, "total_tokens": 1328,
               "prompt_tokens_details": {"cached_tokens": 1024},
               "completion_tokens_details": {"reasoning_tokens": 120}})
    );
    assert_eq!(chunk["purser_cost"], "0.01");
}

#[test]
fn a_replayed_answer_keeps_the_usage_it_was_read_with() {
    let (_, u) = client_usage(Api::Anthropic, fixture!("anthropic-cache.json"));
    let mut t = ChunkTranslator::new(Api::Openai, &dest(Api::Openai));
    t.set_usage(u);
    t.event(&SseEvent {
        event: None,
        data: json!({"choices": [], "usage": {"prompt_tokens": 4012, "completion_tokens": 8}})
            .to_string(),
    });
    assert_eq!(
        t.usage(),
        Usage {
            cache_write_1h: Some(0),
            geo: ANYWHERE,
            ..usage(4012, 3000, 1000, 8, None)
        }
    );
}

#[test]
fn openai_output_is_read_at_the_largest_figure_the_usage_implies() {
    // The relay's reading: completion 0, but total − prompt and the reasoning say 60+.
    let u = super::openai::usage_block(&json!({"prompt_tokens": 21, "completion_tokens": 0,
        "total_tokens": 81, "completion_tokens_details": {"reasoning_tokens": 60}}));
    assert_eq!(
        (u.input, u.output, u.reasoning),
        (Some(21), Some(60), Some(60))
    );
    // Reasoning larger than both: the output is at least the reasoning.
    let u = super::openai::usage_block(&json!({"prompt_tokens": 10, "completion_tokens": 5,
        "total_tokens": 15, "completion_tokens_details": {"reasoning_tokens": 40}}));
    assert_eq!(u.output, Some(40));
    // Reasoning where some compatible servers put it.
    let u = super::openai::usage_block(
        &json!({"prompt_tokens": 10, "completion_tokens": 0, "reasoning_tokens": 33}),
    );
    assert_eq!((u.output, u.reasoning), (Some(33), Some(33)));
    // A consistent usage reads as it is.
    let u = super::openai::usage_block(
        &json!({"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}),
    );
    assert_eq!((u.input, u.output), (Some(12), Some(8)));
    // A total alone (no completion count) is a reading of the output.
    let u = super::openai::usage_block(&json!({"prompt_tokens": 12, "total_tokens": 50}));
    assert_eq!(u.output, Some(38));
    // Reasoning alone is a part, not a total: the output stays unreported.
    let u = super::openai::usage_block(
        &json!({"prompt_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 7}}),
    );
    assert_eq!(u.output, None);
    // Cache reads above the prompt count: the prompt is at least the reads.
    let u = super::openai::usage_block(&json!({"prompt_tokens": 0, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 500}}));
    assert_eq!(u.input, Some(500));
}

#[test]
fn gemini_output_is_read_at_the_largest_figure_the_usage_implies() {
    // candidates + thoughts against total − prompt − tool-use prompt: the larger.
    let m = json!({"promptTokenCount": 21, "candidatesTokenCount": 0, "thoughtsTokenCount": 10,
        "totalTokenCount": 81});
    let u = super::gemini::usage(&m, true);
    assert_eq!(
        (u.input, u.output, u.reasoning),
        (Some(21), Some(60), Some(10))
    );
    let m = json!({"promptTokenCount": 21, "candidatesTokenCount": 30, "thoughtsTokenCount": 60,
        "totalTokenCount": 81});
    assert_eq!(super::gemini::usage(&m, true).output, Some(90));
    // Cached content above the prompt count: the prompt is at least the cache.
    let m =
        json!({"promptTokenCount": 5, "cachedContentTokenCount": 900, "candidatesTokenCount": 1});
    assert_eq!(super::gemini::usage(&m, true).input, Some(900));
}

#[test]
fn a_stream_reads_its_usage_chunk_at_the_largest_reading() {
    let mut t = ChunkTranslator::new(Api::Openai, &dest(Api::Openai));
    t.event(&SseEvent {
        event: None,
        data: json!({"choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 0,
            "total_tokens": 81, "completion_tokens_details": {"reasoning_tokens": 60}}})
        .to_string(),
    });
    // Before the stream ends (or a finish reason), a usage block is a running count.
    assert_eq!(t.usage().output, None);
    t.event(&SseEvent {
        event: None,
        data: "[DONE]".into(),
    });
    assert_eq!(t.usage().output, Some(60));
}

fn translated(api: Api, evs: &[(Option<&str>, Value)]) -> ChunkTranslator {
    let mut t = ChunkTranslator::new(api, &dest(api));
    for (name, data) in evs {
        t.event(&SseEvent {
            event: name.map(str::to_string),
            data: data.to_string(),
        });
    }
    t
}

#[test]
fn any_generated_output_marks_a_stream_started_and_names_alone_do_not() {
    let started = |api, e: Value| translated(api, &[(None, e)]).generated();
    for delta in [
        json!({"reasoning_content": "hm"}),
        json!({"reasoning": "hm"}),
        json!({"reasoning_details": [{"type": "reasoning.text", "text": "hm"}]}),
        json!({"content": "a"}),
        json!({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}]}),
        // A kind of output no one listed yet counts too.
        json!({"audio": {"data": "AAAA"}}),
    ] {
        assert!(
            started(
                Api::Openai,
                json!({"choices": [{"index": 0, "delta": delta}]})
            ),
            "{delta}"
        );
    }
    for delta in [
        json!({"role": "assistant"}),
        json!({"role": "assistant", "content": "", "refusal": null}),
        json!({}),
    ] {
        assert!(
            !started(
                Api::Openai,
                json!({"choices": [{"index": 0, "delta": delta}]})
            ),
            "{delta}"
        );
    }
    let a = |name: &str, v: Value| translated(Api::Anthropic, &[(Some(name), v)]).generated();
    assert!(a(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}})
    ));
    assert!(a(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}})
    ));
    assert!(!a(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    ));
    assert!(started(
        Api::Gemini,
        json!({"candidates": [{"content": {"parts": [{"text": "hm", "thought": true}]}}]})
    ));
    assert!(!started(
        Api::Gemini,
        json!({"candidates": [{"content": {"parts": [{"text": ""}]}}]})
    ));
}

#[test]
fn finish_reasons_are_mapped_once_per_vendor_for_answers_and_streams() {
    for (reason, want) in [
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("RECITATION", "content_filter"),
    ] {
        let (v, _) = translate(
            Api::Gemini,
            &dest(Api::Gemini),
            json!({"candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": reason}]}),
        );
        assert_eq!(v["choices"][0]["finish_reason"], want, "{reason}");
        let t = translated(
            Api::Gemini,
            &[(
                None,
                json!({"candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": reason}]}),
            )],
        );
        assert_eq!(t.finish_reason(), Some(want), "{reason}");
    }
    for (reason, want) in [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ] {
        let (v, _) = translate(
            Api::Anthropic,
            &dest(Api::Anthropic),
            json!({"content": [{"type": "text", "text": "a"}], "stop_reason": reason}),
        );
        assert_eq!(v["choices"][0]["finish_reason"], want, "{reason}");
        let t = translated(
            Api::Anthropic,
            &[(
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 1}}),
            )],
        );
        assert_eq!(t.finish_reason(), Some(want), "{reason}");
    }
}

#[test]
fn a_responses_usage_with_a_class_purser_does_not_price_is_marked_unpriced() {
    let u = |details: Value| {
        super::openai::usage_block(&json!({
            "input_tokens": 3000, "input_tokens_details": details,
            "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 30},
            "total_tokens": 3040,
        }))
    };
    // Cached reads are priced; zero writes are nothing to price.
    let plain = u(json!({"cached_tokens": 2048, "cache_write_tokens": 0,
                         "cache_write_tokens_details": {"ttl_30m_tokens": 0, "ttl_12h_tokens": 0}}));
    assert!(!plain.unpriced);
    assert_eq!((plain.input, plain.cached_input), (Some(3000), Some(2048)));
    // Cache writes and audio are priced apart (`pricing::charge`: writes where the
    // destination bills them, audio at the entry's audio rate, else estimated there).
    let writes = u(json!({"cached_tokens": 0, "cache_write_tokens": 1024, "audio_tokens": 10}));
    assert!(!writes.unpriced);
    assert_eq!(
        (writes.cache_write, writes.audio_input),
        (Some(1024), Some(10))
    );
    // A class purser does not price apart (image tokens, or one added later):
    // estimated.
    let images = u(json!({"cached_tokens": 0, "image_tokens": 765}));
    assert!(images.unpriced);
}

/// Server-side compaction reports each pass in `usage.iterations`; the top level may
/// count only the last. The ledger reads the sum where it is larger, figure by figure.
#[test]
fn anthropic_compaction_iterations_are_summed_when_larger() {
    let u = super::anthropic::usage(&json!({
        "input_tokens": 100, "output_tokens": 20,
        "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
        "iterations": [
            {"type": "compaction", "input_tokens": 180000, "output_tokens": 3000,
             "cache_read_input_tokens": 500, "cache_creation_input_tokens": 0},
            {"type": "message", "input_tokens": 100, "output_tokens": 20,
             "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        ],
    }));
    assert_eq!(u.input, Some(180_600));
    assert_eq!(u.output, Some(3020));
    assert_eq!(u.cached_input, Some(500));
    // Top-level figures larger than the sum stay as they are.
    let u = super::anthropic::usage(&json!({
        "input_tokens": 900, "output_tokens": 50,
        "iterations": [{"type": "message", "input_tokens": 10, "output_tokens": 5}],
    }));
    assert_eq!((u.input, u.output), (Some(900), Some(50)));
}

/// A stream's compaction passes come in `message_delta`'s usage: they survive the
/// merge with `message_start`'s and are summed as in a plain answer.
#[test]
fn anthropic_streamed_compaction_iterations_are_summed() {
    let start = SseEvent {
        event: Some("message_start".into()),
        data: json!({"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 10, "output_tokens": 1}}}).to_string(),
    };
    let delta = SseEvent {
        event: Some("message_delta".into()),
        data: json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                     "usage": {"input_tokens": 10, "output_tokens": 5, "iterations": [
                         {"type": "compaction", "input_tokens": 50000, "output_tokens": 2000},
                         {"type": "message", "input_tokens": 10, "output_tokens": 5}]}})
        .to_string(),
    };
    let mut t = ChunkTranslator::new(Api::Anthropic, &dest(Api::Anthropic));
    t.event(&start);
    t.event(&delta);
    let u = t.usage();
    assert_eq!((u.input, u.output), (Some(50_010), Some(2005)));
}

/// Chat's usage names as the Responses API spells them, at any depth.
fn as_responses_usage(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let k = match k.as_str() {
                        "prompt_tokens" => "input_tokens",
                        "completion_tokens" => "output_tokens",
                        "prompt_tokens_details" => "input_tokens_details",
                        "completion_tokens_details" => "output_tokens_details",
                        k => k,
                    };
                    (k.to_string(), as_responses_usage(v))
                })
                .collect(),
        ),
        v => v.clone(),
    }
}

/// Every reading chat's usage takes, the Responses API's takes too: one rule under
/// two dialects' names, so a relay's extra field (a cache write under Anthropic's
/// name, reasoning at the top level, a total above the parts) is never read in one and
/// missed in the other.
#[test]
fn a_responses_usage_is_read_by_the_same_rule_as_chats() {
    let readings = [
        json!({"prompt_tokens": 21, "completion_tokens": 0, "total_tokens": 81,
               "completion_tokens_details": {"reasoning_tokens": 60}}),
        json!({"prompt_tokens": 10, "completion_tokens": 0, "reasoning_tokens": 33}),
        json!({"prompt_tokens": 12, "total_tokens": 50}),
        json!({"prompt_tokens": 100, "completion_tokens": 5,
               "prompt_tokens_details": {"cached_tokens": 300}}),
        json!({"prompt_tokens": 900, "completion_tokens": 5, "cache_creation_input_tokens": 700}),
        json!({"prompt_tokens": 900, "completion_tokens": 5,
               "prompt_tokens_details": {"cache_write_tokens": 200,
                                         "cache_creation_input_tokens": 400}}),
        json!({"prompt_tokens": 900, "completion_tokens": 5,
               "completion_tokens_details": {"audio_tokens": 7}}),
    ];
    for chat in readings {
        let responses = as_responses_usage(&chat);
        assert_eq!(
            super::openai::usage_block(&responses),
            super::openai::usage_block(&chat),
            "{responses}"
        );
    }
    // The readings the Responses reader took from one place only before.
    let u = super::openai::usage_block(&json!({"input_tokens": 900, "output_tokens": 5,
        "cache_creation_input_tokens": 700, "reasoning_tokens": 40}));
    assert_eq!(
        (u.cache_write, u.output, u.reasoning),
        (Some(700), Some(40), Some(40))
    );
}

/// An error body of a Responses call carries the Responses API's names: "usage found
/// anywhere in it is priced" (DESIGN 5) whichever API's names it uses, so such an
/// answer is billed at its usage, not as unbilled (a 5xx without usage) nor at the
/// worst case.
#[test]
fn an_error_bodys_usage_is_read_under_either_openai_apis_names() {
    let responses = json!({"error": {"message": "upstream cut", "type": "server_error"},
        "usage": {"input_tokens": 1200, "output_tokens": 800, "total_tokens": 2000}});
    let chat = json!({"error": {"message": "upstream cut", "type": "server_error"},
        "usage": {"prompt_tokens": 1200, "completion_tokens": 800, "total_tokens": 2000}});
    for body in [responses, chat] {
        let u = super::usage(Api::Openai, &body);
        assert_eq!((u.input, u.output), (Some(1200), Some(800)), "{body}");
    }
}

/// A Responses stream's terminal events each carry a usage; a relay that repeats the end
/// with a smaller or zeroed one must not lower what was billed (as for a chat stream's
/// usage chunks).
#[test]
fn a_responses_streams_usage_is_the_largest_its_terminal_events_report() {
    let mut t = ChunkTranslator::new(Api::Openai, &dest(Api::Openai));
    t.for_responses();
    let end = |ty: &str, output: u64| SseEvent {
        event: Some(ty.to_string()),
        data: json!({"type": ty, "response": {"id": "resp_1", "status": "completed",
            "usage": {"input_tokens": 50, "output_tokens": output, "total_tokens": 50 + output}}})
        .to_string(),
    };
    t.event(&end("response.failed", 800));
    t.event(&end("response.completed", 0));
    assert_eq!(t.usage().output, Some(800));
}

/// A usage block counts the output before it: output after the last block (a relay's
/// early usage-only chunk, then the answer) leaves the output unknown even once the
/// stream ends whole, so it is charged at its bound. A running count on every chunk
/// (`continuous_usage_stats`) counts all of it and stays a receipt.
#[test]
fn an_early_usage_block_is_no_receipt_for_output_after_it() {
    let usage =
        |out: u64| json!({"prompt_tokens": 12, "completion_tokens": out, "total_tokens": 12 + out});
    let content = |s: &str| json!({"choices": [{"index": 0, "delta": {"content": s}, "finish_reason": null}]});
    let finish = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
    let done = |t: &mut ChunkTranslator| {
        t.event(&SseEvent {
            event: None,
            data: "[DONE]".into(),
        })
    };
    let early = json!({"choices": [], "usage": usage(0)});
    let mut t = translated(
        Api::Openai,
        &[
            (None, early),
            (None, content("a long answer")),
            (None, finish.clone()),
        ],
    );
    done(&mut t);
    assert_eq!((t.usage().input, t.usage().output), (Some(12), None));

    let mut running = content("a");
    running["usage"] = usage(1);
    let mut last = content("b");
    last["usage"] = usage(2);
    let mut t = translated(
        Api::Openai,
        &[(None, running), (None, last), (None, finish)],
    );
    done(&mut t);
    assert_eq!(t.usage().output, Some(2));
}

/// Where a stream's inference ran is read from `message_start` and kept at its
/// dearest: a later `global` does not undo a region.
#[test]
fn an_anthropic_streams_region_is_kept_at_its_dearest_reading() {
    let start = |geo: &str| json!({"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 10, "output_tokens": 1, "inference_geo": geo}}});
    let delta = |geo: &str| json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5, "inference_geo": geo}});
    let geo_of = |a: &str, b: &str| {
        translated(
            Api::Anthropic,
            &[
                (Some("message_start"), start(a)),
                (Some("message_delta"), delta(b)),
            ],
        )
        .usage()
        .geo
    };
    assert_eq!(geo_of("us", "global"), Some(InferenceGeo::Region));
    assert_eq!(geo_of("global", "us"), Some(InferenceGeo::Region));
    assert_eq!(geo_of("global", "global"), Some(InferenceGeo::Anywhere));
    assert_eq!(
        geo_of("not_available", "not_available"),
        Some(InferenceGeo::Anywhere)
    );
    let plain = crate::upstream::anthropic::usage(
        &json!({"input_tokens": 3, "output_tokens": 4, "inference_geo": "eu"}),
    );
    assert_eq!(plain.geo, Some(InferenceGeo::Region));
    let unsaid = crate::upstream::anthropic::usage(&json!({"input_tokens": 3, "output_tokens": 4}));
    assert_eq!(unsaid.geo, None);
}

/// Perplexity reports its search work beside the tokens (citation tokens, searches
/// run), billed apart: the cost is marked estimated, never exact.
#[test]
fn search_work_beside_the_tokens_is_marked_unpriced() {
    let u = |extra: Value| {
        let mut v = json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        super::openai::usage_block(&v)
    };
    assert!(!u(json!({})).unpriced);
    assert!(u(json!({"citation_tokens": 900})).unpriced);
    assert!(u(json!({"num_search_queries": 3})).unpriced);
}
