//! The compiled plan: the immutable, validated form of a policy set that the gateway
//! runs. Built only by `compile`; identified by a content hash (`plan_id`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::diagnostic::Diagnostic;
pub use super::raw::{Api, CapField, Mode, OnExceed, Period, ServiceTier, Tier};
use crate::ids::{ClientId, Jurisdiction, ModelName, PolicyId, ProviderId};
use crate::money::{Money, PricePerMTok};

/// Circuit breaker settings of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CircuitConfig {
    pub failures: u32,
    pub window_s: u64,
    pub cooldown_s: u64,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        CircuitConfig {
            failures: 5,
            window_s: 30,
            cooldown_s: 30,
        }
    }
}

/// Where a provider's key comes from. The key itself is never in the plan.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Credential {
    Env(String),
    File(String),
}

/// One model as served by one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderModel {
    pub upstream: String,
    pub context_window: u64,
    pub input_per_mtok: PricePerMTok,
    pub output_per_mtok: PricePerMTok,
    /// Input tokens read from the vendor's prompt cache; `None`: not in the price table.
    /// Skipped when absent so plans written before these rates keep their `plan_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<PricePerMTok>,
    /// Input tokens written to the vendor's prompt cache; `None`: not in the price table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<PricePerMTok>,
    /// Everything else the model entry declares: cap field, reasoning budget, media
    /// bounds, price tiers. Flattened and skipped when unset, so plans written before
    /// these fields keep their `plan_id`.
    #[serde(flatten)]
    pub terms: ModelTerms,
}

/// What a part of this kind may cost in tokens cannot be read from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaKind {
    Image,
    Audio,
    Video,
    File,
}

impl MediaKind {
    pub const ALL: [MediaKind; 4] = [
        MediaKind::Image,
        MediaKind::Audio,
        MediaKind::Video,
        MediaKind::File,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Audio => "audio",
            MediaKind::Video => "video",
            MediaKind::File => "file",
        }
    }
}

/// Token bounds a model entry declares per media part (`media_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MediaTokens {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<u64>,
}

impl MediaTokens {
    pub fn is_empty(&self) -> bool {
        *self == MediaTokens::default()
    }

    pub fn get(&self, kind: MediaKind) -> Option<u64> {
        match kind {
            MediaKind::Image => self.image,
            MediaKind::Audio => self.audio,
            MediaKind::Video => self.video,
            MediaKind::File => self.file,
        }
    }

    /// The declared bound of one part: of its kind, or, when its kind cannot be told
    /// (a remote URL of unknown type), the largest of all kinds, which needs all four.
    pub fn bound(&self, kind: Option<MediaKind>) -> Option<u64> {
        match kind {
            Some(k) => self.get(k),
            None => MediaKind::ALL
                .iter()
                .map(|k| self.get(*k))
                .try_fold(0u64, |top, b| b.map(|b| top.max(b))),
        }
    }
}

/// A set of per-token rates (a long-context tier, a service tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rates {
    pub input_per_mtok: PricePerMTok,
    pub output_per_mtok: PricePerMTok,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<PricePerMTok>,
}

/// Rates that replace the base ones for a call whose input exceeds a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LongContext {
    pub above_input_tokens: u64,
    #[serde(flatten)]
    pub rates: Rates,
}

/// The optional parts of a model entry; all default to "not declared".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModelTerms {
    /// Anthropic's 1-hour cache writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_1h_per_mtok: Option<PricePerMTok>,
    /// `None`: by family (see `Destination::cap_field`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_field: Option<CapField>,
    /// `None`: by family (see `Destination::reasoning_budget`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_budget: Option<u64>,
    #[serde(skip_serializing_if = "MediaTokens::is_empty")]
    pub media_tokens: MediaTokens,
    /// A fee every call is billed beyond its tokens (a model that searches the web on
    /// every call): in the worst case and the charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fee_per_call: Option<Money>,
    /// Audio input tokens' own rate: without it an audio part has no bound, since
    /// vendors bill audio above text (OpenAI's audio models 16×, Gemini 2.5 Flash 3.3×).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio_input_per_mtok: Option<PricePerMTok>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_context: Option<LongContext>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub service_tiers: BTreeMap<ServiceTier, Rates>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Provider {
    pub id: ProviderId,
    pub api: Api,
    pub base_url: String,
    pub jurisdiction: Jurisdiction,
    pub tier: Tier,
    pub credential: Option<Credential>,
    pub timeout_ms: u64,
    pub circuit: CircuitConfig,
    pub models: BTreeMap<ModelName, ProviderModel>,
    /// `base_url` and its fixed endpoints, parsed once here rather than on every call
    /// (a URL parse was 3% of a request's instructions). Derived from `base_url`, so
    /// not part of the plan's identity.
    #[serde(skip)]
    pub endpoints: Endpoints,
}

