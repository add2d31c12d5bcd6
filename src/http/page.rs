//! `GET /audit/`: the spend page for finance, served from the binary. Its assets are
//! embedded at compile time (`include_str!`/`include_bytes!`): no separate server and
//! no build step. The page holds no data of its own; it asks for the admin token and
//! calls the audit API with it, so it needs no authorization to be served.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// No inline script or style, nothing from elsewhere: even text that slipped into
/// markup could not run. Chart.js sets styles through the CSSOM, which this allows.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Every embedded asset: name under `/audit/assets/`, content type, bytes.
const ASSETS: [(&str, &str, &[u8]); 4] = [
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/audit/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../assets/audit/app.css"),
    ),
    // Chart.js 4.6.1, the registry's minified UMD build, unmodified (MIT; its license
    // is served beside it).
    (
        "chart-4.6.1.umd.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/audit/chart-4.6.1.umd.min.js"),
    ),
    (
        "chart.js-LICENSE.md",
        "text/plain; charset=utf-8",
        include_bytes!("../../assets/audit/chart.js-LICENSE.md"),
    ),
];

const INDEX: &str = include_str!("../../assets/audit/index.html");

fn headers(content_type: &'static str) -> [(header::HeaderName, &'static str); 5] {
    [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-cache"),
    ]
}

pub async fn index() -> Response {
    (headers("text/html; charset=utf-8"), INDEX).into_response()
}

pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => (headers(content_type), *bytes).into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// `/audit` → `/audit/`: the page's asset paths are relative to the directory.
pub async fn to_index() -> Response {
    axum::response::Redirect::permanent("/audit/").into_response()
}
