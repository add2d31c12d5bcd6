//! The compiled plan: the immutable, validated form of a policy set that the gateway
//! runs. Built only by `compile`; identified by a content hash (`plan_id`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::diagnostic::Diagnostic;
pub use super::raw::{Api, Mode, OnExceed, Period, Tier};
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

    /// Cache writes: the listed rate, else `CACHE_WRITE_FALLBACK_MULTIPLIER` × input.
    pub fn cache_write_rate(&self) -> Rate {
        match self.cache_write_per_mtok {
            Some(r) => Rate {
                per_mtok: r,
                listed: true,
            },
            None => {
                let input = self.input_per_mtok.per_million().decimal();
                let fallback = input
                    .checked_mul(CACHE_WRITE_FALLBACK_MULTIPLIER.into())
                    .map_or(Money::new(rust_decimal::Decimal::MAX), Money::new);
                Rate {
                    per_mtok: PricePerMTok::new(fallback),
                    listed: false,
                }
            }
        }
    }

    /// Whether a call to this destination can be billed for cache writes. Only
    /// Anthropic's Messages API bills them per call; OpenAI writes its cache for free
    /// and Gemini bills cache storage by the hour, outside any call. A listed rate
    /// counts whatever the API, since someone priced it for a reason.
    pub fn bills_cache_writes(&self) -> bool {
        self.cache_write_per_mtok.is_some() || self.api == Api::Anthropic
    }

    /// The most one input token can cost here: the input bound of a worst case is
    /// priced at this rate so the ceiling stays a proof whatever class a token lands in.
    pub fn input_rate_ceiling(&self) -> PricePerMTok {
        let mut top = self.input_per_mtok.max(self.cached_input_rate().per_mtok);
        if self.bills_cache_writes() {
            top = top.max(self.cache_write_rate().per_mtok);
        }
        top
    }

    /// Exact cost of a call with these token counts at this destination's prices.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> Money {
        self.input_per_mtok.cost_of(input_tokens) + self.output_per_mtok.cost_of(output_tokens)
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