/// A provider's base URL with the endpoints purser calls at fixed paths, parsed when
/// the plan is compiled. A path whose URL does not parse has none here: the call
/// then carries the text, and the HTTP client reports it as it would have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    base: String,
    parsed: Vec<(EndpointPath, reqwest::Url)>,
    /// The vendor's own platform (`api.openai.com`), where a request that names no
    /// `service_tier` is served at the tier its project's settings pick.
    project_picks_tier: bool,
}

/// The fixed paths under a provider's base URL (Gemini's carry the model: not fixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointPath {
    ChatCompletions,
    Responses,
    Messages,
}

impl EndpointPath {
    const ALL: [EndpointPath; 3] = [
        EndpointPath::ChatCompletions,
        EndpointPath::Responses,
        EndpointPath::Messages,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EndpointPath::ChatCompletions => "/chat/completions",
            EndpointPath::Responses => "/responses",
            EndpointPath::Messages => "/messages",
        }
    }
}

impl Endpoints {
    pub fn new(base: &str) -> Endpoints {
        let parsed = EndpointPath::ALL
            .into_iter()
            .filter_map(|p| {
                reqwest::Url::parse(&format!("{base}{}", p.as_str()))
                    .ok()
                    .map(|u| (p, u))
            })
            .collect();
        // `api.openai.com`, a regional one (`eu.api.openai.com`), with or without the
        // root's trailing dot.
        let project_picks_tier = reqwest::Url::parse(base).is_ok_and(|u| {
            u.host_str()
                .map(|h| h.trim_end_matches('.'))
                .is_some_and(|h| h == "api.openai.com" || h.ends_with(".api.openai.com"))
        });
        Endpoints {
            base: base.to_string(),
            parsed,
            project_picks_tier,
        }
    }

    /// Whether the vendor serves a request that names no `service_tier` at the tier
    /// its project's settings pick (OpenAI's platform: possibly `priority`, at about
    /// twice the standard rates), rather than at its standard one.
    pub fn project_picks_tier(&self) -> bool {
        self.project_picks_tier
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The endpoint at `path`: parsed already where it parses.
    pub fn at(&self, path: EndpointPath) -> Endpoint {
        match self.parsed.iter().find(|(p, _)| *p == path) {
            Some((_, u)) => Endpoint::Parsed(u.clone()),
            None => Endpoint::Text(format!("{}{}", self.base, path.as_str())),
        }
    }
}

/// Where one call goes: a URL parsed with the plan, or text the client parses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Parsed(reqwest::Url),
    Text(String),
}

impl Endpoint {
    pub fn as_str(&self) -> &str {
        match self {
            Endpoint::Parsed(u) => u.as_str(),
            Endpoint::Text(t) => t,
        }
    }
}

impl PartialEq<&str> for Endpoint {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Provider {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Two providers are the same upstream when they reach the same API with the same key:
    /// failing over from one to the other would meet the same limits and the same outage.
    pub fn same_upstream(&self, other: &Provider) -> bool {
        self.base_url.trim_end_matches('/') == other.base_url.trim_end_matches('/')
            && self.credential == other.credential
    }
}

/// A (provider, model) pair a request may be sent to, with what selection needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Destination {
    pub provider: ProviderId,
    pub model: ModelName,
    pub upstream_model: String,
    pub api: Api,
    pub jurisdiction: Jurisdiction,
    pub tier: Tier,
    pub context_window: u64,
    pub input_per_mtok: PricePerMTok,
    pub output_per_mtok: PricePerMTok,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<PricePerMTok>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_per_mtok: Option<PricePerMTok>,
    #[serde(flatten)]
    pub terms: ModelTerms,
}

