//! What-if replay: recorded requests run through another plan's key lookup, model
//! allowance, selection and ceiling proof, and its budgets, with no call made. Pure:
//! it is fed `Recorded` requests one at a time (`Replay::push`) in the order the
//! ledger admitted them and keeps only counters and the current budget window of each
//! (policy, period), so a million requests replay in constant memory.
//!
//! It reuses the gateway's decisions (`selection::select`, `Policy::needs_proof`,
//! `Destination::cost`) and re-implements none; what the recorded shape cannot tell
//! (a media part's kind, a field no bound counts, an input never bounded) is counted
//! as refused or unknown, never guessed.

mod render;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

pub use render::{markdown, text};

use crate::ledger::Shape;
use crate::ledger::recorded::{Recorded, Sent};
use crate::money::Money;
use crate::policy::plan::{Destination, Plan, Policy};
use crate::selection::{self, Refusal, Selected, TierAsk, TokenBounds, Unbounded};

/// What the new plan does with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Sent to `primary`; `clamped` when `on_exceed: clamp` lowered its output cap.
    Routed {
        /// Shared: a replay hands the same verdict to every request of one shape.
        primary: Arc<Destination>,
        worst_case: Money,
        output: u64,
        clamped: bool,
    },
    /// Refused with this code, as the gateway would answer it.
    Refused(Code),
    /// Admitted by the new plan, but the recorded shape has no input bound (it never
    /// reached selection before): its destination and cost are not guessed.
    Unknown,
}

/// The gateway's refusal codes a replay can reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Unauthorized,
    ModelNotAllowed,
    InvalidRequest,
    NoDestination,
    CeilingExceeded,
    BudgetExhausted,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Unauthorized => "unauthorized",
            Code::ModelNotAllowed => "model_not_allowed",
            Code::InvalidRequest => "invalid_request",
            Code::NoDestination => "no_destination",
            Code::CeilingExceeded => "ceiling_exceeded",
            Code::BudgetExhausted => "budget_exhausted",
        }
    }
}

/// A move as the replay counts it (destinations apart, so none is formatted per
/// request).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Move {
    from_provider: Option<String>,
    from_model: Option<String>,
    from_jurisdiction: Option<String>,
    /// The code it was refused with before, when it reached no vendor.
    from_code: Option<String>,
    to_provider: String,
    to_model: String,
    to_jurisdiction: String,
}

/// Requests that now go elsewhere: from → to, with their jurisdictions.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Route {
    /// `provider/upstream_model`, or `refused: <code>` for a request refused before.
    pub from: String,
    pub from_jurisdiction: Option<String>,
    pub to: String,
    pub to_jurisdiction: String,
}

