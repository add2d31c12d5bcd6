//! `/audit/v1/*`: read-only, admin-token only. Handlers parse the query with
//! `crate::audit`, run the ledger query on a blocking thread with its own read
//! connection, and shape the answer.

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use crate::audit::{self, AuditError};
use crate::ledger::audit as q;
use crate::ledger::read;

type Params = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// Why an admin request was not answered; one status and code each.
#[derive(Debug)]
pub enum Refusal {
    /// No admin token configured: the API is off.
    Disabled,
    Unauthorized,
    BadQuery(String),
    Audit(AuditError),
    Internal(String),
}

impl From<AuditError> for Refusal {
    fn from(e: AuditError) -> Self {
        Refusal::Audit(e)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            Refusal::Disabled => (
                StatusCode::FORBIDDEN,
                "audit_disabled",
                "the audit and admin APIs are off: start purser with PURSER_ADMIN_TOKEN set to enable them".to_string(),
            ),
            Refusal::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this API needs `Authorization: Bearer <PURSER_ADMIN_TOKEN>`".to_string(),
            ),
            Refusal::BadQuery(m) => (StatusCode::BAD_REQUEST, "invalid_request", m),
            Refusal::Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", m),
            Refusal::Audit(e) => {
                let (status, code) = match &e {
                    AuditError::InvalidParam { .. }
                    | AuditError::UnknownParam(..)
                    | AuditError::Repeated(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
                    AuditError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
                    AuditError::Ledger(_) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable")
                    }
                    AuditError::Output(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
                };
                (status, code, e.to_string())
            }
        };
        (
            status,
            axum::Json(json!({"error": {"message": message, "type": "admin_error", "code": code}})),
        )
            .into_response()
    }
}

/// The admin gate: off unless a token is configured; then the bearer must match it.
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), Refusal> {
    let token = state.admin.as_ref().ok_or(Refusal::Disabled)?;
    match super::bearer(headers) {
        Some(given) if token.matches(given) => Ok(()),
        _ => Err(Refusal::Unauthorized),
    }
}

fn pairs(params: Params) -> Result<Vec<(String, String)>, Refusal> {
    params
        .map(|Query(p)| p)
        .map_err(|e| Refusal::BadQuery(format!("cannot read the query string: {e}")))
}

/// Run a read on a blocking thread with a fresh read-only connection.
async fn with_reader<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&rusqlite::Connection) -> Result<T, AuditError> + Send + 'static,
) -> Result<T, Refusal> {
    let ledger = state.engine.ledger.clone();
    tokio::task::spawn_blocking(move || {
        let conn = ledger.reader()?;
        f(&conn)
    })
    .await
    .map_err(|e| Refusal::Internal(format!("audit query did not complete: {e}")))?
    .map_err(Refusal::Audit)
}

pub async fn requests(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let query = audit::requests_query(&pairs(params)?)?;
    let page = with_reader(&state, move |c| {
        Ok(q::requests(c, &query.filter, query.limit, query.cursor)?)
    })
    .await?;
    Ok(
        axum::Json(json!({"requests": page.requests, "next_cursor": page.next_cursor}))
            .into_response(),
    )
}

pub async fn request(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let row = with_reader(&state, move |c| {
        read::request(c, &id)?.ok_or(AuditError::NotFound(id))
    })
    .await?;
    Ok(axum::Json(row).into_response())
}

pub async fn spend(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let query = audit::spend_query(&pairs(params)?)?;
    let (since, until) = (
        query.filter.since.as_ref().map(|i| i.text.clone()),
        query.filter.until.as_ref().map(|i| i.text.clone()),
    );
    let group_by = query.group_by;
    let rows = with_reader(&state, move |c| {
        Ok(q::spend(c, &query.filter, query.group_by)?)
    })
    .await?;
    Ok(axum::Json(json!({
        "group_by": group_by.as_str(),
        "since": since,
        "until": until,
        "currency": state.engine.plan().currency(),
        "rows": rows,
    }))
    .into_response())
}

pub async fn budgets(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let engine = state.engine.clone();
    let rows = tokio::task::spawn_blocking(move || engine.current_budgets())
        .await
        .map_err(|e| Refusal::Internal(format!("budget query did not complete: {e}")))?
        .map_err(|e| Refusal::Audit(e.into()))?;
    let currency = state.engine.plan().currency().to_string();
    Ok(axum::Json(json!({"currency": currency, "budgets": rows})).into_response())
}

/// Rows go out as the query yields them, in batches of about this many bytes.
const CSV_BATCH: usize = 32 * 1024;

pub async fn attempts_csv(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let filter = audit::attempts_query(&pairs(params)?)?;
    // Open the reader before answering so a broken ledger is a 503, not a cut stream.
    let conn = state.engine.ledger.reader().map_err(AuditError::from)?;
    let currency = state.engine.plan().currency().to_string();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::task::spawn_blocking(move || write_csv(&conn, &filter, &currency, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        [
            ("content-type", "text/csv; charset=utf-8"),
            (
                "content-disposition",
                "attachment; filename=\"attempts.csv\"",
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

type Chunks = tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>;

/// The CSV writer's sink: batches bytes into body chunks. A closed channel (the client
/// went away) is a broken pipe, which stops the query.
struct ChunkSink {
    tx: Chunks,
    buf: Vec<u8>,
}

impl ChunkSink {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(CSV_BATCH),
        ));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl std::io::Write for ChunkSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CSV_BATCH {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

fn write_csv(conn: &rusqlite::Connection, filter: &q::Filter, currency: &str, tx: Chunks) {
    let mut w = csv::Writer::from_writer(ChunkSink {
        tx: tx.clone(),
        buf: Vec::with_capacity(CSV_BATCH),
    });
    let mut ok = w.write_record(audit::CSV_HEADER).is_ok();
    let result = q::each_attempt(conn, filter, |line| {
        ok = w.write_record(audit::csv_record(&line, currency)).is_ok();
        ok
    });
    match result {
        Ok(()) if ok => {
            let _ = w.flush();
        }
        Ok(()) => {}
        // Headers are already sent; cutting the body is the only honest signal left.
        Err(e) => {
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    }
}

/// Admin token, kept only as its SHA-256 and compared in constant time.
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl AdminToken {
    pub fn new(token: &str) -> Option<AdminToken> {
        use sha2::Digest;
        (!token.trim().is_empty())
            .then(|| AdminToken(sha2::Sha256::digest(token.as_bytes()).into()))
    }

    pub fn matches(&self, given: &str) -> bool {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        let digest: [u8; 32] = sha2::Sha256::digest(given.as_bytes()).into();
        digest.ct_eq(&self.0).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}
