//! The stack both floors stand on (`proxy_floor.rs`, `design_floor.rs`): purser's
//! runtime shape, its upstream client's settings, and a body handed to the vendor and
//! its answer handed back with nothing else done.

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The mock upstream's chat endpoint and the client that calls it.
#[derive(Clone)]
pub struct Upstream {
    client: reqwest::Client,
    url: String,
}

impl Upstream {
    /// `UPSTREAM_BASE` from the environment (the harness exports it).
    pub fn from_env() -> Result<Upstream, Box<dyn std::error::Error>> {
        let base = std::env::var("UPSTREAM_BASE")?;
        Ok(Upstream {
            // As purser's (`upstream::http_client`): no redirects, and every connection
            // kept idle for reqwest's 90 seconds, so a wave of calls finds its own again.
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
            url: format!("{base}/chat/completions"),
        })
    }

    /// Send `body`; the answer's status and body, or the 502 to give the client.
    pub async fn call(&self, body: Bytes) -> Result<(StatusCode, Bytes), Response> {
        let sent = self
            .client
            .post(&self.url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        let answer = sent.map_err(bad_gateway)?;
        let status = answer.status();
        let bytes = answer.bytes().await.map_err(bad_gateway)?;
        Ok((status, bytes))
    }
}

fn bad_gateway(e: reqwest::Error) -> Response {
    (StatusCode::BAD_GATEWAY, e.to_string()).into_response()
}

/// The vendor's answer, handed back.
pub fn answer(status: StatusCode, bytes: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// Serve `app` on `listen` on the runtime `purser serve` picks on a 2-core machine: one
/// request thread. Connections share the router, as `purser serve`'s do
/// (`into_make_service`), and wait to be accepted in a queue as deep as its default
/// (`purser::http::listener`; tokio's `bind` asks for 128 and drops a c=1024 burst's
/// SYNs beyond it).
pub fn serve(listen: &str, app: Router) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener =
            purser::http::listener(listen.parse()?, purser::http::DEFAULT_MAX_IN_FLIGHT)?;
        axum::serve(listener, app.into_make_service()).await?;
        Ok(())
    })
}