impl From<Move> for Route {
    fn from(m: Move) -> Route {
        Route {
            from: match (m.from_provider, m.from_model, m.from_code) {
                (Some(p), Some(model), _) => format!("{p}/{model}"),
                (_, _, code) => format!("refused: {}", code.unwrap_or_default()),
            },
            from_jurisdiction: m.from_jurisdiction,
            to: format!("{}/{}", m.to_provider, m.to_model),
            to_jurisdiction: m.to_jurisdiction,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Moved {
    #[serde(flatten)]
    pub route: Route,
    pub requests: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refused {
    pub code: Code,
    pub requests: u64,
}

/// Money before and after, billed apart from what is charged at worst case.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Spend {
    /// Billed from the vendors' usage, as recorded.
    pub billed_before: Money,
    /// The same tokens at the new destination's prices (zero where the new plan
    /// refuses the request).
    pub billed_after: Money,
    /// `billed_after - billed_before`, exact.
    pub delta: Money,
    /// Charged at worst case (usage missing, or maybe billed), as recorded.
    pub worst_case_before: Money,
    /// The new destination's worst case for those requests, and for requests the new
    /// plan admits that never reached a vendor before (what they would hold).
    pub worst_case_after: Money,
}

/// A window in which a budget of the new plan ran out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exhausted {
    pub window_start: String,
    /// When the first request was refused in it.
    pub ran_out_at: String,
    /// Requests refused in it.
    pub refused: u64,
    /// What the window had been charged when it ran out.
    pub charged: Money,
}

/// One budget of the new plan over the replayed span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetRun {
    pub policy: String,
    pub period: &'static str,
    pub limit: Money,
    pub windows: u64,
    pub exhausted: Vec<Exhausted>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub plan_id: String,
    pub currency: String,
    /// Requests read from the ledger.
    pub read: u64,
    /// Rows without a shape (written before the ledger recorded it): skipped.
    pub skipped_no_shape: u64,
    /// Sent to the same destination as before.
    pub same_destination: u64,
    /// Refused before and now, with the same code.
    pub still_refused: u64,
    /// Sent elsewhere (including requests refused before and admitted now), most
    /// requests first.
    pub moved: Vec<Moved>,
    /// Newly refused, by code (served before, or refused with another code).
    pub refused: Vec<Refused>,
    /// Admitted, with an output cap lowered to fit the ceiling other than before.
    pub clamped: u64,
    /// Admitted now, but the recorded shape has no input bound: not guessed.
    pub unknown: u64,
    pub spend: Spend,
    pub budgets: Vec<BudgetRun>,
}

impl Report {
    /// Requests whose fate changes: moved, newly refused, newly clamped, unknown.
    pub fn changes(&self) -> u64 {
        self.moved.iter().map(|m| m.requests).sum::<u64>()
            + self.refused.iter().map(|r| r.requests).sum::<u64>()
            + self.clamped
            + self.unknown
    }
}

/// The running window of one budget.
struct Window {
    policy: String,
    budget: crate::policy::plan::Budget,
    /// The window's (year, month, day; 0 for a month) and its start as text.
    start: Option<((i32, u8, u8), String)>,
    charged: Money,
    windows: u64,
    exhausted: Vec<Exhausted>,
}

/// A replay in progress.
pub struct Replay<'p> {
    /// Client id → the policies that list it (a key is not recorded, its client is).
    clients: HashMap<String, Vec<&'p Policy>>,
    windows: Vec<Window>,
    moved: Vec<(Move, u64)>,
    refused: BTreeMap<Code, u64>,
    /// Verdicts by (policy, model, shape): `decide` is pure, and recorded traffic has
    /// far fewer shapes than requests. Cleared when it reaches `MEMO` entries, so
    /// memory stays bounded whatever the ledger holds.
    memo: HashMap<&'p str, HashMap<String, HashMap<MemoKey, Verdict>>>,
    memo_len: usize,
    report: Report,
}

/// A shape, and where it went when that can change the verdict (media, bounded where
/// it went).
type MemoKey = (Shape, Option<(String, String)>);

const MEMO: usize = 1 << 16;

impl<'p> Replay<'p> {
    pub fn new(plan: &'p Plan) -> Replay<'p> {
        let mut clients: HashMap<String, Vec<&Policy>> = HashMap::new();
        let mut windows = Vec::new();
        for p in plan.policies() {
            for c in &p.clients {
                clients.entry(c.id.to_string()).or_default().push(p);
            }
            for b in &p.budgets {
                windows.push(Window {
                    policy: p.id.to_string(),
                    budget: *b,
                    start: None,
                    charged: Money::ZERO,
                    windows: 0,
                    exhausted: Vec::new(),
                });
            }
        }
        Replay {
            clients,
            windows,
            moved: Vec::new(),
            refused: BTreeMap::new(),
            memo: HashMap::new(),
            memo_len: 0,
            report: Report {
                plan_id: plan.id().to_string(),
                currency: plan.currency().to_string(),
                ..Report::default()
            },
        }
    }

    /// Replay one request (in ledger order: budgets are counted as they go).
    pub fn push(&mut self, r: &Recorded) {
        self.report.read += 1;
        let Some(shape) = r.shape else {
            self.report.skipped_no_shape += 1;
            return;
        };
        let (policy, verdict) = match self.policy_of(r) {
            None => (None, Verdict::Refused(Code::Unauthorized)),
            Some(p) => (Some(p), self.decided(p, r, &shape)),
        };
        let verdict = match (policy, verdict) {
            (
                Some(p),
                Verdict::Routed {
                    primary,
                    worst_case,
                    output,
                    clamped,
                },
            ) => {
                let charge = charge_of(r, &primary, worst_case);
                if self.admit(p, r, worst_case, charge) {
                    Verdict::Routed {
                        primary,
                        worst_case,
                        output,
                        clamped,
                    }
                } else {
                    Verdict::Refused(Code::BudgetExhausted)
                }
            }
            (_, v) => v,
        };
        self.count(r, &shape, &verdict);
    }

    /// `decide`, remembered.
    fn decided(&mut self, p: &'p Policy, r: &Recorded, shape: &Shape) -> Verdict {
        let before = if shape.media {
            r.primary
                .as_ref()
                .map(|s| (s.provider.clone(), s.upstream_model.clone()))
        } else {
            None
        };
        let key = (*shape, before);
        if let Some(v) = self
            .memo
            .get(p.id.as_str())
            .and_then(|models| models.get(r.model.as_str()))
            .and_then(|shapes| shapes.get(&key))
        {
            return v.clone();
        }
        let v = decide(p, &r.model, shape, r.primary.as_ref());
        if self.memo_len >= MEMO {
            self.memo.clear();
            self.memo_len = 0;
        }
        self.memo
            .entry(p.id.as_str())
            .or_default()
            .entry(r.model.clone())
            .or_default()
            .insert(key, v.clone());
        self.memo_len += 1;
        v
    }

    /// The new plan's policy for the request's client: its recorded policy if that
    /// still lists the client, else the one policy that does.
    fn policy_of(&self, r: &Recorded) -> Option<&'p Policy> {
        let listed = self.clients.get(&r.client)?;
        listed
            .iter()
            .find(|p| p.id.as_str() == r.policy)
            .or_else(|| listed.first())
            .copied()
    }

