//! Streaming attempts. Before the first content reaches the client, a streamed attempt
//! is classified like any other (an error event is the same failure as the same error
//! as a plain answer), so the decision may still fail over. From the first content on,
//! the request is committed to this destination: a later failure ends the stream with
//! an OpenAI-style error event and is recorded as `maybe_billed` (or `billed`, at the
//! usage it carried); nothing is spliced. A vendor's own finish reason after content,
//! `content_filter` included, is not a failure: it reaches the client as the vendor
//! sent it, the stream is read to its end and the attempt billed at its usage.
//!
//! Before the commit, reasoning and tool-call deltas do not commit (nothing has reached
//! the client, so a soft request may still fail over), but they mark the attempt as
//! started: a failure after them is at least `maybe_billed`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::attempt::{Failure, Started};
use super::recorder::{Closing, Ended, Recorder, Verdict};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{truncate_redact, upstream_message};
use crate::breaker::Breaker;
use crate::failure::{self, EventSignal, FailureClass};
use crate::ingress::{ApiError, Ingress};
use crate::ledger;
use crate::money::Money;
use crate::policy::plan::{Api, Destination};
use crate::pricing;
use crate::selection::TokenBounds;
use crate::upstream;
use crate::upstream::stream::{ChunkTranslator, SseDecoder, SseEvent};

/// A stream that has produced content and is still open upstream.
pub struct Live {
    api: Api,
    /// Chat gets OpenAI chunks; a native pass-through (Messages to Anthropic) gets the
    /// vendor's events as sent, the translator reading them only for the ledger.
    ingress: Ingress,
    translator: ChunkTranslator,
    decoder: SseDecoder,
    body: Option<reqwest::Response>,
    /// Events for the client, read before the commit, sent first.
    pending: Vec<Bytes>,
    /// Events that arrived in the same read as the first content, after it: the
    /// tail reads them before anything else, so none is lost.
    backlog: Vec<SseEvent>,
    /// The upstream already ended the answer.
    exhausted: bool,
    idle: Duration,
    /// Hold the event that ends the answer until the attempt is recorded: the vendor
    /// stored the response, and a client that continues from it at once must find it
    /// in the ledger (a stored Responses answer).
    hold_end: bool,
    /// The held end, sent once the attempt is recorded.
    held_end: Vec<Bytes>,
    /// A Messages request translated to chat completions: the chunks written back as
    /// Anthropic events, under the model name the client asked for.
    to_messages: Option<(upstream::from_messages::EventWriter, String)>,
    /// A Responses request translated to chat completions (for Anthropic or Gemini):
    /// the chunks written back as Responses events.
    to_responses: Option<(upstream::from_responses::EventWriter, String)>,
}

pub enum Start {
    Content(Box<Live>),
    Failed(Failure),
}

impl Live {
    /// A failure before the commit, with what the stream had started and the usage it
    /// had reported (the failing event's included).
    fn failed(&self, class: FailureClass, reason: String, message: String) -> Start {
        Start::Failed(Failure {
            // A live stream had a 2xx head: answered, at least.
            started: if self.translator.generated() {
                Started::Generated
            } else {
                Started::Answered
            },
            usage: self.translator.usage(),
            ..Failure::new(class, reason, message)
        })
    }
}

/// How reading one piece of the stream ended.
enum Step {
    Chunk(Bytes),
    End,
    Fail(FailureClass, String),
}

async fn next(body: &mut reqwest::Response, idle: Duration) -> Step {
    match tokio::time::timeout(idle, body.chunk()).await {
        Err(_) => Step::Fail(
            FailureClass::Timeout,
            format!("no stream event within {} ms", idle.as_millis()),
        ),
        Ok(Err(e)) => {
            let (class, reason) = failure::classify_transport(upstream::transport_kind(&e));
            Step::Fail(class, format!("{reason}: {e}"))
        }
        Ok(Ok(None)) => Step::End,
        Ok(Ok(Some(b))) => Step::Chunk(b),
    }
}

