//! What a model's family says about how it is billed, read from its upstream id where
//! the entry does not say: the price rules a vendor applies to every model from some
//! generation on, whatever the request sends. Each reader errs towards billing: a name
//! it cannot place is read as the newest generation, so that the ceiling's proof stays
//! a proof for a model released after this table.

/// A model id as its family patterns read it: lower case, without a vendor prefix
/// (`openai/o3-mini` on a relay is `o3-mini`).
pub fn family_name(upstream: &str) -> String {
    upstream
        .rsplit('/')
        .next()
        .unwrap_or(upstream)
        .to_ascii_lowercase()
}

/// The leading `major[.minor]` of `v` (`5.6-sol` → (5, 6); `4o` → (4, 0)).
pub fn version(v: &str) -> Option<(u32, u32)> {
    let major_len = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let major = v[..major_len].parse().ok()?;
    let rest = &v[major_len..];
    let minor = rest
        .strip_prefix('.')
        .map(|r| {
            r.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    Some((major, minor))
}

/// Whether the model writes its prompt cache by itself and bills the writes, with no
/// mark in the request: OpenAI's GPT-5.6 and every later family (`gpt-5.6-sol`,
/// `gpt-6…`), at 1.25× the uncached input rate ("Cache writes have no additional fee
/// on models before the GPT-5.6 family", OpenAI's prompt caching guide, July 2026),
/// reported as `cache_write_tokens`. Earlier GPT and `o` models write for free. A model
/// not named as OpenAI names them (a deployment's own name) is not recognised: its
/// entry lists `cache_write_per_mtok`.
pub fn writes_cache_by_itself(upstream: &str) -> bool {
    // `gpt-` anywhere: a fine-tune (`ft:gpt-5.6-sol:org::id`), a platform's prefix
    // (`openai.gpt-5.6-sol`).
    let name = family_name(upstream);
    name.find("gpt-")
        .and_then(|at| version(&name[at + "gpt-".len()..]))
        .is_some_and(|v| v >= (5, 6))
}

/// The uncached input rate's multiple a family that writes its cache by itself bills
/// its writes at (`writes_cache_by_itself`), in hundredths: 1.25×.
pub const SELF_WRITE_PERCENT: u32 = 125;

/// Whether the model may be billed at a regional premium its vendor's account picks:
/// Anthropic's models from Claude Opus 4.6 and Sonnet 4.6 on run where the workspace's
/// `default_inference_geo` says when a request names none, and inference kept in one
/// geography (`us`) is billed at 1.1× every rate (Anthropic's data residency and
/// pricing pages). purser cannot see the workspace's setting, and must not override it
/// (it is a residency choice), so the worst case carries the premium. Earlier models
/// (`claude-3-5-sonnet…`, `claude-sonnet-4-5…`, `claude-haiku-4-5…`) reject the
/// parameter and bill no premium; a Claude id whose version cannot be read
/// (`claude-latest`) is read as a newer one. A model that is no Claude (DeepSeek, Kimi
/// or GLM behind their Anthropic-compatible APIs) has no such setting.
pub fn may_bill_regional_premium(upstream: &str) -> bool {
    let name = family_name(upstream);
    let Some(at) = name.find("claude") else {
        // An alias (`opus`) may name a Claude; another vendor's model behind an
        // Anthropic-compatible API has no such setting.
        return !OTHER_VENDORS.iter().any(|v| name.contains(v));
    };
    // `claude` with no version after it (`claude`, an alias): read as the newest.
    let Some(rest) = name[at..].strip_prefix("claude-") else {
        return true;
    };
    // The old naming put the generation first: `claude-3-5-sonnet`, `claude-2.1`,
    // `claude-instant-1.2`.
    if rest.starts_with(|c: char| c.is_ascii_digit()) || rest.starts_with("instant") {
        return false;
    }
    // `opus-4-6`, `sonnet-4-5-20250929`, `opus-4-20250514` (4.0), Vertex's
    // `opus-4-6@20260205`: a tier, a major, and a minor of one or two digits (eight are
    // a date).
    let Some((_, after_tier)) = rest.split_once('-') else {
        return true;
    };
    let digits = |p: &str| -> String { p.chars().take_while(char::is_ascii_digit).collect() };
    // OpenRouter writes the version dotted: `claude-opus-4.6`.
    let mut parts = after_tier.split(['-', '.']);
    let Some(major) = parts.next().and_then(|m| digits(m).parse::<u32>().ok()) else {
        return true;
    };
    let minor = parts
        .next()
        .map(digits)
        .filter(|m| (1..=2).contains(&m.len()))
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    (major, minor) >= (4, 6)
}

/// Model families of other vendors served behind Anthropic-compatible APIs.
const OTHER_VENDORS: [&str; 6] = ["deepseek", "kimi", "moonshot", "glm", "minimax", "qwen"];

/// The regional premium (`may_bill_regional_premium`), in hundredths: 1.1×.
pub const REGIONAL_PERCENT: u32 = 110;

/// Whether the model searches the web on every call, whatever the request says, and
/// bills each call a fee beyond its tokens: OpenAI's search models
/// (`gpt-4o-search-preview`, `gpt-5-search-api`) and deep-research ones
/// (`o3-deep-research`), Perplexity's Sonar family (`sonar`, `sonar-pro`,
/// `sonar-reasoning-pro`: a request fee by search context size), and any model
/// OpenRouter runs `:online` (a fee per search result). By the name's words, so that a
/// variant named the same way is caught too.
pub fn searches_by_itself(upstream: &str) -> bool {
    let name = family_name(upstream);
    let words: Vec<&str> = name.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    name.ends_with(":online")
        || words.first() == Some(&"sonar")
        || words.contains(&"search")
        || name.contains("deep-research")
}

/// Whether the model's searches are no flat fee a call: deep-research models choose
/// how many searches to run (Perplexity bills each, and their citation tokens), and
/// OpenRouter's `:online` puts the results in the prompt, past any input bound. No
/// entry can make these a proof.
pub fn searches_without_bound(upstream: &str) -> bool {
    let name = family_name(upstream);
    name.ends_with(":online") || name.contains("deep-research")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt_5_6_and_later_write_their_cache_by_themselves() {
        for name in [
            "gpt-5.6-sol",
            "gpt-5.6-luna",
            "openai/gpt-5.6-terra",
            "GPT-5.7",
            "gpt-5.10-mini",
            "gpt-6",
            "gpt-6.1-codex",
            "ft:gpt-5.6-sol:acme::abc123",
            "openai.gpt-5.6-sol",
        ] {
            assert!(writes_cache_by_itself(name), "{name}");
        }
        for name in [
            "gpt-5.5",
            "gpt-5",
            "gpt-5-mini",
            "gpt-5.1-codex",
            "gpt-4o-mini",
            "gpt-4.1",
            "o3",
            "my-deployment",
            "claude-opus-4-6",
            "chatgpt-4o-latest",
            "ft:gpt-4o-mini:acme::abc123",
        ] {
            assert!(!writes_cache_by_itself(name), "{name}");
        }
    }

    #[test]
    fn models_that_search_on_every_call_are_named_so() {
        for name in [
            "gpt-4o-search-preview",
            "gpt-4o-mini-search-preview-2025-03-11",
            "gpt-5-search-api",
            "o3-deep-research",
            "o4-mini-deep-research-2025-06-26",
            "sonar",
            "sonar-pro",
            "perplexity/sonar-reasoning-pro",
            "sonar-deep-research",
            "openai/gpt-5.6-sol:online",
        ] {
            assert!(searches_by_itself(name), "{name}");
        }
        for name in [
            "o3-deep-research",
            "sonar-deep-research",
            "openai/gpt-5.6-sol:online",
        ] {
            assert!(searches_without_bound(name), "{name}");
        }
        assert!(!searches_without_bound("sonar-pro"));
        for name in [
            "gpt-5.6-sol",
            "claude-opus-4-6",
            "gemini-2.5-flash",
            "o3",
            "research-assistant-v2",
            "sonnet-searcher",
        ] {
            assert!(!searches_by_itself(name), "{name}");
        }
    }

    #[test]
    fn claude_4_6_and_later_and_unknown_names_may_bill_a_regional_premium() {
        for name in [
            "claude-opus-4-6",
            "claude-sonnet-4-6-20260217",
            "claude-opus-4-7",
            "claude-opus-5-5",
            "claude-haiku-5",
            "claude-latest",
            "anthropic.claude-opus-4-6-v1:0",
            "claude-opus-4-6@20260205",
            "anthropic/claude-opus-4.6",
            "my-claude-alias",
            "opus",
        ] {
            assert!(may_bill_regional_premium(name), "{name}");
        }
        for name in [
            "claude-sonnet-4-5-20250929",
            "claude-haiku-4-5",
            "claude-opus-4-1-20250805",
            "claude-opus-4-20250514",
            "claude-3-5-sonnet-20241022",
            "claude-3-opus-20240229",
            "claude-2.1",
            "claude-instant-1.2",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            "claude-sonnet-4-5@20250929",
            "deepseek-chat",
            "kimi-k2-0905-preview",
            "glm-4.6",
        ] {
            assert!(!may_bill_regional_premium(name), "{name}");
        }
    }
}
