//! The audit surface shared by the HTTP API and the `purser audit` CLI: query
//! parameters parsed into validated filters (once, with an error naming the bad
//! parameter), and the CSV rendering of attempts. The SQL lives in `ledger::audit`.

use crate::failure::FailureClass;
use crate::ledger::audit::{
    Bucket, Cursor, DEFAULT_LIMIT, Filter, GroupBy, Instant, MAX_LIMIT, RequestOutcome,
};

pub mod focus;
use crate::ledger::{LedgerError, audit::AttemptLine};

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("invalid `{name}` = `{value}`: expected {expected}")]
    InvalidParam {
        name: String,
        value: String,
        expected: String,
    },
    #[error("unknown parameter `{0}`; this endpoint accepts: {1}")]
    UnknownParam(String, String),
    #[error("parameter `{0}` given more than once")]
    Repeated(String),
    #[error("no request `{0}` in the ledger")]
    NotFound(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
}

/// Filters every listing accepts.
const FILTERS: [&str; 9] = [
    "since", "until", "provider", "policy", "client", "model", "class", "outcome", "ingress",
];

/// `requests`: filters plus one page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestsQuery {
    pub filter: Filter,
    pub limit: u32,
    pub cursor: Option<Cursor>,
}

/// `spend`: filters plus the grouping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendQuery {
    pub filter: Filter,
    pub group_by: GroupBy,
}

type Pairs<'a> = &'a [(String, String)];

fn invalid(name: &str, value: &str, expected: impl Into<String>) -> AuditError {
    AuditError::InvalidParam {
        name: name.to_string(),
        value: value.to_string(),
        expected: expected.into(),
    }
}

/// Refuse unknown and repeated parameters: a typo must not silently widen a query.
fn check_names(pairs: Pairs<'_>, extra: &[&str]) -> Result<(), AuditError> {
    let mut seen: Vec<&str> = Vec::with_capacity(pairs.len());
    for (k, _) in pairs {
        if !FILTERS.contains(&k.as_str()) && !extra.contains(&k.as_str()) {
            let accepted: Vec<&str> = FILTERS.iter().chain(extra).copied().collect();
            return Err(AuditError::UnknownParam(k.clone(), accepted.join(", ")));
        }
        if seen.contains(&k.as_str()) {
            return Err(AuditError::Repeated(k.clone()));
        }
        seen.push(k);
    }
    Ok(())
}

fn time_param(name: &str, v: &str) -> Result<Instant, AuditError> {
    time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
        .map(Instant::new)
        .map_err(|_| invalid(name, v, "an RFC 3339 time such as 2026-11-01T00:00:00Z"))
}

fn text_param(name: &str, v: &str) -> Result<String, AuditError> {
    if v.is_empty() || v.len() > 256 {
        return Err(invalid(name, v, "a non-empty id of at most 256 bytes"));
    }
    Ok(v.to_string())
}

fn filter(pairs: Pairs<'_>) -> Result<Filter, AuditError> {
    let mut f = Filter::default();
    for (k, v) in pairs {
        match k.as_str() {
            "since" => f.since = Some(time_param(k, v)?),
            "until" => f.until = Some(time_param(k, v)?),
            "provider" => f.provider = Some(text_param(k, v)?),
            "policy" => f.policy = Some(text_param(k, v)?),
            "client" => f.client = Some(text_param(k, v)?),
            "model" => f.model = Some(text_param(k, v)?),
            "class" => {
                if v != "success" && FailureClass::parse(v).is_none() {
                    let names: Vec<&str> = std::iter::once("success")
                        .chain(FailureClass::ALL.iter().map(|c| c.as_str()))
                        .collect();
                    return Err(invalid(k, v, format!("one of {}", names.join(", "))));
                }
                f.class = Some(v.clone());
            }
            "ingress" => {
                f.ingress = Some(crate::ingress::Ingress::parse(v).ok_or_else(|| {
                    let names: Vec<&str> = crate::ingress::Ingress::ALL
                        .iter()
                        .map(|i| i.as_str())
                        .collect();
                    invalid(k, v, format!("one of {}", names.join(", ")))
                })?);
            }
            "outcome" => {
                f.outcome = Some(RequestOutcome::parse(v).ok_or_else(|| {
                    let names: Vec<&str> = RequestOutcome::ALL.iter().map(|o| o.as_str()).collect();
                    invalid(k, v, format!("one of {}", names.join(", ")))
                })?);
            }
            _ => {}
        }
    }
    Ok(f)
}

