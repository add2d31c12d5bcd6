//! JSON Schema validation of each document against the published schemas in `schemas/`.

use std::sync::OnceLock;

use jsonschema::Validator;
use jsonschema::error::ValidationErrorKind;
use serde_json::Value;

use super::diagnostic::{Diagnostic, did_you_mean};
use super::source::{Document, seg};

pub const GATEWAY_SCHEMA: &str = include_str!("../../schemas/gateway.schema.json");
pub const PROVIDER_SCHEMA: &str = include_str!("../../schemas/provider.schema.json");
pub const POLICY_SCHEMA: &str = include_str!("../../schemas/policy.schema.json");

/// Fields whose value is money; a YAML number there gets a specific message.
const MONEY_FIELDS: [&str; 9] = [
    "input_per_mtok",
    "output_per_mtok",
    "cached_input_per_mtok",
    "cache_write_per_mtok",
    "cache_write_1h_per_mtok",
    "audio_input_per_mtok",
    "fee_per_call",
    "per_request",
    "limit",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gateway,
    Provider,
    Policy,
}

pub const KINDS: [&str; 3] = ["gateway", "provider", "policy"];

fn validator(kind: Kind) -> &'static Validator {
    static V: OnceLock<[Validator; 3]> = OnceLock::new();
    let all = V.get_or_init(|| {
        [GATEWAY_SCHEMA, PROVIDER_SCHEMA, POLICY_SCHEMA].map(|text| {
            // The schemas are compiled into the binary and covered by tests, so failing
            // here is a build defect, not bad input.
            #[allow(clippy::expect_used)]
            let json: Value = serde_json::from_str(text).expect("embedded schema is JSON");
            #[allow(clippy::expect_used)]
            jsonschema::draft202012::new(&json).expect("embedded schema compiles")
        })
    });
    match kind {
        Kind::Gateway => &all[0],
        Kind::Provider => &all[1],
        Kind::Policy => &all[2],
    }
}

/// The document's kind, or a diagnostic saying why it has none.
pub fn kind_of(doc: &Document) -> Result<Kind, Diagnostic> {
    match doc.value.get("kind") {
        Some(Value::String(k)) => match k.as_str() {
            "gateway" => Ok(Kind::Gateway),
            "provider" => Ok(Kind::Provider),
            "policy" => Ok(Kind::Policy),
            other => Err(Diagnostic::error(
                "unknown-kind",
                doc.at("/kind"),
                format!("unknown kind `{other}`; expected one of: gateway, provider, policy"),
            )
            .with_help_opt(did_you_mean(other, KINDS))),
        },
        Some(other) => Err(Diagnostic::error(
            "unknown-kind",
            doc.at("/kind"),
            format!("`kind` must be a string, found {other}"),
        )),
        None if !doc.value.is_object() => Err(Diagnostic::error(
            "not-a-mapping",
            doc.at(""),
            "a document must be a mapping with a `kind` field".to_string(),
        )),
        None => Err(Diagnostic::error(
            "missing-field",
            doc.at(""),
            "missing required field `kind`; expected one of: gateway, provider, policy",
        )),
    }
}

