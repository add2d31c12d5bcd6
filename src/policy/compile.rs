//! Semantic validation: turns schema-valid documents into a `Plan`, or reports every
//! problem in the set at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde::de::DeserializeOwned;

use super::diagnostic::{Diagnostic, Diagnostics, Severity, SourceRef, did_you_mean};
use super::plan::*;
use super::raw::{
    RawCircuit, RawCredential, RawGateway, RawModel, RawPolicy, RawProvider, RawRates,
};
use super::schema::{self, Kind};
use super::source::{self, Document, seg};
use crate::ids::{ClientId, Jurisdiction, ModelName, PolicyId, ProviderId};
use crate::money::{Money, PricePerMTok};

const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// Compile every policy file under `dir`.
pub fn compile_dir(dir: &Path) -> Result<Plan, Diagnostics> {
    let loaded = source::load_dir(dir);
    compile_documents(loaded.documents, loaded.diagnostics)
}

/// Compile already-parsed documents (used by `diff --git`, which reads from git).
pub fn compile_documents(
    docs: Vec<Document>,
    mut diags: Vec<Diagnostic>,
) -> Result<Plan, Diagnostics> {
    let mut gateways = Vec::new();
    let mut providers = Vec::new();
    let mut policies = Vec::new();
    let load_failed = diags.iter().any(|d| d.severity == Severity::Error);
    // Names defined by documents that failed validation: references to them are not
    // reported again as unknown, which would only repeat the first error.
    let mut broken = BTreeSet::new();
    for doc in docs {
        let kind = match schema::kind_of(&doc) {
            Ok(k) => k,
            Err(d) => {
                diags.push(d);
                continue;
            }
        };
        let errs = schema::validate(&doc, kind);
        if !errs.is_empty() {
            if let Some(id) = doc.value.get("id").and_then(|v| v.as_str()) {
                broken.insert(id.to_string());
            }
            if let Some(models) = doc.value.get("models").and_then(|m| m.as_object()) {
                broken.extend(models.keys().cloned());
            }
            diags.extend(errs);
            continue;
        }
        match kind {
            Kind::Gateway => typed::<RawGateway>(&doc, &mut diags).map(|r| gateways.push((doc, r))),
            Kind::Provider => {
                typed::<RawProvider>(&doc, &mut diags).map(|r| providers.push((doc, r)))
            }
            Kind::Policy => typed::<RawPolicy>(&doc, &mut diags).map(|r| policies.push((doc, r))),
        };
    }
    let body = Compiler {
        diags: &mut diags,
        broken,
        load_failed,
    }
    .compile(gateways, providers, policies);
    diags.sort_by(|a, b| a.at.cmp(&b.at).then(a.code.cmp(b.code)));
    diags.dedup();
    match body {
        Some(body) if !diags.iter().any(|d| d.severity == Severity::Error) => {
            Ok(Plan::new(body, diags))
        }
        _ => Err(Diagnostics(diags)),
    }
}

fn typed<T: DeserializeOwned>(doc: &Document, diags: &mut Vec<Diagnostic>) -> Option<T> {
    match serde_json::from_value::<T>(doc.value.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            // The schema should have caught this; report rather than panic if they drift.
            diags.push(Diagnostic::error(
                "invalid-document",
                doc.at(""),
                e.to_string(),
            ));
            None
        }
    }
}

struct Compiler<'a> {
    diags: &'a mut Vec<Diagnostic>,
    broken: BTreeSet<String>,
    load_failed: bool,
}

fn money(doc: &Document, ptr: &str, text: &str, diags: &mut Vec<Diagnostic>) -> Option<Money> {
    match text.parse::<Money>() {
        Ok(m) => Some(m),
        Err(e) => {
            diags.push(Diagnostic::error(
                "invalid-money",
                doc.at(ptr),
                e.to_string(),
            ));
            None
        }
    }
}