pub fn requests_query(pairs: Pairs<'_>) -> Result<RequestsQuery, AuditError> {
    check_names(pairs, &["limit", "cursor"])?;
    let mut q = RequestsQuery {
        filter: filter(pairs)?,
        limit: DEFAULT_LIMIT,
        cursor: None,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => {
                q.limit = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| invalid(k, v, format!("an integer from 1 to {MAX_LIMIT}")))?;
            }
            "cursor" => {
                q.cursor = Some(
                    Cursor::decode(v)
                        .ok_or_else(|| invalid(k, v, "a next_cursor from a previous page"))?,
                );
            }
            _ => {}
        }
    }
    Ok(q)
}

pub fn spend_query(pairs: Pairs<'_>) -> Result<SpendQuery, AuditError> {
    check_names(pairs, &["group_by"])?;
    let mut group_by = GroupBy::Provider;
    for (k, v) in pairs {
        if k == "group_by" {
            group_by = GroupBy::parse(v).ok_or_else(|| {
                let names: Vec<&str> = GroupBy::ALL.iter().map(|g| g.as_str()).collect();
                invalid(k, v, format!("one of {}", names.join(", ")))
            })?;
        }
    }
    Ok(SpendQuery {
        filter: filter(pairs)?,
        group_by,
    })
}

/// `spend/series`: filters, the bucket width and the grouping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesQuery {
    pub filter: Filter,
    pub bucket: Bucket,
    pub group_by: GroupBy,
}

/// Groupings a series can stack by: those of the page's switch (the time one is the
/// bucket already; the ingress API is a filter there, not a stack).
fn series_group(g: GroupBy) -> bool {
    match g {
        GroupBy::Provider | GroupBy::Policy | GroupBy::Client | GroupBy::Model => true,
        GroupBy::Day | GroupBy::Ingress => false,
    }
}

pub fn series_query(pairs: Pairs<'_>) -> Result<SeriesQuery, AuditError> {
    check_names(pairs, &["bucket", "group_by"])?;
    let mut q = SeriesQuery {
        filter: filter(pairs)?,
        bucket: Bucket::Day,
        group_by: GroupBy::Provider,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "bucket" => {
                q.bucket = Bucket::parse(v).ok_or_else(|| {
                    let names: Vec<&str> = Bucket::ALL.iter().map(|b| b.as_str()).collect();
                    invalid(k, v, format!("one of {}", names.join(", ")))
                })?;
            }
            "group_by" => {
                q.group_by = GroupBy::parse(v)
                    .filter(|g| series_group(*g))
                    .ok_or_else(|| {
                        let names: Vec<&str> = GroupBy::ALL
                            .iter()
                            .filter(|g| series_group(**g))
                            .map(|g| g.as_str())
                            .collect();
                        invalid(k, v, format!("one of {}", names.join(", ")))
                    })?;
            }
            _ => {}
        }
    }
    Ok(q)
}

pub fn attempts_query(pairs: Pairs<'_>) -> Result<Filter, AuditError> {
    check_names(pairs, &[])?;
    filter(pairs)
}

/// The CSV header, in the order of `csv_record`.
pub const CSV_HEADER: [&str; 31] = [
    "request_id",
    "received_at",
    "policy",
    "client",
    "model",
    "plan_id",
    "ingress",
    "seq",
    "provider",
    "upstream_model",
    "jurisdiction",
    "started_at",
    "finished_at",
    "state",
    "status",
    "class",
    "billing",
    "decision",
    "reason",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "cost",
    "worst_case",
    "cost_basis",
    "message",
    "response_id",
    "currency",
];