/// What one event says, read the same way as a plain answer.
fn signal(api: Api, ingress: Ingress, e: &SseEvent) -> Result<EventSignal, ()> {
    if e.data.trim() == "[DONE]" {
        return Ok(EventSignal::Neutral);
    }
    let v: Value = serde_json::from_str(&e.data).map_err(|_| ())?;
    match (ingress, api) {
        (Ingress::Responses, Api::Openai) => Ok(responses_signal(api, &v)),
        // A translated Responses request reads the vendor's own events.
        (Ingress::Responses, Api::Anthropic | Api::Gemini)
        | (Ingress::Chat | Ingress::Messages, _) => {
            Ok(failure::classify_event(api, e.event.as_deref(), &v))
        }
    }
}

/// A Responses API event. An `error` event or a `response.failed` is classified as the
/// same error would be in a plain answer (its error object, as the body's `error`);
/// generated output (`*.delta`) is content; the rest (lifecycle, item framing, the
/// end) is neutral, the translator reading the usage and the end from it.
fn responses_signal(api: Api, v: &Value) -> EventSignal {
    let ty = v.get("type").and_then(Value::as_str).unwrap_or_default();
    let error = match ty {
        "error" => Some(v.clone()),
        "response.failed" => Some(
            v.pointer("/response/error")
                .cloned()
                .unwrap_or_else(|| json!({"message": "the response failed"})),
        ),
        _ => None,
    };
    if let Some(err) = error {
        let body = json!({"error": err}).to_string();
        return match failure::classify(api, 200, &[], &body) {
            failure::Outcome::Failure { class, reason } => EventSignal::Failure(class, reason),
            // An error that reads as no failure is still not an answer.
            failure::Outcome::Success => EventSignal::Failure(
                FailureClass::Unclassified,
                "a Responses stream error event".into(),
            ),
        };
    }
    if ty.ends_with(".delta") {
        EventSignal::Content
    } else {
        EventSignal::Neutral
    }
}

/// What one pre-commit event means for the attempt.
enum Seen {
    /// Content: commit to this destination.
    Commit,
    /// A complete answer with no content at all (an empty completion).
    Finished,
    /// A failure. `finish`: it is the vendor's finish reason (a filter, a refusal), not
    /// an error event, so the usage that follows it is still to be read.
    Fail {
        class: FailureClass,
        reason: String,
        message: String,
        finish: bool,
    },
    Continue,
}

/// Read until the first content (commit), a failure (the decision may fail over), or
/// the end of the answer.
pub async fn first_content(
    api: Api,
    ingress: Ingress,
    dest: &Destination,
    mut body: reqwest::Response,
    idle: Duration,
) -> Start {
    let mut translator = ChunkTranslator::new(api, dest);
    if ingress == Ingress::Responses && api == Api::Openai {
        translator.for_responses();
    }
    let mut live = Live {
        api,
        ingress,
        translator,
        decoder: SseDecoder::default(),
        body: None,
        pending: Vec::new(),
        backlog: Vec::new(),
        exhausted: false,
        idle,
        hold_end: false,
        held_end: Vec::new(),
        to_messages: (ingress == Ingress::Messages && api != Api::Anthropic)
            .then(|| (Default::default(), dest.model.to_string())),
        to_responses: (ingress == Ingress::Responses && api != Api::Openai)
            .then(|| (Default::default(), dest.model.to_string())),
    };
    // Kept only while no event has been seen: an upstream that ignored `stream` and
    // answered in one JSON body is replayed as chunks rather than called a failure.
    let mut raw: Vec<u8> = Vec::new();
    let mut saw_event = false;
    loop {
        let events = match next(&mut body, idle).await {
            Step::Fail(class, reason) => return live.failed(class, reason.clone(), reason),
            Step::End => {
                let last: Vec<SseEvent> = live.decoder.finish().into_iter().collect();
                saw_event |= !last.is_empty();
                for (i, e) in last.iter().enumerate() {
                    match see(&mut live, e) {
                        Seen::Fail {
                            class,
                            reason,
                            message,
                            finish,
                        } => {
                            if finish {
                                live.read_rest(&last[i + 1..]);
                            }
                            return live.failed(class, reason, message);
                        }
                        // The body has ended: the tail judges completeness from what
                        // the translator saw, after the rest of these events.
                        Seen::Commit | Seen::Finished => {
                            live.backlog = last[i + 1..].to_vec();
                            return Start::Content(Box::new(live));
                        }
                        Seen::Continue => {}
                    }
                }
                let (reason, message) = (
                    "the stream ended before any content",
                    "the upstream closed the stream before any content",
                );
                if !saw_event {
                    return replay_complete(api, dest, &raw, live).unwrap_or_else(|| {
                        Start::Failed(Failure::new(FailureClass::Dropped, reason, message.into()))
                    });
                }
                // A finish reason with no content before it (a Gemini answer of thoughts
                // only, which has no end marker): an empty answer, complete, billed at its
                // usage as the tail judges it.
                if live.translator.complete() {
                    live.exhausted = true;
                    return Start::Content(Box::new(live));
                }
                // Cut: what the stream generated and reported so far still counts.
                return live.failed(FailureClass::Dropped, reason.into(), message.into());
            }
            Step::Chunk(bytes) => {
                if !saw_event && raw.len() < 1 << 20 {
                    raw.extend_from_slice(&bytes);
                }
                match live.decoder.push(&bytes) {
                    Ok(e) => e,
                    Err(e) => {
                        return live.failed(
                            FailureClass::Unclassified,
                            e.to_string(),
                            e.to_string(),
                        );
                    }
                }
            }
        };
        for (i, e) in events.iter().enumerate() {
            saw_event = true;
            match see(&mut live, e) {
                Seen::Fail {
                    class,
                    reason,
                    message,
                    finish,
                } => {
                    if finish {
                        // The usage follows the finish reason: read it, so the refusal
                        // is charged at what the vendor reported.
                        live.read_rest(&events[i + 1..]);
                        // The provider's timeout bounds the whole drain, not each read:
                        // an upstream that trickles bytes after its finish cannot hold
                        // the refusal.
                        let idle = live.idle;
                        let _ = tokio::time::timeout(idle, drain(&mut live, &mut body)).await;
                    }
                    return live.failed(class, reason, message);
                }
                // Several events often arrive in one read: those after the first
                // content are the tail's to forward, in order.
                Seen::Commit => {
                    live.backlog = events[i + 1..].to_vec();
                    live.body = Some(body);
                    return Start::Content(Box::new(live));
                }
                Seen::Finished => {
                    live.exhausted = true;
                    return Start::Content(Box::new(live));
                }
                Seen::Continue => {}
            }
        }
    }
}

