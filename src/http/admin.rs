//! `/admin/v1/*`: the active plan and hot reload, behind the admin token.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::audit::{Refusal, authorize};
use crate::reload::ReloadError;

pub async fn plan(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let plan = state.engine.plan();
    Ok(axum::Json(json!({"plan_id": plan.id(), "plan": plan.to_json()})).into_response())
}

pub async fn reload(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    authorize(&state, &headers)?;
    let Some(reloader) = &state.reloader else {
        return Ok((
            StatusCode::NOT_IMPLEMENTED,
            axum::Json(
                json!({"error": {"code": "reload_unavailable", "type": "admin_error",
                "message": "this gateway was not started from a policy directory"}}),
            ),
        )
            .into_response());
    };
    match reloader.reload().await {
        Ok(done) => {
            tracing::info!(plan_id = %done.plan_id, previous = %done.previous_plan_id, changed = done.changed, "plan reloaded");
            Ok(axum::Json(done).into_response())
        }
        Err(e) => {
            tracing::error!(error = %e, "reload refused; the running plan keeps serving");
            let (status, diagnostics) = match &e {
                ReloadError::DoesNotCompile { diagnostics, .. } => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    diagnostics
                        .0
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>(),
                ),
                ReloadError::CurrencyChanged { .. } => {
                    (StatusCode::UNPROCESSABLE_ENTITY, vec![e.to_string()])
                }
                ReloadError::Interrupted(_) => (StatusCode::INTERNAL_SERVER_ERROR, vec![]),
                ReloadError::Ledger { .. } => (StatusCode::SERVICE_UNAVAILABLE, vec![]),
            };
            Ok((
                status,
                axum::Json(
                    json!({"error": {"code": "plan_invalid", "type": "admin_error",
                    "message": e.to_string(), "active_plan_id": state.engine.plan().id(),
                    "diagnostics": diagnostics}}),
                ),
            )
                .into_response())
        }
    }
}
