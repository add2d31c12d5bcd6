//! Each vendor's error dialect as data: which value in which field means which class.
//! Adding a vendor's signal is adding a row here, never a branch in the classifier.
//!
//! Values are matched lower-cased. A row's class is only evidence: the precedence
//! rule in `classify` decides between rows that disagree.

use super::FailureClass;

/// Where a value was read. Structured fields are the vendor's own machine-readable
/// words and outrank prose (`Message`) at the same relay depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `error.code` or a top-level `code`.
    Code,
    /// `error.type` or a top-level `type` / `object`.
    Type,
    /// Google's `error.status` (the canonical gRPC code name).
    Status,
    /// `details[].reason` of a `google.rpc.ErrorInfo`.
    Reason,
    /// OpenRouter's moderation `metadata.reasons[]`.
    MetadataReason,
    /// Azure's `innererror.code`.
    InnerCode,
    /// An AWS exception name: the `x-amzn-errortype` header, `__type`, or the key of a
    /// Bedrock stream exception event.
    AwsType,
    /// A block marker found in a structured field (Azure `content_filter_result` with a
    /// category `filtered: true`, Gemini `promptFeedback.blockReason` on an error, a
    /// non-empty OpenRouter `flagged_input`).
    Block,
    /// Any message text: `message`, `error` as a string, `detail`, a non-JSON body.
    Message,
}

impl Field {
    pub fn is_structured(self) -> bool {
        match self {
            Field::Code
            | Field::Type
            | Field::Status
            | Field::Reason
            | Field::MetadataReason
            | Field::InnerCode
            | Field::AwsType
            | Field::Block => true,
            Field::Message => false,
        }
    }

    /// How `--explain` names the field.
    pub fn name(self) -> &'static str {
        match self {
            Field::Code => "error.code",
            Field::Type => "error.type",
            Field::Status => "error.status",
            Field::Reason => "details[].reason",
            Field::MetadataReason => "metadata.reasons",
            Field::InnerCode => "innererror.code",
            Field::AwsType => "aws exception",
            Field::Block => "block marker",
            Field::Message => "message",
        }
    }
}