/// A cache write without a rate in the price table is priced at this multiple of the
/// input rate: Anthropic's dearest cache write (the 1-hour cache) costs 2× base input,
/// the 5-minute one 1.25×, so 2× never under-charges a vendor purser speaks to.
pub const CACHE_WRITE_FALLBACK_MULTIPLIER: u32 = 2;

/// The rate one token class is priced at, and whether the price table named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_mtok: PricePerMTok,
    /// False: the table lacks this class and `per_mtok` is a conservative stand-in, so
    /// a cost that used it is `estimated`.
    pub listed: bool,
}

/// Which service tier a call is priced at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierChoice {
    /// The standard tier (`service_tier: default`, or an answer saying so).
    Standard,
    /// Asked for: its rates, or the standard ones where dearer (the ceiling must hold
    /// whichever tier the vendor ends up serving).
    Asked(ServiceTier),
    /// Said served by the answer: its own rates (a tier without declared rates: the
    /// dearest known, `listed` false).
    Served(ServiceTier),
    /// The vendor picks (no `service_tier`, or `auto`: a project's default tier may be
    /// priority): the dearest of the standard and every declared tier.
    AnyDeclared,
    /// The served tier is one the table cannot name: the dearest of every declared one.
    Dearest,
}

/// The rates one call is billed at (`Destination::rates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub input: PricePerMTok,
    pub output: PricePerMTok,
    pub cached: Rate,
    /// Cache writes (Anthropic's 5-minute ones, or the only kind).
    pub write: Rate,
    /// Anthropic's 1-hour cache writes.
    pub write_1h: Rate,
    pub bills_writes: bool,
    pub bills_1h_writes: bool,
    /// Audio input, where the request sends audio (`Applied::with_audio`).
    pub audio: Option<PricePerMTok>,
    /// False when the tier billed has no rates in the table (a stand-in was used).
    pub listed: bool,
}

impl Applied {
    /// The same rates for a request whose body, as sent, carries a `cache_control`
    /// marker: it asks for a cache write, which the vendor behind the API may bill
    /// (Anthropic through an OpenAI-compatible relay such as OpenRouter or LiteLLM, at
    /// up to 2× input; Alibaba's explicit cache, at 1.25×), whatever the model is
    /// called. Unlisted write rates stand in at their fallback.
    pub fn marked(self, marked: bool) -> Applied {
        Applied {
            bills_writes: self.bills_writes || marked,
            bills_1h_writes: self.bills_1h_writes || marked,
            ..self
        }
    }

    /// The same rates, every one at the regional premium where `premium`: a call whose
    /// inference its vendor kept in one region (`Destination::may_bill_regional_premium`)
    /// is billed at that multiple of every rate, cache reads and writes included.
    pub fn regional(self, premium: bool) -> Applied {
        if !premium {
            return self;
        }
        let up = |r: PricePerMTok| percent_of(r, super::family::REGIONAL_PERCENT);
        let up_rate = |r: Rate| Rate {
            per_mtok: up(r.per_mtok),
            ..r
        };
        Applied {
            input: up(self.input),
            output: up(self.output),
            cached: up_rate(self.cached),
            write: up_rate(self.write),
            write_1h: up_rate(self.write_1h),
            audio: self.audio.map(up),
            ..self
        }
    }

    /// The same rates for a request that sends audio, billed at the entry's audio
    /// rate (`audio`, `None` where it sends none).
    pub fn with_audio(self, audio: Option<PricePerMTok>) -> Applied {
        Applied { audio, ..self }
    }

    /// The most one input token can cost: whatever class it is billed in.
    pub fn input_ceiling(&self) -> PricePerMTok {
        let mut top = self.input.max(self.cached.per_mtok);
        if let Some(a) = self.audio {
            top = top.max(a);
        }
        if self.bills_writes {
            top = top.max(self.write.per_mtok);
        }
        if self.bills_1h_writes {
            top = top.max(self.write_1h.per_mtok);
        }
        top
    }
}

/// The stand-in for a priority tier served without declared rates: OpenAI's priority
/// rates are about twice the standard ones.
pub const PRIORITY_FALLBACK_MULTIPLIER: u32 = 2;

