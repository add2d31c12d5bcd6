//! What the chosen stack costs before purser does anything: an axum server that hands
//! each request body to a reqwest client and the answer back, on the same runtime
//! shape and allocator as `purser serve`. No auth, policy, JSON or ledger.
//! `benches/gateway.sh` measures it beside purser and the nginx proxy in one run, so
//! the gap between this floor and purser is purser's own cost.
//!
//!   UPSTREAM_BASE=http://127.0.0.1:18080/v1 proxy-floor 127.0.0.1:18101

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone)]
struct Upstream {
    client: reqwest::Client,
    url: String,
}

async fn forward(State(up): State<Upstream>, body: Bytes) -> Response {
    let sent = up
        .client
        .post(&up.url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = answer.status();
    match answer.bytes().await {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::var("UPSTREAM_BASE")?;
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18101".into());
    // The runtime `purser serve` picks on a 2-core machine: one request thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let upstream = Upstream {
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            url: format!("{base}/chat/completions"),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(forward))
            .with_state(upstream);
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        // Connections share the router, as `purser serve`'s do (`into_make_service`).
        axum::serve(listener, app.into_make_service()).await?;
        Ok(())
    })
}
