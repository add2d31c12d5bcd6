//! The rows the audit API and the CLI show, as both engines answer them (times as
//! RFC 3339 text, money as exact decimal text).

use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AttemptRow {
    pub seq: u32,
    pub provider: String,
    pub upstream_model: String,
    pub jurisdiction: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub state: String,
    pub status: Option<u16>,
    pub class: Option<String>,
    pub billing: String,
    pub decision: Option<String>,
    pub reason: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    /// Of `input_tokens`, read from the vendor's prompt cache; null when not reported.
    pub cache_read_tokens: Option<i64>,
    /// Of `input_tokens`, written to the vendor's prompt cache; null when not reported.
    pub cache_write_tokens: Option<i64>,
    /// Of `cache_write_tokens`, to the 5-minute and the 1-hour cache; null where the
    /// vendor did not split writes by lifetime.
    pub cache_write_5m_tokens: Option<i64>,
    pub cache_write_1h_tokens: Option<i64>,
    pub cost: String,
    pub worst_case: String,
    /// How `cost` was reached: `usage`, `worst_case` or `estimated`; null when the
    /// attempt had no answer to price.
    pub cost_basis: Option<String>,
    pub message: Option<String>,
    /// The vendor's id of the response it stored (Responses API), which a later turn
    /// may continue from; null for every other attempt.
    pub response_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequestRow {
    pub id: String,
    pub received_at: String,
    pub client: String,
    pub policy: String,
    pub plan_id: String,
    pub model: String,
    pub mode: String,
    pub ceiling: String,
    pub worst_case: String,
    pub outcome: String,
    pub error_code: Option<String>,
    pub served_by: Option<String>,
    pub cost: String,
    /// The client API it came in by (`chat`, `messages`, `responses`).
    pub ingress: String,
    pub attempts: Vec<AttemptRow>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BudgetRow {
    pub policy: String,
    pub period: String,
    pub window_start: String,
    pub limit: String,
    pub spent: String,
    pub reserved: String,
}

/// SQLite file inspection for tests and tools; code outside the ledger reads through
/// `Ledger`'s methods.
pub use super::sqlite::read::{budgets, open_reader, request, total_cost};
