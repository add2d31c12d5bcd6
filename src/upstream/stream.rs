//! Streamed answers: an incremental SSE decoder, and one translator per API that turns
//! upstream events into OpenAI `chat.completion.chunk`s while keeping the usage and
//! finish reason the ledger needs.

use serde_json::{Value, json};

use super::Usage;
use crate::policy::plan::{Api, Destination};

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits a byte stream into events, whatever the chunk boundaries, as the SSE format
/// defines them: lines end in `\r\n`, `\n` or `\r`; a blank line ends an event;
/// `:` starts a comment; `event:` and `data:` are the fields purser reads.
///
/// Hand-written rather than a crate's because it must be pushed one read at a time
/// from purser's own read loop (each read under the attempt's idle timeout) and must
/// bound its memory: an upstream that never ends an event is cut off at `MAX_EVENT`.
/// Each byte is scanned once, however the reads cut the stream.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of a line not yet ended.
    buf: Vec<u8>,
    /// The last line ended in `\r`: a `\n` that comes next belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: Vec<String>,
    /// Bytes the event being read holds so far.
    size: usize,
}

/// Longest event purser buffers; an upstream that never ends an event is cut off.
const MAX_EVENT: usize = 4 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
#[error("an upstream stream event exceeded {MAX_EVENT} bytes")]
pub struct EventTooLarge;

impl SseDecoder {
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, EventTooLarge> {
        let mut out = Vec::new();
        let mut rest = bytes;
        // A `\r` that ended the last read waits for the next byte: an empty read says
        // nothing about it, so it keeps waiting (else the `\n` after it would read as
        // a blank line and end the event early, losing its name).
        if self.after_cr {
            match rest.first() {
                Some(b'\n') => {
                    rest = &rest[1..];
                    self.after_cr = false;
                }
                Some(_) => self.after_cr = false,
                None => {}
            }
        }
        while let Some(i) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let ended_by_cr = rest[i] == b'\r';
            let line = if self.buf.is_empty() {
                String::from_utf8_lossy(&rest[..i]).into_owned()
            } else {
                self.buf.extend_from_slice(&rest[..i]);
                let l = String::from_utf8_lossy(&self.buf).into_owned();
                self.buf.clear();
                l
            };
            rest = &rest[i + 1..];
            if ended_by_cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            self.line(&line, &mut out);
        }
        self.buf.extend_from_slice(rest);
        if self.size + self.buf.len() > MAX_EVENT {
            return Err(EventTooLarge);
        }
        Ok(out)
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.size = 0;
            let event = self.event.take();
            if !self.data.is_empty() {
                out.push(SseEvent {
                    event,
                    data: std::mem::take(&mut self.data).join("\n"),
                });
            }
            return;
        }
        self.size += line.len();
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.trim().to_string()),
            "data" => self.data.push(value.to_string()),
            // Comments (an empty field name), `id`, `retry` and unknown fields.
            _ => {}
        }
    }

    /// What is left when the stream ends (an event without its blank line).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if !self.buf.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            self.line(&line, &mut out);
        }
        self.line("", &mut out);
        out.pop()
    }
}

/// Upstream events in, OpenAI chunks out, for one attempt.
pub struct ChunkTranslator {
    api: Api,
    id: String,
    model: String,
    created: i64,
    /// OpenAI: every usage block seen, each figure at its largest
    /// (`Usage::default()` until one arrives).
    usage: Usage,
    /// OpenAI: a usage block arrived with or after the finish reason. Earlier blocks
    /// are running counts (`stream_options.continuous_usage_stats`, a relay's early
    /// usage-only chunk), whose output is no receipt until the stream ends whole with
    /// no output after the last of them.
    openai_usage_final: bool,
    /// OpenAI: output arrived after the last usage block (or before any): that block
    /// did not count it, so it is no receipt even once the stream ends whole.
    openai_output_after_usage: bool,
    /// Anthropic: `message_start`'s usage with each `message_delta`'s laid over it
    /// (the delta's counts are cumulative and final; newer API versions repeat the
    /// input counts there too).
    anthropic_usage: serde_json::Map<String, Value>,
    /// Anthropic: a `message_delta` brought the final output count.
    anthropic_output_final: bool,
    /// Gemini: every `usageMetadata` read, each figure at its largest (a block before
    /// the finish reason reads as a running count: its output is not final).
    gemini_usage: Option<Usage>,
    /// Usage already read elsewhere (a complete answer replayed as a stream).
    known_usage: Option<Usage>,
    finish: Option<String>,
    role_sent: bool,
    /// The upstream said it is done (`[DONE]`, `message_stop`).
    ended: bool,
    /// An event carried output: content, reasoning, a tool call, anything the model
    /// generated (the attempt has started, so it is billable).
    generated: bool,
    /// The stream is the OpenAI Responses API's (typed events), read for the ledger
    /// only: it is forwarded as sent.
    responses: bool,
    /// Responses API: the response's id, as its lifecycle events name it.
    response_id: Option<String>,
    /// Responses API: output items announced or listed at the end, the most seen.
    output_items: u64,
    /// Responses API: the response says it was not stored.
    not_stored: bool,
    /// Responses API: `response.output_item.added` events seen.
    announced_items: u64,
}

