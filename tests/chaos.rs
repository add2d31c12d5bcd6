//! Chaos: concurrent clients against vendors scripted at random — delays, 429 and 5xx,
//! timeouts, streams cut before and after content, events coalesced or split anywhere,
//! answers without usage, 2xx bodies that are errors, reasoning before content, the
//! vendor's content filter after content — and clients that hang up or stop reading at
//! random points; streaming and plain requests in all three ingress APIs (chat
//! completions, Anthropic Messages, OpenAI Responses), some to a reasoning model that
//! reads only `max_completion_tokens` and some carrying a file part, under hard and soft
//! policies
//! with small day budgets and alternates, while budgets are added, raised and lowered by
//! reloads mid-run. The PostgreSQL run goes through a fault proxy that delays the
//! database and cuts it once.
//! After quiescence, the money invariants are checked from the ledger file and the
//! vendors' call logs, and every stream a client read to its end is checked against
//! what the vendor sent.
//!
//! Seeded: the seed is printed, and `PURSER_CHAOS_SEED=<seed>` replays a run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;
#[path = "common/faultproxy.rs"]
#[allow(dead_code)] // the chaos run cuts and slows the database; it drops no COMMIT reply
mod faultproxy;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::db::Engine;
use common::money::{assert_money_invariants_after_reloads_on, quiesce_on};
use common::vendors::{Script, Vendors};
use common::{provider, sha};
use futures_util::StreamExt;
use serde_json::{Value, json};

const KEYS: [&str; 2] = ["key-chaos-hard", "key-chaos-soft"];
const PROVIDERS: [&str; 3] = ["oa", "an", "ge"];
const REQUESTS: usize = 160;
const CLIENTS: usize = 16;

/// xorshift64*: small, seedable, and enough to pick scripts.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Day budgets of the hard and soft policies; `None`: no budget.
#[derive(Debug, Clone, Copy)]
struct Budgets(Option<&'static str>, Option<&'static str>);

/// The budgets a run starts with, and those reloads switch between mid-run: added,
/// raised, lowered (below what was already spent, too) and removed.
const START: Budgets = Budgets(Some("0.006"), Some("0.008"));
const RELOADS: [Budgets; 4] = [
    Budgets(Some("0.004"), Some("0.012")),
    Budgets(None, Some("0.002")),
    Budgets(Some("0.009"), None),
    START,
];

fn docs(v: &Vendors, b: Budgets) -> Vec<String> {
    // Breakers that rarely open, so most requests reach the scripted vendors.
    let t = |s: String| {
        s.replace(
            "timeout_ms: 300",
            "timeout_ms: 400\ncircuit: { failures: 40, window_s: 2, cooldown_s: 1 }",
        )
    };
    // A file part is bounded where the model declares its size (OpenAI and Anthropic
    // here); Gemini's entry does not, so a file request cannot be sent there under a
    // budget.
    let files = |s: String| {
        s.replace(
            "    output_per_mtok",
            "    media_tokens: { file: 600 }\n    output_per_mtok",
        )
    };
    let budget = |limit: Option<&str>| match limit {
        Some(l) => format!("budgets: [ {{ period: day, limit: \"{l}\" }} ]\n"),
        None => String::new(),
    };
    vec![
        t(files(provider(
            v,
            "oa",
            "openai",
            "us",
            &[("m", "0.15", "0.60"), ("o4-mini", "0.15", "0.60")],
        ))),
        t(files(provider(
            v,
            "an",
            "anthropic",
            "us",
            &[("m", "0.25", "1.25")],
        ))),
        t(provider(v, "ge", "gemini", "us", &[("m", "0.10", "0.40")])),
        format!(
            "kind: policy\nid: hard\nclients:\n  - {{ id: h, key_sha256: \"{}\" }}\nmodels: [m, o4-mini]\njurisdictions: [us]\nceiling: {{ per_request: \"0.001\", mode: hard }}\nmax_output_tokens: 200\n{}alternates:\n  m: an/m\n",
            sha(KEYS[0]),
            budget(b.0)
        ),
        format!(
            "kind: policy\nid: soft\nclients:\n  - {{ id: s, key_sha256: \"{}\" }}\nmodels: [m, o4-mini]\njurisdictions: [us]\nceiling: {{ per_request: \"0.001\", mode: soft }}\nmax_output_tokens: 200\n{}alternates:\n  m: an/m\n",
            sha(KEYS[1]),
            budget(b.1)
        ),
    ]
}