impl Live {
    /// Whether the client gets the vendor's own events (a native pass-through).
    fn native(&self) -> bool {
        match self.ingress {
            Ingress::Chat => false,
            Ingress::Messages => self.to_messages.is_none(),
            Ingress::Responses => self.to_responses.is_none(),
        }
    }

    /// What one event gives the client, in its ingress's format: the vendor's event
    /// as sent, or the chunks translated from it.
    fn out(&mut self, e: &SseEvent, chunks: Vec<Value>) -> Vec<Bytes> {
        if self.native() {
            vec![raw(e)]
        } else {
            self.written(&chunks)
        }
    }

    /// OpenAI chunks as the client reads them: as they are, or as Anthropic or
    /// Responses events.
    fn written(&mut self, chunks: &[Value]) -> Vec<Bytes> {
        match (&mut self.to_messages, &mut self.to_responses) {
            (Some((w, model)), _) => chunks
                .iter()
                .flat_map(|c| w.chunk(c, model))
                .map(Bytes::from)
                .collect(),
            (None, Some((w, model))) => chunks
                .iter()
                .flat_map(|c| w.chunk(c, model))
                .map(Bytes::from)
                .collect(),
            (None, None) => chunks.iter().map(sse).collect(),
        }
    }

    /// Keep an event read before the commit for the client.
    fn hold(&mut self, e: &SseEvent, chunks: Vec<Value>) {
        let out = self.out(e, chunks);
        self.pending.extend(out);
    }

    /// Read events for their usage only: nothing more reaches the client.
    fn read_rest(&mut self, events: &[SseEvent]) {
        for e in events {
            self.translator.event(e);
        }
    }
}

/// Read the rest of a stream that failed on a finish reason, for its usage: to its end,
/// a cut, or the idle timeout, whichever comes first.
async fn drain(live: &mut Live, body: &mut reqwest::Response) {
    while !live.translator.saw_end_marker() {
        match next(body, live.idle).await {
            Step::Chunk(bytes) => match live.decoder.push(&bytes) {
                Ok(events) => live.read_rest(&events),
                Err(_) => return,
            },
            Step::End => {
                let last: Vec<SseEvent> = live.decoder.finish().into_iter().collect();
                live.read_rest(&last);
                return;
            }
            Step::Fail(..) => return,
        }
    }
}