/// A JSON value that says something: not null, `false`, an empty string, array or
/// object.
fn nonempty(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => a.iter().any(nonempty),
        Value::Object(o) => o.values().any(nonempty),
        Value::Bool(true) | Value::Number(_) => true,
    }
}

/// Whether a delta or block carries generated output: any field but the ones that only
/// name it (`role`, `type`, `index`) says something. A rule, not a list of fields, so
/// that a vendor's next kind of output (reasoning under a new name, audio, a new tool
/// block) counts without a change here.
fn carries_output(v: &Value) -> bool {
    v.as_object().is_some_and(|o| {
        o.iter()
            .any(|(k, v)| !matches!(k.as_str(), "role" | "type" | "index") && nonempty(v))
    })
}

impl ChunkTranslator {
    pub fn new(api: Api, dest: &Destination) -> ChunkTranslator {
        ChunkTranslator {
            api,
            id: format!("chatcmpl-{}", ulid::Ulid::generate()),
            model: dest.model.to_string(),
            created: time::OffsetDateTime::now_utc().unix_timestamp(),
            usage: Usage::default(),
            openai_usage_final: false,
            openai_output_after_usage: false,
            anthropic_usage: serde_json::Map::new(),
            anthropic_output_final: false,
            gemini_usage: None,
            known_usage: None,
            finish: None,
            role_sent: false,
            ended: false,
            generated: false,
            responses: false,
            response_id: None,
            output_items: 0,
            not_stored: false,
            announced_items: 0,
        }
    }

    /// Responses API: the response the stream carried as the vendor stores it, once an
    /// event named it (whether the request asked to store it is the caller's to check).
    pub fn stored_response(&self) -> Option<super::StoredResponse> {
        if self.not_stored {
            return None;
        }
        Some(super::StoredResponse {
            id: self.response_id.clone()?,
            output_items: self.output_items,
        })
    }

    /// Read a Responses API stream instead of chat chunks.
    pub fn for_responses(&mut self) {
        self.responses = true;
    }

    /// Whether the stream has carried any generated output (content, reasoning, a tool
    /// call), whether or not it reached the client.
    pub fn generated(&self) -> bool {
        self.generated
    }