fn script(rng: &mut Rng) -> Script {
    match rng.below(18) {
        0 => Script::Delay(rng.below(150)),
        1 => Script::Delay(600), // past the 400 ms attempt timeout
        2 => Script::Status(429, r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#.into()),
        3 => Script::Status(500, r#"{"error":{"message":"The server had an error","type":"server_error"}}"#.into()),
        4 => Script::Status(503, r#"{"error":{"message":"The engine is currently overloaded","type":"server_error"}}"#.into()),
        5 => Script::StreamCut(0),
        6 => Script::StreamCut(1 + rng.below(3) as usize),
        7 => Script::StreamBatched,
        8 => Script::NoUsage,
        9 => Script::StreamSlow(rng.below(60)),
        // Split anywhere in whichever stream is asked for ("oa" serves chat and
        // Responses alike).
        10 => Script::StreamSplitAt((0..rng.below(6)).map(|_| rng.next()).collect()),
        11 => Script::Drop,
        // A relay's 200 whose body is an error: the model may have started.
        12 => Script::Status(200, r#"{"error":{"message":"Upstream error from provider: overloaded","code":502},"user_id":"u"}"#.into()),
        13 => Script::FilterAfterContent,
        14 => Script::ReasoningFirst,
        _ => Script::Ok,
    }
}

/// How a client treats its request.
#[derive(Debug, Clone, Copy)]
enum Client {
    /// Read the whole answer.
    Patient,
    /// Give up after this many milliseconds.
    Impatient(u64),
    /// Read this many stream chunks, then hang up.
    Leaves(usize),
    /// Keep the connection but read nothing for this many milliseconds, then read on.
    Stalls(u64),
}

/// The API a client speaks to purser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ingress {
    /// `/v1/chat/completions`: any vendor, translated.
    Chat,
    /// `/v1/messages`: natively to Anthropic only (the `an/m` alternate).
    Messages,
    /// `/v1/responses`: natively to OpenAI only (`oa`).
    Responses,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy)]
struct Ask {
    ingress: Ingress,
    key: &'static str,
    stream: bool,
    /// The reasoning model that reads only `max_completion_tokens`.
    reasoning: bool,
    /// A PDF file part beside the text.
    file: bool,
}

/// A stream a client read to its end: who served it and the text it got.
struct ReadToEnd {
    ingress: Ingress,
    provider: String,
    text: String,
    complete: bool,
}

/// The path and body of a request in its ingress's own shape: a text part and, with
/// `file`, a PDF beside it; the output cap in the ingress's own field.
fn request(ask: Ask) -> (&'static str, Value) {
    let Ask {
        ingress,
        stream,
        reasoning,
        file,
        ..
    } = ask;
    // The reasoning model is OpenAI's: a Messages request for it has no destination
    // that takes it natively, so Messages always asks for `m` (served by `an/m`).
    let model = if reasoning && ingress != Ingress::Messages {
        "o4-mini"
    } else {
        "m"
    };
    let pdf = "JVBERi0xLjQK";
    match ingress {
        Ingress::Chat => {
            let content = if file {
                json!([
                    {"type": "text", "text": "hello"},
                    {"type": "file", "file": {"filename": "a.pdf", "file_data": format!("data:application/pdf;base64,{pdf}")}}
                ])
            } else {
                json!("hello")
            };
            let body = json!({"model": model, "stream": stream, "max_tokens": 100,
                              "messages": [{"role": "user", "content": content}]});
            ("/v1/chat/completions", body)
        }
        Ingress::Messages => {
            let content = if file {
                json!([
                    {"type": "text", "text": "hello"},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}}
                ])
            } else {
                json!("hello")
            };
            let body = json!({"model": model, "stream": stream, "max_tokens": 100,
                              "messages": [{"role": "user", "content": content}]});
            ("/v1/messages", body)
        }
        Ingress::Responses => {
            // The mock's Responses answer reports Codex-sized usage (3,000 input tokens,
            // 2,048 of them cached): the request carries as much, so the vendor never
            // reports more than was sent, as a real one cannot.
            let text = "hello ".repeat(500);
            let input = if file {
                json!([{"role": "user", "content": [
                    {"type": "input_text", "text": text},
                    {"type": "input_file", "filename": "a.pdf", "file_data": format!("data:application/pdf;base64,{pdf}")}
                ]}])
            } else {
                json!(text)
            };
            let body = json!({"model": model, "stream": stream, "max_output_tokens": 100,
                              "store": false, "input": input});
            ("/v1/responses", body)
        }
    }
}