/// How a row matches a value (already lower-cased).
#[derive(Debug, Clone, Copy)]
pub enum Pat {
    /// The whole value.
    Is(&'static str),
    /// A substring.
    Has(&'static str),
    /// Both substrings (prose that is only specific in combination).
    Both(&'static str, &'static str),
    /// The value starts with this (Anthropic's `model: <name>` 404).
    Starts(&'static str),
    /// Any value at all (a non-empty `metadata.reasons` is a moderation verdict).
    Any,
}

impl Pat {
    pub fn matches(self, v: &str) -> bool {
        match self {
            Pat::Is(p) => v == p,
            Pat::Has(p) => v.contains(p),
            Pat::Both(a, b) => v.contains(a) && v.contains(b),
            Pat::Starts(p) => v.trim_start().starts_with(p),
            Pat::Any => !v.is_empty(),
        }
    }

    /// The text `--explain` shows for a prose match: the phrase, not the whole message.
    pub fn shown(self, v: &str) -> String {
        match self {
            Pat::Is(_) | Pat::Any => v.to_string(),
            Pat::Has(p) | Pat::Starts(p) => p.to_string(),
            Pat::Both(a, b) => format!("{a}…{b}"),
        }
    }
}

/// One signal: in `field`, a value matching `pat` means `class`.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub field: Field,
    pub pat: Pat,
    pub class: FailureClass,
}

/// A vendor's (or a family of compatible vendors') signals.
pub struct Dialect {
    pub name: &'static str,
    pub rules: &'static [Rule],
}

const fn r(field: Field, pat: Pat, class: FailureClass) -> Rule {
    Rule { field, pat, class }
}

use FailureClass as C;
use Field as F;
use Pat as P;

/// OpenAI and every OpenAI-compatible server (Groq, Together, Fireworks, DeepSeek,
/// Mistral, vLLM, Ollama, xAI, OpenRouter) share `error.type` / `error.code` words.
const OPENAI: &[Rule] = &[
    r(
        F::Code,
        P::Is("content_policy_violation"),
        C::ContentRefusal,
    ),
    r(F::Code, P::Is("content_filter"), C::ContentRefusal),
    // "Invalid prompt: your prompt was flagged as potentially violating our usage
    // policy": OpenAI's reasoning-model safety check, sent as a 400.
    r(F::Code, P::Is("invalid_prompt"), C::ContentRefusal),
    r(
        F::Type,
        P::Is("content_policy_violation"),
        C::ContentRefusal,
    ),
    // Moonshot (Kimi) and the relays in front of it put the refusal in `type`.
    r(F::Type, P::Is("content_filter"), C::ContentRefusal),
    r(F::Type, P::Is("access_terminated_error"), C::Auth),
    r(F::Code, P::Is("invalid_api_key"), C::Auth),
    r(F::Code, P::Is("invalid_authentication"), C::Auth),
    r(F::Code, P::Is("account_deactivated"), C::Auth),
    r(F::Code, P::Is("organization_deactivated"), C::Auth),
    r(
        F::Code,
        P::Is("unsupported_country_region_territory"),
        C::Auth,
    ),
    r(F::Code, P::Is("no_such_organization"), C::Auth),
    r(F::Code, P::Is("invalid_organization"), C::Auth),
    r(F::Type, P::Is("invalid_api_key"), C::Auth),
    r(F::Code, P::Is("insufficient_quota"), C::RateLimited),
    r(F::Type, P::Is("insufficient_quota"), C::RateLimited),
    r(F::Code, P::Is("billing_hard_limit_reached"), C::RateLimited),
    r(F::Code, P::Is("billing_not_active"), C::RateLimited),
    r(F::Code, P::Is("rate_limit_exceeded"), C::RateLimited),
    r(F::Type, P::Is("rate_limit_exceeded"), C::RateLimited),
    r(F::Type, P::Is("requests"), C::RateLimited),
    r(F::Type, P::Is("tokens"), C::RateLimited),
    r(F::Code, P::Is("context_length_exceeded"), C::ContextLength),
    r(F::Code, P::Is("string_above_max_length"), C::ContextLength),
    r(F::Code, P::Is("model_not_found"), C::ModelNotFound),
    r(F::Code, P::Is("model_decommissioned"), C::ModelNotFound),
    r(F::Code, P::Is("model_not_available"), C::ModelNotFound),
    r(F::Type, P::Is("server_error"), C::ServerError),
    r(F::Code, P::Is("server_error"), C::ServerError),
    r(F::Type, P::Is("model_error"), C::ServerError),
    r(F::Code, P::Is("capacity_exceeded"), C::Overloaded),
    r(F::Code, P::Is("overloaded"), C::Overloaded),
    r(F::Type, P::Is("engine_overloaded"), C::Overloaded),
    r(F::Code, P::Is("engine_overloaded"), C::Overloaded),
    r(F::Type, P::Is("timeout"), C::Timeout),
    r(F::Type, P::Is("invalid_request_error"), C::Malformed),
    r(F::Code, P::Is("invalid_request_error"), C::Malformed),
    // vLLM's `ErrorResponse` and Mistral's `object: error` envelopes.
    r(F::Type, P::Is("badrequesterror"), C::Malformed),
    r(F::Type, P::Is("notfounderror"), C::ModelNotFound),
    r(F::Type, P::Is("internalservererror"), C::ServerError),
    r(
        F::Type,
        P::Is("invalid_request_message_order"),
        C::Malformed,
    ),
];

/// Azure OpenAI: the OpenAI words plus its own `innererror` and content filter.
const AZURE: &[Rule] = &[
    r(
        F::InnerCode,
        P::Is("responsibleaipolicyviolation"),
        C::ContentRefusal,
    ),
    r(
        F::Code,
        P::Is("responsibleaipolicyviolation"),
        C::ContentRefusal,
    ),
    r(F::Block, P::Is("content_filter_result"), C::ContentRefusal),
    r(F::Code, P::Is("deploymentnotfound"), C::ModelNotFound),
    r(F::Code, P::Is("operationnotsupported"), C::Malformed),
    r(F::Code, P::Is("toomanyrequests"), C::RateLimited),
    r(F::Code, P::Is("unauthorized"), C::Auth),
    r(F::Code, P::Is("permissiondenied"), C::Auth),
    r(F::Code, P::Is("authenticationtypedisabled"), C::Auth),
    r(F::Code, P::Is("internalservererror"), C::ServerError),
    r(F::Code, P::Is("serviceunavailable"), C::Overloaded),
    r(F::Code, P::Is("timeout"), C::Timeout),
];

/// Anthropic's `error.type` words (also used by its Bedrock and Vertex deployments).
const ANTHROPIC: &[Rule] = &[
    r(F::Type, P::Is("authentication_error"), C::Auth),
    r(F::Type, P::Is("permission_error"), C::Auth),
    r(F::Type, P::Is("billing_error"), C::RateLimited),
    r(F::Type, P::Is("rate_limit_error"), C::RateLimited),
    r(F::Type, P::Is("request_too_large"), C::ContextLength),
    r(F::Type, P::Is("overloaded_error"), C::Overloaded),
    r(F::Type, P::Is("api_error"), C::ServerError),
    r(F::Type, P::Is("timeout_error"), C::Timeout),
    r(F::Type, P::Is("not_found_error"), C::Malformed),
];

/// Google (Gemini API, Vertex AI): canonical status names and `ErrorInfo` reasons.
const GOOGLE: &[Rule] = &[
    r(F::Block, P::Is("blockreason"), C::ContentRefusal),
    r(F::Reason, P::Is("api_key_invalid"), C::Auth),
    r(F::Reason, P::Is("api_key_service_blocked"), C::Auth),
    r(F::Reason, P::Is("api_key_http_referrer_blocked"), C::Auth),
    r(F::Reason, P::Is("api_key_ip_address_blocked"), C::Auth),
    r(F::Reason, P::Is("api_key_expired"), C::Auth),
    r(F::Reason, P::Is("service_disabled"), C::Auth),
    r(F::Reason, P::Is("access_token_scope_insufficient"), C::Auth),
    r(F::Reason, P::Is("iam_permission_denied"), C::Auth),
    r(F::Reason, P::Is("consumer_suspended"), C::Auth),
    r(F::Reason, P::Is("billing_disabled"), C::RateLimited),
    r(F::Reason, P::Is("rate_limit_exceeded"), C::RateLimited),
    r(F::Reason, P::Is("resource_exhausted"), C::RateLimited),
    r(F::Status, P::Is("unauthenticated"), C::Auth),
    r(F::Status, P::Is("permission_denied"), C::Auth),
    r(F::Status, P::Is("resource_exhausted"), C::RateLimited),
    r(F::Status, P::Is("unavailable"), C::Overloaded),
    r(F::Status, P::Is("deadline_exceeded"), C::Timeout),
    r(F::Status, P::Is("internal"), C::ServerError),
    r(F::Status, P::Is("unknown"), C::ServerError),
    r(F::Status, P::Is("invalid_argument"), C::Malformed),
    r(F::Status, P::Is("failed_precondition"), C::Malformed),
    r(F::Status, P::Is("out_of_range"), C::Malformed),
    r(F::Status, P::Is("not_found"), C::Malformed),
];

/// Amazon Bedrock exception names (InvokeModel, Converse and their streams).
const BEDROCK: &[Rule] = &[
    r(F::AwsType, P::Is("accessdeniedexception"), C::Auth),
    r(F::AwsType, P::Is("unrecognizedclientexception"), C::Auth),
    r(F::AwsType, P::Is("expiredtokenexception"), C::Auth),
    r(F::AwsType, P::Is("invalidsignatureexception"), C::Auth),
    r(F::AwsType, P::Is("throttlingexception"), C::RateLimited),
    r(
        F::AwsType,
        P::Is("servicequotaexceededexception"),
        C::RateLimited,
    ),
    r(
        F::AwsType,
        P::Is("resourcenotfoundexception"),
        C::ModelNotFound,
    ),
    r(F::AwsType, P::Is("modelnotreadyexception"), C::Overloaded),
    r(
        F::AwsType,
        P::Is("serviceunavailableexception"),
        C::Overloaded,
    ),
    r(F::AwsType, P::Is("modeltimeoutexception"), C::Timeout),
    r(F::AwsType, P::Is("internalserverexception"), C::ServerError),
    r(F::AwsType, P::Is("modelerrorexception"), C::ServerError),
    r(
        F::AwsType,
        P::Is("modelstreamerrorexception"),
        C::ServerError,
    ),
    r(F::AwsType, P::Is("validationexception"), C::Malformed),
    // boto3 and the relays that quote it: "An error occurred (ThrottlingException)".
    r(F::Message, P::Has("(throttlingexception)"), C::RateLimited),
    r(F::Message, P::Has("(accessdeniedexception)"), C::Auth),
    r(
        F::Message,
        P::Has("(serviceunavailableexception)"),
        C::Overloaded,
    ),
    r(F::Message, P::Has("(modeltimeoutexception)"), C::Timeout),
];

/// Cloudflare's own error pages in front of a vendor (problem+json). Cloudflare never
/// reached the origin: nothing was sent to the model.
const CLOUDFLARE: &[Rule] = &[
    r(F::Code, P::Starts("cloudflare:connection"), C::ServerError),
    r(F::Code, P::Starts("cloudflare:origin"), C::ServerError),
];

/// OpenRouter's moderation verdict.
const OPENROUTER: &[Rule] = &[
    r(F::MetadataReason, P::Any, C::ContentRefusal),
    r(F::Block, P::Is("flagged_input"), C::ContentRefusal),
];

/// Prose every vendor uses. Explicit sentences (a refusal, a disabled account, an
/// exhausted credit, an over-long input, a missing model) are phrased narrowly on
/// purpose: prose decides only when no structured field did.
const PROSE: &[Rule] = &[
    // Content policy: the vendors' fixed refusal sentences.
    r(
        F::Message,
        P::Has("content filtering policy"),
        C::ContentRefusal,
    ),
    r(
        F::Message,
        P::Has("content management policy"),
        C::ContentRefusal,
    ),
    r(
        F::Message,
        P::Has("violates usage guidelines"),
        C::ContentRefusal,
    ),
    r(
        F::Message,
        P::Has("content_policy_violation"),
        C::ContentRefusal,
    ),
    r(
        F::Message,
        P::Has("flagged as potentially violating"),
        C::ContentRefusal,
    ),
    r(
        F::Message,
        P::Has("rejected as a result of our safety system"),
        C::ContentRefusal,
    ),
    r(
        F::Message,
        P::Has("responsibleaipolicyviolation"),
        C::ContentRefusal,
    ),
    r(F::Message, P::Has("requires moderation"), C::ContentRefusal),
    // DeepSeek's moderation refusal, sent as an invalid_request_error.
    r(F::Message, P::Has("content exists risk"), C::ContentRefusal),
    // Credential and account.
    r(F::Message, P::Has("api key not valid"), C::Auth),
    r(F::Message, P::Has("api key not found"), C::Auth),
    r(F::Message, P::Has("invalid api key"), C::Auth),
    r(F::Message, P::Has("incorrect api key"), C::Auth),
    r(F::Message, P::Has("api key expired"), C::Auth),
    r(F::Message, P::Has("invalid x-api-key"), C::Auth),
    r(F::Message, P::Has("invalid authentication"), C::Auth),
    r(F::Message, P::Has("authentication fails"), C::Auth),
    r(
        F::Message,
        P::Has("organization has been disabled"),
        C::Auth,
    ),
    r(F::Message, P::Has("account has been disabled"), C::Auth),
    r(F::Message, P::Has("account has been deactivated"), C::Auth),
    r(F::Message, P::Has("account is disabled"), C::Auth),
    r(
        F::Message,
        P::Has("user location is not supported"),
        C::Auth,
    ),
    // AWS IAM's denial sentence, also relayed by proxies in front of Bedrock.
    r(F::Message, P::Has("is not authorized to perform"), C::Auth),
    r(F::Message, P::Has("model access is denied"), C::Auth),
    r(F::Message, P::Has("unsupported_country"), C::Auth),
    // Quota, credit, rate.
    r(
        F::Message,
        P::Has("credit balance is too low"),
        C::RateLimited,
    ),
    r(
        F::Message,
        P::Has("exceeded your current quota"),
        C::RateLimited,
    ),
    r(F::Message, P::Has("insufficient balance"), C::RateLimited),
    r(F::Message, P::Has("insufficient credits"), C::RateLimited),
    r(F::Message, P::Has("requires more credits"), C::RateLimited),
    r(F::Message, P::Has("api usage limits"), C::RateLimited),
    r(F::Message, P::Has("quota exceeded"), C::RateLimited),
    r(
        F::Message,
        P::Has("resource has been exhausted"),
        C::RateLimited,
    ),
    r(F::Message, P::Has("billing"), C::RateLimited),
    r(F::Message, P::Has("rate limit"), C::RateLimited),
    r(F::Message, P::Has("ratelimit"), C::RateLimited),
    r(F::Message, P::Has("tokens per min"), C::RateLimited),
    r(F::Message, P::Has("requests per min"), C::RateLimited),
    r(F::Message, P::Has("too many requests"), C::RateLimited),
    // Input too long.
    r(F::Message, P::Has("context length"), C::ContextLength),
    r(F::Message, P::Has("context window"), C::ContextLength),
    r(F::Message, P::Has("context limit"), C::ContextLength),
    r(F::Message, P::Has("prompt is too long"), C::ContextLength),
    r(F::Message, P::Has("input is too long"), C::ContextLength),
    r(F::Message, P::Has("input token count"), C::ContextLength),
    r(F::Message, P::Has("too many tokens"), C::ContextLength),
    r(
        F::Message,
        P::Has("reduce the length of the messages"),
        C::ContextLength,
    ),
    r(
        F::Message,
        P::Has("maximum prompt length"),
        C::ContextLength,
    ),
    // Hugging Face TGI: the input alone does not fit (a lone `max_new_tokens` bound
    // is only a malformed request).
    r(
        F::Message,
        P::Has("`inputs` tokens + `max_new_tokens`"),
        C::ContextLength,
    ),
    // The model is not there.
    r(
        F::Message,
        P::Both("model", "does not exist"),
        C::ModelNotFound,
    ),
    r(F::Message, P::Both("model", "not found"), C::ModelNotFound),
    r(
        F::Message,
        P::Both("model", "decommissioned"),
        C::ModelNotFound,
    ),
    r(
        F::Message,
        P::Both("model", "no longer supported"),
        C::ModelNotFound,
    ),
    r(
        F::Message,
        P::Both("model", "is not supported"),
        C::ModelNotFound,
    ),
    r(
        F::Message,
        P::Both("deployment", "does not exist"),
        C::ModelNotFound,
    ),
    r(F::Message, P::Starts("model:"), C::ModelNotFound),
    // OpenRouter: no provider serves the model (for this account's policy).
    r(F::Message, P::Has("no endpoints found"), C::ModelNotFound),
    r(
        F::Message,
        P::Has("no endpoints available"),
        C::ModelNotFound,
    ),
    // Vertex: a partner model not enabled for this project.
    r(
        F::Message,
        P::Has("not allowed to use publisher model"),
        C::ModelNotFound,
    ),
    // Family words: decide only where the status leaves the class open.
    r(F::Message, P::Has("overloaded"), C::Overloaded),
    r(F::Message, P::Has("high demand"), C::Overloaded),
    r(F::Message, P::Has("capacity"), C::Overloaded),
    r(F::Message, P::Has("system resource"), C::Overloaded),
    r(F::Message, P::Has("temporarily unavailable"), C::Overloaded),
    r(F::Message, P::Has("timed out"), C::Timeout),
    r(F::Message, P::Has("internal server error"), C::ServerError),
];

/// Every dialect, consulted for every answer: a relay can put any vendor's words
/// inside any adapter's envelope, so the adapter does not narrow the tables.
pub const DIALECTS: &[Dialect] = &[
    Dialect {
        name: "openai",
        rules: OPENAI,
    },
    Dialect {
        name: "azure",
        rules: AZURE,
    },
    Dialect {
        name: "anthropic",
        rules: ANTHROPIC,
    },
    Dialect {
        name: "google",
        rules: GOOGLE,
    },
    Dialect {
        name: "bedrock",
        rules: BEDROCK,
    },
    Dialect {
        name: "cloudflare",
        rules: CLOUDFLARE,
    },
    Dialect {
        name: "openrouter",
        rules: OPENROUTER,
    },
    Dialect {
        name: "prose",
        rules: PROSE,
    },
];

/// Classes a signal decides whatever the status says (after a content-policy signal):
/// they name the cause, where the others only name a family of causes.
pub fn is_explicit(class: FailureClass) -> bool {
    match class {
        C::ContentRefusal | C::Auth | C::RateLimited | C::ContextLength | C::ModelNotFound => true,
        C::Timeout
        | C::Connect
        | C::Dropped
        | C::Overloaded
        | C::ServerError
        | C::CircuitOpen
        | C::Malformed
        | C::Unclassified => false,
    }
}

/// Rank of an explicit class in the precedence rule (lower wins).
pub fn rank(class: FailureClass) -> u8 {
    match class {
        C::ContentRefusal => 0,
        C::Auth => 1,
        C::RateLimited => 2,
        C::ContextLength => 3,
        C::ModelNotFound => 4,
        C::Overloaded => 5,
        C::Timeout => 6,
        C::ServerError => 7,
        C::Malformed => 8,
        C::Connect | C::Dropped | C::CircuitOpen | C::Unclassified => 9,
    }
}
