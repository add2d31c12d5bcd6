//! What an answered attempt cost: the vendor's usage figures priced at the
//! destination's rates, with any figure the vendor did not report charged at its bound.
//!
//! The one place where usage becomes money, so a plain answer, a stream's tail and a
//! cut stream are all charged by the same rule.

use serde::Serialize;

use crate::money::Money;
use crate::policy::plan::Destination;
use crate::selection::TokenBounds;
use crate::upstream::Usage;

/// How an attempt's cost was reached (the ledger's `cost_basis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CostBasis {
    /// Every billed figure came from the vendor's usage.
    Usage,
    /// Usage was missing or partial: the missing part is charged at its bound.
    WorstCase,
    /// A token class the price table has no rate for was priced conservatively.
    Estimated,
}

impl CostBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            CostBasis::Usage => "usage",
            CostBasis::WorstCase => "worst_case",
            CostBasis::Estimated => "estimated",
        }
    }
}

/// The priced attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub cost: Money,
    pub basis: CostBasis,
    /// Input tokens as the ledger records them (None: the vendor reported none).
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// Price a success (or the part of a stream that was delivered) from its usage; a
/// figure the vendor did not report is charged at its bound.
pub fn charge(dest: &Destination, usage: &Usage, bounds: TokenBounds) -> Charge {
    let reported = |n: u64| (n > 0).then_some(n);
    let input = reported(usage.prompt_tokens);
    let output = reported(usage.completion_tokens);
    let basis = if input.is_none() || output.is_none() {
        CostBasis::WorstCase
    } else {
        CostBasis::Usage
    };
    Charge {
        cost: dest.cost(
            input.unwrap_or(bounds.input),
            output.unwrap_or(bounds.output),
        ),
        basis,
        input_tokens: input,
        output_tokens: output,
    }
}
