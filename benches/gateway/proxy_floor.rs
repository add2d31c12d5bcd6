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
use axum::response::Response;
use axum::routing::post;

#[path = "stack.rs"]
mod stack;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn forward(State(up): State<stack::Upstream>, body: Bytes) -> Response {
    match up.call(body).await {
        Ok((status, bytes)) => stack::answer(status, bytes),
        Err(bad_gateway) => bad_gateway,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let upstream = stack::Upstream::from_env()?;
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18101".into());
    let app = Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state(upstream);
    stack::serve(&listen, app)
}