impl Compiler<'_> {
    fn err(&mut self, code: &'static str, at: SourceRef, msg: String, help: Option<String>) {
        self.diags
            .push(Diagnostic::error(code, at, msg).with_help_opt(help));
    }

    fn compile(
        mut self,
        gateways: Vec<(Document, RawGateway)>,
        providers: Vec<(Document, RawProvider)>,
        policies: Vec<(Document, RawPolicy)>,
    ) -> Option<PlanBody> {
        let gateway = self.gateway(gateways);
        let default_circuit = gateway.as_ref().map(|g| g.2).unwrap_or_default();
        let providers = self.providers(providers, default_circuit);
        let policies = self.policies(policies, &providers);
        let (currency, hint, _) = gateway?;
        Some(PlanBody {
            currency,
            no_destination_hint: hint,
            providers: providers.into_iter().map(|(k, (_, p))| (k, p)).collect(),
            policies,
        })
    }

    fn gateway(
        &mut self,
        gateways: Vec<(Document, RawGateway)>,
    ) -> Option<(String, Option<String>, CircuitConfig)> {
        let mut iter = gateways.into_iter();
        let Some((first_doc, g)) = iter.next() else {
            if self.load_failed {
                return None; // a file that could not be read may hold it
            }
            self.err(
                "missing-gateway",
                SourceRef {
                    file: "<policy set>".into(),
                    line: 1,
                    col: 1,
                },
                "no `kind: gateway` document in the set".into(),
                Some("add one document with `kind: gateway` and `currency: USD`".into()),
            );
            return None;
        };
        for (doc, _) in iter {
            self.err(
                "duplicate-gateway",
                doc.at("/kind"),
                "a second `kind: gateway` document; a set has exactly one".into(),
                Some(format!("the first is at {}", first_doc.at("/kind"))),
            );
        }
        let circuit = merge_circuit(CircuitConfig::default(), g.circuit);
        Some((g.currency, g.no_destination_hint, circuit))
    }

    fn providers(
        &mut self,
        raw: Vec<(Document, RawProvider)>,
        default_circuit: CircuitConfig,
    ) -> BTreeMap<ProviderId, (Document, Provider)> {
        let mut out: BTreeMap<ProviderId, (Document, Provider)> = BTreeMap::new();
        for (doc, p) in raw {
            let id = ProviderId::new(&p.id);
            if let Some((first, _)) = out.get(&id) {
                self.err(
                    "duplicate-id",
                    doc.at("/id"),
                    format!("duplicate provider id `{}`", p.id),
                    Some(format!("first defined at {}", first.at("/id"))),
                );
                continue;
            }
            let mut models = BTreeMap::new();
            for (name, m) in &p.models {
                let base = format!("/models/{}", seg(name));
                let input = money(
                    &doc,
                    &format!("{base}/input_per_mtok"),
                    &m.input_per_mtok,
                    self.diags,
                );
                let output = money(
                    &doc,
                    &format!("{base}/output_per_mtok"),
                    &m.output_per_mtok,
                    self.diags,
                );
                // Optional rates: absent means "not in the table", priced conservatively
                // at charge time; a present but malformed one is an error like any price.
                let mut optional = |field: &str, text: &Option<String>| match text {
                    None => Ok(None),
                    Some(t) => money(&doc, &format!("{base}/{field}"), t, self.diags)
                        .map(|m| Some(PricePerMTok::new(m)))
                        .ok_or(()),
                };
                let cached = optional("cached_input_per_mtok", &m.cached_input_per_mtok);
                let write = optional("cache_write_per_mtok", &m.cache_write_per_mtok);
                let terms = terms(&doc, &base, m, self.diags);
                // Only the OpenAI API has two cap fields: elsewhere the field is set by
                // the translation, and this setting would silently do nothing.
                if let (Some(_), Api::Anthropic | Api::Gemini) = (m.cap_field, p.api) {
                    self.diags.push(
                        Diagnostic::warning(
                            "cap-field-unused",
                            doc.at(&format!("{base}/cap_field")),
                            format!(
                                "`cap_field` has no effect on a provider with api `{}`: purser always sends its one cap field",
                                p.api.as_str()
                            ),
                        )
                        .with_help("remove it, or set it on an `api: openai` provider"),
                    );
                }
                if let (Some(i), Some(o), Ok(cached), Ok(write), Some(terms)) =
                    (input, output, cached, write, terms)
                {
                    models.insert(
                        ModelName::new(name),
                        ProviderModel {
                            upstream: m.upstream.clone().unwrap_or_else(|| name.clone()),
                            context_window: m.context_window,
                            input_per_mtok: PricePerMTok::new(i),
                            output_per_mtok: PricePerMTok::new(o),
                            cached_input_per_mtok: cached,
                            cache_write_per_mtok: write,
                            terms,
                        },
                    );
                }
            }
            let provider = Provider {
                id: id.clone(),
                api: p.api,
                endpoints: Endpoints::new(p.base_url.trim_end_matches('/')),
                base_url: p.base_url.trim_end_matches('/').to_string(),
                jurisdiction: Jurisdiction::new(&p.jurisdiction),
                tier: p.tier,
                credential: p.credential.map(|c| match c {
                    RawCredential::Env(e) => Credential::Env(e),
                    RawCredential::File(f) => Credential::File(f),
                }),
                timeout_ms: p.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
                circuit: merge_circuit(default_circuit, p.circuit),
                models,
            };
            if provider.credential.is_some()
                && let Some(host) = cleartext_remote_host(&provider.base_url)
            {
                self.diags.push(
                    Diagnostic::warning(
                        "cleartext-credential",
                        doc.at("/base_url"),
                        format!(
                            "provider `{}` sends its key over plain http:// to `{host}`, which is not loopback: the key and every prompt cross the network in cleartext",
                            provider.id
                        ),
                    )
                    .with_help("use https://, or keep http:// for 127.0.0.1, [::1] or localhost"),
                );
            }
            out.insert(id, (doc, provider));
        }
        out
    }

    fn policies(
        &mut self,
        raw: Vec<(Document, RawPolicy)>,
        providers: &BTreeMap<ProviderId, (Document, Provider)>,
    ) -> BTreeMap<PolicyId, Policy> {
        let mut out: BTreeMap<PolicyId, Policy> = BTreeMap::new();
        let mut first_at: HashMap<String, SourceRef> = HashMap::new();
        let mut key_owner: HashMap<String, (String, SourceRef)> = HashMap::new();
        let all_models: BTreeSet<&str> = providers
            .values()
            .flat_map(|(_, p)| p.models.keys().map(|m| m.as_str()))
            .collect();
        for (doc, p) in raw {
            if let Some(first) = first_at.get(&p.id) {
                self.err(
                    "duplicate-id",
                    doc.at("/id"),
                    format!("duplicate policy id `{}`", p.id),
                    Some(format!("first defined at {first}")),
                );
                continue;
            }
            first_at.insert(p.id.clone(), doc.at("/id"));

            let mut client_ids = BTreeSet::new();
            let mut clients = Vec::new();
            for (i, c) in p.clients.iter().enumerate() {
                let hash = c.key_sha256.to_ascii_lowercase();
                if !client_ids.insert(c.id.clone()) {
                    self.err(
                        "duplicate-id",
                        doc.at(&format!("/clients/{i}/id")),
                        format!("duplicate client id `{}` in policy `{}`", c.id, p.id),
                        None,
                    );
                }
                let at = doc.at(&format!("/clients/{i}/key_sha256"));
                if let Some((owner, owner_at)) = key_owner.get(&hash) {
                    self.err(
                        "duplicate-client-key",
                        at.clone(),
                        format!("client `{}` has the same key hash as a client of policy `{owner}`; a key belongs to one policy", c.id),
                        Some(format!("the other is at {owner_at}")),
                    );
                } else {
                    key_owner.insert(hash.clone(), (p.id.clone(), at));
                }
                clients.push(Client {
                    id: ClientId::new(&c.id),
                    key_sha256: hash,
                });
            }
            clients.sort_by(|a, b| a.id.cmp(&b.id));

            let per_request = money(
                &doc,
                "/ceiling/per_request",
                &p.ceiling.per_request,
                self.diags,
            );
            if let Some(c) = per_request
                && !c.is_positive()
            {
                self.err(
                    "non-positive-ceiling",
                    doc.at("/ceiling/per_request"),
                    format!("ceiling `per_request: \"{}\"` must be a positive amount", p.ceiling.per_request),
                    Some("a ceiling of zero or less would refuse every request; remove the policy instead".into()),
                );
            }
            let mut budgets = Vec::new();
            let mut periods = BTreeSet::new();
            for (i, b) in p.budgets.iter().enumerate() {
                let ptr = format!("/budgets/{i}/limit");
                if !periods.insert(b.period) {
                    self.err(
                        "duplicate-budget",
                        doc.at(&format!("/budgets/{i}/period")),
                        format!("two `{}` budgets in policy `{}`", b.period.as_str(), p.id),
                        None,
                    );
                }
                if let Some(limit) = money(&doc, &ptr, &b.limit, self.diags) {
                    if !limit.is_positive() {
                        self.err(
                            "non-positive-budget",
                            doc.at(&ptr),
                            format!("budget limit `\"{}\"` must be a positive amount", b.limit),
                            None,
                        );
                    }
                    budgets.push(Budget {
                        period: b.period,
                        limit,
                    });
                }
            }
            budgets.sort_by_key(|b| b.period);

            let jurisdictions: BTreeSet<Jurisdiction> =
                p.jurisdictions.iter().map(Jurisdiction::new).collect();
            let mut routes = BTreeMap::new();
            for (i, m) in p.models.iter().enumerate() {
                let ptr = format!("/models/{i}");
                if !all_models.contains(m.as_str()) {
                    if self.broken.contains(m) {
                        continue;
                    }
                    self.err(
                        "unknown-model",
                        doc.at(&ptr),
                        format!("model `{m}` is not served by any provider"),
                        did_you_mean(m, all_models.iter().copied()),
                    );
                    continue;
                }
                let mut pool = Vec::new();
                let mut accounts = Vec::new();
                for (_, prov) in providers.values() {
                    if !jurisdictions.contains(&prov.jurisdiction) {
                        continue;
                    }
                    if let Some(d) = destination(prov, m) {
                        match prov.tier {
                            Tier::Pool => pool.push(d),
                            Tier::Account => accounts.push(d),
                        }
                    }
                }
                if pool.is_empty() && accounts.is_empty() {
                    self.diags.push(
                        Diagnostic::warning(
                            "no-destination",
                            doc.at(&ptr),
                            format!("model `{m}` has no provider in jurisdictions [{}]; requests for it will be refused", p.jurisdictions.join(", ")),
                        ),
                    );
                }
                routes.insert(
                    ModelName::new(m),
                    Route {
                        pool,
                        accounts,
                        alternate: None,
                    },
                );
            }

            for (model, target) in &p.alternates {
                let ptr = format!("/alternates/{}", seg(model));
                let Some(route) = routes.get_mut(model.as_str()) else {
                    if p.models.contains(model) {
                        continue; // already reported as an unknown model
                    }
                    self.err(
                        "alternate-for-unlisted-model",
                        doc.key_at(&ptr),
                        format!(
                            "alternate for `{model}`, which policy `{}` does not allow",
                            p.id
                        ),
                        did_you_mean(model, p.models.iter().map(String::as_str)),
                    );
                    continue;
                };
                let Some((prov_id, alt_model)) = target.split_once('/') else {
                    continue;
                };
                let Some((_, prov)) = providers.get(prov_id) else {
                    if self.broken.contains(prov_id) {
                        continue;
                    }
                    self.err(
                        "unknown-provider",
                        doc.at(&ptr),
                        format!("alternate `{target}` names unknown provider `{prov_id}`"),
                        did_you_mean(prov_id, providers.keys().map(|k| k.as_str())),
                    );
                    continue;
                };
                if !jurisdictions.contains(&prov.jurisdiction) {
                    self.err(
                        "alternate-jurisdiction",
                        doc.at(&ptr),
                        format!(
                            "alternate `{target}` is in jurisdiction `{}`, which policy `{}` does not allow (allowed: {})",
                            prov.jurisdiction, p.id, p.jurisdictions.join(", ")
                        ),
                        Some(format!("add `{}` to the policy's jurisdictions, or pick an alternate in them", prov.jurisdiction)),
                    );
                    continue;
                }
                let Some(dest) = destination(prov, alt_model) else {
                    self.err(
                        "alternate-unpriced",
                        doc.at(&ptr),
                        format!("alternate `{target}`: provider `{prov_id}` has no price for model `{alt_model}`"),
                        did_you_mean(alt_model, prov.models.keys().map(|k| k.as_str()))
                            .or_else(|| Some(format!("add `{alt_model}` with its prices under `models:` of provider `{prov_id}`"))),
                    );
                    continue;
                };
                let candidates: Vec<&Destination> =
                    route.pool.iter().chain(&route.accounts).collect();
                if !candidates.is_empty()
                    && candidates.iter().all(|c| {
                        providers
                            .get(c.provider.as_str())
                            .is_some_and(|(_, cp)| cp.same_upstream(prov))
                    })
                {
                    self.err(
                        "alternate-same-upstream",
                        doc.at(&ptr),
                        format!("alternate `{target}` is the same upstream (base_url and credential) as every primary for `{model}`; an outage there is an outage of the alternate too"),
                        Some("name an alternate at another vendor or account".into()),
                    );
                    continue;
                }
                route.alternate = Some(dest);
            }

            let Some(per_request) = per_request else {
                continue;
            };
            out.insert(
                PolicyId::new(&p.id),
                Policy {
                    id: PolicyId::new(&p.id),
                    clients,
                    jurisdictions: jurisdictions.into_iter().collect(),
                    ceiling: Ceiling {
                        per_request,
                        mode: p.ceiling.mode,
                        on_exceed: p.ceiling.on_exceed,
                    },
                    max_output_tokens: p.max_output_tokens,
                    budgets,
                    routes,
                },
            );
        }
        out
    }
}