fn see(live: &mut Live, e: &SseEvent) -> Seen {
    match signal(live.api, live.ingress, e) {
        Ok(EventSignal::Failure(class, reason)) => {
            // Read by the translator too: a failing event may carry usage, and whether
            // it set a finish reason tells a vendor's finish from an error event.
            let finished_before = live.translator.complete();
            live.translator.event(e);
            Seen::Fail {
                class,
                reason: reason.into_owned(),
                message: upstream_message(&e.data),
                finish: !finished_before && live.translator.complete(),
            }
        }
        Ok(EventSignal::Content) => {
            let chunks = live.translator.event(e);
            live.hold(e, chunks);
            Seen::Commit
        }
        Ok(EventSignal::Neutral) => {
            let chunks = live.translator.event(e);
            live.hold(e, chunks);
            if live.translator.saw_end_marker() {
                Seen::Finished
            } else {
                Seen::Continue
            }
        }
        Err(()) => Seen::Continue,
    }
}

/// A 2xx that is one JSON answer instead of a stream: classified and, if it is a
/// success, replayed as OpenAI chunks so the client gets one consistent stream.
fn replay_complete(api: Api, dest: &Destination, raw: &[u8], mut live: Live) -> Option<Start> {
    // A native client asked for the vendor's events; a JSON body is not one, and
    // making events up would not be the vendor's stream: the attempt is a cut.
    if live.native() {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    let v: Value = serde_json::from_str(text).ok()?;
    match failure::classify(api, 200, &[], text) {
        // A 2xx answer: the vendor ran the call, so it is billable whatever its class.
        failure::Outcome::Failure { class, reason } => Some(Start::Failed(Failure {
            started: Started::Answered,
            usage: upstream::usage(api, &v),
            ..Failure::new(class, reason, upstream_message(text))
        })),
        failure::Outcome::Success => {
            let (answer, reported) = upstream::translate(api, dest, v);
            let delta = answer
                .pointer("/choices/0/message")
                .cloned()
                .unwrap_or(Value::Null);
            let finish = answer
                .pointer("/choices/0/finish_reason")
                .cloned()
                .unwrap_or(json!("stop"));
            let usage = answer.get("usage").cloned().unwrap_or(Value::Null);
            let mut t = ChunkTranslator::new(Api::Openai, dest);
            // The usage as read from the vendor's answer: the OpenAI block below cannot
            // carry cache writes or say that a figure was not reported.
            t.set_usage(reported);
            for data in [
                json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                json!({"choices": [], "usage": usage}),
            ] {
                let chunks = t.event(&SseEvent {
                    event: None,
                    data: data.to_string(),
                });
                let out = live.written(&chunks);
                live.pending.extend(out);
            }
            live.translator = t;
            live.exhausted = true;
            Some(Start::Content(Box::new(live)))
        }
    }
}

/// The rest of a committed streaming attempt, run after the client got its headers.
/// It reads the upstream to its end even when the client has gone, so the ledger
/// learns what the vendor billed.
pub struct Tail {
    pub rec: Recorder,
    pub seq: u32,
    pub dest: Destination,
    pub worst: Money,
    pub bounds: TokenBounds,
    pub breaker: Option<Arc<Breaker>>,
    pub sent: Option<Instant>,
    pub key: Option<String>,
    /// The request has the vendor store its response (Responses API): its id is
    /// recorded, and the answer's last event waits for that record.
    pub stores: bool,
}

enum End {
    Complete,
    Failed {
        class: FailureClass,
        reason: String,
        message: String,
    },
}

/// The client's side of the stream; once it has gone, nothing more is sent.
struct Out {
    tx: mpsc::Sender<Bytes>,
    gone: bool,
    /// How long one send may make no progress (the provider's `timeout_ms`): a client
    /// that keeps its socket open but stops reading is then treated as gone, so it
    /// cannot hold the reservation, its in-flight slot and the upstream call.
    deadline: Duration,
}

impl Out {
    async fn send(&mut self, b: Bytes) {
        if self.gone {
            return;
        }
        // Room in the channel: no timer (the common case, on the path of every chunk).
        let b = match self.tx.try_send(b) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.gone = true;
                return;
            }
            Err(mpsc::error::TrySendError::Full(b)) => b,
        };
        match tokio::time::timeout(self.deadline, self.tx.send(b)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.gone = true,
            Err(_) => {
                tracing::info!(
                    deadline_ms = self.deadline.as_millis(),
                    "the client read nothing within the provider's timeout; the attempt finishes without it"
                );
                self.gone = true;
            }
        }
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A vendor's event as it sent it: its name and each line of its data (comments, ids
/// and retry hints are not events and are not forwarded).
fn raw(e: &SseEvent) -> Bytes {
    let mut s = String::with_capacity(e.data.len() + 32);
    if let Some(name) = &e.event {
        s.push_str("event: ");
        s.push_str(name);
        s.push('\n');
    }
    for line in e.data.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    Bytes::from(s)
}

impl Tail {
    pub async fn run(self, mut live: Live, tx: mpsc::Sender<Bytes>) {
        let mut out = Out {
            tx,
            gone: false,
            deadline: live.idle,
        };
        live.hold_end = self.stores && live.native();
        for c in std::mem::take(&mut live.pending) {
            out.send(c).await;
        }
        let backlog = std::mem::take(&mut live.backlog);
        let end = match forward(&mut live, backlog, &mut out).await {
            Some(end) => end,
            None if live.exhausted => End::Complete,
            None => pump(&mut live, &mut out).await,
        };
        // Boxed: the ending's future (4.6 kB, the ledger write inside) would otherwise
        // be a slot in this task's state for the whole stream, which waits in `pump`.
        Box::pin(self.finish(end, &mut live, &mut out)).await;
    }

    async fn finish(mut self, end: End, live: &mut Live, out: &mut Out) {
        let usage = live.translator.usage();
        let provider = self.dest.provider.to_string();
        if out.gone {
            self.rec.client_left();
        }
        let served = |verdict| Ended {
            seq: self.seq,
            dest: &self.dest,
            worst: self.worst,
            sent: self.sent,
            status: Some(200),
            verdict,
            reason: match live.translator.finish_reason() {
                Some(f) if f != "stop" => format!("a complete streamed answer (finish reason {f})"),
                Some(_) | None => "a complete streamed answer".into(),
            },
            stored: live.translator.stored_response().filter(|_| self.stores),
        };
        let (ended, closing) = match &end {
            End::Complete => {
                let charge = pricing::charge(&self.dest, &usage, self.bounds);
                (
                    served(Verdict::Served(charge)),
                    Closing {
                        outcome: ledger::Outcome::Served,
                        served_by: Some(provider.clone()),
                        error_code: None,
                    },
                )
            }
            End::Failed {
                class,
                reason,
                message,
            } => {
                if let Some(b) = &self.breaker {
                    b.record(Some(*class), self.rec.now_ms());
                }
                // Content was generated and sent: whatever the class, it is billable;
                // at its usage when the stream reported it.
                let failure = Failure {
                    started: Started::Generated,
                    usage,
                    ..Failure::new(*class, reason.clone(), message.clone())
                };
                let bill = failure.bill(&self.dest, self.bounds);
                (
                    Ended {
                        seq: self.seq,
                        dest: &self.dest,
                        worst: self.worst,
                        sent: self.sent,
                        status: Some(200),
                        verdict: Verdict::Failed {
                            class: *class,
                            bill,
                            decision: crate::decide::Action::Stop,
                            message: truncate_redact(message, self.key.as_deref()),
                        },
                        reason: format!(
                            "{reason}; the stream had already sent content to the client, so it ends with an error event and nothing is spliced"
                        ),
                        stored: None,
                    },
                    Closing {
                        outcome: ledger::Outcome::Failed,
                        served_by: None,
                        error_code: Some(class.as_str().to_string()),
                    },
                )
            }
        };
        let request_id = self.rec.request_id().to_string();
        let cost = match &ended.verdict {
            Verdict::Served(c) => c.cost,
            Verdict::Failed { .. } => Money::ZERO,
        };
        if let Err(err) = self.rec.record(ended, Some(closing)).await {
            // The client has its answer; the recorder's guard hands the request to the
            // sweeper, which interrupts it at its worst case once the ledger can write.
            tracing::error!(error = %err, %request_id, "cannot record the end of a stream");
        }
        match end {
            // A native stream carries the vendor's own end (`message_stop`,
            // `response.completed`), held until now when the response was stored.
            End::Complete if live.native() => {
                for b in std::mem::take(&mut live.held_end) {
                    out.send(b).await;
                }
            }
            // A Messages request translated to chat: Anthropic's own ending.
            End::Complete if live.to_messages.is_some() => {
                let usage = live.translator.usage();
                if let Some((w, model)) = &mut live.to_messages {
                    for e in w.end(&usage, model) {
                        out.send(Bytes::from(e)).await;
                    }
                }
            }
            // A Responses request translated to chat: the Responses ending.
            End::Complete if live.to_responses.is_some() => {
                let usage = live.translator.usage();
                if let Some((w, model)) = &mut live.to_responses {
                    for e in w.end(&usage, model) {
                        out.send(Bytes::from(e)).await;
                    }
                }
            }
            End::Complete => {
                out.send(sse(&live.translator.usage_chunk(&cost.to_string())))
                    .await;
                out.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            }
            End::Failed { class, message, .. } => {
                let err = ApiError::stream_cut(
                    live.ingress,
                    class,
                    &provider,
                    &request_id,
                    format!(
                        "{} (provider {provider}, class {class}; the stream was cut after content was sent)",
                        truncate_redact(&message, self.key.as_deref())
                    ),
                );
                out.send(err.stream_event()).await;
            }
        }
    }
}

/// Read the upstream to its end, forwarding every event in order.
async fn pump(live: &mut Live, out: &mut Out) -> End {
    let Some(mut body) = live.body.take() else {
        return ended(live);
    };
    loop {
        let events = match next(&mut body, live.idle).await {
            // The answer was already complete (its finish reason is in): only what
            // came after it — the usage — is lost, and that is charged at its bound.
            Step::Fail(..) if live.translator.complete() => return End::Complete,
            Step::Fail(class, reason) => {
                return End::Failed {
                    class,
                    message: reason.clone(),
                    reason,
                };
            }
            Step::End => {
                let rest: Vec<SseEvent> = live.decoder.finish().into_iter().collect();
                if let Some(end) = forward(live, rest, out).await {
                    return end;
                }
                return ended(live);
            }
            Step::Chunk(bytes) => match live.decoder.push(&bytes) {
                Ok(e) => e,
                Err(e) => {
                    return End::Failed {
                        class: FailureClass::Unclassified,
                        reason: e.to_string(),
                        message: e.to_string(),
                    };
                }
            },
        };
        if let Some(end) = forward(live, events, out).await {
            return end;
        }
    }
}

/// The body ended: complete if the answer was, else a cut.
fn ended(live: &Live) -> End {
    if live.translator.complete() {
        End::Complete
    } else {
        End::Failed {
            class: FailureClass::Dropped,
            reason: "the stream was cut before the answer was complete".into(),
            message: "the upstream closed the stream mid-answer".into(),
        }
    }
}

/// Send translated events on; `Some` when one of them ends the stream. A failure the
/// classifier reads from a vendor's finish reason (`content_filter`, a refusal, a
/// Gemini block) after content is the vendor's own finish: it is forwarded as sent and
/// the stream read on for its usage. An error event ends the stream.
async fn forward(live: &mut Live, events: Vec<SseEvent>, out: &mut Out) -> Option<End> {
    for e in events {
        let failure = match signal(live.api, live.ingress, &e) {
            Ok(EventSignal::Failure(class, reason)) => Some((class, reason)),
            Ok(EventSignal::Content | EventSignal::Neutral) | Err(()) => None,
        };
        let finished_before = live.translator.complete();
        let chunks = live.translator.event(&e);
        if let Some((class, reason)) = failure
            && (finished_before || !live.translator.complete())
        {
            return Some(End::Failed {
                class,
                reason: reason.into_owned(),
                message: upstream_message(&e.data),
            });
        }
        let bytes = live.out(&e, chunks);
        if live.hold_end && live.translator.saw_end_marker() {
            live.held_end.extend(bytes);
            return Some(End::Complete);
        }
        for c in bytes {
            out.send(c).await;
        }
        if live.translator.saw_end_marker() {
            return Some(End::Complete);
        }
    }
    None
}