/// The text a stream carried and whether it reached its own end without an error,
/// read the way each ingress's clients read it.
fn read_stream(ingress: Ingress, text: &str) -> (String, bool) {
    let mut events: Vec<(Option<&str>, Value)> = Vec::new();
    let (mut name, mut done, mut unparsed) = (None, false, false);
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n);
        } else if let Some(d) = line.strip_prefix("data: ") {
            // Chat's end: `[DONE]` as the last data line.
            done = d.trim() == "[DONE]";
            match serde_json::from_str::<Value>(d) {
                Ok(v) => events.push((name.take(), v)),
                Err(_) if done => {}
                Err(_) => unparsed = true,
            }
        }
    }
    let errored = unparsed
        || events
            .iter()
            .any(|(n, v)| *n == Some("error") || v.get("error").is_some() || v["type"] == "error");
    let (delta, end) = match ingress {
        Ingress::Chat => ("/choices/0/delta/content", None),
        Ingress::Messages => ("/delta/text", Some("message_stop")),
        Ingress::Responses => ("/delta", Some("response.completed")),
    };
    let content: String = events
        .iter()
        .filter(|(_, v)| ingress != Ingress::Responses || v["type"] == "response.output_text.delta")
        .filter_map(|(_, v)| v.pointer(delta).and_then(Value::as_str))
        .collect();
    let ended = match end {
        None => done && events.last().is_some(),
        Some(ty) => events.last().is_some_and(|(_, v)| v["type"] == ty),
    };
    (content, ended && !errored)
}

async fn one(base: String, ask: Ask, client: Client) -> Option<ReadToEnd> {
    let (path, body) = request(ask);
    let mut rb = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body);
    rb = match ask.ingress {
        // Claude Code's two ways to present a key.
        Ingress::Messages if ask.file => rb.header("x-api-key", ask.key),
        Ingress::Messages => rb.bearer_auth(ask.key),
        Ingress::Chat | Ingress::Responses => rb.bearer_auth(ask.key),
    };
    if ask.ingress == Ingress::Messages {
        rb = rb.header("anthropic-version", "2023-06-01");
    }
    if let Client::Impatient(ms) = client {
        rb = rb.timeout(Duration::from_millis(ms));
    }
    let r = rb.send().await.ok()?;
    let provider = r
        .headers()
        .get("x-purser-provider")?
        .to_str()
        .ok()?
        .to_string();
    if let Client::Stalls(ms) = client {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if !ask.stream || r.status() != 200 {
        let _ = r.bytes().await;
        return None;
    }
    let mut chunks = r.bytes_stream();
    let mut raw = Vec::new();
    let mut n = 0;
    while let Some(c) = chunks.next().await {
        let Ok(c) = c else { return None };
        raw.extend_from_slice(&c);
        n += 1;
        if let Client::Leaves(k) = client
            && n >= k
        {
            return None; // hangs up
        }
    }
    let text = String::from_utf8(raw).unwrap();
    let (content, complete) = read_stream(ask.ingress, &text);
    Some(ReadToEnd {
        ingress: ask.ingress,
        provider,
        text: content,
        complete,
    })
}

