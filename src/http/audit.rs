//! `/audit/v1/*`: read-only, admin-token only. Handlers parse the query with
//! `crate::audit`, ask the ledger (whichever engine it is on), and shape the answer.

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use crate::audit::{self, AuditError};
use crate::ledger::audit as q;

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

pub async fn requests(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let query = audit::requests_query(&pairs(params)?)?;
    let page = state
        .engine
        .ledger
        .requests(query.filter, query.limit, query.cursor)
        .await
        .map_err(|e| Refusal::Audit(e.into()))?;
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
    let row = state
        .engine
        .ledger
        .request(&id)
        .await
        .map_err(|e| Refusal::Audit(e.into()))?
        .ok_or(Refusal::Audit(AuditError::NotFound(id)))?;
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
    let rows = state
        .engine
        .ledger
        .spend(query.filter, query.group_by)
        .await
        .map_err(|e| Refusal::Audit(e.into()))?;
    Ok(axum::Json(json!({
        "group_by": group_by.as_str(),
        "since": since,
        "until": until,
        "currency": state.engine.plan().currency(),
        "rows": rows,
    }))
    .into_response())
}

/// `GET /audit/v1/spend/series`: spend per time bucket, stacked by a grouping.
pub async fn series(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let query = audit::series_query(&pairs(params)?)?;
    let (since, until) = (
        query.filter.since.as_ref().map(|i| i.text.clone()),
        query.filter.until.as_ref().map(|i| i.text.clone()),
    );
    let rows = state
        .engine
        .ledger
        .series(query.filter, query.bucket, query.group_by)
        .await
        .map_err(|e| Refusal::Audit(e.into()))?;
    Ok(axum::Json(json!({
        "bucket": query.bucket.as_str(),
        "group_by": query.group_by.as_str(),
        "since": since,
        "until": until,
        "currency": state.engine.plan().currency(),
        "rows": rows,
    }))
    .into_response())
}

/// `GET /audit/v1/failures`: attempts per provider and class, and request outcomes.
pub async fn failures(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let filter = audit::attempts_query(&pairs(params)?)?;
    let f = state
        .engine
        .ledger
        .failures(filter)
        .await
        .map_err(|e| Refusal::Audit(e.into()))?;
    Ok(axum::Json(f).into_response())
}

pub async fn budgets(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let rows = state
        .engine
        .current_budgets()
        .await
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
    csv_response(&state, filter, CsvKind::Attempts).await
}

/// `GET /audit/v1/focus.csv`: billed and maybe-billed attempts as FOCUS 1.2 rows.
pub async fn focus_csv(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Params,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let filter = audit::attempts_query(&pairs(params)?)?;
    csv_response(&state, filter, CsvKind::Focus).await
}

/// Which CSV an attempt stream is written as.
#[derive(Clone, Copy)]
enum CsvKind {
    Attempts,
    Focus,
}

impl CsvKind {
    fn header(self) -> &'static [&'static str] {
        match self {
            CsvKind::Attempts => &audit::CSV_HEADER,
            CsvKind::Focus => &audit::focus::HEADER,
        }
    }

    fn filename(self) -> &'static str {
        match self {
            CsvKind::Attempts => "attachment; filename=\"attempts.csv\"",
            CsvKind::Focus => "attachment; filename=\"focus-1.2.csv\"",
        }
    }

    /// The line's cells, or `None` when this CSV leaves the line out.
    fn record(self, line: &q::AttemptLine, currency: &str) -> Option<Vec<String>> {
        match self {
            CsvKind::Attempts => Some(audit::csv_record(line, currency)),
            CsvKind::Focus => audit::focus::record(line, currency),
        }
    }
}

async fn csv_response(
    state: &AppState,
    filter: q::Filter,
    kind: CsvKind,
) -> Result<Response, Refusal> {
    let mut lines = state.engine.ledger.attempt_lines(filter);
    // Wait for the first line before answering, so a broken ledger is a 503, not a
    // cut stream.
    let first = match lines.recv().await {
        Some(Err(e)) => return Err(Refusal::Audit(e.into())),
        first => first,
    };
    let csv = Csv {
        lines,
        first,
        currency: state.engine.plan().currency().to_string(),
        header: true,
        done: false,
        kind,
    };
    let stream = futures_util::stream::unfold(csv, |mut csv| async move {
        csv.next_chunk().await.map(|chunk| (chunk, csv))
    });
    Ok((
        [
            ("content-type", "text/csv; charset=utf-8"),
            ("content-disposition", kind.filename()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The CSV body: attempt lines as the ledger yields them, in chunks of about
/// `CSV_BATCH` bytes. A client that goes away drops the body, and with it the
/// receiver, which stops the query.
struct Csv {
    lines: tokio::sync::mpsc::Receiver<Result<q::AttemptLine, crate::ledger::LedgerError>>,
    first: Option<Result<q::AttemptLine, crate::ledger::LedgerError>>,
    currency: String,
    header: bool,
    done: bool,
    kind: CsvKind,
}

impl Csv {
    async fn next_chunk(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        let mut w = csv::Writer::from_writer(Vec::with_capacity(CSV_BATCH + 1024));
        if std::mem::take(&mut self.header) {
            w.write_record(self.kind.header()).ok()?;
        }
        loop {
            let next = match self.first.take() {
                Some(line) => Some(line),
                None => self.lines.recv().await,
            };
            match next {
                Some(Ok(line)) => {
                    let Some(record) = self.kind.record(&line, &self.currency) else {
                        continue;
                    };
                    if let Err(e) = w.write_record(record) {
                        self.done = true;
                        return Some(Err(std::io::Error::other(e)));
                    }
                    if w.get_ref().len() >= CSV_BATCH {
                        break;
                    }
                }
                // Headers are already sent; cutting the body is the only honest signal left.
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(std::io::Error::other(e.to_string())));
                }
                None => {
                    self.done = true;
                    break;
                }
            }
        }
        match w.into_inner() {
            Ok(bytes) if bytes.is_empty() => None,
            Ok(bytes) => Some(Ok(Bytes::from(bytes))),
            Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
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