/// Validate `doc` against its kind's schema; every violation becomes a diagnostic.
pub fn validate(doc: &Document, kind: Kind) -> Vec<Diagnostic> {
    let v = validator(kind);
    let mut out = Vec::new();
    // (object pointer, suggested name) of unknown fields, so that a typo is reported
    // once, not again as the missing field it was meant to be.
    let mut suggested: Vec<(String, String)> = Vec::new();
    for err in v.iter_errors(&doc.value) {
        let ptr = err.instance_path().as_str().to_string();
        let field = ptr.rsplit('/').next().unwrap_or("");
        let d = match err.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                let allowed = allowed_properties(kind, &ptr);
                for name in unexpected {
                    let p = format!("{ptr}/{}", seg(name));
                    if let Some(best) = closest(name, &allowed) {
                        suggested.push((ptr.clone(), best));
                    }
                    let where_ = if ptr.is_empty() {
                        "the document".to_string()
                    } else {
                        format!("`{}`", ptr.trim_start_matches('/'))
                    };
                    out.push(
                        Diagnostic::error(
                            "unknown-field",
                            doc.key_at(&p),
                            format!(
                                "unknown field `{name}` in {where_}; expected one of: {}",
                                allowed.join(", ")
                            ),
                        )
                        .with_help_opt(did_you_mean(name, allowed.iter().map(String::as_str))),
                    );
                }
                continue;
            }
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or("?");
                let where_ = if ptr.is_empty() {
                    String::new()
                } else {
                    format!(" in `{}`", ptr.trim_start_matches('/'))
                };
                Diagnostic::error(
                    "missing-field",
                    doc.at(&ptr),
                    format!("missing required field `{name}`{where_}"),
                )
            }
            ValidationErrorKind::Type { .. }
                if MONEY_FIELDS.contains(&field) && err.instance().is_number() =>
            {
                let written = doc
                    .raw_scalar(&ptr)
                    .map(str::to_string)
                    .unwrap_or_else(|| err.instance().to_string());
                Diagnostic::error(
                    "money-not-string",
                    doc.at(&ptr),
                    format!("`{field}: {written}` is a YAML number; money must be exact"),
                )
                .with_help(format!("write prices as strings: \"{written}\""))
            }
            _ => {
                let written = doc
                    .raw_scalar(&ptr)
                    .map(str::to_string)
                    .unwrap_or_else(|| err.instance().to_string());
                let what = if ptr.is_empty() {
                    "the document".to_string()
                } else {
                    format!("`{}`", ptr.trim_start_matches('/'))
                };
                Diagnostic::error(
                    "invalid-value",
                    doc.at(&ptr),
                    format!(
                        "invalid value `{written}` for {what}: {}",
                        describe(err.kind(), &err.to_string())
                    ),
                )
            }
        };
        out.push(d);
    }
    out.retain(|d| {
        !(d.code == "missing-field"
            && suggested.iter().any(|(p, name)| {
                d.message
                    .starts_with(&format!("missing required field `{name}`"))
                    && doc.at(p) == d.at
            }))
    });
    out
}

fn closest(name: &str, allowed: &[String]) -> Option<String> {
    did_you_mean(name, allowed.iter().map(String::as_str))?;
    allowed
        .iter()
        .max_by(|a, b| strsim::jaro_winkler(name, a).total_cmp(&strsim::jaro_winkler(name, b)))
        .cloned()
}

fn describe(kind: &ValidationErrorKind, fallback: &str) -> String {
    match kind {
        ValidationErrorKind::Enum { options } => format!("expected one of {options}"),
        ValidationErrorKind::Pattern { pattern } if pattern.contains("[0-9]+(\\.") => {
            "expected a non-negative decimal string such as \"0.15\"".to_string()
        }
        ValidationErrorKind::Pattern { pattern } => format!("expected text matching `{pattern}`"),
        _ => fallback.to_string(),
    }
}

/// The property names the schema allows at `ptr`, for "expected one of" and suggestions.
fn allowed_properties(kind: Kind, ptr: &str) -> Vec<String> {
    let schema_text = match kind {
        Kind::Gateway => GATEWAY_SCHEMA,
        Kind::Provider => PROVIDER_SCHEMA,
        Kind::Policy => POLICY_SCHEMA,
    };
    let Ok(schema) = serde_json::from_str::<Value>(schema_text) else {
        return vec![];
    };
    let mut node = &schema;
    let segs: Vec<&str> = ptr.split('/').skip(1).collect();
    let mut i = 0;
    while i < segs.len() {
        node = resolve(&schema, node);
        let s = segs[i];
        let next = if s.chars().all(|c| c.is_ascii_digit()) && node.get("items").is_some() {
            node.get("items")
        } else if let Some(p) = node.get("properties").and_then(|p| p.get(s)) {
            Some(p)
        } else {
            node.get("additionalProperties").filter(|a| a.is_object())
        };
        match next {
            Some(n) => node = n,
            None => return vec![],
        }
        i += 1;
    }
    node = resolve(&schema, node);
    let mut names: Vec<String> = node
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    if names.is_empty() {
        // credential: oneOf of single-key objects.
        if let Some(Value::Array(alts)) = node.get("oneOf") {
            for a in alts {
                if let Some(m) = a.get("properties").and_then(Value::as_object) {
                    names.extend(m.keys().cloned());
                }
            }
        }
    }
    names.sort();
    names
}

fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) if r.starts_with("#/") => root.pointer(&r[1..]).unwrap_or(node),
        _ => node,
    }
}