    /// Admission against the new plan's budgets of `p`: false (nothing charged) when
    /// any window has no room for `worst_case`, as the ledger refuses it.
    fn admit(&mut self, p: &Policy, r: &Recorded, worst_case: Money, charge: Money) -> bool {
        let mine = |w: &Window| w.policy == p.id.as_str();
        let mut fits = true;
        for w in self.windows.iter_mut().filter(|w| mine(w)) {
            // Compared as numbers: a window's text is made once, when it starts.
            let t = r.received_at.to_offset(time::UtcOffset::UTC);
            let key = match w.budget.period {
                crate::policy::plan::Period::Day => (t.year(), u8::from(t.month()), t.day()),
                crate::policy::plan::Period::Month => (t.year(), u8::from(t.month()), 0),
            };
            if w.start.as_ref().map(|(k, _)| *k) != Some(key) {
                let text = crate::ledger::window_start(w.budget.period, r.received_at);
                w.start = Some((key, text));
                w.charged = Money::ZERO;
                w.windows += 1;
            }
            if w.charged + worst_case > w.budget.limit {
                fits = false;
            }
        }
        for w in self.windows.iter_mut().filter(|w| mine(w)) {
            if fits {
                w.charged = w.charged + charge;
                continue;
            }
            if w.charged + worst_case <= w.budget.limit {
                continue;
            }
            let start = w.start.as_ref().map(|(_, s)| s.clone()).unwrap_or_default();
            match w.exhausted.last_mut() {
                Some(e) if e.window_start == start => e.refused += 1,
                Some(_) | None => w.exhausted.push(Exhausted {
                    window_start: start,
                    ran_out_at: crate::ledger::rfc3339(r.received_at),
                    refused: 1,
                    charged: w.charged,
                }),
            }
        }
        fits
    }

    fn count(&mut self, r: &Recorded, shape: &Shape, verdict: &Verdict) {
        let report = &mut self.report;
        report.spend.billed_before = report.spend.billed_before + r.billed;
        report.spend.worst_case_before = report.spend.worst_case_before + r.worst_case;
        let before_code = || r.error_code.clone().unwrap_or_else(|| r.outcome.clone());
        match verdict {
            Verdict::Routed {
                primary,
                worst_case,
                output,
                clamped,
            } => {
                let after = primary.cost(r.input_tokens, r.output_tokens);
                report.spend.billed_after = report.spend.billed_after + after;
                if r.worst_case.is_positive() || r.primary.is_none() {
                    report.spend.worst_case_after = report.spend.worst_case_after + *worst_case;
                }
                if *clamped && shape.output_bound != Some(*output) {
                    report.clamped += 1;
                }
                let same = r.primary.as_ref().is_some_and(|s| {
                    s.provider == primary.provider.as_str()
                        && s.upstream_model == primary.upstream_model
                });
                if same {
                    report.same_destination += 1;
                } else {
                    // Few distinct moves: found by comparing in place, allocated once.
                    let from_code = r.primary.is_none().then(before_code);
                    let is = |m: &Move| {
                        m.to_provider == primary.provider.as_str()
                            && m.to_model == primary.upstream_model
                            && match (&r.primary, &from_code) {
                                (Some(s), _) => {
                                    m.from_provider.as_deref() == Some(s.provider.as_str())
                                        && m.from_model.as_deref()
                                            == Some(s.upstream_model.as_str())
                                }
                                (None, code) => m.from_provider.is_none() && m.from_code == *code,
                            }
                    };
                    match self.moved.iter_mut().find(|(m, _)| is(m)) {
                        Some((_, n)) => *n += 1,
                        None => self.moved.push((
                            Move {
                                from_provider: r.primary.as_ref().map(|s| s.provider.clone()),
                                from_model: r.primary.as_ref().map(|s| s.upstream_model.clone()),
                                from_jurisdiction: r
                                    .primary
                                    .as_ref()
                                    .map(|s| s.jurisdiction.clone()),
                                from_code,
                                to_provider: primary.provider.to_string(),
                                to_model: primary.upstream_model.clone(),
                                to_jurisdiction: primary.jurisdiction.to_string(),
                            },
                            1,
                        )),
                    }
                }
            }
            Verdict::Refused(code) => {
                let was = r.primary.is_none()
                    && r.error_code.as_deref().unwrap_or(&r.outcome) == code.as_str();
                if was {
                    report.still_refused += 1;
                } else {
                    *self.refused.entry(*code).or_default() += 1;
                }
            }
            Verdict::Unknown => report.unknown += 1,
        }
    }

