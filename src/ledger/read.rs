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
    pub cost: String,
    pub worst_case: String,
    /// How `cost` was reached: `usage`, `worst_case` or `estimated`; null when the
    /// attempt had no answer to price.
    pub cost_basis: Option<String>,
    pub message: Option<String>,
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
