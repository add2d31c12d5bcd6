//! What an answered attempt cost: the vendor's usage figures priced at the
//! destination's rates, with any figure the vendor did not report charged at its bound.
//!
//! The one place where usage becomes money, so a plain answer, a stream's tail and a
//! cut stream are all charged by the same rule.

use serde::Serialize;

use crate::money::Money;
use crate::policy::plan::{Api, Destination, Rate, TierChoice};
use crate::selection::TokenBounds;
use crate::upstream::{InferenceGeo, ServedTier, Usage};

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
    /// The prompt-cache parts of `input_tokens`, as the ledger records them.
    pub cache: CacheTokens,
}

/// The prompt-cache parts of an attempt's input, as reported: what the ledger's
/// `cache_*_tokens` columns hold. `None`: not reported, not a reported 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheTokens {
    /// Read from the vendor's prompt cache.
    pub read: Option<u64>,
    /// Written to it, whatever the lifetime.
    pub write: Option<u64>,
    /// Of `write`, to the 5-minute cache: the writes not reported as 1-hour ones, as
    /// `charge` prices them. `None` where the vendor did not split writes by lifetime.
    pub write_5m: Option<u64>,
    /// Of `write`, to the 1-hour cache. `None` where the vendor did not split them.
    pub write_1h: Option<u64>,
}

impl CacheTokens {
    pub fn of(usage: &Usage) -> CacheTokens {
        let split = usage.cache_write_1h.map(|h| {
            let write = usage.cache_write.unwrap_or(0);
            // More 1-hour writes than writes in all (a vendor inconsistency) are
            // recorded as reported; the 5-minute part is what is left, at least 0.
            (write.saturating_sub(h), h)
        });
        CacheTokens {
            read: usage.cached_input,
            write: usage.cache_write,
            write_5m: split.map(|(short, _)| short),
            write_1h: split.map(|(_, long)| long),
        }
    }
}