    pub fn finish(self) -> Report {
        let mut report = self.report;
        report.spend.delta = report.spend.billed_after - report.spend.billed_before;
        let mut moved: Vec<Moved> = self
            .moved
            .into_iter()
            .map(|(m, requests)| Moved {
                route: m.into(),
                requests,
            })
            .collect();
        moved.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then_with(|| a.route.cmp(&b.route))
        });
        report.moved = moved;
        report.refused = self
            .refused
            .into_iter()
            .map(|(code, requests)| Refused { code, requests })
            .collect();
        report.budgets = self
            .windows
            .into_iter()
            .map(|w| BudgetRun {
                policy: w.policy,
                period: w.budget.period.as_str(),
                limit: w.budget.limit,
                windows: w.windows,
                exhausted: w.exhausted,
            })
            .collect();
        report
    }
}

/// What the budgets are charged for a request the new plan admits: its recorded
/// tokens at the new destination's prices, and its worst case where it was charged at
/// worst case before or never reached a vendor (what it would hold).
fn charge_of(r: &Recorded, primary: &Destination, worst_case: Money) -> Money {
    let billed = primary.cost(r.input_tokens, r.output_tokens);
    if r.worst_case.is_positive() || r.primary.is_none() {
        billed + worst_case
    } else {
        billed
    }
}

/// The new plan's model allowance, selection and ceiling proof for a recorded shape,
/// every circuit closed (no call is made, so none opens). `before` is where the
/// request went: its recorded input bound was proved there.
pub fn decide(policy: &Policy, model: &str, shape: &Shape, before: Option<&Sent>) -> Verdict {
    let Some(route) = policy.routes.get(model) else {
        return Verdict::Refused(Code::ModelNotAllowed);
    };
    let strict = policy.needs_proof();
    // A field no bound counts was admitted only where no proof was needed: the shape
    // does not say which, so a policy that needs a proof refuses it, as the gateway would.
    if strict && shape.unbounded {
        return Verdict::Refused(Code::InvalidRequest);
    }
    if route.is_empty() {
        return Verdict::Refused(Code::NoDestination);
    }
    let Some(input) = shape.input_tokens else {
        // Never bounded before (refused before selection proved anything): under a
        // proof it cannot be bounded from the shape; elsewhere it is not guessed.
        return if strict {
            Verdict::Refused(Code::InvalidRequest)
        } else {
            Verdict::Unknown
        };
    };
    let went_there = |d: &Destination| {
        before.is_some_and(|s| {
            s.provider == d.provider.as_str() && s.upstream_model == d.upstream_model
        })
    };
    let output = shape.requested_output.unwrap_or(policy.max_output_tokens);
    let bounds_of = |d: &Destination| -> Result<TokenBounds, Unbounded> {
        if strict && d.unpriced_call_fee() {
            return Err(selection::unpriced_call_fee());
        }
        // The shape records that media was sent, not its kinds: under a proof, only the
        // destination that bounded it before, or one that declares a bound for every
        // kind, can bound it.
        // A part of unknown kind may be audio, which needs its rate where audio is taken.
        let audio_unpriced = crate::upstream::bound::may_be_audio(d.api, None)
            && d.terms.audio_input_per_mtok.is_none();
        if strict
            && shape.media
            && !went_there(d)
            && (d.terms.media_tokens.bound(None).is_none() || audio_unpriced)
        {
            return Err(Unbounded {
                param: "messages".into(),
                what: "a media part recorded without its kind, and the destination does not declare every kind in `media_tokens` (and `audio_input_per_mtok`, where audio is taken)".into(),
            });
        }
        Ok(TokenBounds {
            input,
            output,
            reasoning: d.reasoning_budget().unwrap_or(0),
            choices: shape.choices.max(1),
            // The service tier asked for is not in the shape: as for a request that
            // names none, any tier the model declares may be served.
            tier: TierAsk::VendorPicks,
            // Nor are cache marks: the rates of a request that asked for no write.
            cache_marked: false,
            // Media of unknown kind may be audio: at the audio rate where one is listed.
            audio: shape.media && d.terms.audio_input_per_mtok.is_some(),
        })
    };
    match selection::select(route, &policy.ceiling, bounds_of, |_| false) {
        Ok(Selected {
            primary,
            worst_case,
            bounds,
            clamped_from,
            ..
        }) => Verdict::Routed {
            primary: Arc::new(primary),
            worst_case,
            output: bounds.output,
            clamped: clamped_from.is_some(),
        },
        Err(Refusal::NoDestination) => Verdict::Refused(Code::NoDestination),
        Err(Refusal::Unbounded(_)) => Verdict::Refused(Code::InvalidRequest),
        Err(Refusal::DoesNotFit { .. }) => Verdict::Refused(Code::CeilingExceeded),
    }
}

