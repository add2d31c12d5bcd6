//! The client APIs purser answers (DESIGN 6), and the one place an error becomes what
//! a client of each reads: [`ApiError`] renders a refusal or a failure as the OpenAI
//! envelope (chat completions), Anthropic's `{"type":"error",…}` (Messages) or the
//! Responses API's error, as a body and as a stream error event.
//!
//! Statuses are chosen by what the clients do with them, not only by what the words
//! mean: Claude Code retries 401 (with backoff, for minutes), 429 and 5xx, and on a 400
//! drops its betas one at a time and tries again; Codex retries 5xx, 429, 401 and 404,
//! and never a 400. A refusal that will not change (a spent budget, a ceiling, the
//! policy) must end the run at once with purser's reason, so it never uses a status
//! either client retries.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::failure::FailureClass;
use crate::gateway::{AttemptReport, GatewayError};

/// Which client API a request came in by; the ledger records it per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ingress {
    /// OpenAI chat completions, `POST /v1/chat/completions`. Rows written before the
    /// ledger recorded the ingress are chat: it was the only one.
    #[default]
    Chat,
    /// Anthropic Messages, `POST /v1/messages`.
    Messages,
    /// OpenAI Responses, `POST /v1/responses`.
    Responses,
}

impl Ingress {
    pub const ALL: [Ingress; 3] = [Ingress::Chat, Ingress::Messages, Ingress::Responses];

    pub fn as_str(self) -> &'static str {
        match self {
            Ingress::Chat => "chat",
            Ingress::Messages => "messages",
            Ingress::Responses => "responses",
        }
    }

    pub fn parse(s: &str) -> Option<Ingress> {
        Ingress::ALL.into_iter().find(|i| i.as_str() == s)
    }
}

impl std::fmt::Display for Ingress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as one ingress answers it: status, body and stream event.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub ingress: Ingress,
    pub status: u16,
    /// purser's code (DESIGN 6): a gateway refusal or the failure class.
    pub code: String,
    /// The OpenAI envelope's `type`.
    openai_type: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub provider: Option<String>,
    pub request_id: Option<String>,
    pub attempts: Vec<AttemptReport>,
}

impl ApiError {
    /// A gateway error as `ingress` answers it.
    pub fn new(ingress: Ingress, e: &GatewayError, request_id: Option<&str>) -> ApiError {
        let (provider, attempts) = match e {
            GatewayError::Upstream {
                provider, attempts, ..
            } => (Some(provider.clone()), attempts.clone()),
            GatewayError::Unauthorized
            | GatewayError::InvalidRequest { .. }
            | GatewayError::ModelNotAllowed { .. }
            | GatewayError::NoDestination { .. }
            | GatewayError::CeilingExceeded(_)
            | GatewayError::BudgetExhausted(_)
            | GatewayError::LedgerUnavailable { .. }
            | GatewayError::Internal(_) => (None, Vec::new()),
        };
        ApiError {
            ingress,
            status: status_of(ingress, e),
            code: e.code().to_string(),
            openai_type: openai_type(e),
            message: e.to_string(),
            param: e.param().map(str::to_string),
            provider,
            request_id: request_id.map(str::to_string),
            attempts,
        }
    }

    /// A refusal of the HTTP edge itself (no engine call: body too large, at the
    /// in-flight limit, an unknown model id), with the status it has in every ingress.
    pub fn edge(
        ingress: Ingress,
        status: u16,
        code: &str,
        openai_type: &'static str,
        message: impl Into<String>,
        param: Option<&str>,
    ) -> ApiError {
        ApiError {
            ingress,
            status,
            code: code.to_string(),
            openai_type,
            message: message.into(),
            param: param.map(str::to_string),
            provider: None,
            request_id: None,
            attempts: Vec::new(),
        }
    }

    /// A stream that failed after content had reached the client.
    pub fn stream_cut(
        ingress: Ingress,
        class: FailureClass,
        provider: &str,
        request_id: &str,
        message: String,
    ) -> ApiError {
        ApiError {
            ingress,
            // The status the same failure has as a plain answer: it names the error's
            // type (Anthropic's `overloaded_error`, `api_error`) in the event.
            status: upstream_status(class, None),
            code: class.as_str().to_string(),
            openai_type: "upstream_error",
            message,
            param: None,
            provider: Some(provider.to_string()),
            request_id: Some(request_id.to_string()),
            attempts: Vec::new(),
        }
    }

    /// What the user reads: purser's own words, marked as purser's, for the clients
    /// that show only the message (Claude Code, Codex).
    fn said(&self) -> String {
        format!("purser ({}): {}", self.code, self.message)
    }

