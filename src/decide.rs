//! The decision after a failed attempt: one exhaustive function of the class and an
//! explicit context. It says what to do and why; the why goes to the ledger and to
//! the client's error.
#![deny(clippy::wildcard_enum_match_arm)]

use serde::Serialize;

use crate::failure::{Billing, FailureClass};
use crate::policy::plan::Mode;

/// Whether the period budgets hold the alternate's worst case (plus what the attempts
/// so far may have cost). Learning it means reserving it: the chain asks the ledger for
/// the top-up only when `awaits_budget` says the answer decides, then decides again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetRoom {
    /// Not asked. `decide` stops rather than fail over on a budget nobody checked.
    Unasked,
    /// The top-up is reserved in every period budget.
    Reserved,
    /// A period budget cannot hold it; nothing was reserved.
    Exhausted,
}

/// The state of the policy's alternate for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlternateState {
    /// The policy names no alternate for this model.
    None,
    /// Named, and not yet used.
    Available {
        /// Same `base_url` and credential as the destination that just failed.
        same_upstream: bool,
        fits_ceiling: bool,
        /// The alternate's API can carry every field of the request
        /// (`upstream::fields::check`): purser drops nothing silently.
        carries_fields: bool,
        budget: BudgetRoom,
    },
    /// The failed attempt was already on the alternate: a request reaches at most two
    /// destinations.
    AlreadyUsed,
}

impl AlternateState {
    /// The same state with the budget's answer in.
    pub fn with_budget(self, room: BudgetRoom) -> AlternateState {
        match self {
            AlternateState::Available {
                same_upstream,
                fits_ceiling,
                carries_fields,
                budget: _,
            } => AlternateState::Available {
                same_upstream,
                fits_ceiling,
                carries_fields,
                budget: room,
            },
            AlternateState::None | AlternateState::AlreadyUsed => self,
        }
    }
}

/// Everything the decision depends on besides the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Context {
    pub mode: Mode,
    /// Billing of every attempt before the one that just failed, worst first.
    pub earlier_billing: Billing,
    /// Billing of the attempt that just failed: its class's, raised to at least
    /// `maybe_billed` once the vendor started (a 2xx, a streamed byte of output), and
    /// `billed` when its usage was found (DESIGN 5, "Billable once started").
    pub billing: Billing,
    pub alternate: AlternateState,
    /// The credential source now yields a different secret than the one just used.
    pub credential_changed: bool,
    /// This destination was already retried once with a re-read credential.
    pub already_retried: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Client-side class: return the upstream's error, make no further call.
    Refuse,
    /// Rotated key: rebuild the client and send once more to the same destination.
    RetrySame,
    /// Send to the alternate.
    FailOver,
    /// Provider-side class, but failover is not allowed: the request fails.
    Stop,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Refuse => "refuse",
            Action::RetrySame => "retry",
            Action::FailOver => "failover",
            Action::Stop => "stop",
        }
    }
}

/// Why the decision was taken; rendered into the ledger's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    ClientSideClass,
    CredentialRotated,
    CredentialUnchanged,
    /// The credential rotated, but the failed call may have been billed: sending it
    /// again would make a second potentially billable call on the same reservation.
    RetryMayBillTwice,
    AlreadyRetried,
    NoAlternate,
    AlternateAlreadyUsed,
    SameUpstream,
    HardCeilingMaybeBilled,
    AlternateOverCeiling,
    /// The decision was to fail over, but the alternate's worst case (plus what the
    /// failed attempt may have cost) does not fit what is left of a period budget.
    AlternateOverBudget,
    /// The decision was to fail over, but the alternate's API cannot carry a field of
    /// the request (purser drops nothing silently).
    AlternateRefusesFields,
    /// Failing over needs the alternate's worst case reserved, and it was not asked
    /// for (a chain that skipped `awaits_budget` fails closed).
    BudgetUnasked,
    ProviderSideClass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub action: Action,
    pub why: Why,
    pub class: FailureClass,
}

impl Decision {
    /// A sentence for the ledger and the client's error.
    pub fn reason(&self) -> String {
        let c = self.class;
        match self.why {
            Why::ClientSideClass => format!("{c} is not the provider's fault: any other vendor would answer the same, so no further call is made"),
            Why::CredentialRotated => "auth failed and the credential source now yields a different key: retrying once with it".into(),
            Why::CredentialUnchanged => "auth failed and the credential is unchanged: no further call is made".into(),
            Why::RetryMayBillTwice => "auth failed after an answer that may have been billed: a retry would bill twice on one reservation, so no further call is made".into(),
            Why::AlreadyRetried => format!("{c} after retrying with the rotated credential: no further call is made"),
            Why::NoAlternate => format!("{c} is provider-side, but the policy names no alternate for this model"),
            Why::AlternateAlreadyUsed => format!("{c} on the alternate: a request reaches at most two destinations"),
            Why::SameUpstream => format!("{c}: the alternate is the same upstream as the destination that failed, so calling it is skipped"),
            Why::HardCeilingMaybeBilled => format!("{c} may have been billed: under a hard ceiling a request makes at most one potentially billable attempt"),
            Why::AlternateOverCeiling => format!("{c}: the alternate's worst case does not fit the ceiling"),
            Why::AlternateOverBudget => format!("{c} is provider-side, but the alternate's worst case does not fit what is left of the period budget: no further call is made"),
            Why::AlternateRefusesFields => format!("{c} is provider-side, but the alternate's API cannot carry a field of this request: no further call is made"),
            Why::BudgetUnasked => format!("{c} is provider-side, but the alternate's worst case was not reserved in the budget: no further call is made"),
            Why::ProviderSideClass => format!("{c} is provider-side: failing over to the alternate"),
        }
    }
}