/// Every rate of `r` times `k`.
fn scaled(r: Rates, k: u32) -> Rates {
    Rates {
        input_per_mtok: times(r.input_per_mtok, k),
        output_per_mtok: times(r.output_per_mtok, k),
        cached_input_per_mtok: r.cached_input_per_mtok.map(|c| times(c, k)),
    }
}

/// An unlisted write rate: `CACHE_WRITE_FALLBACK_MULTIPLIER` × this input rate.
fn write_fallback(input: PricePerMTok) -> Rate {
    Rate {
        per_mtok: times(input, CACHE_WRITE_FALLBACK_MULTIPLIER),
        listed: false,
    }
}

/// `rate` × `pct` / 100, exactly (saturating at the largest amount).
fn percent_of(rate: PricePerMTok, pct: u32) -> PricePerMTok {
    let v = rate.per_million().decimal();
    PricePerMTok::new(
        v.checked_mul(pct.into())
            .map(|x| x / rust_decimal::Decimal::ONE_HUNDRED)
            .map_or(Money::new(rust_decimal::Decimal::MAX), Money::new),
    )
}

fn times(rate: PricePerMTok, k: u32) -> PricePerMTok {
    percent_of(rate, k.saturating_mul(100))
}

impl Destination {
    pub fn label(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }

    /// Cache reads: the listed rate, else the full input rate (every vendor discounts
    /// cache reads, so the full rate never under-charges).
    pub fn cached_input_rate(&self) -> Rate {
        match self.cached_input_per_mtok {
            Some(r) => Rate {
                per_mtok: r,
                listed: true,
            },
            None => Rate {
                per_mtok: self.input_per_mtok,
                listed: false,
            },
        }
    }

    /// Cache writes: the listed rate, else `write_default` of the input rate.
    pub fn cache_write_rate(&self) -> Rate {
        match self.cache_write_per_mtok {
            Some(r) => Rate {
                per_mtok: r,
                listed: true,
            },
            None => self.write_default(self.input_per_mtok),
        }
    }

    /// A write rate the entry does not list, for input at `input`: the multiple its
    /// vendor publishes where the family writes its cache by itself (1.25×, a known
    /// rate), else the conservative `CACHE_WRITE_FALLBACK_MULTIPLIER` (a stand-in).
    fn write_default(&self, input: PricePerMTok) -> Rate {
        if self.writes_cache_by_itself() {
            Rate {
                per_mtok: percent_of(input, super::family::SELF_WRITE_PERCENT),
                listed: true,
            }
        } else {
            write_fallback(input)
        }
    }

    /// Whether any call to this destination can be billed for cache writes whatever
    /// the request sends: Anthropic's Messages API; OpenAI's models from GPT-5.6 on,
    /// which write their cache by themselves (`family::writes_cache_by_itself`); any
    /// entry listing a write rate, since someone priced it for a reason. Earlier OpenAI
    /// models write for free, and Gemini bills cache storage by the hour, outside any
    /// call. Any other API bills them when the request asks for them
    /// (`Applied::marked`).
    pub fn bills_cache_writes(&self) -> bool {
        self.cache_write_per_mtok.is_some()
            || self.api == Api::Anthropic
            || self.writes_cache_by_itself()
    }

    /// An OpenAI-API model of a family that writes its prompt cache by itself and bills
    /// the writes, reported whenever billed (`family::writes_cache_by_itself`).
    pub fn writes_cache_by_itself(&self) -> bool {
        self.api == Api::Openai && super::family::writes_cache_by_itself(&self.upstream_model)
    }

    /// The fee every call here is billed beyond its tokens: the entry's, else none.
    pub fn call_fee(&self) -> Money {
        self.terms.fee_per_call.unwrap_or(Money::ZERO)
    }

    /// A model that searches the web on every call and bills each search beyond its
    /// tokens (`family::searches_by_itself`), whose entry lists no fee for it, or one
    /// whose searches no flat fee bounds (`family::searches_without_bound`): no bound
    /// holds for it.
    pub fn unpriced_call_fee(&self) -> bool {
        let name = &self.upstream_model;
        (self.terms.fee_per_call.is_none() && super::family::searches_by_itself(name))
            || super::family::searches_without_bound(name)
    }

