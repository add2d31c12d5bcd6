//! Chaos: concurrent clients against vendors scripted at random — delays, 429 and 5xx,
//! timeouts, streams cut before and after content, events coalesced or split anywhere,
//! answers without usage — and clients that hang up at random points; streaming and
//! plain requests under hard and soft policies with small day budgets and alternates.
//! After quiescence, the money invariants are checked from the ledger file and the
//! vendors' call logs, and every stream a client read to its end is checked against
//! what the vendor sent.
//!
//! Seeded: the seed is printed, and `PURSER_CHAOS_SEED=<seed>` replays a run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::db::Engine;
use common::money::{assert_money_invariants_on, quiesce_on};
use common::vendors::{Script, Vendors, stream_body};
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

fn docs(v: &Vendors) -> Vec<String> {
    // Breakers that rarely open, so most requests reach the scripted vendors.
    let t = |s: String| {
        s.replace(
            "timeout_ms: 300",
            "timeout_ms: 400\ncircuit: { failures: 40, window_s: 2, cooldown_s: 1 }",
        )
    };
    vec![
        t(provider(v, "oa", "openai", "us", &[("m", "0.15", "0.60")])),
        t(provider(
            v,
            "an",
            "anthropic",
            "us",
            &[("m", "0.25", "1.25")],
        )),
        t(provider(v, "ge", "gemini", "us", &[("m", "0.10", "0.40")])),
        format!(
            "kind: policy\nid: hard\nclients:\n  - {{ id: h, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.001\", mode: hard }}\nmax_output_tokens: 200\nbudgets: [ {{ period: day, limit: \"0.006\" }} ]\nalternates:\n  m: an/m\n",
            sha(KEYS[0])
        ),
        format!(
            "kind: policy\nid: soft\nclients:\n  - {{ id: s, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.001\", mode: soft }}\nmax_output_tokens: 200\nbudgets: [ {{ period: day, limit: \"0.008\" }} ]\nalternates:\n  m: an/m\n",
            sha(KEYS[1])
        ),
    ]
}

fn api_of(provider: &str) -> &'static str {
    match provider {
        "oa" => "openai",
        "an" => "anthropic",
        _ => "gemini",
    }
}

fn script(rng: &mut Rng, provider: &str) -> Script {
    match rng.below(14) {
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
        10 => {
            let body = stream_body(api_of(provider), provider, "m");
            let mut cuts: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(body.len() as u64) as usize).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([body.len()]) {
                if c > from {
                    pieces.push(body[from..c].to_vec());
                    from = c;
                }
            }
            Script::StreamPieces(pieces)
        }
        11 => Script::Drop,
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
}

/// A stream a client read to its end: who served it and the text it got.
struct ReadToEnd {
    provider: String,
    text: String,
    complete: bool,
}

async fn one(url: String, key: &'static str, stream: bool, client: Client) -> Option<ReadToEnd> {
    let body = json!({"model": "m", "stream": stream, "max_tokens": 100,
                      "messages": [{"role": "user", "content": "hello"}]});
    let mut rb = reqwest::Client::new()
        .post(url)
        .bearer_auth(key)
        .json(&body);
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
    if !stream || r.status() != 200 {
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
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    let content: String = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    Some(ReadToEnd {
        provider,
        text: content,
        complete: data.last() == Some(&"[DONE]") && !text.contains("\"error\""),
    })
}

#[test]
fn chaos_keeps_every_money_invariant() {
    chaos(Engine::Sqlite);
}

/// The same chaos with the ledger on PostgreSQL.
#[test]
fn chaos_keeps_every_money_invariant_on_postgres() {
    chaos(Engine::Postgres);
}

fn chaos(engine: Engine) {
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
    let outcome = std::panic::catch_unwind(|| run(seed, engine));
    if let Err(e) = outcome {
        eprintln!("chaos failed with seed {seed}: replay with PURSER_CHAOS_SEED={seed}");
        std::panic::resume_unwind(e);
    }
}

fn run(seed: u64, engine: Engine) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let Some(g) = common::start_on(engine, "chaos", docs).await else {
            return;
        };
        let mut rng = Rng(seed);
        for p in PROVIDERS {
            let scripts = (0..REQUESTS / 2).map(|_| script(&mut rng, p)).collect();
            g.vendors.script(p, scripts);
        }
        let plan: Vec<(&'static str, bool, Client)> = (0..REQUESTS)
            .map(|_| {
                let key = KEYS[rng.below(2) as usize];
                let stream = rng.below(2) == 0;
                let client = match rng.below(6) {
                    0 => Client::Impatient(20 + rng.below(300)),
                    1 => Client::Leaves(1 + rng.below(3) as usize),
                    _ => Client::Patient,
                };
                (key, stream, client)
            })
            .collect();
        let work = Arc::new(Mutex::new(plan.into_iter()));
        let read = Arc::new(Mutex::new(Vec::new()));
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let (work, read, url) = (work.clone(), read.clone(), g.url("/v1/chat/completions"));
            clients.push(tokio::spawn(async move {
                loop {
                    let next = work.lock().unwrap().next();
                    let Some((key, stream, client)) = next else { return };
                    if let Some(r) = one(url.clone(), key, stream, client).await {
                        read.lock().unwrap().push(r);
                    }
                }
            }));
        }
        for c in clients {
            c.await.unwrap();
        }
        quiesce_on(&g.ledger_db, 30).await;
        assert_money_invariants_on(&g.ledger_db, &g.vendors, &PROVIDERS).await;
        // Every stream read to its end: a complete one is exactly what its vendor
        // wrote; one ended by an error event holds a prefix of it.
        let read = read.lock().unwrap();
        for r in read.iter() {
            let sent = format!("Hello from {}.", r.provider);
            if r.complete {
                assert_eq!(r.text, sent, "seed {seed}");
            } else {
                assert!(sent.starts_with(&r.text), "seed {seed}: `{}` is not a prefix of `{sent}`", r.text);
            }
        }
        let outcomes = g
            .ledger_db
            .rows("SELECT outcome || '/' || COALESCE(error_code, '-'), COUNT(*) FROM requests GROUP BY 1 ORDER BY 2 DESC")
            .await;
        println!(
            "seed {seed} ({engine:?}): {} streams read to the end; outcomes {outcomes:?}",
            read.len()
        );
    });
}