/// The host of a plain `http://` URL that leaves this machine; `None` for https and
/// for loopback (127.0.0.0/8, ::1, localhost), where nothing crosses a network.
fn cleartext_remote_host(base_url: &str) -> Option<String> {
    let scheme_len = "http://".len();
    let scheme = base_url.get(..scheme_len)?;
    if !scheme.eq_ignore_ascii_case("http://") {
        return None;
    }
    let rest = &base_url[scheme_len..];
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Credentials in the URL (`user:pass@host`) come before the last `@`.
    let hostport = authority.rsplit('@').next().unwrap_or_default();
    let host = match hostport.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => hostport.split(':').next().unwrap_or_default(),
    };
    let lower = host.to_ascii_lowercase();
    let loopback = match lower.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => lower == "localhost" || lower.ends_with(".localhost"),
    };
    (!loopback).then(|| host.to_string())
}

fn destination(prov: &Provider, model: &str) -> Option<Destination> {
    let m = prov.models.get(model)?;
    Some(Destination {
        provider: prov.id.clone(),
        model: ModelName::new(model),
        upstream_model: m.upstream.clone(),
        api: prov.api,
        jurisdiction: prov.jurisdiction.clone(),
        tier: prov.tier,
        context_window: m.context_window,
        input_per_mtok: m.input_per_mtok,
        output_per_mtok: m.output_per_mtok,
        cached_input_per_mtok: m.cached_input_per_mtok,
        cache_write_per_mtok: m.cache_write_per_mtok,
        terms: m.terms.clone(),
    })
}