    /// An Anthropic-API model whose workspace may keep its inference in one region, at
    /// a premium on every rate (`family::may_bill_regional_premium`).
    pub fn may_bill_regional_premium(&self) -> bool {
        self.api == Api::Anthropic && super::family::may_bill_regional_premium(&self.upstream_model)
    }

    /// Whether any call here can be billed for 1-hour cache writes: Anthropic's, or any
    /// API whose entry lists the rate.
    pub fn bills_1h_cache_writes(&self) -> bool {
        self.terms.cache_write_1h_per_mtok.is_some() || self.api == Api::Anthropic
    }

    /// The most one input token can cost here at the base rates: see `rates`.
    pub fn input_rate_ceiling(&self) -> PricePerMTok {
        self.rates(0, TierChoice::Standard).input_ceiling()
    }

    /// The rates a call with `input_tokens` input tokens at `tier` is billed at, class
    /// by class, the dearest applicable. Above the long-context threshold the
    /// long-context rates apply; a service tier's declared rates are taken where dearer
    /// (the ceiling must hold whichever way the vendor reads its own tiers); cache
    /// writes of a call not at the base rates are priced at the stand-in multiple of its
    /// input rate, since listed write rates are for base input. A rate the table lacks
    /// makes `listed` false.
    pub fn rates(&self, input_tokens: u64, tier: TierChoice) -> Applied {
        let base = Rates {
            input_per_mtok: self.input_per_mtok,
            output_per_mtok: self.output_per_mtok,
            cached_input_per_mtok: self.cached_input_per_mtok,
        };
        let dearer = |a: Rates, b: Rates| Rates {
            input_per_mtok: a.input_per_mtok.max(b.input_per_mtok),
            output_per_mtok: a.output_per_mtok.max(b.output_per_mtok),
            cached_input_per_mtok: match (a.cached_input_per_mtok, b.cached_input_per_mtok) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            },
        };
        // Taken class by class with the base rates where dearer, so the rates never fall
        // as the input grows: a charge for less input than the bound never exceeds the
        // worst case, whatever an entry declares.
        let mut r = match self.terms.long_context {
            Some(l) if input_tokens > l.above_input_tokens => dearer(base, l.rates),
            Some(_) | None => base,
        };
        let mut listed = true;
        let declared = self.terms.service_tiers.values();
        match tier {
            TierChoice::Standard => {}
            TierChoice::Asked(t) => match self.terms.service_tiers.get(&t) {
                Some(x) => r = dearer(r, *x),
                None => listed = false,
            },
            TierChoice::Served(t) => match self.terms.service_tiers.get(&t) {
                // Billed at its own rates (flex below the standard ones); above the
                // long-context threshold, the dearer of the two.
                Some(x) if r == base => r = *x,
                Some(x) => r = dearer(r, *x),
                None => {
                    listed = false;
                    r = declared.fold(r, |r, x| dearer(r, *x));
                    // Priority served with no rates declared (a project that defaults
                    // to it, behind a proxy purser cannot pin): at a stand-in multiple
                    // of the rates, as unlisted cache writes are, never at the standard
                    // ones it costs about twice.
                    if t == ServiceTier::Priority {
                        r = dearer(r, scaled(r, PRIORITY_FALLBACK_MULTIPLIER));
                    }
                }
            },
            TierChoice::AnyDeclared => r = declared.fold(r, |r, x| dearer(r, *x)),
            TierChoice::Dearest => {
                listed = false;
                r = declared.fold(r, |r, x| dearer(r, *x));
            }
        }
        let at_base = r == base;
        let fallback = self.write_default(r.input_per_mtok);
        // The write rates at the base rates: listed, else the fallback multiple.
        let base_write = self.cache_write_rate();
        // A family that writes by itself has one write rate whatever the lifetime asked
        // (a mark to it buys no dearer write).
        let base_write_1h = match self.terms.cache_write_1h_per_mtok {
            Some(x) => Rate {
                per_mtok: x,
                listed: true,
            },
            None => self.write_default(self.input_per_mtok),
        };
        // Off the base rates (long context, another tier) the listed ones do not apply:
        // the fallback multiple of the input rate, but never below the base write rate,
        // so that write rates too never fall as the input grows (a listed 1-hour rate
        // above twice the long-context input rate would otherwise have).
        let off_base = |at: Rate| Rate {
            per_mtok: fallback.per_mtok.max(at.per_mtok),
            // Known only where both are: a family's published multiple, over a base
            // rate that is listed or that same multiple.
            listed: fallback.listed && at.listed,
        };
        let (write, write_1h) = if at_base {
            (base_write, base_write_1h)
        } else {
            (off_base(base_write), off_base(base_write_1h))
        };
        let cached = match r.cached_input_per_mtok {
            Some(c) => Rate {
                per_mtok: c,
                listed: true,
            },
            None => Rate {
                per_mtok: r.input_per_mtok,
                listed: false,
            },
        };
        Applied {
            input: r.input_per_mtok,
            output: r.output_per_mtok,
            cached,
            write,
            write_1h,
            bills_writes: self.bills_cache_writes(),
            bills_1h_writes: self.bills_1h_cache_writes(),
            audio: None,
            listed,
        }
    }

    /// The request field this model reads its output cap from: the entry's
    /// `cap_field`, else by family. OpenAI's reasoning models (`o1`, `o3`, `o4-mini`,
    /// `gpt-5`…: an `o` and a digit, or `gpt-` and a major version of 5 or more) take
    /// only `max_completion_tokens`; every other model, and every OpenAI-compatible
    /// server purser knows, reads `max_tokens`.
    pub fn cap_field(&self) -> CapField {
        if let Some(f) = self.terms.cap_field {
            return f;
        }
        let name = super::family::family_name(&self.upstream_model);
        let mut chars = name.chars();
        let o_digit = chars.next() == Some('o') && chars.next().is_some_and(|c| c.is_ascii_digit());
        let gpt_major = name
            .strip_prefix("gpt-")
            .and_then(super::family::version)
            .is_some_and(|(major, _)| major >= 5);
        if o_digit || gpt_major {
            CapField::MaxCompletionTokens
        } else {
            CapField::MaxTokens
        }
    }

    /// Reasoning tokens per choice this model may bill beyond its output cap: the
    /// entry's `reasoning_budget`, else by family. `None`: it bills none outside the
    /// cap (OpenAI's reasoning tokens are inside `max_completion_tokens`).
    /// - DeepSeek's reasoner (`deepseek-reasoner`, `deepseek-r1…`): its chain of thought
    ///   is outside `max_tokens` and up to 32K tokens (DeepSeek API docs, reasoning model).
    /// - Gemini 2.5 and later (`gemini-2.5-…`, `gemini-3…`, and aliases such as
    ///   `gemini-flash-latest`) think by default; purser sends this budget as
    ///   `thinkingConfig.thinkingBudget` and counts it outside the cap: 8192.
    ///   `gemini-2.5-flash-lite` does not think unless asked, and 1.x / 2.0 never: none.
    pub fn reasoning_budget(&self) -> Option<u64> {
        if self.terms.reasoning_budget.is_some() {
            return self.terms.reasoning_budget;
        }
        let name = super::family::family_name(&self.upstream_model);
        if name.starts_with("deepseek-reasoner") || name.starts_with("deepseek-r1") {
            return Some(32_768);
        }
        if name.starts_with("gemini-2.5-flash-lite") {
            return None;
        }
        // Every Gemini thinks unless it is of a generation known not to: an alias
        // (`gemini-flash-latest`, `gemini-exp-…`) names a thinking model as often as
        // not, and counting thinking that does not happen only makes the bound safe.
        let known_not_to = name.starts_with("gemini-1.")
            || name.starts_with("gemini-2.0")
            || name.starts_with("gemini-pro") && !name.contains("latest")
            || name.starts_with("gemini-ultra");
        (name.starts_with("gemini-") && !known_not_to).then_some(8_192)
    }

    /// The cost of a call with these token counts at this destination's prices, plain
    /// input and output (no breakdown is known): at the rates their count reaches
    /// (long context), with the regional premium where the model may be billed it, and
    /// the fee per call where tokens were billed (a call nobody billed has no fee).
    /// Replay's estimate of what the new plan would have billed.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> Money {
        let r = self
            .rates(input_tokens, TierChoice::Standard)
            .regional(self.may_bill_regional_premium());
        let fee = if input_tokens > 0 || output_tokens > 0 {
            self.call_fee()
        } else {
            Money::ZERO
        };
        r.input.cost_of(input_tokens) + r.output.cost_of(output_tokens) + fee
    }
}

