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
            // Every choice may have reached the cap: the bound the worst case priced.
            bounds.total_output()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Jurisdiction, ModelName, ProviderId};
    use crate::money::PricePerMTok;
    use crate::policy::plan::{Api, Tier};
    use proptest::prelude::*;

    fn price(s: &str) -> PricePerMTok {
        PricePerMTok::new(s.parse().unwrap())
    }

    fn money(s: &str) -> Money {
        s.parse().unwrap()
    }

    /// Input 2, output 10 per Mtok; optional cache rates.
    fn dest(api: Api, cached: Option<&str>, write: Option<&str>) -> Destination {
        Destination {
            provider: ProviderId::new("p"),
            model: ModelName::new("m"),
            upstream_model: "m".into(),
            api,
            jurisdiction: Jurisdiction::new("us"),
            tier: Tier::Account,
            context_window: 1_000_000,
            input_per_mtok: price("2"),
            output_per_mtok: price("10"),
            cached_input_per_mtok: cached.map(price),
            cache_write_per_mtok: write.map(price),
        }
    }

    const BOUNDS: TokenBounds = TokenBounds {
        input: 1_000,
        output: 500,
        choices: 1,
    };

    fn full(input: u64, cached: u64, write: u64, output: u64) -> Usage {
        Usage {
            input: Some(input),
            cached_input: Some(cached),
            cache_write: Some(write),
            output: Some(output),
            reasoning: None,
        }
    }

    #[test]
    fn plain_usage_is_priced_at_the_listed_rates() {
        let c = charge(&dest(Api::Openai, None, None), &full(100, 0, 0, 50), BOUNDS);
        // 100 × 2/M + 50 × 10/M
        assert_eq!(c.cost, money("0.0007"));
        assert_eq!(c.basis, CostBasis::Usage);
        assert_eq!((c.input_tokens, c.output_tokens), (Some(100), Some(50)));
    }

    #[test]
    fn reported_zeros_are_figures_not_gaps() {
        let c = charge(&dest(Api::Openai, None, None), &full(0, 0, 0, 0), BOUNDS);
        assert_eq!(c.cost, Money::ZERO);
        assert_eq!(c.basis, CostBasis::Usage);
        assert_eq!((c.input_tokens, c.output_tokens), (Some(0), Some(0)));
    }

    #[test]
    fn cached_input_at_the_cached_rate() {
        let d = dest(Api::Openai, Some("0.5"), None);
        let c = charge(&d, &full(1_000, 800, 0, 0), BOUNDS);
        // 200 × 2/M + 800 × 0.5/M
        assert_eq!(c.cost, money("0.0008"));
        assert_eq!(c.basis, CostBasis::Usage);
    }

    #[test]
    fn cached_input_without_a_rate_costs_the_input_rate_and_is_estimated() {
        let d = dest(Api::Openai, None, None);
        let c = charge(&d, &full(1_000, 800, 0, 0), BOUNDS);
        assert_eq!(c.cost, money("0.002"));
        assert_eq!(c.basis, CostBasis::Estimated);
    }

    #[test]
    fn cache_writes_at_their_rate_or_twice_input_estimated() {
        let listed = dest(Api::Anthropic, Some("0.2"), Some("2.5"));
        // 100 plain × 2 + 300 read × 0.2 + 600 written × 2.5, per M; 10 out × 10/M
        let c = charge(&listed, &full(1_000, 300, 600, 10), BOUNDS);
        assert_eq!(c.cost, money("0.00186"));
        assert_eq!(c.basis, CostBasis::Usage);

        let unlisted = dest(Api::Anthropic, Some("0.2"), None);
        let c = charge(&unlisted, &full(1_000, 300, 600, 10), BOUNDS);
        // the 600 written at 2 × 2 = 4/M
        assert_eq!(c.cost, money("0.00276"));
        assert_eq!(c.basis, CostBasis::Estimated);
    }

    #[test]
    fn no_cache_tokens_means_no_estimate_even_without_cache_rates() {
        let c = charge(
            &dest(Api::Anthropic, None, None),
            &full(10, 0, 0, 1),
            BOUNDS,
        );
        assert_eq!(c.basis, CostBasis::Usage);
    }

    #[test]
    fn a_success_without_usage_is_charged_its_worst_case() {
        for api in [Api::Openai, Api::Anthropic, Api::Gemini] {
            let d = dest(api, Some("0.5"), Some("3"));
            let c = charge(&d, &Usage::default(), BOUNDS);
            assert_eq!(c.cost, crate::selection::worst_case(&d, BOUNDS), "{api:?}");
            assert_eq!(c.basis, CostBasis::WorstCase);
            assert_eq!((c.input_tokens, c.output_tokens), (None, None));
        }
    }

    #[test]
    fn a_missing_total_is_charged_at_its_bound_and_the_other_as_reported() {
        let d = dest(Api::Openai, None, None);
        let no_output = Usage {
            output: None,
            ..full(100, 0, 0, 0)
        };
        let c = charge(&d, &no_output, BOUNDS);
        // 100 × 2/M + 500 (bound) × 10/M
        assert_eq!(c.cost, money("0.0052"));
        assert_eq!(c.basis, CostBasis::WorstCase);
        assert_eq!((c.input_tokens, c.output_tokens), (Some(100), None));

        let no_input = Usage {
            input: None,
            ..full(0, 0, 0, 50)
        };
        let c = charge(&d, &no_input, BOUNDS);
        // 1000 (bound) × 2/M + 50 × 10/M
        assert_eq!(c.cost, money("0.0025"));
        assert_eq!(c.basis, CostBasis::WorstCase);
    }

    #[test]
    fn a_missing_input_bound_is_priced_at_the_dearest_input_rate() {
        // Cache writes at 3/M outrank input at 2/M: the bound is priced at 3.
        let d = dest(Api::Openai, None, Some("3"));
        let c = charge(
            &d,
            &Usage {
                input: None,
                ..full(0, 0, 0, 0)
            },
            BOUNDS,
        );
        assert_eq!(c.cost, money("0.003"));
    }

    #[test]
    fn an_unreported_cache_write_count_prices_anthropic_input_as_writes() {
        // Anthropic bills cache writes: without the count, any input token may be one.
        let d = dest(Api::Anthropic, None, None);
        let u = Usage {
            cache_write: None,
            ..full(100, 0, 0, 0)
        };
        let c = charge(&d, &u, BOUNDS);
        assert_eq!(c.cost, money("0.0004"));
        assert_eq!(c.basis, CostBasis::WorstCase);
        // OpenAI never bills writes, so the same gap changes nothing there.
        let c = charge(&dest(Api::Openai, None, None), &u, BOUNDS);
        assert_eq!(c.cost, money("0.0002"));
        assert_eq!(c.basis, CostBasis::Usage);
    }

    #[test]
    fn an_unreported_cached_count_is_harmless_when_cache_reads_are_cheaper() {
        let d = dest(Api::Openai, Some("0.5"), None);
        let u = Usage {
            cached_input: None,
            ..full(100, 0, 0, 0)
        };
        let c = charge(&d, &u, BOUNDS);
        assert_eq!(c.cost, money("0.0002"));
        assert_eq!(c.basis, CostBasis::Usage);
    }

    #[test]
    fn worst_case_outranks_estimated() {
        // Cached tokens with no listed rate (estimated) and no output count (bound).
        let d = dest(Api::Openai, None, None);
        let u = Usage {
            output: None,
            ..full(100, 50, 0, 0)
        };
        assert_eq!(charge(&d, &u, BOUNDS).basis, CostBasis::WorstCase);
    }

    #[test]
    fn reasoning_is_inside_output_and_not_charged_twice() {
        let d = dest(Api::Openai, None, None);
        let u = Usage {
            reasoning: Some(40),
            ..full(0, 0, 0, 50)
        };
        assert_eq!(charge(&d, &u, BOUNDS).cost, money("0.0005"));
    }

    #[test]
    fn parts_larger_than_the_total_are_charged_as_reported() {
        let d = dest(Api::Anthropic, Some("1"), Some("4"));
        // 10 reads and 10 writes reported against a total of 5: 10 × 1 + 10 × 4, per M.
        let c = charge(&d, &full(5, 10, 10, 0), BOUNDS);
        assert_eq!(c.cost, money("0.00005"));
    }

    #[test]
    fn the_worst_case_prices_input_at_the_dearest_input_side_rate() {
        use crate::selection::worst_case;
        let b = TokenBounds {
            input: 1_000_000,
            output: 0,
            choices: 1,
        };
        // OpenAI and Gemini bill no cache writes: input at the input rate.
        assert_eq!(worst_case(&dest(Api::Openai, None, None), b), money("2"));
        assert_eq!(
            worst_case(&dest(Api::Gemini, Some("0.5"), None), b),
            money("2")
        );
        // Anthropic bills them: the listed rate, or the 2× stand-in.
        assert_eq!(worst_case(&dest(Api::Anthropic, None, None), b), money("4"));
        assert_eq!(
            worst_case(&dest(Api::Anthropic, None, Some("2.5")), b),
            money("2.5")
        );
        // A listed rate counts whatever the API; one below input changes nothing.
        assert_eq!(
            worst_case(&dest(Api::Openai, None, Some("3")), b),
            money("3")
        );
        assert_eq!(
            worst_case(&dest(Api::Anthropic, None, Some("1")), b),
            money("2")
        );
        // Output is priced at the output rate alone: reasoning is output.
        let out = TokenBounds {
            input: 0,
            output: 1_000_000,
            choices: 1,
        };
        assert_eq!(
            worst_case(&dest(Api::Anthropic, None, None), out),
            money("10")
        );
    }

    #[test]
    fn basis_names_are_the_ledger_values() {
        assert_eq!(CostBasis::Usage.as_str(), "usage");
        assert_eq!(CostBasis::WorstCase.as_str(), "worst_case");
        assert_eq!(CostBasis::Estimated.as_str(), "estimated");
    }

    fn rate() -> impl Strategy<Value = PricePerMTok> {
        (0u32..100_000).prop_map(|cents| {
            PricePerMTok::new(Money::new(rust_decimal::Decimal::new(cents.into(), 2)))
        })
    }

    fn any_dest() -> impl Strategy<Value = Destination> {
        (
            prop_oneof![Just(Api::Openai), Just(Api::Anthropic), Just(Api::Gemini)],
            rate(),
            rate(),
            proptest::option::of(rate()),
            proptest::option::of(rate()),
        )
            .prop_map(|(api, input, output, cached, write)| Destination {
                input_per_mtok: input,
                output_per_mtok: output,
                cached_input_per_mtok: cached,
                cache_write_per_mtok: write,
                ..dest(api, None, None)
            })
    }

    /// Usage within the bounds: the parts fit in the input total, reasoning in the
    /// output. Writes only where the API bills them, as the adapters report.
    fn usage_within(writes: bool, b: TokenBounds) -> impl Strategy<Value = Usage> {
        (
            0..=b.input,
            // Output of all choices together is what the vendor reports.
            0..=b.total_output(),
            any::<(u64, u64, u64)>(),
            any::<u8>(),
        )
            .prop_map(move |(input, output, (r, w, t), mask)| {
                let reads = r % (input + 1);
                let written = if writes { w % (input - reads + 1) } else { 0 };
                let thoughts = t % (output + 1);
                let keep = |bit: u8, v: u64| (mask & (1 << bit) == 0).then_some(v);
                Usage {
                    input: keep(0, input),
                    cached_input: keep(1, reads),
                    cache_write: keep(2, written),
                    output: keep(3, output),
                    reasoning: keep(4, thoughts),
                }
            })
    }

    fn dest_usage_bounds() -> impl Strategy<Value = (Destination, Usage, TokenBounds)> {
        (any_dest(), 0u64..2_000_000, 0u64..200_000, 0u64..4).prop_flat_map(
            |(d, input, output, choices)| {
                let b = TokenBounds {
                    input,
                    output,
                    choices,
                };
                let writes = d.bills_cache_writes();
                (Just(d), usage_within(writes, b), Just(b))
            },
        )
    }

    proptest! {
        #[test]
        fn the_charge_never_exceeds_the_worst_case((d, u, b) in dest_usage_bounds()) {
            let c = charge(&d, &u, b);
            prop_assert!(c.cost <= crate::selection::worst_case(&d, b), "{c:?} for {u:?}");
        }

        #[test]
        fn a_missing_figure_never_lowers_the_charge(
            (d, u, b) in dest_usage_bounds(),
            field in 0usize..5,
        ) {
            let mut less = u;
            match field {
                0 => less.input = None,
                1 => less.cached_input = None,
                2 => less.cache_write = None,
                3 => less.output = None,
                _ => less.reasoning = None,
            }
            let (before, after) = (charge(&d, &u, b), charge(&d, &less, b));
            prop_assert!(after.cost >= before.cost, "{before:?} → {after:?}");
            // A missing total is always a bound. (A missing breakdown is priced as
            // plain input, the reading of a vendor that does not cache, and is a bound
            // only when a class it may hide is dearer.)
            if field == 0 || field == 3 {
                prop_assert_eq!(after.basis, CostBasis::WorstCase);
            }
        }

        #[test]
        fn a_complete_report_is_never_a_bound((d, u, b) in dest_usage_bounds()) {
            let complete = Usage {
                input: u.input.or(Some(0)),
                cached_input: u.cached_input.or(Some(0)),
                cache_write: u.cache_write.or(Some(0)),
                output: u.output.or(Some(0)),
                reasoning: u.reasoning,
            };
            prop_assert_ne!(charge(&d, &complete, b).basis, CostBasis::WorstCase);
        }
    }
}