/// Replay every recorded request of `span` in `ledger` through `plan`, batch by batch
/// as the ledger yields them.
pub async fn over(
    ledger: &crate::ledger::Ledger,
    plan: &Plan,
    span: crate::ledger::recorded::Span,
) -> Result<Report, crate::ledger::LedgerError> {
    let mut batches = ledger.recorded(span);
    let mut replay = Replay::new(plan);
    while let Some(batch) = batches.recv().await {
        for r in &batch? {
            replay.push(r);
        }
    }
    Ok(replay.finish())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

    use super::*;
    use crate::ledger::recorded::{Flat, FlatAttempt, Folder};

    /// A plan of one policy `p` (client `c`) over two vendors: `a` in the US (declares
    /// no media bound) and `b` in the EU (declares every kind, and the audio rate).
    fn plan(policy_extra: &str) -> Plan {
        let dir = tempfile::tempdir().unwrap();
        let set = format!(
            "kind: gateway\ncurrency: USD\n---\nkind: provider\nid: a\napi: openai\nbase_url: http://127.0.0.1:9/a\njurisdiction: us\nmodels:\n  m:\n    context_window: 100000\n    input_per_mtok: \"1\"\n    output_per_mtok: \"2\"\n---\nkind: provider\nid: b\napi: openai\nbase_url: http://127.0.0.1:9/b\njurisdiction: eu\nmodels:\n  m:\n    context_window: 100000\n    input_per_mtok: \"3\"\n    output_per_mtok: \"6\"\n    media_tokens: {{ image: 1000, audio: 1000, video: 1000, file: 1000 }}\n    audio_input_per_mtok: \"30\"\n---\nkind: policy\nid: p\nclients:\n  - {{ id: c, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [eu, us]\nmax_output_tokens: 100\n{policy_extra}\n",
            "0".repeat(64)
        );
        std::fs::write(dir.path().join("set.yaml"), set).unwrap();
        crate::policy::compile_dir(dir.path()).unwrap()
    }

    fn shape() -> Shape {
        Shape {
            input_tokens: Some(1000),
            requested_output: None,
            output_bound: Some(100),
            choices: 1,
            stream: false,
            tools: false,
            media: false,
            unbounded: false,
        }
    }

    fn sent(p: &str) -> Sent {
        Sent {
            provider: p.into(),
            upstream_model: "m".into(),
            jurisdiction: "us".into(),
        }
    }

    fn to(v: &Verdict) -> &str {
        match v {
            Verdict::Routed { primary, .. } => primary.provider.as_str(),
            Verdict::Refused(c) => c.as_str(),
            Verdict::Unknown => "unknown",
        }
    }

    const HARD: &str = "ceiling: { per_request: \"1\", mode: hard }";
    const SOFT: &str = "ceiling: { per_request: \"1\", mode: soft }";

    #[test]
    fn the_cheapest_fitting_destination_is_chosen() {
        let plan = plan(HARD);
        let p = plan.policy("p").unwrap();
        assert_eq!(to(&decide(p, "m", &shape(), None)), "a");
        assert_eq!(to(&decide(p, "x", &shape(), None)), "model_not_allowed");
    }

    /// Media recorded without its kind: bounded where it went before, or where every
    /// kind is declared; elsewhere refused under a proof, never guessed.
    #[test]
    fn media_is_bounded_only_where_it_can_be() {
        let plan = plan(HARD);
        let p = plan.policy("p").unwrap();
        let media = Shape {
            media: true,
            ..shape()
        };
        assert_eq!(to(&decide(p, "m", &media, Some(&sent("a")))), "a");
        assert_eq!(to(&decide(p, "m", &media, Some(&sent("gone")))), "b");
        let soft = plan_soft();
        let p = soft.policy("p").unwrap();
        assert_eq!(to(&decide(p, "m", &media, None)), "a", "no proof needed");
    }

    fn plan_soft() -> Plan {
        plan(SOFT)
    }

    /// A field no bound counts, or an input never bounded: refused under a proof,
    /// not guessed without one.
    #[test]
    fn what_the_shape_cannot_bound_is_not_guessed() {
        let hard = plan(HARD);
        let soft = plan_soft();
        let unbounded = Shape {
            unbounded: true,
            ..shape()
        };
        let never = Shape {
            input_tokens: None,
            ..shape()
        };
        let (h, s) = (hard.policy("p").unwrap(), soft.policy("p").unwrap());
        assert_eq!(to(&decide(h, "m", &unbounded, None)), "invalid_request");
        assert_eq!(to(&decide(s, "m", &unbounded, None)), "a");
        assert_eq!(to(&decide(h, "m", &never, None)), "invalid_request");
        assert_eq!(to(&decide(s, "m", &never, None)), "unknown");
    }

    fn flat(id: &str, attempt: Option<(u32, &str, Option<&str>, &str, &str)>) -> Flat {
        Flat {
            request: Recorded {
                id: id.into(),
                received_at: time::OffsetDateTime::UNIX_EPOCH,
                client: "c".into(),
                policy: "p".into(),
                model: "m".into(),
                outcome: "served".into(),
                error_code: None,
                shape: Some(shape()),
                primary: None,
                input_tokens: 0,
                output_tokens: 0,
                billed: Money::ZERO,
                worst_case: Money::ZERO,
            },
            attempt: attempt.map(|(seq, billing, basis, cost, wc)| FlatAttempt {
                seq,
                sent: sent(if seq == 1 { "a" } else { "b" }),
                billing: billing.into(),
                cost_basis: basis.map(str::to_string),
                input_tokens: Some(10),
                output_tokens: Some(5),
                cost: cost.parse().unwrap(),
                worst_case: wc.parse().unwrap(),
            }),
        }
    }

    /// A request's rows fold into one: the first attempt is where selection sent it;
    /// usage-billed attempts are billed with their tokens, the rest at worst case.
    #[test]
    fn rows_fold_into_requests_with_billed_apart_from_worst_case() {
        let mut f = Folder::default();
        let rows = [
            flat("r1", Some((1, "maybe_billed", None, "0", "0.5"))),
            flat("r1", Some((2, "billed", Some("usage"), "0.01", "0.4"))),
            flat("r2", Some((1, "billed", Some("worst_case"), "0.3", "0.3"))),
            flat("r3", None),
        ];
        let mut done = Vec::new();
        for row in rows {
            done.extend(f.push(row).unwrap());
        }
        done.extend(f.finish());
        assert_eq!(done.len(), 3);
        let (r1, r2, r3) = (&done[0], &done[1], &done[2]);
        assert_eq!(r1.primary.as_ref().unwrap().provider, "a");
        assert_eq!(r1.billed, "0.01".parse().unwrap());
        assert_eq!((r1.input_tokens, r1.output_tokens), (10, 5));
        assert_eq!(r1.worst_case, "0.5".parse().unwrap());
        assert_eq!(r2.billed, Money::ZERO);
        assert_eq!(
            r2.input_tokens, 0,
            "tokens of a worst-case charge are not usage"
        );
        assert_eq!(r2.worst_case, "0.3".parse().unwrap());
        assert!(r3.primary.is_none());
    }
}
