//! Clients that stop reading, or are refused before their body is read (defect 6 of
//! issue 20): every wait on a client has a deadline, and a refusal can be read.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::time::{Duration, Instant};

use common::vendors::Script;
use common::{provider, sha};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "key-slow-clients";

fn docs(vendors: &common::vendors::Vendors) -> Vec<String> {
    vec![
        provider(vendors, "p", "openai", "us", &[("m", "0.001", "0.001")])
            .replace("timeout_ms: 300", "timeout_ms: 1000"),
        format!(
            "kind: policy\nid: team\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"1\", mode: hard }}\nmax_output_tokens: 100\nbudgets:\n  - {{ period: day, limit: \"100\" }}\n",
            sha(KEY)
        ),
    ]
}

/// A long OpenAI stream (about 16 MB of content events), in pieces of 200 events.
fn long_stream() -> Vec<Vec<u8>> {
    let text = "x".repeat(200);
    let event = format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n"
    );
    let mut pieces: Vec<Vec<u8>> = (0..320).map(|_| event.repeat(200).into_bytes()).collect();
    pieces.push(
        b"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
          data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":8,\"total_tokens\":20}}\n\n\
          data: [DONE]\n\n"
            .to_vec(),
    );
    pieces
}

/// A raw client with a small receive buffer sends a streaming request, reads a little
/// and then nothing more, keeping its socket open. Within the provider's timeout of no
/// progress the gateway treats it as gone: the stream is read to its end upstream, the
/// attempt billed, the request finished (`client_disconnected`) and its slot released.
/// (On main `Out::send` waited for the client forever: the request stayed in flight.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_hold_its_request() {
    let gw = common::start(docs).await;
    gw.vendors
        .script("p", vec![Script::StreamPieces(long_stream())]);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(gw.addr).await.unwrap();
    let body = serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hello"}]}).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    // Read the first bytes of the answer, then stop reading.
    let mut first = [0u8; 1024];
    let n = conn.read(&mut first).await.unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first[..n])
    );
    let start = Instant::now();
    while gw.engine.in_flight() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the request is still in flight {:?} after its client stopped reading",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let conn_db = purser::ledger::read::open_reader(&gw.db).unwrap();
    let (outcome, code, billing): (String, Option<String>, String) = conn_db
        .query_row(
            "SELECT r.outcome, r.error_code, a.billing FROM requests r JOIN attempts a ON a.request_id = r.id",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        (outcome.as_str(), code.as_deref(), billing.as_str()),
        ("served", Some("client_disconnected"), "billed")
    );
    common::money::assert_money_invariants(&gw.db, &gw.vendors, &["p"]);
    drop(conn); // held open until here
}

/// Send `head` and a body of `size` bytes on a raw connection, then read the answer.
/// A gateway that answers and closes without reading the body resets the connection,
/// and the client sees an error instead of the answer.
async fn send_big(addr: std::net::SocketAddr, head: &str, size: usize) -> Result<String, String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("writing the head: {e}"))?;
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    while sent < size {
        let n = chunk.len().min(size - sent);
        conn.write_all(&chunk[..n])
            .await
            .map_err(|e| format!("writing the body after {sent} bytes: {e}"))?;
        sent += n;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n")
                    && String::from_utf8_lossy(&answer).contains("\"error\"")
                {
                    break;
                }
            }
            Ok(Err(e)) => return Err(format!("reading the answer: {e}")),
            Err(_) => break,
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A stranger's 8 MB request is refused from its headers (401), and the stranger can
/// read the refusal: the gateway drains the body instead of resetting the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_is_read_can_be_read() {
    let gw = common::start(docs).await;
    let size = 8 * 1024 * 1024;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer not-a-key\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    );
    let answer = send_big(gw.addr, &head, size).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("unauthorized"), "{answer}");
}

/// A body over the limit (declared or not) gets its 413, readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_a_readable_413() {
    let gw = common::start_tuned(docs, None, |o| o.body_limit = 1024 * 1024).await;
    let size = 8 * 1024 * 1024;
    let declared = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    );
    let answer = send_big(gw.addr, &declared, size).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert_eq!(gw.vendors.calls("p"), 0);
}