fn d(action: Action, why: Why, class: FailureClass) -> Decision {
    Decision { action, why, class }
}

/// What to do after an attempt failed with `class` (DESIGN 5).
pub fn decide(class: FailureClass, ctx: &Context) -> Decision {
    match class {
        FailureClass::Auth => {
            if ctx.already_retried {
                d(Action::Refuse, Why::AlreadyRetried, class)
            } else if ctx.billing != Billing::NotBilled {
                // A 2xx auth error (a relay's): the call may have been billed, and the
                // retry's worst case has no reservation of its own.
                d(Action::Refuse, Why::RetryMayBillTwice, class)
            } else if ctx.credential_changed {
                d(Action::RetrySame, Why::CredentialRotated, class)
            } else {
                d(Action::Refuse, Why::CredentialUnchanged, class)
            }
        }
        FailureClass::ModelNotFound
        | FailureClass::ContextLength
        | FailureClass::ContentRefusal
        | FailureClass::Malformed => d(Action::Refuse, Why::ClientSideClass, class),
        FailureClass::RateLimited
        | FailureClass::Overloaded
        | FailureClass::ServerError
        | FailureClass::Connect
        | FailureClass::CircuitOpen
        | FailureClass::Timeout
        | FailureClass::Dropped
        | FailureClass::Unclassified => fail_over_or_stop(class, ctx),
    }
}

fn fail_over_or_stop(class: FailureClass, ctx: &Context) -> Decision {
    let (same_upstream, fits, carries, budget) = match ctx.alternate {
        AlternateState::None => return d(Action::Stop, Why::NoAlternate, class),
        AlternateState::AlreadyUsed => return d(Action::Stop, Why::AlternateAlreadyUsed, class),
        AlternateState::Available {
            same_upstream,
            fits_ceiling,
            carries_fields,
            budget,
        } => (same_upstream, fits_ceiling, carries_fields, budget),
    };
    if same_upstream {
        return d(Action::Stop, Why::SameUpstream, class);
    }
    let billed_so_far = ctx.earlier_billing.max(ctx.billing);
    match ctx.mode {
        Mode::Hard if billed_so_far != Billing::NotBilled => {
            return d(Action::Stop, Why::HardCeilingMaybeBilled, class);
        }
        Mode::Hard | Mode::Soft => {}
    }
    if !fits {
        return d(Action::Stop, Why::AlternateOverCeiling, class);
    }
    if !carries {
        return d(Action::Stop, Why::AlternateRefusesFields, class);
    }
    match budget {
        BudgetRoom::Reserved => d(Action::FailOver, Why::ProviderSideClass, class),
        BudgetRoom::Exhausted => d(Action::Stop, Why::AlternateOverBudget, class),
        BudgetRoom::Unasked => d(Action::Stop, Why::BudgetUnasked, class),
    }
}

/// Whether the decision now turns on the budget alone: the alternate's budget is not
/// asked yet, and with it reserved `decide` would fail over. The chain reserves the
/// top-up only then (a reservation is a ledger write), and decides again with the
/// answer as `BudgetRoom`.
pub fn awaits_budget(class: FailureClass, ctx: &Context) -> bool {
    match ctx.alternate {
        AlternateState::Available {
            budget: BudgetRoom::Unasked,
            ..
        } => {
            let reserved = Context {
                alternate: ctx.alternate.with_budget(BudgetRoom::Reserved),
                ..*ctx
            };
            decide(class, &reserved).action == Action::FailOver
        }
        AlternateState::Available {
            budget: BudgetRoom::Reserved | BudgetRoom::Exhausted,
            ..
        }
        | AlternateState::None
        | AlternateState::AlreadyUsed => false,
    }
}

/// Whether `class` would reach the alternate under `mode`, assuming it is configured,
/// distinct, fits, can carry the request, its budget holds, and nothing before was
/// billed nor anything started (`purser classify`, `explain`).
pub fn fails_over(class: FailureClass, mode: Mode) -> bool {
    let ctx = Context {
        mode,
        earlier_billing: Billing::NotBilled,
        billing: class.billing(),
        alternate: AlternateState::Available {
            same_upstream: false,
            fits_ceiling: true,
            carries_fields: true,
            budget: BudgetRoom::Reserved,
        },
        credential_changed: false,
        already_retried: false,
    };
    decide(class, &ctx).action == Action::FailOver
}
