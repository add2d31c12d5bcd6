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

/// Price a success (or the part of a stream that was delivered) from its usage.
///
/// Each reported class is priced at its rate: plain input at the input rate, cache
/// reads and writes at theirs (a rate the table lacks at its stand-in, making the cost
/// `estimated`), output (reasoning included) at the output rate. What the vendor did
/// not report is charged so that a missing figure never lowers the cost:
/// - a missing input or output total is charged at its bound, input at the dearest
///   input-side rate, exactly as the worst case prices it;
/// - input whose breakdown is missing (say, no cache-write count from a vendor that
///   bills cache writes) is priced at the dearest rate it could hide.
///
/// Either makes the basis `worst_case`, which outranks `estimated`, which outranks
/// `usage`. For usage within the bounds the cost never exceeds the worst case.
pub fn charge(dest: &Destination, usage: &Usage, bounds: TokenBounds) -> Charge {
    let mut missing = false;
    let mut estimated = false;
    let input_cost = match usage.input {
        None => {
            missing = true;
            dest.input_rate_ceiling().cost_of(bounds.input)
        }
        Some(total) => {
            let cached = dest.cached_input_rate();
            let write = dest.cache_write_rate();
            let reads = usage.cached_input.unwrap_or(0);
            let writes = usage.cache_write.unwrap_or(0);
            // Tokens not broken out as reads or writes. Should the parts exceed the total
            // (a vendor inconsistency), the parts are charged as reported: the larger.
            let plain = total.saturating_sub(reads.saturating_add(writes));
            let mut plain_rate = dest.input_per_mtok;
            let hidden = [
                (usage.cached_input, cached, true),
                (usage.cache_write, write, dest.bills_cache_writes()),
            ];
            for (reported, rate, possible) in hidden {
                // An unreported part may hide in the plain tokens: price them at its
                // rate if that is dearer. Only a dearer rate makes the cost a bound.
                if possible && reported.is_none() && rate.per_mtok > plain_rate {
                    plain_rate = rate.per_mtok;
                    missing = true;
                }
            }
            if (reads > 0 && !cached.listed) || (writes > 0 && !write.listed) {
                estimated = true;
            }
            plain_rate.cost_of(plain)
                + cached.per_mtok.cost_of(reads)
                + write.per_mtok.cost_of(writes)
        }
    };
    let output_cost = dest
        .output_per_mtok
        .cost_of(usage.output.unwrap_or_else(|| {
            missing = true;
            bounds.output
        }));
    let basis = if missing {
        CostBasis::WorstCase
    } else if estimated {
        CostBasis::Estimated
    } else {
        CostBasis::Usage
    };
    Charge {
        cost: input_cost + output_cost,
        basis,
        input_tokens: usage.input,
        output_tokens: usage.output,
    }
}
