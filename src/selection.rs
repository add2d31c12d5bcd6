//! Selection: (plan route, request bounds) → the primary destination and the alternate.
//!
//! Pure: no I/O, no clock. The circuit state comes in as a predicate so that the same
//! function serves the gateway and `purser explain`.

use serde::Serialize;

use crate::money::Money;
use crate::policy::plan::{
    Applied, Ceiling, Destination, OnExceed, Route, ServiceTier, TierChoice,
};

/// Upper bounds on the tokens one call to one destination can consume. Computed per
/// destination (`select`'s `bounds_of`): the input bound is over the body as that
/// destination's API receives it, and the reasoning a model bills beyond its cap is
/// its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenBounds {
    pub input: u64,
    /// Per choice: the cap forwarded to the vendor.
    pub output: u64,
    /// Per choice: reasoning the model may bill beyond the cap (0 when none).
    pub reasoning: u64,
    /// Choices asked for (`n`): each may reach the output cap.
    pub choices: u64,
    /// The service tier the request asks for.
    pub tier: TierAsk,
    /// The body as sent carries a `cache_control` marker: a cache write may be billed
    /// (`Applied::marked`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cache_marked: bool,
    /// The body as sent carries audio, billed at the entry's audio rate
    /// (`bound::sends_audio`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub audio: bool,
}

/// The service tier a request asks for (its `service_tier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TierAsk {
    /// None, or `auto`: the vendor picks (a project's default tier may be priority),
    /// so any tier the model entry declares may be served.
    VendorPicks,
    /// `default`: the standard tier.
    Standard,
    Tier(ServiceTier),
}

impl TokenBounds {
    /// Output tokens of every choice together, reasoning beyond the cap included: what
    /// the output side can cost.
    pub fn total_output(&self) -> u64 {
        self.output
            .saturating_add(self.reasoning)
            .saturating_mul(self.choices.max(1))
    }

    /// Tokens of context the call can fill: input, and one choice's output.
    pub fn context_needed(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.reasoning)
    }

    pub fn tier_choice(&self) -> TierChoice {
        match self.tier {
            TierAsk::VendorPicks => TierChoice::AnyDeclared,
            TierAsk::Standard => TierChoice::Standard,
            TierAsk::Tier(t) => TierChoice::Asked(t),
        }
    }

    /// The rates these bounds are proved at on `d`: the long-context tier the input
    /// reaches, the service tier asked for, cache writes billable after a mark, the
    /// regional premium a vendor's account may pick unseen. The worst case, its
    /// arithmetic and the clamp all read these, so none can leave the mark or the
    /// premium out (the clamp once left the mark).
    pub fn rates(&self, d: &Destination) -> Applied {
        self.rates_at(
            d,
            self.input,
            self.tier_choice(),
            d.may_bill_regional_premium(),
        )
    }

    /// The rates of a call with these bounds on `d` billed for `input` tokens at `tier`,
    /// with or without the regional premium: the worst case's (`rates`), or the
    /// charge's, which reads the input, tier and region from the answer.
    pub fn rates_at(
        &self,
        d: &Destination,
        input: u64,
        tier: TierChoice,
        regional: bool,
    ) -> Applied {
        d.rates(input, tier)
            .marked(self.cache_marked)
            .with_audio(d.terms.audio_input_per_mtok.filter(|_| self.audio))
            .regional(regional)
    }
}

/// A request whose cost at a destination cannot be bounded: the part or field, and
/// what it is. Under a hard ceiling or a budget it is refused with `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unbounded {
    /// Where in the client's request (OpenAI's `param`): `messages[2].content[0]`.
    pub param: String,
    /// What it is and why it has no bound, for the message.
    pub what: String,
}

