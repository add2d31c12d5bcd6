//! Streaming attempts. Before the first content reaches the client, a streamed attempt
//! is classified like any other (an error event is the same failure as the same error
//! as a plain answer), so the decision may still fail over. From the first content on,
//! the request is committed to this destination: a later failure ends the stream with
//! an OpenAI-style error event and is recorded as `maybe_billed`; nothing is spliced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Engine, truncate_redact, upstream_message};
use crate::breaker::Breaker;
use crate::failure::{self, Billing, EventSignal, FailureClass};
use crate::ledger::{self, AttemptResult, RequestResult};
use crate::money::Money;
use crate::policy::plan::{Api, Destination};
use crate::upstream::stream::{ChunkTranslator, SseDecoder, SseEvent};
use crate::upstream::{self, Usage};

/// A stream that has produced content and is still open upstream.
pub struct Live {
    api: Api,
    translator: ChunkTranslator,
    decoder: SseDecoder,
    body: Option<reqwest::Response>,
    /// Chunks translated before the commit, sent first.
    pending: Vec<Value>,
    /// The upstream already ended the answer.
    exhausted: bool,
    idle: Duration,
}

pub enum Start {
    Content(Box<Live>),
    Failed {
        class: FailureClass,
        reason: String,
        message: String,
    },
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
fn signal(api: Api, e: &SseEvent) -> Result<EventSignal, ()> {
    if e.data.trim() == "[DONE]" {
        return Ok(EventSignal::Neutral);
    }
    let v: Value = serde_json::from_str(&e.data).map_err(|_| ())?;
    Ok(failure::classify_event(api, e.event.as_deref(), &v))
}

/// What one pre-commit event means for the attempt.
enum Seen {
    /// Content: commit to this destination.
    Commit,
    /// A complete answer with no content at all (an empty completion).
    Finished,
    Fail(Start),
    Continue,
}

/// Read until the first content (commit), a failure (the decision may fail over), or
/// the end of the answer.
pub async fn first_content(
    api: Api,
    dest: &Destination,
    mut body: reqwest::Response,
    idle: Duration,
) -> Start {
    let mut live = Live {
        api,
        translator: ChunkTranslator::new(api, dest),
        decoder: SseDecoder::default(),
        body: None,
        pending: Vec::new(),
        exhausted: false,
        idle,
    };
    // Kept only while no event has been seen: an upstream that ignored `stream` and
    // answered in one JSON body is replayed as chunks rather than called a failure.
    let mut raw: Vec<u8> = Vec::new();
    let mut saw_event = false;
    loop {
        let events = match next(&mut body, idle).await {
            Step::Fail(class, reason) => {
                return Start::Failed {
                    class,
                    message: reason.clone(),
                    reason,
                };
            }
            Step::End => {
                let last: Vec<SseEvent> = live.decoder.finish().into_iter().collect();
                saw_event |= !last.is_empty();
                for e in &last {
                    match see(&mut live, e) {
                        Seen::Fail(f) => return f,
                        Seen::Commit | Seen::Finished => {
                            live.exhausted = live.translator.complete();
                            return Start::Content(Box::new(live));
                        }
                        Seen::Continue => {}
                    }
                }
                if !saw_event && let Some(start) = replay_complete(api, dest, &raw, live) {
                    return start;
                }
                return Start::Failed {
                    class: FailureClass::Dropped,
                    reason: "the stream ended before any content".into(),
                    message: "the upstream closed the stream before any content".into(),
                };
            }
            Step::Chunk(bytes) => {
                if !saw_event && raw.len() < 1 << 20 {
                    raw.extend_from_slice(&bytes);
                }
                match live.decoder.push(&bytes) {
                    Ok(e) => e,
                    Err(e) => {
                        return Start::Failed {
                            class: FailureClass::Unclassified,
                            reason: e.to_string(),
                            message: e.to_string(),
                        };
                    }
                }
            }
        };
        for e in &events {
            saw_event = true;
            match see(&mut live, e) {
                Seen::Fail(f) => return f,
                Seen::Commit => {
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

fn see(live: &mut Live, e: &SseEvent) -> Seen {
    match signal(live.api, e) {
        Ok(EventSignal::Failure(class, reason)) => Seen::Fail(Start::Failed {
            class,
            reason: reason.into_owned(),
            message: upstream_message(&e.data),
        }),
        Ok(EventSignal::Content) => {
            let chunks = live.translator.event(e);
            live.pending.extend(chunks);
            Seen::Commit
        }
        Ok(EventSignal::Neutral) => {
            let chunks = live.translator.event(e);
            live.pending.extend(chunks);
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
    let text = std::str::from_utf8(raw).ok()?;
    let v: Value = serde_json::from_str(text).ok()?;
    match failure::classify(api, 200, &[], text) {
        failure::Outcome::Failure { class, reason } => Some(Start::Failed {
            class,
            reason: reason.into_owned(),
            message: upstream_message(text),
        }),
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
            t.set_usage(reported);
            for data in [
                json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                json!({"choices": [], "usage": usage}),
            ] {
                let chunks = t.event(&SseEvent {
                    event: None,
                    data: data.to_string(),
                });
                live.pending.extend(chunks);
            }
            live.translator = t;
            live.exhausted = true;
            Some(Start::Content(Box::new(live)))
        }
    }
}

/// The rest of a committed streaming attempt, run after the client got its headers.
pub struct Tail {
    pub engine: Arc<Engine>,
    pub request_id: String,
    pub seq: u32,
    pub dest: Destination,
    pub currency: String,
    pub worst: Money,
    pub billed_before: Money,
    pub charged_before: Money,
    pub breaker: Option<Arc<Breaker>>,
    pub sent: Instant,
    pub key: Option<String>,
}

enum End {
    Complete,
    Failed {
        class: FailureClass,
        reason: String,
        message: String,
    },
    ClientGone,
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl Tail {
    pub async fn run(self, mut live: Live, tx: mpsc::Sender<Bytes>) {
        let mut end = None;
        for c in std::mem::take(&mut live.pending) {
            if tx.send(sse(&c)).await.is_err() {
                end = Some(End::ClientGone);
                break;
            }
        }
        let end = match end {
            Some(e) => e,
            None if live.exhausted => End::Complete,
            None => self.pump(&mut live, &tx).await,
        };
        self.finish(end, &live, &tx).await;
    }

    async fn pump(&self, live: &mut Live, tx: &mpsc::Sender<Bytes>) -> End {
        let Some(mut body) = live.body.take() else {
            return End::Complete;
        };
        loop {
            let step = tokio::select! {
                // The client went away: dropping `body` cancels the upstream call.
                () = tx.closed() => return End::ClientGone,
                s = next(&mut body, live.idle) => s,
            };
            let events = match step {
                Step::Fail(class, reason) => {
                    return End::Failed {
                        class,
                        message: reason.clone(),
                        reason,
                    };
                }
                Step::End => {
                    let tail: Vec<SseEvent> = live.decoder.finish().into_iter().collect();
                    if let Some(end) = self.forward(live, tail, tx).await {
                        return end;
                    }
                    return if live.translator.complete() {
                        End::Complete
                    } else {
                        End::Failed {
                            class: FailureClass::Dropped,
                            reason: "the stream was cut before the answer was complete".into(),
                            message: "the upstream closed the stream mid-answer".into(),
                        }
                    };
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
            if let Some(end) = self.forward(live, events, tx).await {
                return end;
            }
        }
    }

    /// Send translated events on; `Some` when one of them ends the stream.
    async fn forward(
        &self,
        live: &mut Live,
        events: Vec<SseEvent>,
        tx: &mpsc::Sender<Bytes>,
    ) -> Option<End> {
        for e in events {
            if let Ok(EventSignal::Failure(class, reason)) = signal(live.api, &e) {
                return Some(End::Failed {
                    class,
                    reason: reason.into_owned(),
                    message: upstream_message(&e.data),
                });
            }
            for c in live.translator.event(&e) {
                if tx.send(sse(&c)).await.is_err() {
                    return Some(End::ClientGone);
                }
            }
            if live.translator.saw_end_marker() {
                return Some(End::Complete);
            }
        }
        None
    }

    async fn finish(self, end: End, live: &Live, tx: &mpsc::Sender<Bytes>) {
        let e = &self.engine;
        let usage: Usage = live.translator.usage();
        let tokens = |n: u64| (n > 0).then_some(n);
        let provider = self.dest.provider.as_str();
        let (class, billing, cost, decision, reason, message, outcome, code) = match &end {
            End::Complete => {
                let cost = self
                    .dest
                    .cost(usage.input.unwrap_or(0), usage.output.unwrap_or(0));
                (
                    None,
                    Billing::Billed,
                    cost,
                    "served",
                    "a complete streamed answer".to_string(),
                    None,
                    ledger::Outcome::Served,
                    None,
                )
            }
            End::Failed {
                class,
                reason,
                message,
            } => (
                Some(*class),
                // Content was generated and sent: whatever the class, it may be billed.
                Billing::MaybeBilled,
                Money::ZERO,
                "stop",
                format!(
                    "{reason}; the stream had already sent content to the client, so it ends with an error event and nothing is spliced"
                ),
                Some(truncate_redact(message, self.key.as_deref())),
                ledger::Outcome::Failed,
                Some(class.as_str().to_string()),
            ),
            End::ClientGone => (
                Some(FailureClass::Dropped),
                Billing::MaybeBilled,
                Money::ZERO,
                "stop",
                "the client disconnected mid-stream; the upstream call was cancelled".to_string(),
                None,
                ledger::Outcome::Failed,
                Some("client_disconnected".to_string()),
            ),
        };
        let class_name = class.map_or("success", FailureClass::as_str);
        e.metrics
            .attempt(provider, class_name, Some(self.sent.elapsed()));
        if class.is_none() {
            e.metrics.spend(provider, &self.currency, cost);
        }
        if let (Some(b), Some(c)) = (&self.breaker, class)
            && !matches!(end, End::ClientGone)
        {
            b.record(Some(c), e.clock.now_ms());
        }
        tracing::info!(seq = self.seq, provider, class = class_name, %cost, decision, "attempt (stream)");
        let billed = self.billed_before + cost;
        let charged = self.charged_before
            + if billing == Billing::MaybeBilled {
                self.worst
            } else {
                cost
            };
        let recorded = e
            .ledger
            .finish(
                AttemptResult {
                    request_id: self.request_id.clone(),
                    seq: self.seq,
                    finished_at: e.clock.wall(),
                    status: Some(200),
                    class: class_name.to_string(),
                    billing,
                    decision: decision.to_string(),
                    reason,
                    input_tokens: usage.input.and_then(tokens),
                    output_tokens: usage.output.and_then(tokens),
                    cost,
                    message: message.clone(),
                },
                RequestResult {
                    request_id: self.request_id.clone(),
                    outcome,
                    error_code: code.clone(),
                    served_by: class.is_none().then(|| provider.to_string()),
                    cost: billed,
                    charged,
                },
            )
            .await;
        if let Err(err) = &recorded {
            // The client already has its answer; the row stays in flight and becomes
            // interrupted / maybe_billed at the next start.
            tracing::error!(error = %err, request_id = %self.request_id, "cannot record the end of a stream");
        }
        match end {
            End::Complete => {
                let _ = tx
                    .send(sse(&live.translator.usage_chunk(&cost.to_string())))
                    .await;
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            }
            End::Failed { class, .. } => {
                let err = json!({"error": {
                    "message": format!("{} (provider {provider}, class {class}; the stream was cut after content was sent)", message.unwrap_or_default()),
                    "type": "upstream_error",
                    "code": class.as_str(),
                    "provider": provider,
                    "request_id": self.request_id,
                }});
                let _ = tx.send(sse(&err)).await;
            }
            End::ClientGone => {}
        }
    }
}
