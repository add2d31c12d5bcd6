//! Serde shapes that mirror the YAML documents. No invariants live here: they are
//! checked by the schema and by `compile`, which turns these into plan types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    #[allow(dead_code)]
    pub kind: String,
    pub currency: String,
    pub no_destination_hint: Option<String>,
    pub circuit: Option<RawCircuit>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCircuit {
    pub failures: Option<u32>,
    pub window_s: Option<u64>,
    pub cooldown_s: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    Openai,
    Anthropic,
    Gemini,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Openai => "openai",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        }
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Pool,
    #[default]
    Account,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum RawCredential {
    Env(String),
    File(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProvider {
    #[allow(dead_code)]
    pub kind: String,
    pub id: String,
    pub api: Api,
    pub base_url: String,
    pub jurisdiction: String,
    #[serde(default)]
    pub tier: Tier,
    pub credential: Option<RawCredential>,
    pub timeout_ms: Option<u64>,
    pub circuit: Option<RawCircuit>,
    pub models: BTreeMap<String, RawModel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub upstream: Option<String>,
    pub context_window: u64,
    pub input_per_mtok: String,
    pub output_per_mtok: String,
    pub cached_input_per_mtok: Option<String>,
    pub cache_write_per_mtok: Option<String>,
    /// Anthropic's 1-hour cache writes (dearer than the 5-minute ones).
    pub cache_write_1h_per_mtok: Option<String>,
    /// Which request field carries the output cap (OpenAI API); default by family.
    pub cap_field: Option<CapField>,
    /// Reasoning tokens per choice the model may bill beyond its output cap; default
    /// by family. Sent to Gemini as `thinkingConfig.thinkingBudget`.
    pub reasoning_budget: Option<u64>,
    /// Declared token bounds of parts whose tokens cannot be bounded from their bytes.
    pub media_tokens: Option<RawMediaTokens>,
    /// Audio input tokens' own rate (OpenAI's audio models, Gemini).
    pub audio_input_per_mtok: Option<String>,
    /// A fee every call is billed beyond its tokens (search models).
    pub fee_per_call: Option<String>,
    /// Dearer rates above an input size (Gemini 2.5 Pro above 200k input).
    pub long_context: Option<RawLongContext>,
    /// Rates of the vendor's service tiers (OpenAI `service_tier`: priority, flex).
    pub service_tiers: Option<BTreeMap<ServiceTier, RawRates>>,
}

/// The field a model reads its output cap from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapField {
    MaxTokens,
    MaxCompletionTokens,
}

impl CapField {
    pub fn as_str(self) -> &'static str {
        match self {
            CapField::MaxTokens => "max_tokens",
            CapField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// A priced service tier a request may ask for (OpenAI `service_tier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceTier {
    Priority,
    Flex,
}

impl ServiceTier {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceTier::Priority => "priority",
            ServiceTier::Flex => "flex",
        }
    }

    /// The tier a request's or response's `service_tier` value names; `None` for the
    /// standard tier's names and for names purser does not know.
    pub fn parse(s: &str) -> Option<ServiceTier> {
        match s {
            "priority" => Some(ServiceTier::Priority),
            "flex" => Some(ServiceTier::Flex),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMediaTokens {
    pub image: Option<u64>,
    pub audio: Option<u64>,
    pub video: Option<u64>,
    pub file: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRates {
    pub input_per_mtok: String,
    pub output_per_mtok: String,
    pub cached_input_per_mtok: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLongContext {
    pub above_input_tokens: u64,
    pub input_per_mtok: String,
    pub output_per_mtok: String,
    pub cached_input_per_mtok: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[allow(dead_code)]
    pub kind: String,
    pub id: String,
    pub clients: Vec<RawClient>,
    pub models: Vec<String>,
    pub jurisdictions: Vec<String>,
    pub ceiling: RawCeiling,
    pub max_output_tokens: u64,
    #[serde(default)]
    pub budgets: Vec<RawBudget>,
    #[serde(default)]
    pub alternates: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClient {
    pub id: String,
    pub key_sha256: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Hard,
    Soft,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Hard => "hard",
            Mode::Soft => "soft",
        }
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum OnExceed {
    #[default]
    Reject,
    Clamp,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCeiling {
    pub per_request: String,
    pub mode: Mode,
    #[serde(default)]
    pub on_exceed: OnExceed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    pub period: Period,
    pub limit: String,
}
