//! Selection: (plan route, request bounds) → the primary destination and the alternate.
//!
//! Pure: no I/O, no clock. The circuit state comes in as a predicate so that the same
//! function serves the gateway and `purser explain`.

use serde::Serialize;

use crate::money::Money;
use crate::policy::plan::{Ceiling, Destination, OnExceed, Route};

/// Tokens added per message for role markers and chat-template framing. Generous on
/// purpose: OpenAI documents 3-4, Anthropic and Gemini templates a few more.
pub const PER_MESSAGE_OVERHEAD: u64 = 32;
/// Tokens added once per request (reply priming, tool preamble framing).
pub const PER_REQUEST_OVERHEAD: u64 = 64;

/// Upper bounds on the tokens one call can consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenBounds {
    pub input: u64,
    /// Per choice: the cap forwarded to the vendor.
    pub output: u64,
    /// Choices asked for (`n`): each may reach the output cap.
    pub choices: u64,
}

impl TokenBounds {
    /// Output tokens of every choice together: what the output side can cost.
    pub fn total_output(&self) -> u64 {
        self.output.saturating_mul(self.choices.max(1))
    }
}

/// Provable input-token bound: no byte-level tokenizer emits more tokens than UTF-8
/// bytes, so bytes of all text sent plus fixed framing bounds every tokenizer.
pub fn input_bound(text_bytes: u64, messages: u64) -> u64 {
    text_bytes
        .saturating_add(messages.saturating_mul(PER_MESSAGE_OVERHEAD))
        .saturating_add(PER_REQUEST_OVERHEAD)
}

/// Worst-case cost of one call to `d` with these bounds.
pub fn worst_case(d: &Destination, b: TokenBounds) -> Money {
    // Any input token may be billed in any input-side class (a cache write can cost
    // more than plain input), so the input bound is priced at the dearest of them.
    // Reasoning tokens are output tokens, already inside the output bound.
    d.input_rate_ceiling().cost_of(b.input) + d.output_per_mtok.cost_of(b.total_output())
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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Considered {
    pub destination: Destination,
    pub worst_case: Money,
    pub verdict: Verdict,
}

/// The alternate and whether it could take the request within the ceiling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AlternateFit {
    pub destination: Destination,
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
    pub bounds: TokenBounds,
    /// `Some(original)` when `on_exceed: clamp` lowered the output bound to fit.
    pub clamped_from: Option<u64>,
    pub alternate: Option<AlternateFit>,
    pub considered: Vec<Considered>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum Refusal {
    /// No destination serves the model in the policy's jurisdictions.
    NoDestination,
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
    // With `n` choices each may reach the output cap: say so, so the sum adds up.
    let out = if b.choices > 1 {
        format!("{} × {}", b.choices, b.output)
    } else {
        b.output.to_string()
    };
    format!(
        "{} in × {}/M + {out} out × {}/M = {}",
        b.input,
        // The dearest input-side rate: the one the worst case is proved with.
        d.input_rate_ceiling().for_people(currency),
        d.output_per_mtok.for_people(currency),
        worst_case(d, b).for_people(currency)
    )
}

/// The message a client reads when no candidate fits the ceiling: the ceiling and each
/// candidate's arithmetic (or its window), so the refusal explains itself.
pub fn does_not_fit_message(
    ceiling: Money,
    currency: &str,
    bounds: TokenBounds,
    considered: &[Considered],
) -> String {
    let detail: Vec<String> = considered
        .iter()
        .map(|c| match &c.verdict {
            Verdict::ContextTooSmall { needed, window } => format!(
                "{}: needs {needed} tokens, window {window}",
                c.destination.label()
            ),
            Verdict::Chosen
            | Verdict::NotNeeded
            | Verdict::OverCeiling { .. }
            | Verdict::CircuitOpen => {
                format!(
                    "{}: {}",
                    c.destination.label(),
                    arithmetic(&c.destination, bounds, currency)
                )
            }
        })
        .collect();
    format!(
        "worst case exceeds the ceiling of {} {currency} per request ({}); lower max_tokens or shorten the input",
        ceiling.for_people(currency),
        detail.join("; ")
    )
}

/// Candidates in selection order: pool first (plan order), then accounts cheapest-first
/// for this request's bounds (ties by provider id, so the order is stable).
pub fn ordered(route: &Route, bounds: TokenBounds) -> Vec<(Destination, Money)> {
    let mut accounts: Vec<(Destination, Money)> = route
        .accounts
        .iter()
        .map(|d| (d.clone(), worst_case(d, bounds)))
        .collect();
    accounts.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.provider.cmp(&b.0.provider)));
    route
        .pool
        .iter()
        .map(|d| (d.clone(), worst_case(d, bounds)))
        .chain(accounts)
        .collect()
}

