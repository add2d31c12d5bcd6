//! Ledger rows written straight to a `Ledger`, for tests of the books themselves
//! (budget windows, holders): one request, its attempts and its ending, with the
//! fields those tests do not vary fixed.

use purser::decide::Action;
use purser::failure::{Billing, FailureClass};
use purser::ledger::{
    AttemptResult, BudgetLimit, Decision, NewAttempt, NewRequest, Outcome, RequestResult,
};
use purser::money::Money;
use purser::policy::plan::{Mode, Period};

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

/// A soft request of policy `team`, received now, worst case `worst`.
pub fn new_request(id: &str, worst: &str) -> NewRequest {
    NewRequest {
        id: id.into(),
        received_at: time::OffsetDateTime::now_utc(),
        client: "bot".into(),
        policy: "team".into(),
        plan_id: "p1".into(),
        model: "m".into(),
        mode: Mode::Soft,
        ceiling: m("1"),
        worst_case: m(worst),
        ingress: Default::default(),
        shape: None,
    }
}

/// Attempt `seq` of request `id` to provider `p`, started now.
pub fn attempt(id: &str, seq: u32, worst: &str) -> NewAttempt {
    NewAttempt {
        request_id: id.into(),
        seq,
        provider: "p".into(),
        upstream_model: "m".into(),
        jurisdiction: "us".into(),
        started_at: time::OffsetDateTime::now_utc(),
        worst_case: m(worst),
    }
}

/// Attempt `seq` ended: served (200) when billed, else a timeout (504) that fails over.
pub fn ended(id: &str, seq: u32, billing: Billing, cost: &str) -> AttemptResult {
    let served = matches!(billing, Billing::Billed);
    AttemptResult {
        request_id: id.into(),
        seq,
        finished_at: time::OffsetDateTime::now_utc(),
        status: Some(if served { 200 } else { 504 }),
        class: (!served).then_some(FailureClass::Timeout),
        billing,
        decision: if served {
            Decision::Served
        } else {
            Decision::After(Action::FailOver)
        },
        reason: "test".into(),
        input_tokens: None,
        output_tokens: None,
        cost: m(cost),
        cost_basis: None,
        message: None,
        cache: Default::default(),
        stored: None,
    }
}

/// Request `id` ended with `outcome`, costing `cost` and charged `charged`.
pub fn closed(id: &str, outcome: Outcome, cost: &str, charged: &str) -> RequestResult {
    RequestResult {
        request_id: id.into(),
        outcome,
        error_code: None,
        served_by: None,
        cost: m(cost),
        charged: m(charged),
    }
}

/// A day budget of `limit`.
pub fn day_limit(limit: &str) -> Vec<BudgetLimit> {
    vec![BudgetLimit {
        period: Period::Day,
        limit: m(limit),
    }]
}