#[test]
fn chaos_keeps_every_money_invariant() {
    chaos(Engine::Sqlite, Meddling::Reloads);
}

/// The same chaos with the ledger on PostgreSQL.
#[test]
fn chaos_keeps_every_money_invariant_on_postgres() {
    chaos(Engine::Postgres, Meddling::ReloadsAndDatabaseCuts);
}

/// What happens beside the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meddling {
    /// Reloads that add, raise, lower and remove the day budgets.
    Reloads,
    /// The same reloads, with the database slowed and cut now and then through a
    /// fault proxy (PostgreSQL).
    ReloadsAndDatabaseCuts,
}

fn chaos(engine: Engine, meddling: Meddling) {
    let seed: u64 = std::env::var("PURSER_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    println!("chaos seed {seed} (replay with PURSER_CHAOS_SEED={seed})");
    let outcome = std::panic::catch_unwind(|| run(seed, engine, meddling));
    if let Err(e) = outcome {
        eprintln!("chaos failed with seed {seed}: replay with PURSER_CHAOS_SEED={seed}");
        std::panic::resume_unwind(e);
    }
}

fn run(seed: u64, engine: Engine, meddling: Meddling) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // On PostgreSQL the gateway reaches the server through a fault proxy.
        let proxy = match engine {
            Engine::Postgres => Some(Arc::new(faultproxy::FaultProxy::start("127.0.0.1:5432").await)),
            Engine::Sqlite => None,
        };
        let via = proxy.clone();
        let Some(g) = common::start_on_via(
            engine,
            "chaos",
            |v| docs(v, START),
            move |url| via.map_or_else(|| url.to_string(), |p| p.url(url)),
        )
        .await
        else {
            return;
        };
        let mut rng = Rng(seed);
        for p in PROVIDERS {
            let scripts = (0..REQUESTS / 2).map(|_| script(&mut rng)).collect();
            g.vendors.script(p, scripts);
        }
        let plan: Vec<(Ask, Client)> = (0..REQUESTS)
            .map(|_| {
                let ask = Ask {
                    ingress: [Ingress::Chat, Ingress::Messages, Ingress::Responses][rng.below(3) as usize],
                    key: KEYS[rng.below(2) as usize],
                    stream: rng.below(2) == 0,
                    reasoning: rng.below(4) == 0,
                    file: rng.below(5) == 0,
                };
                let client = match rng.below(7) {
                    0 => Client::Impatient(20 + rng.below(300)),
                    1 => Client::Leaves(1 + rng.below(3) as usize),
                    2 => Client::Stalls(50 + rng.below(500)),
                    _ => Client::Patient,
                };
                (ask, client)
            })
            .collect();
        let work = Arc::new(Mutex::new(plan.into_iter()));
        let read = Arc::new(Mutex::new(Vec::new()));
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let (work, read, url) = (work.clone(), read.clone(), g.url(""));
            clients.push(tokio::spawn(async move {
                loop {
                    let next = work.lock().unwrap().next();
                    let Some((ask, client)) = next else { return };
                    if let Some(r) = one(url.clone(), ask, client).await {
                        read.lock().unwrap().push(r);
                    }
                }
            }));
        }
        // Meanwhile: reloads that add, raise, lower and remove the day budgets, and on
        // PostgreSQL a slow database and one cut of it.
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let meddler = {
            let (busy, config, url) = (busy.clone(), g.config.join("set.yaml"), g.url("/admin/v1/reload"));
            let vendors_docs: Vec<String> = RELOADS.iter().map(|b| {
                let mut all = vec!["kind: gateway\ncurrency: USD\n".to_string()];
                all.extend(docs(&g.vendors, *b));
                all.join("---\n")
            }).collect();
            let proxy = proxy.clone();
            let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
            tokio::spawn(async move {
                let mut i = 0;
                while busy.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(150 + rng.below(250))).await;
                    std::fs::write(&config, &vendors_docs[i % vendors_docs.len()]).unwrap();
                    // A reload that adds a budget asks the ledger first: while the
                    // database is cut it is refused (the old plan keeps serving).
                    let mut reloaded = false;
                    for _ in 0..20 {
                        let r = reqwest::Client::new().post(&url).bearer_auth(common::ADMIN).send().await.unwrap();
                        if r.status() == 200 {
                            reloaded = true;
                            break;
                        }
                        assert_eq!(r.status(), 503, "reload: {}", r.text().await.unwrap_or_default());
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    assert!(reloaded, "the reload never went through");
                    if let Some(p) = &proxy {
                        match i % 6 {
                            2 => p.delay(Duration::from_millis(rng.below(15))),
                            4 if meddling == Meddling::ReloadsAndDatabaseCuts => {
                                p.cut();
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                p.restore();
                            }
                            _ => p.delay(Duration::ZERO),
                        }
                    }
                    i += 1;
                }
                if let Some(p) = &proxy {
                    p.restore();
                    p.delay(Duration::ZERO);
                }
            })
        };
        for c in clients {
            c.await.unwrap();
        }
        busy.store(false, std::sync::atomic::Ordering::Relaxed);
        meddler.await.unwrap();
        // Every request's task first: one whose client gave up before its admission is
        // not in the ledger yet, and would be admitted while the checks read it.
        tokio::time::timeout(Duration::from_secs(30), g.engine.drained())
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: a request's task still running after 30 s"));
        quiesce_on(&g.ledger_db, 30).await;
        // Budgets were lowered below what a window had spent: spent may then pass the
        // new limit, but never what the attempts charged.
        assert_money_invariants_after_reloads_on(&g.ledger_db, &g.vendors, &PROVIDERS).await;
        // The reasoning model never received the cap in a field it refuses.
        let refused = g
            .ledger_db
            .count("SELECT COUNT(*) FROM attempts WHERE message LIKE '%unsupported_parameter%' OR message LIKE '%max_completion_tokens%'")
            .await;
        assert_eq!(refused, 0, "seed {seed}: a cap reached the reasoning model in a field it refuses");
        // Every stream read to its end: a complete one is exactly what its vendor
        // wrote; one ended by an error event holds a prefix of it.
        let read: Vec<ReadToEnd> = std::mem::take(&mut *read.lock().unwrap());
        for r in read.iter() {
            let sent = format!("Hello from {}.", r.provider);
            if r.complete {
                assert_eq!(r.text, sent, "seed {seed}: {:?}", r.ingress);
            } else {
                assert!(sent.starts_with(&r.text), "seed {seed}: {:?} `{}` is not a prefix of `{sent}`", r.ingress, r.text);
            }
        }
        // All three ingresses reached the ledger, each recorded as its own.
        let ingresses = g.ledger_db.column("SELECT DISTINCT ingress FROM requests ORDER BY 1").await;
        assert_eq!(
            ingresses,
            ["chat", "messages", "responses"],
            "seed {seed}: the ledger's ingresses"
        );
        let outcomes = g
            .ledger_db
            .rows("SELECT ingress || ' ' || outcome || '/' || COALESCE(error_code, '-'), COUNT(*) FROM requests GROUP BY 1 ORDER BY 1")
            .await;
        let whole = |i: Ingress| read.iter().filter(|r| r.ingress == i && r.complete).count();
        println!(
            "seed {seed} ({engine:?}): {} streams read to the end, whole: {} chat, {} messages, {} responses; outcomes {outcomes:?}",
            read.len(),
            whole(Ingress::Chat),
            whole(Ingress::Messages),
            whole(Ingress::Responses)
        );
    });
}