/// The optional parts of a model entry, their prices checked like any price; `None`
/// when one is malformed (the diagnostic is pushed).
fn terms(
    doc: &Document,
    base: &str,
    m: &RawModel,
    diags: &mut Vec<Diagnostic>,
) -> Option<ModelTerms> {
    let mut ok = true;
    let mut price = |ptr: String, text: &str| -> Option<PricePerMTok> {
        let p = money(doc, &ptr, text, diags).map(PricePerMTok::new);
        ok &= p.is_some();
        p
    };
    let mut rates = |at: String, r: &RawRates| -> Option<Rates> {
        let input = price(format!("{at}/input_per_mtok"), &r.input_per_mtok);
        let output = price(format!("{at}/output_per_mtok"), &r.output_per_mtok);
        let cached = r
            .cached_input_per_mtok
            .as_ref()
            .map(|c| price(format!("{at}/cached_input_per_mtok"), c));
        Some(Rates {
            input_per_mtok: input?,
            output_per_mtok: output?,
            cached_input_per_mtok: match cached {
                None => None,
                Some(c) => Some(c?),
            },
        })
    };
    let long_context = m.long_context.as_ref().and_then(|l| {
        let r = RawRates {
            input_per_mtok: l.input_per_mtok.clone(),
            output_per_mtok: l.output_per_mtok.clone(),
            cached_input_per_mtok: l.cached_input_per_mtok.clone(),
        };
        rates(format!("{base}/long_context"), &r).map(|rates| LongContext {
            above_input_tokens: l.above_input_tokens,
            rates,
        })
    });
    let mut service_tiers = BTreeMap::new();
    for (tier, r) in m.service_tiers.iter().flatten() {
        if let Some(r) = rates(format!("{base}/service_tiers/{}", tier.as_str()), r) {
            service_tiers.insert(*tier, r);
        }
    }
    let write_1h = m
        .cache_write_1h_per_mtok
        .as_ref()
        .and_then(|t| price(format!("{base}/cache_write_1h_per_mtok"), t));
    let audio_rate = m
        .audio_input_per_mtok
        .as_ref()
        .and_then(|t| price(format!("{base}/audio_input_per_mtok"), t));
    let call_fee = m.fee_per_call.as_ref().and_then(|t| {
        let at = format!("{base}/fee_per_call");
        let fee = money(doc, &at, t, diags);
        ok &= fee.is_some();
        fee
    });
    let media = m.media_tokens.unwrap_or_default();
    ok.then_some(ModelTerms {
        fee_per_call: call_fee,
        cache_write_1h_per_mtok: write_1h,
        audio_input_per_mtok: audio_rate,
        cap_field: m.cap_field,
        reasoning_budget: m.reasoning_budget,
        media_tokens: MediaTokens {
            image: media.image,
            audio: media.audio,
            video: media.video,
            file: media.file,
        },
        long_context,
        service_tiers,
    })
}