/// Worst-case cost of one call to `d` with these bounds: input at the dearest rate any
/// input token may be billed at (cache writes of either lifetime, the long-context
/// tier its input bound reaches, the service tier asked for), output, reasoning beyond
/// the cap included, at the output rate of the same tier; and the fee per call the
/// entry lists.
pub fn worst_case(d: &Destination, b: TokenBounds) -> Money {
    let r = b.rates(d);
    r.input_ceiling().cost_of(b.input) + r.output.cost_of(b.total_output()) + d.call_fee()
}

/// Why a model that searches on every call has no bound without its fee listed.
pub fn unpriced_call_fee() -> Unbounded {
    Unbounded {
        param: "model".into(),
        what: "this model searches the web on every call and bills each call beyond its tokens: a fee its entry does not list (`fee_per_call`), or, for deep-research and `:online` models, searches and results no fee bounds".into(),
    }
}

/// Why a candidate was not chosen, or that it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Chosen,
    /// Fits, but an earlier candidate was chosen.
    NotNeeded,
    ContextTooSmall {
        needed: u64,
        window: u64,
    },
    OverCeiling {
        worst_case: Money,
        ceiling: Money,
    },
    CircuitOpen,
    /// The request's cost there cannot be bounded (a part with no declared bound).
    Unbounded(Unbounded),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Considered {
    pub destination: Destination,
    /// `None` when the request cannot be bounded there.
    pub bounds: Option<TokenBounds>,
    pub worst_case: Option<Money>,
    pub verdict: Verdict,
}

/// The alternate and whether it could take the request within the ceiling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AlternateFit {
    pub destination: Destination,
    /// The alternate's own bounds (`Err`: the request cannot be bounded there, and
    /// `fits` is false).
    pub bounds: Result<TokenBounds, Unbounded>,
    /// Zero when `bounds` is `Err`: never reserved, since it does not fit.
    pub worst_case: Money,
    pub fits: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selected {
    pub primary: Destination,
    pub worst_case: Money,
    /// True when every fitting candidate's circuit is open: the attempt is recorded as
    /// `circuit_open` with no call made.
    pub circuit_open: bool,
    /// The primary's bounds.
    pub bounds: TokenBounds,
    /// `Some(original)` when `on_exceed: clamp` lowered the output bound to fit.
    pub clamped_from: Option<u64>,
    pub alternate: Option<AlternateFit>,
    pub considered: Vec<Considered>,
}