/// The destinations of one (policy, model): pool first, then accounts (ordered
/// cheapest-first per request, since the order depends on its token bounds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    pub pool: Vec<Destination>,
    pub accounts: Vec<Destination>,
    pub alternate: Option<Destination>,
}

impl Route {
    pub fn is_empty(&self) -> bool {
        self.pool.is_empty() && self.accounts.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Ceiling {
    pub per_request: Money,
    pub mode: Mode,
    pub on_exceed: OnExceed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub period: Period,
    pub limit: Money,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Client {
    pub id: ClientId,
    pub key_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub id: PolicyId,
    pub clients: Vec<Client>,
    pub jurisdictions: Vec<Jurisdiction>,
    pub ceiling: Ceiling,
    pub max_output_tokens: u64,
    pub budgets: Vec<Budget>,
    /// Every model the policy allows, with its route (possibly empty: refused at selection).
    pub routes: BTreeMap<ModelName, Route>,
}

impl Policy {
    /// Whether a request's worst case must be a proof: under a hard ceiling, and under
    /// any budget (`soft` relaxes failover, never the budget, so what a soft request
    /// reserves is a real bound too). What cannot be bounded is then refused.
    pub fn needs_proof(&self) -> bool {
        self.ceiling.mode == Mode::Hard || !self.budgets.is_empty()
    }
}

/// The part of the plan that is hashed: everything that decides a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanBody {
    pub currency: String,
    pub no_destination_hint: Option<String>,
    pub providers: BTreeMap<ProviderId, Provider>,
    pub policies: BTreeMap<PolicyId, Policy>,
}

/// Who a client key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRef {
    pub policy: PolicyId,
    pub client: ClientId,
}

#[derive(Debug, Clone)]
pub struct Plan {
    id: String,
    body: Arc<PlanBody>,
    clients: HashMap<[u8; 32], ClientRef>,
    warnings: Vec<Diagnostic>,
}

impl Plan {
    pub(super) fn new(body: PlanBody, warnings: Vec<Diagnostic>) -> Plan {
        use sha2::Digest;
        let mut clients = HashMap::new();
        for p in body.policies.values() {
            for c in &p.clients {
                let mut k = [0u8; 32];
                if hex::decode_to_slice(&c.key_sha256, &mut k).is_ok() {
                    clients.insert(
                        k,
                        ClientRef {
                            policy: p.id.clone(),
                            client: c.id.clone(),
                        },
                    );
                }
            }
        }
        // BTreeMaps and sorted vectors make this serialization canonical, so file order,
        // comments and formatting never change the id.
        let canonical = serde_json::to_vec(&body).unwrap_or_default();
        let id = hex::encode(sha2::Sha256::digest(&canonical));
        Plan {
            id: id[..16].to_string(),
            body: Arc::new(body),
            clients,
            warnings,
        }
    }

