//! The write operations, as both engines' group-commit writers receive them.

use super::{AttemptResult, BudgetLimit, NewAttempt, NewRequest, RequestResult};
use crate::money::Money;

#[derive(Debug)]
pub enum Op {
    Admit {
        req: NewRequest,
        budgets: Vec<BudgetLimit>,
        /// The first attempt, written with the admission (one commit instead of two).
        first: Option<NewAttempt>,
    },
    Refusal {
        req: NewRequest,
        error_code: String,
    },
    BeginAttempt(NewAttempt),
    FinishAttempt(AttemptResult),
    FinishRequest(RequestResult),
    /// The last attempt and its request, completed together.
    Finish(AttemptResult, RequestResult),
    Settle {
        request_id: String,
        cost: Money,
    },
    TopUp {
        request_id: String,
        extra: Money,
        /// The budgets of the request's policy in the plan running now: a reload since
        /// its admission may have lowered (or removed) one, and the stored limit is
        /// only what the last admission saw.
        limits: Vec<BudgetLimit>,
    },
    Interrupt {
        request_id: String,
        reason: String,
    },
    /// Budgets a reload adds (back): the current window of each (policy, period), if
    /// it exists, has its `spent` counted again from the ledger. A window kept while its
    /// budget was absent missed the charges of that time (nothing reserved in it then).
    ReseedWindows {
        windows: Vec<(String, crate::policy::plan::Period)>,
        at: time::OffsetDateTime,
    },
    Probe,
}

impl Op {
    /// Whether an upstream call, or an operator's word, waits on this operation being
    /// durable. Under full durability a group holding one is fsynced before any of its
    /// callers return. The others record how something ended (a call's answer, a
    /// refusal with no call): they are fsynced by the next group that needs it, or by
    /// the checkpointer within milliseconds. A power loss in between leaves the
    /// attempt `in_flight`, which restart turns into `interrupted` / `maybe_billed` at
    /// its worst case, as after a crash (DESIGN 5): never a call without its row.
    pub fn durable_before_reply(&self) -> bool {
        match self {
            Op::Admit { .. }
            | Op::BeginAttempt(_)
            | Op::TopUp { .. }
            | Op::Settle { .. }
            | Op::Interrupt { .. }
            | Op::ReseedWindows { .. }
            | Op::Probe => true,
            Op::Refusal { .. } | Op::FinishAttempt(_) | Op::FinishRequest(_) | Op::Finish(..) => {
                false
            }
        }
    }
}