/// Price a success (or the part of a stream that was delivered) from its usage.
///
/// The rates are those of the call as billed: the tier the answer says it was served
/// at (else the one the request asked for), the long-context rates when the input
/// billed (else its bound) passes their threshold. Each reported class is priced at its
/// rate: plain input at the input rate, cache reads and writes (5-minute and 1-hour)
/// at theirs, output (reasoning included) at the output rate. A rate the table lacks
/// is charged at its stand-in (a served tier with no declared rates: the dearest
/// declared), making the cost `estimated`. A call whose inference the answer says ran
/// in one region is charged at the regional premium; one that does not say, where the
/// workspace may have picked a region, too (`estimated`). What the vendor did not report is charged
/// so that a missing figure never lowers the cost:
/// - a missing input or output total is charged at its bound, input at the dearest
///   input-side rate, exactly as the worst case prices it;
/// - input whose breakdown is missing (say, no cache-write count from a vendor that
///   bills cache writes, or no split of writes by lifetime) is priced at the dearest
///   rate it could hide.
///
/// Either makes the basis `worst_case`, which outranks `estimated`, which outranks
/// `usage`. For usage within the bounds the cost never exceeds the worst case.
pub fn charge(dest: &Destination, usage: &Usage, bounds: TokenBounds) -> Charge {
    let mut missing = false;
    let tier = match usage.served_tier {
        Some(ServedTier::Standard) => TierChoice::Standard,
        Some(ServedTier::Tier(t)) => TierChoice::Served(t),
        Some(ServedTier::Unlisted) => TierChoice::Dearest,
        None => bounds.tier_choice(),
    };
    // The regional premium where the answer says a region, or where it does not say
    // and the workspace may have picked one (a guess at what was billed).
    let geo_guessed = usage.geo.is_none() && dest.may_bill_regional_premium();
    let regional = usage.geo == Some(InferenceGeo::Region) || geo_guessed;
    let rates = bounds.rates_at(dest, usage.input.unwrap_or(bounds.input), tier, regional);
    // The cache writes as reported. Not reported, they are unknown (priced below as a
    // part that may hide in the plain input) where the request asked for one (a mark)
    // or the API reports them whenever it bills them (Anthropic's: a missing count is
    // missing); elsewhere a structural 0: nothing asked for a write, and an entry that
    // lists a write rate on another API (for a relay that marks by itself) is charged
    // the writes its answers report.
    let cache_write = match usage.cache_write {
        Some(w) => Some(w),
        None if bounds.cache_marked
            || dest.api == Api::Anthropic
            || dest.writes_cache_by_itself() =>
        {
            None
        }
        None => usage.input.map(|_| 0),
    };
    // The vendor picked the tier and did not say which: the dearest declared one is a
    // guess at what was billed.
    let guessed = tier == TierChoice::AnyDeclared && !dest.terms.service_tiers.is_empty();
    let mut estimated = !rates.listed || guessed || geo_guessed || usage.unpriced;
    let input_cost = match usage.input {
        None => {
            missing = true;
            rates.input_ceiling().cost_of(bounds.input)
        }
        Some(total) => {
            let (cached, write, write_1h) = (rates.cached, rates.write, rates.write_1h);
            let reads = usage.cached_input.unwrap_or(0);
            // Writes are charged apart only where they can be billed (OpenAI writes its
            // cache for free and may still count them): elsewhere they are plain input.
            let writes = if rates.bills_writes || rates.bills_1h_writes {
                cache_write.unwrap_or(0)
            } else {
                // Writes reported where purser reads none as billed (a model its family
                // rules do not place, say a deployment's own name): as plain input, but
                // the vendor may have billed them, so not exact.
                estimated |= cache_write.is_some_and(|w| w > 0);
                0
            };
            // Writes by lifetime: the 1-hour ones as reported (more than the total
            // reported is charged as reported), the rest 5-minute. Without the split,
            // every write may be a 1-hour one where the destination bills them. Where
            // only 1-hour writes are billed (an entry listing that rate alone), every
            // write is one: the rate the bound counted.
            let (short, long) = match usage.cache_write_1h {
                _ if !rates.bills_writes => (0, writes),
                // A destination that bills no 1-hour writes bills every write as one.
                Some(_) if !rates.bills_1h_writes => (writes, 0),
                Some(h) => (writes.saturating_sub(h), h),
                None if rates.bills_1h_writes
                    && writes > 0
                    && write_1h.per_mtok > write.per_mtok =>
                {
                    missing = true;
                    (0, writes)
                }
                None => (writes, 0),
            };
            let parts = reads.saturating_add(short).saturating_add(long);
            // Audio at its own rate: the entry's (with the premium, as every rate),
            // else as plain input, a guess (`estimated`). At most the tokens the reads
            // and writes leave: a vendor that counts a cached prompt's audio in its
            // breakdown too does not bill it twice.
            let audio = usage
                .audio_input
                .unwrap_or(0)
                .min(total.saturating_sub(parts));
            let audio_rate = match dest.terms.audio_input_per_mtok {
                Some(a) => rates.audio.unwrap_or(a),
                None => {
                    estimated |= audio > 0;
                    rates.input
                }
            };
            // Tokens not broken out as reads, writes or audio. Should the parts exceed
            // the total (a vendor inconsistency), the parts are charged as reported: the
            // larger.
            let plain = total.saturating_sub(parts.saturating_add(audio));
            let mut plain_rate = rates.input;
            let audio_sent = Rate {
                per_mtok: audio_rate,
                listed: true,
            };
            let hidden = [
                (usage.cached_input, cached, true),
                (cache_write, write, rates.bills_writes),
                (cache_write, write_1h, rates.bills_1h_writes),
                // Audio sent and its count not reported: it may hide in the plain input.
                (usage.audio_input, audio_sent, rates.audio.is_some()),
            ];
            for (reported, rate, possible) in hidden {
                // An unreported part may hide in the plain tokens: price them at its
                // rate if that is dearer. Only a dearer rate makes the cost a bound.
                if possible && reported.is_none() && rate.per_mtok > plain_rate {
                    plain_rate = rate.per_mtok;
                    missing = true;
                }
            }
            // It may hide in the audio tokens too (the tokens a breakdown leaves
            // uncounted are taken by the audio first), so audio is priced at the dearer
            // of its rate and the plain tokens' (no vendor bills audio below text).
            let audio_rate = audio_rate.max(plain_rate);
            if (reads > 0 && !cached.listed)
                || (short > 0 && !write.listed)
                || (long > 0 && !write_1h.listed)
            {
                estimated = true;
            }
            plain_rate.cost_of(plain)
                + audio_rate.cost_of(audio)
                + cached.per_mtok.cost_of(reads)
                + write.per_mtok.cost_of(short)
                + write_1h.per_mtok.cost_of(long)
        }
    };
    let output_cost = rates.output.cost_of(usage.output.unwrap_or_else(|| {
        missing = true;
        // Every choice may have reached the cap, and reasoning beyond it: the bound
        // the worst case priced.
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
        // A billed call is billed its fee, where the entry lists one.
        cost: input_cost + output_cost + dest.call_fee(),
        basis,
        input_tokens: usage.input,
        output_tokens: usage.output,
        cache: CacheTokens::of(&Usage {
            cache_write,
            ..*usage
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Jurisdiction, ModelName, ProviderId};
    use crate::money::PricePerMTok;
    use crate::policy::plan::{Api, LongContext, ModelTerms, Rates, ServiceTier, Tier};
    use crate::selection::{TierAsk, worst_case};
    use proptest::prelude::*;

    fn price(s: &str) -> PricePerMTok {
        PricePerMTok::new(s.parse().unwrap())
    }

    fn money(s: &str) -> Money {
        s.parse().unwrap()
    }

    /// Input 2, output 10 per Mtok; optional cache rates. Of a family no vendor rule
    /// reprices (`policy::family`): on Anthropic's API, a model before the regional
    /// premium (the tests of such rules name their own).
    fn dest(api: Api, cached: Option<&str>, write: Option<&str>) -> Destination {
        Destination {
            provider: ProviderId::new("p"),
            model: ModelName::new("m"),
            upstream_model: match api {
                Api::Anthropic => "claude-sonnet-4-5".into(),
                Api::Openai | Api::Gemini => "m".into(),
            },
            api,
            jurisdiction: Jurisdiction::new("us"),
            tier: Tier::Account,
            context_window: 1_000_000,
            input_per_mtok: price("2"),
            output_per_mtok: price("10"),
            cached_input_per_mtok: cached.map(price),
            cache_write_per_mtok: write.map(price),
            terms: Default::default(),
        }
    }

    const BOUNDS: TokenBounds = TokenBounds {
        input: 1_000,
        output: 500,
        choices: 1,
        reasoning: 0,
        tier: TierAsk::VendorPicks,
        cache_marked: false,
        audio: false,
    };

    fn full(input: u64, cached: u64, write: u64, output: u64) -> Usage {
        Usage {
            input: Some(input),
            cached_input: Some(cached),
            cache_write: Some(write),
            output: Some(output),
            reasoning: None,
            cache_write_1h: Some(0),
            audio_input: None,
            served_tier: None,
            unpriced: false,
            geo: None,
        }
    }

    /// Writes an OpenAI-API answer does not report: a structural 0 unless the request
    /// asked for one (a `cache_control` mark), even where the entry lists a write rate;
    /// after a mark, unknown, and the input is charged at the write rate as a bound.
    #[test]
    fn unreported_writes_are_unknown_only_after_a_mark() {
        let d = dest(Api::Openai, None, Some("4"));
        let u = Usage {
            cache_write: None,
            cache_write_1h: None,
            ..full(100, 0, 0, 50)
        };
        let c = charge(&d, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0007"), CostBasis::Usage));
        assert_eq!(c.cache.write, Some(0));
        let marked = TokenBounds {
            cache_marked: true,
            ..BOUNDS
        };
        let c = charge(&d, &u, marked);
        // 100 at the dearest write rate (the 1-hour fallback, 2 × 2/M) + 50 × 10/M.
        assert_eq!(c.basis, CostBasis::WorstCase);
        assert!(c.cost >= money("0.0009"), "{c:?}");
        assert_eq!(c.cache.write, None);
        assert!(c.cost <= crate::selection::worst_case(&d, marked));
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
            reasoning: 0,
            tier: TierAsk::VendorPicks,
            cache_marked: false,
            audio: false,
        };
        // OpenAI and Gemini bill no cache writes: input at the input rate.
        assert_eq!(worst_case(&dest(Api::Openai, None, None), b), money("2"));
        assert_eq!(
            worst_case(&dest(Api::Gemini, Some("0.5"), None), b),
            money("2")
        );
        // Anthropic bills them, 5-minute and 1-hour: the dearer listed rate, or the
        // 2× stand-in of a 1-hour write that is not listed.
        assert_eq!(worst_case(&dest(Api::Anthropic, None, None), b), money("4"));
        assert_eq!(
            worst_case(&dest(Api::Anthropic, None, Some("2.5")), b),
            money("4")
        );
        let listed_1h = Destination {
            terms: ModelTerms {
                cache_write_1h_per_mtok: Some(price("3")),
                ..ModelTerms::default()
            },
            ..dest(Api::Anthropic, None, Some("2.5"))
        };
        assert_eq!(worst_case(&listed_1h, b), money("3"));
        // A listed rate counts whatever the API; one below input changes nothing.
        assert_eq!(
            worst_case(&dest(Api::Openai, None, Some("3")), b),
            money("3")
        );
        assert_eq!(
            worst_case(&dest(Api::Openai, None, Some("1")), b),
            money("2")
        );
        // Output is priced at the output rate alone: reasoning is output.
        let out = TokenBounds {
            input: 0,
            output: 1_000_000,
            choices: 1,
            reasoning: 0,
            tier: TierAsk::VendorPicks,
            cache_marked: false,
            audio: false,
        };
        assert_eq!(
            worst_case(&dest(Api::Anthropic, None, None), out),
            money("10")
        );
    }

    fn rates(i: &str, o: &str) -> Rates {
        Rates {
            input_per_mtok: price(i),
            output_per_mtok: price(o),
            cached_input_per_mtok: None,
        }
    }

    /// Gemini 2.5 Pro: 1.25/10 up to 200k input, 2.50/15 above.
    fn long_context() -> Destination {
        Destination {
            input_per_mtok: price("1.25"),
            output_per_mtok: price("10"),
            terms: ModelTerms {
                long_context: Some(LongContext {
                    above_input_tokens: 200_000,
                    rates: rates("2.50", "15"),
                }),
                ..ModelTerms::default()
            },
            ..dest(Api::Gemini, None, None)
        }
    }

    #[test]
    fn long_context_rates_apply_above_their_threshold_to_worst_case_and_charge() {
        let d = long_context();
        let small = TokenBounds {
            input: 200_000,
            output: 1_000,
            ..BOUNDS
        };
        // 200k × 1.25/M + 1k × 10/M
        assert_eq!(worst_case(&d, small), money("0.26"));
        let large = TokenBounds {
            input: 300_000,
            ..small
        };
        // 300k × 2.50/M + 1k × 15/M
        assert_eq!(worst_case(&d, large), money("0.765"));
        // Billed input decides the tier: below the threshold, the base rates.
        let c = charge(&d, &full(100_000, 0, 0, 1_000), large);
        assert_eq!(c.cost, money("0.135"));
        assert_eq!(c.basis, CostBasis::Usage);
        let c = charge(&d, &full(250_000, 0, 0, 1_000), large);
        assert_eq!(c.cost, money("0.64"));
        // No input figure: the bound, and its tier.
        let u = Usage {
            input: None,
            ..full(0, 0, 0, 1_000)
        };
        assert_eq!(charge(&d, &u, large).cost, money("0.765"));
    }

    fn tiered() -> Destination {
        Destination {
            terms: ModelTerms {
                service_tiers: [
                    (ServiceTier::Priority, rates("4", "20")),
                    (ServiceTier::Flex, rates("1", "5")),
                ]
                .into_iter()
                .collect(),
                ..ModelTerms::default()
            },
            ..dest(Api::Openai, None, None)
        }
    }

    #[test]
    fn the_served_tier_is_charged_and_an_unnamed_one_at_the_dearest_estimated() {
        let d = tiered();
        let priority = TokenBounds {
            tier: TierAsk::Tier(ServiceTier::Priority),
            ..BOUNDS
        };
        // The worst case of a priority request is at priority rates: 1000 × 4 + 500 × 20.
        assert_eq!(worst_case(&d, priority), money("0.014"));
        let u = full(100, 0, 0, 10);
        // Asked for priority, nothing said: priority.
        assert_eq!(charge(&d, &u, priority).cost, money("0.0006"));
        // Asked for nothing (or `auto`): the vendor picks, so the worst case is at the
        // dearest declared tier, and an answer that does not say is charged there,
        // estimated. Asked for `default`: the standard rates.
        assert_eq!(worst_case(&d, BOUNDS), money("0.014"));
        let c = charge(&d, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0006"), CostBasis::Estimated));
        let standard = TokenBounds {
            tier: TierAsk::Standard,
            ..BOUNDS
        };
        assert_eq!(worst_case(&d, standard), money("0.007"));
        let c = charge(&d, &u, standard);
        assert_eq!((c.cost, c.basis), (money("0.0003"), CostBasis::Usage));
        // Asked for priority, served at the standard tier: standard.
        let served = |t| Usage {
            served_tier: Some(t),
            ..u
        };
        let c = charge(&d, &served(ServedTier::Standard), priority);
        assert_eq!((c.cost, c.basis), (money("0.0003"), CostBasis::Usage));
        // Asked for nothing, served at priority (a project default): priority.
        let c = charge(&d, &served(ServedTier::Tier(ServiceTier::Priority)), BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0006"), CostBasis::Usage));
        // Asked for flex: the worst case at the standard rates, which are dearer (the
        // vendor may serve either); served at flex: flex's own rates, 100 × 1 + 10 × 5.
        let flex = TokenBounds {
            tier: TierAsk::Tier(ServiceTier::Flex),
            ..BOUNDS
        };
        assert_eq!(worst_case(&d, flex), money("0.007"));
        let c = charge(&d, &served(ServedTier::Tier(ServiceTier::Flex)), flex);
        assert_eq!((c.cost, c.basis), (money("0.00015"), CostBasis::Usage));
        // A tier the table cannot name: the dearest declared, estimated.
        let c = charge(&d, &served(ServedTier::Unlisted), BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0006"), CostBasis::Estimated));
        // Priority served without rates on this entry (a project default behind a
        // proxy): twice the base rates, the stand-in, estimated; flex so served: the
        // base rates, estimated (never below what flex costs).
        let plain = dest(Api::Openai, None, None);
        let c = charge(
            &plain,
            &served(ServedTier::Tier(ServiceTier::Priority)),
            BOUNDS,
        );
        assert_eq!((c.cost, c.basis), (money("0.0006"), CostBasis::Estimated));
        let c = charge(&plain, &served(ServedTier::Tier(ServiceTier::Flex)), BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0003"), CostBasis::Estimated));
    }

    #[test]
    fn one_hour_cache_writes_at_their_rate_and_an_unsplit_write_at_the_dearer() {
        let d = Destination {
            terms: ModelTerms {
                cache_write_1h_per_mtok: Some(price("4")),
                ..ModelTerms::default()
            },
            ..dest(Api::Anthropic, Some("0.2"), Some("2.5"))
        };
        // 1000 written, 400 of them for an hour: 600 × 2.5 + 400 × 4, per M.
        let u = Usage {
            cache_write_1h: Some(400),
            ..full(1_000, 0, 1_000, 0)
        };
        let c = charge(&d, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0031"), CostBasis::Usage));
        // Without the split, every write may be a 1-hour one.
        let u = Usage {
            cache_write_1h: None,
            ..u
        };
        let c = charge(&d, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.004"), CostBasis::WorstCase));
    }

    #[test]
    fn reasoning_beyond_the_cap_is_in_the_output_bound() {
        let d = dest(Api::Openai, None, None);
        let b = TokenBounds {
            input: 0,
            output: 1_000,
            reasoning: 32_768,
            ..BOUNDS
        };
        // (1000 + 32768) × 10/M
        assert_eq!(worst_case(&d, b), money("0.33768"));
        let no_output = Usage {
            output: None,
            ..full(0, 0, 0, 0)
        };
        assert_eq!(charge(&d, &no_output, b).cost, money("0.33768"));
    }

    fn named(api: Api, upstream: &str) -> Destination {
        Destination {
            upstream_model: upstream.into(),
            ..dest(api, None, None)
        }
    }

    /// GPT-5.6 and later write their cache by themselves and bill the writes at 1.25×
    /// input (OpenAI's prompt caching guide): bounded and charged so with no mark and
    /// no listed rate; GPT-5.5 writes for free.
    #[test]
    fn gpt_5_6_writes_are_bounded_and_charged_at_a_quarter_over_input() {
        let (new, old) = (
            named(Api::Openai, "gpt-5.6-sol"),
            named(Api::Openai, "gpt-5.5"),
        );
        let wc = crate::selection::worst_case;
        assert_eq!(wc(&new, BOUNDS), money("0.0075"));
        assert_eq!(wc(&old, BOUNDS), money("0.007"));
        let u = full(1_000, 0, 400, 50);
        let c = charge(&new, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0027"), CostBasis::Usage));
        assert_eq!(charge(&old, &u, BOUNDS).cost, money("0.0025"));
        // Not reported by a family that reports every write it bills: unknown, so the
        // plain input is priced at the write rate, as a bound.
        let unreported = Usage {
            cache_write: None,
            ..u
        };
        let c = charge(&new, &unreported, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.003"), CostBasis::WorstCase));
        // A listed rate still wins over the published multiple.
        let listed = Destination {
            cache_write_per_mtok: Some(price("3")),
            ..new
        };
        assert_eq!(charge(&listed, &u, BOUNDS).cost, money("0.0029"));
    }

    /// Claude Opus 4.6 and later may run where the workspace keeps it: at 1.1× every
    /// rate in one region. The worst case carries the premium; the charge follows what
    /// the answer says, and guesses it (estimated) when the answer says nothing.
    #[test]
    fn the_regional_premium_is_bounded_and_charged_where_the_answer_says_a_region() {
        let (new, old) = (
            named(Api::Anthropic, "claude-opus-4-6"),
            named(Api::Anthropic, "claude-sonnet-4-5-20250929"),
        );
        let wc = crate::selection::worst_case;
        // Anthropic bills writes: input at the 2× stand-in, then the premium.
        assert_eq!(wc(&new, BOUNDS), money("0.0099"));
        assert_eq!(wc(&old, BOUNDS), money("0.009"));
        let at = |geo| Usage {
            geo,
            ..full(1_000, 0, 0, 50)
        };
        let c = |d: &Destination, geo| {
            let c = charge(d, &at(geo), BOUNDS);
            (c.cost, c.basis)
        };
        let region = Some(InferenceGeo::Region);
        let anywhere = Some(InferenceGeo::Anywhere);
        assert_eq!(c(&new, region), (money("0.00275"), CostBasis::Usage));
        assert_eq!(c(&new, anywhere), (money("0.0025"), CostBasis::Usage));
        assert_eq!(c(&new, None), (money("0.00275"), CostBasis::Estimated));
        assert_eq!(c(&old, None), (money("0.0025"), CostBasis::Usage));
        assert_eq!(c(&old, anywhere), (money("0.0025"), CostBasis::Usage));
    }

    /// Audio input at the entry's audio rate: every input token of a request that
    /// sends audio is bounded at it, and the audio tokens an answer reports are charged
    /// at it (without a listed rate, at the input rate, marked estimated).
    #[test]
    fn audio_input_is_bounded_and_charged_at_its_own_rate() {
        let audio_model = Destination {
            terms: ModelTerms {
                audio_input_per_mtok: Some(price("40")),
                ..ModelTerms::default()
            },
            ..dest(Api::Openai, None, None)
        };
        let with_audio = TokenBounds {
            audio: true,
            ..BOUNDS
        };
        let wc = crate::selection::worst_case;
        assert_eq!(wc(&audio_model, with_audio), money("0.045"));
        assert_eq!(wc(&audio_model, BOUNDS), money("0.007"));
        let u = Usage {
            audio_input: Some(600),
            ..full(1_000, 0, 0, 50)
        };
        let c = charge(&audio_model, &u, with_audio);
        assert_eq!((c.cost, c.basis), (money("0.0253"), CostBasis::Usage));
        let unlisted = dest(Api::Openai, None, None);
        let c = charge(&unlisted, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0025"), CostBasis::Estimated));
        // Audio sent and no count of it reported (a relay that drops the breakdown):
        // it may be any of the input, priced at the audio rate as a bound.
        let unsaid = Usage {
            audio_input: None,
            ..u
        };
        let c = charge(&audio_model, &unsaid, with_audio);
        assert_eq!((c.cost, c.basis), (money("0.0405"), CostBasis::WorstCase));
        // A cached prompt's audio counted in the breakdown too (Gemini): at most what the
        // reads leave is audio, so the cached part is not charged twice.
        let cached = Usage {
            cached_input: Some(900),
            audio_input: Some(1_000),
            ..full(1_000, 900, 0, 50)
        };
        let c = charge(&audio_model, &cached, with_audio);
        assert_eq!(c.cost, cost_of(&[(100, "40"), (900, "2"), (50, "10")]));
        assert!(c.cost <= crate::selection::worst_case(&audio_model, with_audio));
    }

    fn cost_of(parts: &[(u64, &str)]) -> Money {
        parts.iter().map(|(n, r)| price(r).cost_of(*n)).sum()
    }

    /// A `cache_control` mark to a model that writes by itself buys no dearer write:
    /// its writes stay at the family's 1.25×, exact. Writes an answer reports where
    /// none is read as billed (a model no family rule places) are charged as plain
    /// input, but marked estimated: the vendor may have billed them.
    #[test]
    fn writes_to_a_self_writing_family_after_a_mark_stay_at_its_rate() {
        let new = named(Api::Openai, "gpt-5.6-sol");
        let marked = TokenBounds {
            cache_marked: true,
            ..BOUNDS
        };
        let u = full(1_000, 0, 400, 50);
        let c = charge(&new, &u, marked);
        assert_eq!((c.cost, c.basis), (money("0.0027"), CostBasis::Usage));
        let azure = named(Api::Openai, "my-deployment");
        let c = charge(&azure, &u, BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0025"), CostBasis::Estimated));
    }

    /// A fee per call (a model that searches on every call) is in the worst case, the
    /// clamp's arithmetic and the charge of a billed call.
    #[test]
    fn a_fee_per_call_is_bounded_clamped_and_charged() {
        let searching = Destination {
            upstream_model: "sonar-pro".into(),
            terms: ModelTerms {
                fee_per_call: Some(money("0.014")),
                ..ModelTerms::default()
            },
            ..dest(Api::Openai, None, None)
        };
        assert!(!searching.unpriced_call_fee());
        assert!(
            Destination {
                terms: ModelTerms::default(),
                ..searching.clone()
            }
            .unpriced_call_fee()
        );
        let wc = crate::selection::worst_case;
        assert_eq!(wc(&searching, BOUNDS), money("0.021"));
        let c = charge(&searching, &full(1_000, 0, 0, 50), BOUNDS);
        assert_eq!((c.cost, c.basis), (money("0.0165"), CostBasis::Usage));
        // 0.02 leaves 0.02 − 0.014 − 0.002 of input = 0.004 for output: 400 tokens.
        assert_eq!(
            crate::selection::clamp_output(&searching, BOUNDS, money("0.02")),
            Some(400)
        );
        assert!(
            crate::selection::arithmetic(&searching, BOUNDS, "USD").contains("+ 0.014 per call")
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

    fn any_rates() -> impl Strategy<Value = Rates> {
        (rate(), rate(), proptest::option::of(rate())).prop_map(|(i, o, c)| Rates {
            input_per_mtok: i,
            output_per_mtok: o,
            cached_input_per_mtok: c,
        })
    }

    /// Any rates, including long-context tiers (at any threshold, cheaper or dearer
    /// than the base), service tiers and 1-hour cache writes.
    fn any_dest() -> impl Strategy<Value = Destination> {
        (
            prop_oneof![Just(Api::Openai), Just(Api::Anthropic), Just(Api::Gemini)],
            (rate(), rate()),
            proptest::option::of(rate()),
            proptest::option::of(rate()),
            proptest::option::of(rate()),
            proptest::option::of((0u64..3_000_000, any_rates())),
            proptest::option::of(any_rates()),
            // Families whose names change the billing (`policy::family`), and one that
            // names none.
            prop_oneof![
                Just("m"),
                Just("gpt-5.6-sol"),
                Just("gpt-5.5"),
                Just("claude-opus-4-6"),
                Just("claude-sonnet-4-5"),
            ],
            proptest::option::of(rate()),
        )
            .prop_map(
                |(api, (input, output), cached, write, write_1h, long, priority, name, audio)| {
                    Destination {
                        upstream_model: name.into(),
                        input_per_mtok: input,
                        output_per_mtok: output,
                        cached_input_per_mtok: cached,
                        cache_write_per_mtok: write,
                        terms: ModelTerms {
                            cache_write_1h_per_mtok: write_1h,
                            audio_input_per_mtok: audio,
                            long_context: long.map(|(above, rates)| LongContext {
                                above_input_tokens: above,
                                rates,
                            }),
                            service_tiers: priority
                                .map(|r| (ServiceTier::Priority, r))
                                .into_iter()
                                .collect(),
                            ..ModelTerms::default()
                        },
                        ..dest(api, None, None)
                    }
                },
            )
    }

    /// Usage within the bounds: the parts fit in the input total, reasoning in the
    /// output. Writes only where the API bills them, as the adapters report; a region
    /// said only where the model may be kept in one.
    fn usage_within(writes: bool, regional: bool, b: TokenBounds) -> impl Strategy<Value = Usage> {
        let audio = b.audio;
        (
            0..=b.input,
            // Output of all choices together is what the vendor reports.
            0..=b.total_output(),
            any::<(u64, u64, u64, u64)>(),
            any::<u8>(),
        )
            .prop_map(move |(input, output, (r, w, t, a), mask)| {
                let reads = r % (input + 1);
                let written = if writes { w % (input - reads + 1) } else { 0 };
                let thoughts = t % (output + 1);
                let keep = |bit: u8, v: u64| (mask & (1 << bit) == 0).then_some(v);
                let geo = match mask >> 6 {
                    0 => None,
                    1 => Some(InferenceGeo::Anywhere),
                    _ if regional => Some(InferenceGeo::Region),
                    _ => Some(InferenceGeo::Anywhere),
                };
                Usage {
                    input: keep(0, input),
                    cached_input: keep(1, reads),
                    cache_write: keep(2, written),
                    output: keep(3, output),
                    reasoning: keep(4, thoughts),
                    cache_write_1h: keep(5, written / 2),
                    // Any share of the input, cached or written parts included (Gemini's
                    // breakdown counts a cached prompt's audio too).
                    audio_input: audio.then(|| a % (input + 1)),
                    served_tier: None,
                    unpriced: false,
                    geo,
                }
            })
    }

    fn dest_usage_bounds() -> impl Strategy<Value = (Destination, Usage, TokenBounds)> {
        (
            any_dest(),
            0u64..2_000_000,
            (0u64..200_000, 0u64..40_000),
            0u64..4,
            (any::<bool>(), any::<bool>(), any::<bool>()),
        )
            .prop_flat_map(
                |(d, input, (output, reasoning), choices, (priority, marked, audio))| {
                    let b = TokenBounds {
                        input,
                        output,
                        choices,
                        reasoning,
                        // Only a declared tier is bounded (the gateway refuses the others).
                        tier: if priority && !d.terms.service_tiers.is_empty() {
                            TierAsk::Tier(ServiceTier::Priority)
                        } else {
                            TierAsk::VendorPicks
                        },
                        // A request that asked for a cache write, or not.
                        cache_marked: marked,
                        // Audio sent: bounded only where its rate is listed.
                        audio: audio && d.terms.audio_input_per_mtok.is_some(),
                    };
                    // Writes reported whatever the destination: a compatible server may
                    // count them where none is billed (charged then as plain input).
                    let regional = d.may_bill_regional_premium();
                    (Just(d), usage_within(true, regional, b), Just(b))
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
            // Unreported writes where nothing asked for one and the API does not report
            // them whenever it bills them are a structural 0 (see `charge`): that reading
            // may be lower than a report, by design.
            let structural = field == 2
                && !b.cache_marked
                && d.api != Api::Anthropic
                && !d.writes_cache_by_itself();
            let (before, after) = (charge(&d, &u, b), charge(&d, &less, b));
            prop_assert!(structural || after.cost >= before.cost, "{before:?} → {after:?}");
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
                cache_write_1h: u.cache_write_1h.or(Some(0)),
                audio_input: u.audio_input,
                served_tier: None,
                unpriced: false,
                geo: u.geo,
            };
            prop_assert_ne!(charge(&d, &complete, b).basis, CostBasis::WorstCase);
        }
    }
}