    /// The error body.
    pub fn body(&self) -> Value {
        match self.ingress {
            Ingress::Chat => json!({"error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
                "provider": self.provider,
                "request_id": self.request_id,
                "attempts": self.attempts,
            }}),
            Ingress::Responses => json!({"error": {
                "message": self.said(),
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
                "provider": self.provider,
                "request_id": self.request_id,
                "attempts": self.attempts,
            }}),
            Ingress::Messages => json!({
                "type": "error",
                "error": {"type": anthropic_type(self.status), "message": self.said()},
                "request_id": self.request_id,
            }),
        }
    }

    /// The error as one server-sent event of the ingress's stream format.
    pub fn stream_event(&self) -> Bytes {
        match self.ingress {
            Ingress::Chat => Bytes::from(format!("data: {}\n\n", self.body())),
            Ingress::Messages => Bytes::from(format!("event: error\ndata: {}\n\n", self.body())),
            Ingress::Responses => {
                let v = json!({
                    "type": "error",
                    "code": self.code,
                    "message": self.said(),
                    "param": self.param,
                });
                Bytes::from(format!("event: error\ndata: {v}\n\n"))
            }
        }
    }
}

/// Anthropic's error type for a status, as its SDKs map them.
pub fn anthropic_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

fn openai_type(e: &GatewayError) -> &'static str {
    match e {
        GatewayError::Unauthorized => "authentication_error",
        GatewayError::InvalidRequest { .. }
        | GatewayError::ModelNotAllowed { .. }
        | GatewayError::NoDestination { .. } => "invalid_request_error",
        GatewayError::CeilingExceeded(_) | GatewayError::BudgetExhausted(_) => "budget_error",
        GatewayError::LedgerUnavailable { .. } | GatewayError::Internal(_) => "server_error",
        GatewayError::Upstream { .. } => "upstream_error",
    }
}

/// The status `ingress` answers `e` with. Chat keeps DESIGN 6's codes. Messages: a
/// destination the policy cannot give is a permission (403), not a 400 Claude Code
/// would retry with fewer betas. Responses: budget and ceiling are 400, the one status
/// Codex never retries.
pub fn status_of(ingress: Ingress, e: &GatewayError) -> u16 {
    match (ingress, e) {
        (_, GatewayError::Unauthorized) => 401,
        (_, GatewayError::InvalidRequest { .. }) => 400,
        (Ingress::Chat | Ingress::Responses, GatewayError::NoDestination { .. }) => 400,
        (Ingress::Messages, GatewayError::NoDestination { .. }) => 403,
        (_, GatewayError::ModelNotAllowed { .. }) => 403,
        (
            Ingress::Chat | Ingress::Messages,
            GatewayError::CeilingExceeded(_) | GatewayError::BudgetExhausted(_),
        ) => 402,
        (
            Ingress::Responses,
            GatewayError::CeilingExceeded(_) | GatewayError::BudgetExhausted(_),
        ) => 400,
        (_, GatewayError::LedgerUnavailable { .. }) => 503,
        (_, GatewayError::Internal(_)) => 500,
        (_, GatewayError::Upstream { class, status, .. }) => upstream_status(*class, *status),
    }
}

fn upstream_status(class: FailureClass, status: Option<u16>) -> u16 {
    use FailureClass as C;
    match class {
        // No upstream answered: purser itself has no usable credential for the
        // provider. The client's key is fine, so this is not a 401.
        C::Auth if status.is_none() => 502,
        // Client-side classes keep the upstream's own status so SDKs raise the same error.
        C::Auth
        | C::ModelNotFound
        | C::ContextLength
        | C::ContentRefusal
        | C::Malformed
        | C::RateLimited => status
            .filter(|s| (300..600).contains(s))
            .unwrap_or(match class {
                C::RateLimited => 429,
                C::Auth => 401,
                C::ModelNotFound => 404,
                C::ContextLength | C::ContentRefusal | C::Malformed => 400,
                // Not reached: the arm above takes only the classes listed there.
                C::Timeout
                | C::Overloaded
                | C::CircuitOpen
                | C::Connect
                | C::Dropped
                | C::ServerError
                | C::Unclassified => 502,
            }),
        C::Timeout => 504,
        C::Overloaded | C::CircuitOpen => 503,
        C::Connect | C::Dropped | C::ServerError | C::Unclassified => 502,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_is_not_a_status_either_agent_retries() {
        let e = GatewayError::BudgetExhausted("budget `monthly` of policy `p` is spent".into());
        for ingress in Ingress::ALL {
            let a = ApiError::new(ingress, &e, Some("r1"));
            assert!(
                ![401, 408, 409, 429].contains(&a.status) && a.status < 500,
                "{ingress}: {}",
                a.status
            );
            assert!(a.body().to_string().contains("is spent"));
        }
        let m = ApiError::new(Ingress::Messages, &e, Some("r1"));
        assert_eq!(m.body()["type"], "error");
        assert_eq!(m.body()["error"]["type"], "billing_error");
        assert!(
            m.body()["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("purser (budget_exhausted)")
        );
        let ev = String::from_utf8(m.stream_event().to_vec()).unwrap();
        assert!(ev.starts_with("event: error\ndata: {"), "{ev}");
    }

    #[test]
    fn ingress_names_round_trip() {
        for i in Ingress::ALL {
            assert_eq!(Ingress::parse(i.as_str()), Some(i));
        }
        assert_eq!(Ingress::parse("grpc"), None);
    }
}