    /// The finish reason seen, in OpenAI's words.
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish.as_deref()
    }

    /// What the vendor has reported so far, each figure only once it is final: a
    /// stream cut before its closing usage leaves the output `None`, to be charged at
    /// its bound, never at a running count.
    pub fn usage(&self) -> Usage {
        if let Some(u) = self.known_usage {
            return u;
        }
        match self.api {
            // Final once it came with or after the finish reason, or once the stream
            // ended whole (`[DONE]`) after it.
            Api::Openai
                if self.openai_usage_final || (self.ended && !self.openai_output_after_usage) =>
            {
                self.usage
            }
            // Only running counts so far: the output is not known.
            Api::Openai => Usage {
                output: None,
                ..self.usage
            },
            Api::Anthropic => {
                let mut u = Value::Object(self.anthropic_usage.clone());
                if !self.anthropic_output_final {
                    // message_start's output_tokens is a placeholder (1), not a count.
                    if let Some(o) = u.as_object_mut() {
                        o.remove("output_tokens");
                    }
                }
                super::anthropic::usage(&u)
            }
            Api::Gemini => self.gemini_usage.unwrap_or_default(),
        }
    }

    /// Take the usage of a complete answer replayed through this translator as
    /// chunks: re-reading it from the translated OpenAI block would lose what that shape
    /// cannot say (cache writes, a figure the vendor did not report).
    pub fn set_usage(&mut self, usage: Usage) {
        self.known_usage = Some(usage);
    }

    /// The answer is complete: an explicit end marker, or a finish reason seen.
    pub fn complete(&self) -> bool {
        self.ended || self.finish.is_some()
    }

    pub fn saw_end_marker(&self) -> bool {
        self.ended
    }

    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Value {
        let mut delta = delta;
        if !self.role_sent {
            delta["role"] = json!("assistant");
            self.role_sent = true;
        }
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    /// Translate one upstream event; `None` data means the event was not JSON.
    pub fn event(&mut self, e: &SseEvent) -> Vec<Value> {
        if e.data.trim() == "[DONE]" {
            self.ended = true;
            return vec![];
        }
        let Ok(v) = serde_json::from_str::<Value>(&e.data) else {
            return vec![];
        };
        if self.responses {
            self.responses_event(&v);
            return vec![];
        }
        match self.api {
            Api::Openai => self.openai(v),
            Api::Anthropic => self.anthropic(e.event.as_deref(), &v),
            Api::Gemini => self.gemini(&v),
        }
    }

    fn openai(&mut self, mut v: Value) -> Vec<Value> {
        let choices = v.get("choices").and_then(Value::as_array);
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = self.usage.largest(super::openai::usage_block(u));
            // With or after the finish reason; a usage-only chunk before it (a relay's
            // running count) closes nothing.
            let closes = self.finish.is_some()
                || v.pointer("/choices/0/finish_reason")
                    .is_some_and(|f| !f.is_null());
            self.openai_usage_final |= closes;
        }
        let output = choices.into_iter().flatten().any(|c| {
            c.get("delta")
                .or_else(|| c.get("message"))
                .is_some_and(carries_output)
        });
        self.generated |= output;
        // A chunk's own usage counts its own output (running counts are cumulative).
        let counted = v.get("usage").is_some_and(|u| !u.is_null());
        self.openai_output_after_usage = (self.openai_output_after_usage || output) && !counted;
        if choices.is_none_or(|c| c.is_empty()) {
            // The usage-only chunk: re-emitted last by `finish`, with the cost.
            return vec![];
        }
        if let Some(f) = v
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            self.finish = Some(f.to_string());
        }
        // OpenAI's own chunk shape: passed through, under the name the client asked for.
        v["model"] = json!(self.model);
        if let Some(o) = v.as_object_mut() {
            o.remove("usage");
        }
        self.role_sent = true;
        vec![v]
    }

    fn anthropic(&mut self, name: Option<&str>, v: &Value) -> Vec<Value> {
        let ty = v.get("type").and_then(Value::as_str).or(name);
        match ty {
            Some("message_start") => {
                self.merge_anthropic_usage(v.pointer("/message/usage"));
                if let Some(id) = v.pointer("/message/id").and_then(Value::as_str) {
                    self.id = format!("chatcmpl-{id}");
                }
                vec![]
            }
            Some("content_block_start") => {
                if v.get("content_block").is_some_and(carries_output) {
                    self.generated = true;
                }
                match v.pointer("/content_block/type").and_then(Value::as_str) {
                    Some("tool_use") => {
                        let idx = v.get("index").cloned().unwrap_or(json!(0));
                        let call = json!([{"index": idx, "id": v.pointer("/content_block/id"), "type": "function",
                                "function": {"name": v.pointer("/content_block/name"), "arguments": ""}}]);
                        vec![self.chunk(json!({"tool_calls": call}), None)]
                    }
                    _ => vec![],
                }
            }
            Some("content_block_delta") => {
                if v.get("delta").is_some_and(carries_output) {
                    self.generated = true;
                }
                if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str) {
                    return vec![self.chunk(json!({"content": t}), None)];
                }
                if let Some(j) = v.pointer("/delta/partial_json").and_then(Value::as_str) {
                    let idx = v.get("index").cloned().unwrap_or(json!(0));
                    return vec![self.chunk(
                        json!({"tool_calls": [{"index": idx, "function": {"arguments": j}}]}),
                        None,
                    )];
                }
                vec![]
            }
            Some("message_delta") => {
                self.merge_anthropic_usage(v.get("usage"));
                if v.pointer("/usage/output_tokens").is_some_and(Value::is_u64) {
                    self.anthropic_output_final = true;
                }
                let finish = super::anthropic::finish_reason(
                    v.pointer("/delta/stop_reason").and_then(Value::as_str),
                );
                self.finish = Some(finish.to_string());
                vec![self.chunk(json!({}), Some(finish))]
            }
            Some("message_stop") => {
                self.ended = true;
                vec![]
            }
            _ => vec![],
        }
    }

    /// One Responses API event: any `*.delta` is generated output; the response's end
    /// (`completed`, `incomplete`) carries its usage and its status, as does a failure.
    fn responses_event(&mut self, v: &Value) {
        let ty = v.get("type").and_then(Value::as_str).unwrap_or_default();
        if ty.ends_with(".delta") && v.get("delta").is_some_and(nonempty) {
            self.generated = true;
        }
        if let Some(r) = v.get("response") {
            if let Some(id) = r.get("id").and_then(Value::as_str) {
                self.response_id = Some(id.to_string());
            }
            self.not_stored |= r.get("store") == Some(&Value::Bool(false));
            if let Some(Value::Array(out)) = r.get("output") {
                self.output_items = self.output_items.max(out.len() as u64);
            }
        }
        if ty == "response.output_item.added" {
            self.announced_items = self.announced_items.saturating_add(1);
            self.output_items = self.output_items.max(self.announced_items);
        }
        if let Some(end) = ty.strip_prefix("response.")
            && matches!(end, "completed" | "incomplete" | "failed")
        {
            // At the largest over every terminal event, as a chat stream's usage chunks
            // are: a relay that repeats the end with a smaller or zeroed usage must not
            // lower what was billed.
            if let Some(u) = v.pointer("/response/usage").filter(|u| u.is_object()) {
                self.usage = self.usage.largest(Usage {
                    served_tier: v
                        .pointer("/response/service_tier")
                        .and_then(Value::as_str)
                        .map(super::ServedTier::parse),
                    ..super::openai::usage_block(u)
                });
            }
            // A failed response is a failure of the attempt (its error is classified
            // where the event is read), not the answer's end: its usage still counts.
            if end != "failed" {
                self.finish = Some(end.to_string());
                self.ended = true;
            }
        }
    }

    /// Lay a usage object's counts over those seen before; a `null` count (the API
    /// sends them for classes it has nothing for) does not erase an earlier figure.
    fn merge_anthropic_usage(&mut self, u: Option<&Value>) {
        for (k, n) in u.and_then(Value::as_object).into_iter().flatten() {
            // Each count at its largest reading: a later event that repeats a count
            // lower (or zeroed) never lowers what was billed. `cache_creation` splits
            // the writes by cache lifetime (priced apart), merged the same way.
            match (n, self.anthropic_usage.get_mut(k)) {
                (Value::Number(_), Some(old)) if n.as_u64() > old.as_u64() => *old = n.clone(),
                (Value::Number(_), None) if n.is_u64() => {
                    self.anthropic_usage.insert(k.clone(), n.clone());
                }
                (Value::Object(parts), Some(Value::Object(old))) if k == "cache_creation" => {
                    for (pk, pv) in parts {
                        if pv.as_u64() > old.get(pk).and_then(Value::as_u64) {
                            old.insert(pk.clone(), pv.clone());
                        }
                    }
                }
                (Value::Object(_), None) if k == "cache_creation" => {
                    self.anthropic_usage.insert(k.clone(), n.clone());
                }
                // Where the inference ran, at its dearest reading: a region said once
                // (`message_start`) is not undone by a later `global`.
                (Value::String(_), old) if k == "inference_geo" => {
                    let geo = super::anthropic::geo;
                    if geo(n) > old.and_then(|o| geo(o)) {
                        self.anthropic_usage.insert(k.clone(), n.clone());
                    }
                }
                // Compaction passes: the report listing more of them is kept (a later,
                // shorter repeat never drops a billed pass). `usage()` sums them.
                (Value::Array(passes), old) if k == "iterations" => {
                    let shorter = old
                        .and_then(|o| o.as_array())
                        .is_some_and(|o| o.len() > passes.len());
                    if !shorter {
                        self.anthropic_usage.insert(k.clone(), n.clone());
                    }
                }
                _ => {}
            }
        }
    }

    fn gemini(&mut self, v: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        if v.get("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.pointer("/content/parts").and_then(Value::as_array))
            .flatten()
            .any(nonempty)
        {
            self.generated = true;
        }
        let text: String = v
            .pointer("/candidates/0/content/parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            // Thought summaries are not the answer (see `gemini::translate`).
            .filter(|p| p.get("thought").and_then(Value::as_bool) != Some(true))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        if !text.is_empty() {
            out.push(self.chunk(json!({"content": text}), None));
        }
        if let Some(f) = v
            .pointer("/candidates/0/finishReason")
            .and_then(Value::as_str)
        {
            let finish = super::gemini::finish_reason(f);
            self.finish = Some(finish.to_string());
            out.push(self.chunk(json!({}), Some(finish)));
        }
        if let Some(m) = v.get("usageMetadata") {
            // Read after the finish reason: the chunk carrying it closes the counts.
            let read = super::gemini::usage(m, self.finish.is_some());
            self.gemini_usage = Some(self.gemini_usage.map_or(read, |u| u.largest(read)));
        }
        out
    }

    /// The closing usage chunk (OpenAI's `stream_options.include_usage` shape), with
    /// the exact cost purser recorded.
    pub fn usage_chunk(&self, cost: &str) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [],
               "usage": self.usage().to_openai(),
               "purser_cost": cost})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(raw: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut d = SseDecoder::default();
        let mut got = Vec::new();
        let mut from = 0;
        for &c in cuts.iter().chain([raw.len()].iter()) {
            let c = c.clamp(from, raw.len());
            got.extend(d.push(&raw[from..c]).unwrap());
            from = c;
        }
        got.extend(d.finish());
        got
    }

    proptest::proptest! {
        /// Any events, with any mix of line endings, cut into reads anywhere, decode
        /// to the same events as the stream read whole.
        #[test]
        fn any_endings_and_any_cuts_give_the_same_events(
            events in proptest::collection::vec(("[a-z_]{0,8}", proptest::collection::vec("[ -~é→]{0,12}", 1..3)), 1..6),
            endings in proptest::collection::vec(0usize..3, 64),
            mut cuts in proptest::collection::vec(0usize..400, 0..10),
        ) {
            let mut raw = String::new();
            let mut k = 0;
            let mut last = "";
            // A `\r` ending followed by a `\n` ending would read as one `\r\n`: the
            // format itself cannot tell them apart, so the generator never writes it.
            let mut end = || {
                k += 1;
                let mut e = ["\n", "\r\n", "\r"][endings[k % endings.len()]];
                if last == "\r" && e == "\n" {
                    e = "\r\n";
                }
                last = e;
                e
            };
            for (name, data) in &events {
                if !name.is_empty() {
                    raw.push_str(&format!("event: {name}{}", end()));
                }
                raw.push_str(&format!(": a comment{}", end()));
                for d in data {
                    raw.push_str(&format!("data: {d}{}", end()));
                }
                raw.push_str(end());
            }
            let raw = raw.into_bytes();
            cuts.sort_unstable();
            let whole = all(&raw, &[]);
            proptest::prop_assert_eq!(whole.len(), events.len());
            for (e, (name, data)) in whole.iter().zip(&events) {
                proptest::prop_assert_eq!(e.event.clone(), (!name.is_empty()).then(|| name.clone()));
                proptest::prop_assert_eq!(&e.data, &data.join("\n"));
            }
            proptest::prop_assert_eq!(all(&raw, &cuts), whole);
        }
    }

    /// Found by the property test above: an empty read between a `\r` and its `\n`
    /// (a duplicate cut) ended the event early and lost its name.
    #[test]
    fn an_empty_read_between_cr_and_lf_changes_nothing() {
        let raw = b"event: error\r\ndata: {}\n\n";
        let whole = all(raw, &[]);
        assert_eq!(all(raw, &[13, 13]), whole);
        assert_eq!(whole[0].event.as_deref(), Some("error"));
    }

    #[test]
    fn an_event_that_never_ends_is_cut_off() {
        let mut d = SseDecoder::default();
        let line = vec![b'x'; 1 << 20];
        d.push(b"data: ").unwrap();
        let mut failed = false;
        for _ in 0..5 {
            failed |= d.push(&line).is_err();
        }
        assert!(failed);
    }

    #[test]
    fn events_survive_any_chunking() {
        let raw = b"event: message_start\r\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\n: comment\n\ndata: [DONE]\n\n";
        for split in 1..raw.len() {
            let mut d = SseDecoder::default();
            let mut got = d.push(&raw[..split]).unwrap();
            got.extend(d.push(&raw[split..]).unwrap());
            assert_eq!(got.len(), 3, "split at {split}");
            assert_eq!(got[0].event.as_deref(), Some("message_start"));
            assert_eq!(got[1].data, "x\ny");
            assert_eq!(got[2].data, "[DONE]");
        }
    }
}