impl Selected {
    /// The bounds a call to `d` (the primary or the alternate) was proved with: what a
    /// missing usage figure of its attempt is charged at.
    pub fn bounds_for(&self, d: &Destination) -> TokenBounds {
        match &self.alternate {
            Some(AlternateFit {
                destination,
                bounds: Ok(b),
                ..
            }) if destination == d && *d != self.primary => *b,
            Some(_) | None => self.bounds,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum Refusal {
    /// No destination serves the model in the policy's jurisdictions.
    NoDestination,
    /// No destination can bound the request's cost: the first candidate's reason.
    Unbounded(Unbounded),
    /// Some destination exists, but none fits the ceiling (or the context window).
    DoesNotFit {
        cheapest_worst_case: Option<Money>,
        considered: Vec<Considered>,
    },
}

/// How a worst case is reached, for people: `2096 in × 0.15/M + 1024 out × 0.60/M =
/// 0.0009288`, amounts in the currency's minor units. One wording for `explain` and
/// for the refusal a client reads.
pub fn arithmetic(d: &Destination, b: TokenBounds, currency: &str) -> String {
    let per_choice = if b.reasoning > 0 {
        format!("({} + {} reasoning)", b.output, b.reasoning)
    } else {
        b.output.to_string()
    };
    // With `n` choices each may reach the output cap: say so, so the sum adds up.
    let out = if b.choices > 1 {
        format!("{} × {per_choice}", b.choices)
    } else {
        per_choice
    };
    let r = b.rates(d);
    let fee = d.call_fee();
    let fee = if fee.is_positive() {
        format!(" + {} per call", fee.for_people(currency))
    } else {
        String::new()
    };
    format!(
        "{} in × {}/M + {out} out × {}/M{fee} = {}",
        b.input,
        // The dearest input-side rate: the one the worst case is proved with.
        r.input_ceiling().for_people(currency),
        r.output.for_people(currency),
        worst_case(d, b).for_people(currency)
    )
}

/// The message a client reads when no candidate fits the ceiling: the ceiling and each
/// candidate's arithmetic (or its window, or what cannot be bounded there), so the
/// refusal explains itself.
pub fn does_not_fit_message(ceiling: Money, currency: &str, considered: &[Considered]) -> String {
    let detail: Vec<String> = considered
        .iter()
        .map(|c| {
            let label = c.destination.label();
            match (&c.verdict, c.bounds) {
                (Verdict::ContextTooSmall { needed, window }, _) => {
                    format!("{label}: needs {needed} tokens, window {window}")
                }
                (Verdict::Unbounded(u), _) => {
                    format!("{label}: `{}` cannot be bounded ({})", u.param, u.what)
                }
                (
                    Verdict::Chosen
                    | Verdict::NotNeeded
                    | Verdict::OverCeiling { .. }
                    | Verdict::CircuitOpen,
                    Some(b),
                ) => format!("{label}: {}", arithmetic(&c.destination, b, currency)),
                (
                    Verdict::Chosen
                    | Verdict::NotNeeded
                    | Verdict::OverCeiling { .. }
                    | Verdict::CircuitOpen,
                    None,
                ) => format!("{label}: no bound"),
            }
        })
        .collect();
    format!(
        "worst case exceeds the ceiling of {} {currency} per request ({}); lower max_tokens or shorten the input",
        ceiling.for_people(currency),
        detail.join("; ")
    )
}

/// A candidate with the bounds of this request there.
type Bounded = (Destination, Result<TokenBounds, Unbounded>);

/// Candidates in selection order: pool first (plan order), then accounts cheapest-first
/// for this request's bounds at each (ties by provider id, so the order is stable);
/// candidates where the request cannot be bounded last.
pub fn ordered(
    route: &Route,
    bounds_of: impl Fn(&Destination) -> Result<TokenBounds, Unbounded>,
) -> Vec<Bounded> {
    let wc = |(d, b): &Bounded| b.as_ref().ok().map(|b| worst_case(d, *b));
    let mut accounts: Vec<Bounded> = route
        .accounts
        .iter()
        .map(|d| (d.clone(), bounds_of(d)))
        .collect();
    accounts.sort_by(|a, b| match (wc(a), wc(b)) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.0.provider.cmp(&b.0.provider)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.0.provider.cmp(&b.0.provider),
    });
    route
        .pool
        .iter()
        .map(|d| (d.clone(), bounds_of(d)))
        .chain(accounts)
        .collect()
}

fn verdict(d: &Destination, wc: Money, b: TokenBounds, ceiling: &Ceiling) -> Option<Verdict> {
    let needed = b.context_needed();
    if needed > d.context_window {
        return Some(Verdict::ContextTooSmall {
            needed,
            window: d.context_window,
        });
    }
    if wc > ceiling.per_request {
        return Some(Verdict::OverCeiling {
            worst_case: wc,
            ceiling: ceiling.per_request,
        });
    }
    None
}

/// The largest per-choice output cap (≥ 1) that makes a call to `d` with bounds `b`
/// fit the ceiling and the window, no larger than `b.output`. Reasoning beyond the cap
/// is not the cap's to clamp: it stays in the bound.
pub fn clamp_output(d: &Destination, b: TokenBounds, ceiling: Money) -> Option<u64> {
    let r = b.rates(d);
    let fixed = r.input_ceiling().cost_of(b.input)
        + r.output
            .cost_of(b.reasoning.saturating_mul(b.choices.max(1)))
        + d.call_fee();
    let base = b.input.saturating_add(b.reasoning);
    if fixed > ceiling || base >= d.context_window {
        return None;
    }
    let room = ceiling.saturating_sub(fixed);
    // One more output token per choice costs `choices` tokens.
    let per_token = r.output.cost_of(b.choices.max(1));
    let by_money = if per_token.is_positive() {
        let n = (room.decimal() / per_token.decimal()).floor();
        u64::try_from(n).unwrap_or(u64::MAX)
    } else {
        u64::MAX
    };
    let by_window = d.context_window - base;
    let out = b.output.min(by_money).min(by_window);
    (out >= 1).then_some(out)
}

/// Select the primary for a request: the first candidate that fits and whose circuit is
/// closed; if every fitting candidate is open, the first fitting one (recorded as
/// `circuit_open`). `bounds_of` gives the request's bounds at each destination, or
/// what cannot be bounded there.
pub fn select(
    route: &Route,
    ceiling: &Ceiling,
    bounds_of: impl Fn(&Destination) -> Result<TokenBounds, Unbounded>,
    circuit_open: impl Fn(&Destination) -> bool,
) -> Result<Selected, Refusal> {
    if route.is_empty() {
        return Err(Refusal::NoDestination);
    }
    let candidates = ordered(route, &bounds_of);
    if candidates.iter().all(|(_, b)| b.is_err())
        && let Some((_, Err(u))) = candidates.first()
    {
        return Err(Refusal::Unbounded(u.clone()));
    }
    let (chosen, considered, clamped_from) = match pick(&candidates, ceiling, &circuit_open) {
        Ok((i, considered)) => (i, considered, None),
        Err(considered) => {
            let clamped = match ceiling.on_exceed {
                OnExceed::Reject => None,
                OnExceed::Clamp => candidates.iter().find_map(|(d, b)| {
                    let b = b.as_ref().ok()?;
                    clamp_output(d, *b, ceiling.per_request).map(|out| (out, b.output))
                }),
            };
            let retry = clamped.and_then(|(out, from)| {
                let lowered: Vec<Bounded> = candidates
                    .iter()
                    .map(|(d, b)| {
                        let b = b.clone().map(|b| TokenBounds {
                            output: b.output.min(out),
                            ..b
                        });
                        (d.clone(), b)
                    })
                    .collect();
                pick(&lowered, ceiling, &circuit_open)
                    .ok()
                    .map(|(i, c)| (i, c, from))
            });
            match retry {
                Some((i, considered, from)) => (i, considered, Some(from)),
                None => {
                    let cheapest = considered.iter().filter_map(|c| c.worst_case).min();
                    return Err(Refusal::DoesNotFit {
                        cheapest_worst_case: cheapest,
                        considered,
                    });
                }
            }
        }
    };
    let primary = considered[chosen].destination.clone();
    let (Some(worst), Some(bounds)) = (considered[chosen].worst_case, considered[chosen].bounds)
    else {
        return Err(Refusal::DoesNotFit {
            cheapest_worst_case: None,
            considered,
        });
    };
    let open = considered[chosen].verdict == Verdict::CircuitOpen;
    let alternate = route.alternate.as_ref().map(|a| {
        // The alternate gets the same output cap as the primary: one `ChatRequest`.
        let b = bounds_of(a).map(|b| TokenBounds {
            output: bounds.output,
            ..b
        });
        match b {
            Ok(b) => {
                let wc = worst_case(a, b);
                AlternateFit {
                    destination: a.clone(),
                    bounds: Ok(b),
                    worst_case: wc,
                    fits: verdict(a, wc, b, ceiling).is_none(),
                }
            }
            Err(u) => AlternateFit {
                destination: a.clone(),
                bounds: Err(u),
                worst_case: Money::ZERO,
                fits: false,
            },
        }
    });
    Ok(Selected {
        primary,
        worst_case: worst,
        circuit_open: open,
        bounds,
        clamped_from,
        alternate,
        considered,
    })
}

/// Index of the chosen candidate and the verdict on each, or every verdict if none fits.
fn pick(
    candidates: &[Bounded],
    ceiling: &Ceiling,
    circuit_open: &impl Fn(&Destination) -> bool,
) -> Result<(usize, Vec<Considered>), Vec<Considered>> {
    let mut considered = Vec::new();
    let mut chosen = None;
    let mut first_fit_open = None;
    for (i, (d, b)) in candidates.iter().enumerate() {
        let (bounds, wc, v) = match b {
            Err(u) => (None, None, Verdict::Unbounded(u.clone())),
            Ok(b) => {
                let wc = worst_case(d, *b);
                let v = match verdict(d, wc, *b, ceiling) {
                    Some(v) => v,
                    None if chosen.is_some() => Verdict::NotNeeded,
                    None if circuit_open(d) => {
                        first_fit_open.get_or_insert(i);
                        Verdict::CircuitOpen
                    }
                    None => {
                        chosen = Some(i);
                        Verdict::Chosen
                    }
                };
                (Some(*b), Some(wc), v)
            }
        };
        considered.push(Considered {
            destination: d.clone(),
            bounds,
            worst_case: wc,
            verdict: v,
        });
    }
    match chosen.or(first_fit_open) {
        Some(i) => Ok((i, considered)),
        None => Err(considered),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Jurisdiction, ModelName, ProviderId};
    use crate::money::PricePerMTok;
    use crate::policy::plan::{Api, Mode, Tier};

    fn dest(p: &str, tier: Tier, pin: &str, pout: &str, window: u64) -> Destination {
        Destination {
            provider: ProviderId::new(p),
            model: ModelName::new("m"),
            upstream_model: "m".into(),
            api: Api::Openai,
            jurisdiction: Jurisdiction::new("us"),
            tier,
            context_window: window,
            input_per_mtok: PricePerMTok::new(pin.parse().unwrap()),
            output_per_mtok: PricePerMTok::new(pout.parse().unwrap()),
            cached_input_per_mtok: None,
            cache_write_per_mtok: None,
            terms: Default::default(),
        }
    }

    fn ceiling(c: &str, on_exceed: OnExceed) -> Ceiling {
        Ceiling {
            per_request: c.parse().unwrap(),
            mode: Mode::Hard,
            on_exceed,
        }
    }

    /// One choice, no reasoning, the tier the vendor picks, no cache mark.
    fn one_choice(input: u64, output: u64) -> TokenBounds {
        TokenBounds {
            input,
            output,
            choices: 1,
            reasoning: 0,
            tier: TierAsk::VendorPicks,
            cache_marked: false,
            audio: false,
        }
    }

    /// A request that asks for a cache write is clamped to the cap that fits with its
    /// input at the write rate (2× here), not at the input rate: 1,000 in at 2/M and
    /// 1,000 out at 1/M is exactly 0.003 (attack review of 51a8b07).
    #[test]
    fn a_marked_request_is_clamped_at_the_write_rate() {
        let d = dest("a", Tier::Account, "1", "1", 128_000);
        let b = TokenBounds {
            cache_marked: true,
            audio: false,
            ..one_choice(1_000, 5_000)
        };
        let ceiling: Money = "0.003".parse().unwrap();
        let out = clamp_output(&d, b, ceiling).unwrap();
        assert_eq!(out, 1_000);
        assert_eq!(worst_case(&d, TokenBounds { output: out, ..b }), ceiling);
        assert!(
            arithmetic(&d, b, "USD").contains("2.00"),
            "{}",
            arithmetic(&d, b, "USD")
        );
    }

    #[test]
    fn worst_case_is_exact_arithmetic() {
        let d = dest("a", Tier::Account, "0.15", "0.60", 128_000);
        let b = one_choice(1_000, 4_096);
        // 1000 * 0.15/1e6 + 4096 * 0.60/1e6 = 0.00015 + 0.0024576
        assert_eq!(worst_case(&d, b), "0.0026076".parse().unwrap());
    }

    #[test]
    fn pool_first_then_cheapest_account_for_this_request() {
        // b is cheaper on input, c on output: which is cheaper depends on the request.
        let route = Route {
            pool: vec![dest("pool", Tier::Pool, "0", "0", 8_000)],
            accounts: vec![
                dest("b", Tier::Account, "1", "10", 100_000),
                dest("c", Tier::Account, "5", "2", 100_000),
            ],
            alternate: None,
        };
        let long_input = one_choice(50_000, 100);
        let names: Vec<_> = ordered(&route, |_| Ok(long_input))
            .iter()
            .map(|(d, _)| d.provider.to_string())
            .collect();
        assert_eq!(names, ["pool", "b", "c"]);
        let long_output = one_choice(100, 50_000);
        let names: Vec<_> = ordered(&route, |_| Ok(long_output))
            .iter()
            .map(|(d, _)| d.provider.to_string())
            .collect();
        assert_eq!(names, ["pool", "c", "b"]);
        // The pool's window is too small for the long request: first account wins.
        let s = select(
            &route,
            &ceiling("10", OnExceed::Reject),
            |_| Ok(long_input),
            |_| false,
        )
        .unwrap();
        assert_eq!(s.primary.provider.as_str(), "b");
        assert!(matches!(
            s.considered[0].verdict,
            Verdict::ContextTooSmall { .. }
        ));
    }

    #[test]
    fn over_ceiling_is_refused_or_clamped() {
        let route = Route {
            pool: vec![],
            accounts: vec![dest("a", Tier::Account, "1", "10", 1_000_000)],
            alternate: None,
        };
        let b = one_choice(1_000, 100_000);
        // worst case = 0.001 + 1.0 > 0.5
        let r = select(
            &route,
            &ceiling("0.5", OnExceed::Reject),
            |_| Ok(b),
            |_| false,
        );
        assert!(matches!(r, Err(Refusal::DoesNotFit { .. })));
        let s = select(
            &route,
            &ceiling("0.5", OnExceed::Clamp),
            |_| Ok(b),
            |_| false,
        )
        .unwrap();
        // (0.5 - 0.001) / 0.00001 = 49,900 tokens
        assert_eq!(s.bounds.output, 49_900);
        assert_eq!(s.clamped_from, Some(100_000));
        assert!(s.worst_case <= "0.5".parse().unwrap());
    }

    #[test]
    fn the_refusal_shows_money_in_minor_units() {
        let route = Route {
            pool: vec![],
            accounts: vec![
                dest("a", Tier::Account, "1", "10", 1_000_000),
                dest("small", Tier::Account, "1", "1", 10),
            ],
            alternate: None,
        };
        let b = one_choice(1_000, 100_000);
        let Err(Refusal::DoesNotFit { considered, .. }) = select(
            &route,
            &ceiling("0.5", OnExceed::Reject),
            |_| Ok(b),
            |_| false,
        ) else {
            panic!("fits")
        };
        let m = does_not_fit_message("0.5".parse().unwrap(), "USD", &considered);
        assert_eq!(
            m,
            "worst case exceeds the ceiling of 0.50 USD per request (small/m: needs 101000 tokens, window 10; a/m: 1000 in × 1.00/M + 100000 out × 10.00/M = 1.001); lower max_tokens or shorten the input"
        );
        let two = TokenBounds { choices: 2, ..b };
        assert_eq!(
            arithmetic(&considered[1].destination, two, "USD"),
            "1000 in × 1.00/M + 2 × 100000 out × 10.00/M = 2.001"
        );
    }

    #[test]
    fn open_circuit_is_skipped_unless_every_fit_is_open() {
        let route = Route {
            pool: vec![],
            accounts: vec![
                dest("a", Tier::Account, "1", "1", 100_000),
                dest("b", Tier::Account, "2", "2", 100_000),
            ],
            alternate: None,
        };
        let b = one_choice(10, 10);
        let c = ceiling("1", OnExceed::Reject);
        let s = select(&route, &c, |_| Ok(b), |d| d.provider.as_str() == "a").unwrap();
        assert_eq!(s.primary.provider.as_str(), "b");
        assert!(!s.circuit_open);
        let s = select(&route, &c, |_| Ok(b), |_| true).unwrap();
        assert_eq!(s.primary.provider.as_str(), "a");
        assert!(s.circuit_open);
    }

    #[test]
    fn empty_route_is_no_destination() {
        let route = Route {
            pool: vec![],
            accounts: vec![],
            alternate: None,
        };
        let r = select(
            &route,
            &ceiling("1", OnExceed::Reject),
            |_| Ok(one_choice(1, 1)),
            |_| false,
        );
        assert_eq!(r, Err(Refusal::NoDestination));
    }

    #[test]
    fn bounds_are_per_destination_and_an_unbounded_one_is_passed_over() {
        let route = Route {
            pool: vec![],
            accounts: vec![
                dest("a", Tier::Account, "1", "1", 100_000),
                dest("b", Tier::Account, "1", "1", 100_000),
            ],
            alternate: Some(dest("alt", Tier::Account, "1", "1", 100_000)),
        };
        let b = |input| one_choice(input, 10);
        // `a` receives the request as a longer body (another API's translation).
        let by_dest = |d: &Destination| match d.provider.as_str() {
            "a" => Ok(b(5_000)),
            "b" => Ok(b(1_000)),
            _ => Ok(b(2_000)),
        };
        let s = select(&route, &ceiling("1", OnExceed::Reject), by_dest, |_| false).unwrap();
        assert_eq!(s.primary.provider.as_str(), "b");
        assert_eq!(s.bounds.input, 1_000);
        let alt = s.alternate.clone().unwrap();
        assert_eq!(s.bounds_for(&alt.destination).input, 2_000);
        assert_eq!(s.bounds_for(&s.primary).input, 1_000);

        // Where the request cannot be bounded, the candidate is passed over, named.
        let unbounded = || Unbounded {
            param: "messages[0].content[1]".into(),
            what: "a file part".into(),
        };
        let only_a = |d: &Destination| match d.provider.as_str() {
            "a" => Ok(b(5_000)),
            _ => Err(unbounded()),
        };
        let s = select(&route, &ceiling("1", OnExceed::Reject), only_a, |_| false).unwrap();
        assert_eq!(s.primary.provider.as_str(), "a");
        assert!(
            s.considered
                .iter()
                .any(|c| c.verdict == Verdict::Unbounded(unbounded()))
        );
        let alt = s.alternate.unwrap();
        assert!(!alt.fits);
        assert_eq!(alt.bounds, Err(unbounded()));
        // Nowhere: refused, naming the part.
        let r = select(
            &route,
            &ceiling("1", OnExceed::Reject),
            |_| Err(unbounded()),
            |_| false,
        );
        assert_eq!(r, Err(Refusal::Unbounded(unbounded())));
    }

    #[test]
    fn clamping_leaves_reasoning_beyond_the_cap_in_the_bound() {
        let route = Route {
            pool: vec![],
            accounts: vec![dest("a", Tier::Account, "0", "10", 1_000_000)],
            alternate: None,
        };
        let b = TokenBounds {
            reasoning: 10_000,
            ..one_choice(0, 100_000)
        };
        // 0.5 at 10/M is 50,000 output tokens, 10,000 of them reasoning: a cap of 40,000.
        let s = select(
            &route,
            &ceiling("0.5", OnExceed::Clamp),
            |_| Ok(b),
            |_| false,
        )
        .unwrap();
        assert_eq!(s.bounds.output, 40_000);
        assert_eq!(s.worst_case, "0.5".parse().unwrap());
    }
}