fn verdict(d: &Destination, wc: Money, b: TokenBounds, ceiling: &Ceiling) -> Option<Verdict> {
    let needed = b.input.saturating_add(b.output);
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

/// The largest per-choice output bound (≥ 1) that makes a call to `d` with `choices`
/// choices fit the ceiling and the window.
pub fn clamp_output(
    d: &Destination,
    input: u64,
    choices: u64,
    ceiling: Money,
    requested: u64,
) -> Option<u64> {
    let input_cost = d.input_rate_ceiling().cost_of(input);
    if input_cost > ceiling || input >= d.context_window {
        return None;
    }
    let room = ceiling.saturating_sub(input_cost);
    // One more output token per choice costs `choices` tokens.
    let per_token = d.output_per_mtok.cost_of(choices.max(1));
    let by_money = if per_token.is_positive() {
        let n = (room.decimal() / per_token.decimal()).floor();
        u64::try_from(n).unwrap_or(u64::MAX)
    } else {
        u64::MAX
    };
    let by_window = d.context_window - input;
    let out = requested.min(by_money).min(by_window);
    (out >= 1).then_some(out)
}

/// Select the primary for a request: the first candidate that fits and whose circuit is
/// closed; if every fitting candidate is open, the first fitting one (recorded as
/// `circuit_open`).
pub fn select(
    route: &Route,
    ceiling: &Ceiling,
    bounds: TokenBounds,
    circuit_open: impl Fn(&Destination) -> bool,
) -> Result<Selected, Refusal> {
    if route.is_empty() {
        return Err(Refusal::NoDestination);
    }
    let (chosen, considered, bounds, clamped_from) =
        match pick(route, ceiling, bounds, &circuit_open) {
            Ok((i, considered)) => (i, considered, bounds, None),
            Err(considered) => {
                let clamped = match ceiling.on_exceed {
                    OnExceed::Reject => None,
                    OnExceed::Clamp => ordered(route, bounds).iter().find_map(|(d, _)| {
                        clamp_output(
                            d,
                            bounds.input,
                            bounds.choices,
                            ceiling.per_request,
                            bounds.output,
                        )
                        .map(|out| TokenBounds {
                            output: out,
                            ..bounds
                        })
                    }),
                };
                match clamped
                    .and_then(|b| pick(route, ceiling, b, &circuit_open).ok().map(|r| (r, b)))
                {
                    Some(((i, considered), b)) => (i, considered, b, Some(bounds.output)),
                    None => {
                        let cheapest = considered.iter().map(|c| c.worst_case).min();
                        return Err(Refusal::DoesNotFit {
                            cheapest_worst_case: cheapest,
                            considered,
                        });
                    }
                }
            }
        };
    let primary = considered[chosen].destination.clone();
    let worst = considered[chosen].worst_case;
    let open = considered[chosen].verdict == Verdict::CircuitOpen;
    let alternate = route.alternate.as_ref().map(|a| {
        let wc = worst_case(a, bounds);
        AlternateFit {
            destination: a.clone(),
            worst_case: wc,
            fits: verdict(a, wc, bounds, ceiling).is_none(),
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
    route: &Route,
    ceiling: &Ceiling,
    bounds: TokenBounds,
    circuit_open: &impl Fn(&Destination) -> bool,
) -> Result<(usize, Vec<Considered>), Vec<Considered>> {
    let mut considered = Vec::new();
    let mut chosen = None;
    let mut first_fit_open = None;
    for (i, (d, wc)) in ordered(route, bounds).into_iter().enumerate() {
        let v = match verdict(&d, wc, bounds, ceiling) {
            Some(v) => v,
            None if chosen.is_some() => Verdict::NotNeeded,
            None if circuit_open(&d) => {
                first_fit_open.get_or_insert(i);
                Verdict::CircuitOpen
            }
            None => {
                chosen = Some(i);
                Verdict::Chosen
            }
        };
        considered.push(Considered {
            destination: d,
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
        }
    }

    fn ceiling(c: &str, on_exceed: OnExceed) -> Ceiling {
        Ceiling {
            per_request: c.parse().unwrap(),
            mode: Mode::Hard,
            on_exceed,
        }
    }

    #[test]
    fn worst_case_is_exact_arithmetic() {
        let d = dest("a", Tier::Account, "0.15", "0.60", 128_000);
        let b = TokenBounds {
            input: 1_000,
            output: 4_096,
            choices: 1,
        };
        // 1000 * 0.15/1e6 + 4096 * 0.60/1e6 = 0.00015 + 0.0024576
        assert_eq!(worst_case(&d, b), "0.0026076".parse().unwrap());
        assert_eq!(input_bound(100, 2), 100 + 64 + 64);
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
        let long_input = TokenBounds {
            input: 50_000,
            output: 100,
            choices: 1,
        };
        let names: Vec<_> = ordered(&route, long_input)
            .iter()
            .map(|(d, _)| d.provider.to_string())
            .collect();
        assert_eq!(names, ["pool", "b", "c"]);
        let long_output = TokenBounds {
            input: 100,
            output: 50_000,
            choices: 1,
        };
        let names: Vec<_> = ordered(&route, long_output)
            .iter()
            .map(|(d, _)| d.provider.to_string())
            .collect();
        assert_eq!(names, ["pool", "c", "b"]);
        // The pool's window is too small for the long request: first account wins.
        let s = select(&route, &ceiling("10", OnExceed::Reject), long_input, |_| {
            false
        })
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
        let b = TokenBounds {
            input: 1_000,
            output: 100_000,
            choices: 1,
        };
        // worst case = 0.001 + 1.0 > 0.5
        let r = select(&route, &ceiling("0.5", OnExceed::Reject), b, |_| false);
        assert!(matches!(r, Err(Refusal::DoesNotFit { .. })));
        let s = select(&route, &ceiling("0.5", OnExceed::Clamp), b, |_| false).unwrap();
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
        let b = TokenBounds {
            input: 1_000,
            output: 100_000,
            choices: 1,
        };
        let Err(Refusal::DoesNotFit { considered, .. }) =
            select(&route, &ceiling("0.5", OnExceed::Reject), b, |_| false)
        else {
            panic!("fits")
        };
        let m = does_not_fit_message("0.5".parse().unwrap(), "USD", b, &considered);
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
        let b = TokenBounds {
            input: 10,
            output: 10,
            choices: 1,
        };
        let c = ceiling("1", OnExceed::Reject);
        let s = select(&route, &c, b, |d| d.provider.as_str() == "a").unwrap();
        assert_eq!(s.primary.provider.as_str(), "b");
        assert!(!s.circuit_open);
        let s = select(&route, &c, b, |_| true).unwrap();
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
            TokenBounds {
                input: 1,
                output: 1,
                choices: 1,
            },
            |_| false,
        );
        assert_eq!(r, Err(Refusal::NoDestination));
    }
}