/// One attempt as CSV cells, every text cell passed through `guard_cell`.
pub fn csv_record(line: &AttemptLine, currency: &str) -> Vec<String> {
    let a = &line.attempt;
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let num = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
    [
        line.request_id.clone(),
        line.received_at.clone(),
        line.policy.clone(),
        line.client.clone(),
        line.model.clone(),
        line.plan_id.clone(),
        line.ingress.clone(),
        a.seq.to_string(),
        a.provider.clone(),
        a.upstream_model.clone(),
        a.jurisdiction.clone(),
        a.started_at.clone(),
        opt(&a.finished_at),
        a.state.clone(),
        a.status.map(|s| s.to_string()).unwrap_or_default(),
        opt(&a.class),
        a.billing.clone(),
        opt(&a.decision),
        opt(&a.reason),
        num(a.input_tokens),
        num(a.output_tokens),
        num(a.cache_read_tokens),
        num(a.cache_write_tokens),
        num(a.cache_write_5m_tokens),
        num(a.cache_write_1h_tokens),
        a.cost.clone(),
        a.worst_case.clone(),
        opt(&a.cost_basis),
        opt(&a.message),
        opt(&a.response_id),
        currency.to_string(),
    ]
    .into_iter()
    .map(guard_cell)
    .collect()
}

/// Neutralise spreadsheet formulas: a cell that starts with `=`, `+`, `-`, `@` (or a
/// tab / carriage return, which some spreadsheets strip first) gets a leading `'`, so
/// an upstream message can never run as a formula in a finance reviewer's sheet.
pub fn guard_cell(s: String) -> String {
    match s.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{s}"),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn filters_parse_and_bad_ones_name_the_parameter() {
        let q = requests_query(&pairs(&[
            ("provider", "openai-main"),
            ("class", "rate_limited"),
            ("since", "2026-11-01T00:00:00Z"),
            ("limit", "5"),
        ]))
        .unwrap();
        assert_eq!(q.limit, 5);
        assert_eq!(q.filter.provider.as_deref(), Some("openai-main"));
        assert_eq!(q.filter.since.unwrap().text, "2026-11-01T00:00:00.000Z");
        for (k, v, needle) in [
            ("limit", "0", "1 to 1000"),
            ("limit", "1001", "1 to 1000"),
            ("class", "ratelimit", "rate_limited"),
            ("since", "yesterday", "RFC 3339"),
            ("outcome", "ok", "served"),
            ("ingress", "grpc", "messages"),
            ("cursor", "zz", "next_cursor"),
            ("provdier", "x", "accepts"),
        ] {
            let e = requests_query(&pairs(&[(k, v)])).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(needle), "{k}={v}: {e}");
        }
        let e = spend_query(&pairs(&[("group_by", "vendor")])).unwrap_err();
        assert!(
            e.to_string()
                .contains("provider, policy, client, model, day")
        );
        assert!(
            requests_query(&pairs(&[("model", "a"), ("model", "b")])).is_err(),
            "a repeated filter is refused"
        );
    }

    #[test]
    fn cursor_round_trips_and_rejects_tampering() {
        let c = Cursor(1_234_567);
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        for bad in [hex::encode("1 OR 1=1"), hex::encode("v1:-3"), "zz".into()] {
            assert_eq!(Cursor::decode(&bad), None, "{bad}");
        }
    }

    #[test]
    fn formula_cells_are_neutralised() {
        for s in ["=SUM(A1)", "+1", "-2", "@cmd", "\tx"] {
            assert!(guard_cell(s.to_string()).starts_with('\''), "{s}");
        }
        assert_eq!(guard_cell("0.0001".into()), "0.0001");
    }
}