fn merge_circuit(base: CircuitConfig, over: Option<RawCircuit>) -> CircuitConfig {
    let o = over.unwrap_or_default();
    CircuitConfig {
        failures: o.failures.unwrap_or(base.failures),
        window_s: o.window_s.unwrap_or(base.window_s),
        cooldown_s: o.cooldown_s.unwrap_or(base.cooldown_s),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plain_http_off_this_machine_is_cleartext() {
        use super::cleartext_remote_host as c;
        assert_eq!(
            c("http://api.example.com/v1").as_deref(),
            Some("api.example.com")
        );
        assert_eq!(c("HTTP://10.0.0.5:8000/v1").as_deref(), Some("10.0.0.5"));
        assert_eq!(
            c("http://u:p@gw.internal:80/v1").as_deref(),
            Some("gw.internal")
        );
        assert_eq!(
            c("http://[2001:db8::1]:80/v1").as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(c("http://127.0.0.1:9000/v1"), None);
        assert_eq!(c("http://127.8.9.10/v1"), None);
        assert_eq!(c("http://[::1]:8000/v1"), None);
        assert_eq!(c("http://localhost:8000"), None);
        assert_eq!(c("http://LOCALHOST/v1"), None);
        assert_eq!(c("https://api.openai.com/v1"), None);
    }
}