    /// Stable content hash (16 hex digits) of everything that decides a request.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn body(&self) -> &PlanBody {
        &self.body
    }

    pub fn currency(&self) -> &str {
        &self.body.currency
    }

    pub fn no_destination_hint(&self) -> Option<&str> {
        self.body.no_destination_hint.as_deref()
    }

    pub fn warnings(&self) -> &[Diagnostic] {
        &self.warnings
    }

    pub fn provider(&self, id: &ProviderId) -> Option<&Provider> {
        self.body.providers.get(id)
    }

    pub fn providers(&self) -> impl Iterator<Item = &Provider> {
        self.body.providers.values()
    }

    pub fn policy(&self, id: &str) -> Option<&Policy> {
        self.body.policies.get(id)
    }

    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.body.policies.values()
    }

    /// The client whose key hashes to `digest`. The map lookup is on a hash of the
    /// key, so timing reveals nothing about any key.
    pub fn client_by_key_hash(&self, digest: &[u8; 32]) -> Option<&ClientRef> {
        self.clients.get(digest)
    }

    /// The plan as JSON, with its id.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "plan_id": self.id,
            "currency": self.body.currency,
            "no_destination_hint": self.body.no_destination_hint,
            "providers": self.body.providers,
            "policies": self.body.policies,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(api: Api, upstream: &str) -> Destination {
        Destination {
            provider: ProviderId::new("p"),
            model: ModelName::new("m"),
            upstream_model: upstream.into(),
            api,
            jurisdiction: Jurisdiction::new("us"),
            tier: Tier::Account,
            context_window: 1_000,
            input_per_mtok: PricePerMTok::new(Money::ZERO),
            output_per_mtok: PricePerMTok::new(Money::ZERO),
            cached_input_per_mtok: None,
            cache_write_per_mtok: None,
            terms: ModelTerms::default(),
        }
    }

    /// Replay's estimate of a call at a destination: the long-context rates its input
    /// reaches, the regional premium where the model may be billed it, the fee.
    #[test]
    fn a_calls_estimated_cost_takes_every_rule_of_its_price() {
        let price = |s: &str| PricePerMTok::new(s.parse().unwrap());
        let plain = Destination {
            input_per_mtok: price("1"),
            output_per_mtok: price("2"),
            ..named(Api::Openai, "m")
        };
        let m = |s: &str| s.parse::<Money>().unwrap();
        assert_eq!(plain.cost(1_000, 100), m("0.0012"));
        let long = Destination {
            terms: ModelTerms {
                long_context: Some(LongContext {
                    above_input_tokens: 500,
                    rates: Rates {
                        input_per_mtok: price("2"),
                        output_per_mtok: price("4"),
                        cached_input_per_mtok: None,
                    },
                }),
                fee_per_call: Some(m("0.01")),
                ..ModelTerms::default()
            },
            ..plain.clone()
        };
        assert_eq!(long.cost(1_000, 100), m("0.0124"));
        let claude = Destination {
            api: Api::Anthropic,
            upstream_model: "claude-opus-4-6".into(),
            ..plain
        };
        assert_eq!(claude.cost(1_000, 100), m("0.00132"));
    }

    #[test]
    fn the_cap_field_is_read_from_the_family_unless_the_entry_says() {
        for m in [
            "o1",
            "o1-mini",
            "o3",
            "o3-mini",
            "o4-mini",
            "gpt-5",
            "gpt-5-mini",
            "gpt-5.1",
            "openai/o3-mini",
            "GPT-6",
        ] {
            assert_eq!(
                named(Api::Openai, m).cap_field(),
                CapField::MaxCompletionTokens,
                "{m}"
            );
        }
        for m in [
            "gpt-4o-mini",
            "gpt-4.1",
            "llama-3.1-8b",
            "omni-x",
            "gpt-4o-2024",
            "qwen2.5",
        ] {
            assert_eq!(
                named(Api::Openai, m).cap_field(),
                CapField::MaxTokens,
                "{m}"
            );
        }
        let mut d = named(Api::Openai, "gpt-4o-mini");
        d.terms.cap_field = Some(CapField::MaxCompletionTokens);
        assert_eq!(d.cap_field(), CapField::MaxCompletionTokens);
    }

    #[test]
    fn the_reasoning_budget_is_read_from_the_family_unless_the_entry_says() {
        assert_eq!(
            named(Api::Openai, "deepseek-reasoner").reasoning_budget(),
            Some(32_768)
        );
        assert_eq!(
            named(Api::Gemini, "gemini-2.5-pro").reasoning_budget(),
            Some(8_192)
        );
        assert_eq!(
            named(Api::Gemini, "gemini-2.5-flash").reasoning_budget(),
            Some(8_192)
        );
        assert_eq!(
            named(Api::Gemini, "gemini-3-pro-preview").reasoning_budget(),
            Some(8_192)
        );
        assert_eq!(
            named(Api::Gemini, "gemini-2.5-flash-lite").reasoning_budget(),
            None
        );
        assert_eq!(
            named(Api::Gemini, "gemini-2.0-flash").reasoning_budget(),
            None
        );
        assert_eq!(named(Api::Openai, "o3").reasoning_budget(), None);
        let mut d = named(Api::Gemini, "gemini-2.5-pro");
        d.terms.reasoning_budget = Some(128);
        assert_eq!(d.reasoning_budget(), Some(128));
    }
}
