//! Recorded requests as a replay reads them (`Ledger::recorded`): each request with
//! its shape at admission, where selection sent it, and what it was billed, in the
//! order the ledger admitted them. Both engines answer one flat row per attempt
//! (`Flat`); `Folder` joins a request's rows into one `Recorded`, so memory stays one
//! request whatever the ledger holds.

use super::{LedgerError, Shape};
use crate::money::Money;

/// Which requests to read.
#[derive(Debug, Clone, Default)]
pub struct Span {
    /// Received at or after.
    pub since: Option<time::OffsetDateTime>,
    /// Received before.
    pub until: Option<time::OffsetDateTime>,
    /// Only this policy's.
    pub policy: Option<String>,
}

/// Where an attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub provider: String,
    pub upstream_model: String,
    pub jurisdiction: String,
}

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub id: String,
    pub received_at: time::OffsetDateTime,
    pub client: String,
    pub policy: String,
    pub model: String,
    /// `served`, `refused`, `failed`, `interrupted`, `in_flight`.
    pub outcome: String,
    pub error_code: Option<String>,
    /// `None`: written before the ledger recorded shapes.
    pub shape: Option<Shape>,
    /// The first attempt's destination (the primary selection chose); `None` when it
    /// was refused before any attempt.
    pub primary: Option<Sent>,
    /// Tokens of the attempts billed from the vendor's usage.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// What those attempts were billed.
    pub billed: Money,
    /// What was charged at worst case, never billed from usage: attempts that may have
    /// been billed without proof, and billed ones whose usage was missing.
    pub worst_case: Money,
}

/// One row as an engine answers it: the request, and one of its attempts (or none).
#[derive(Debug)]
pub(crate) struct Flat {
    pub request: Recorded,
    pub attempt: Option<FlatAttempt>,
}

#[derive(Debug)]
pub(crate) struct FlatAttempt {
    pub seq: u32,
    pub sent: Sent,
    /// `billed`, `maybe_billed`, `not_billed`.
    pub billing: String,
    pub cost_basis: Option<String>,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cost: Money,
    pub worst_case: Money,
}

/// Joins consecutive rows of one request (rows arrive request by request, attempts in
/// order) into one `Recorded`.
#[derive(Default)]
pub(crate) struct Folder {
    current: Option<Recorded>,
}

impl Folder {
    /// Add a row; answers the previous request when this row starts another.
    pub fn push(&mut self, row: Flat) -> Result<Option<Recorded>, LedgerError> {
        let done = match &self.current {
            Some(c) if c.id == row.request.id => None,
            Some(_) | None => self.current.replace(row.request),
        };
        if let (Some(a), Some(c)) = (row.attempt, self.current.as_mut()) {
            add(c, a)?;
        }
        Ok(done)
    }

    /// The last request.
    pub fn finish(self) -> Option<Recorded> {
        self.current
    }
}

fn add(c: &mut Recorded, a: FlatAttempt) -> Result<(), LedgerError> {
    if a.seq == 1 {
        c.primary = Some(a.sent);
    }
    let tokens = |t: Option<i64>| u64::try_from(t.unwrap_or(0)).unwrap_or(0);
    match (a.billing.as_str(), a.cost_basis.as_deref()) {
        ("billed", Some("worst_case")) => c.worst_case = c.worst_case + a.cost,
        ("billed", _) => {
            c.billed = c.billed + a.cost;
            c.input_tokens = c.input_tokens.saturating_add(tokens(a.input_tokens));
            c.output_tokens = c.output_tokens.saturating_add(tokens(a.output_tokens));
        }
        ("maybe_billed", _) => c.worst_case = c.worst_case + a.worst_case,
        ("not_billed", _) => {}
        (other, _) => return Err(LedgerError::Corrupt(format!("billing state `{other}`"))),
    }
    Ok(())
}

/// Rows sent to a replay at a time: one channel message per batch keeps the hand-over
/// cheap at a million rows, and bounds what waits for a slow reader.
pub(crate) const BATCH: usize = 1024;

/// A shape from its columns: present when `choices` is (every row written with a shape
/// has it).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per stored column, read by both engines"
)]
pub(crate) fn shape(
    input: Option<i64>,
    requested: Option<i64>,
    output: Option<i64>,
    choices: Option<i64>,
    stream: Option<bool>,
    tools: Option<bool>,
    media: Option<bool>,
    unbounded: Option<bool>,
) -> Option<Shape> {
    let count = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    Some(Shape {
        input_tokens: count(input),
        requested_output: count(requested),
        output_bound: count(output),
        choices: count(choices)?,
        stream: stream.unwrap_or(false),
        tools: tools.unwrap_or(false),
        media: media.unwrap_or(false),
        unbounded: unbounded.unwrap_or(false),
    })
}

/// The shape columns in the order `shape` takes them; `NULL`s on a ledger whose schema
/// predates them (read without migrating: it may be a backup, or serve gateways).
/// `typed` casts the `NULL`s to the columns' types, as PostgreSQL needs to read them.
pub(crate) fn shape_columns(has_them: bool, typed: bool) -> &'static str {
    match (has_them, typed) {
        (true, _) => {
            "r.shape_input_tokens, r.shape_requested_output, r.shape_output_bound, r.shape_choices, \
             r.shape_stream, r.shape_tools, r.shape_media, r.shape_unbounded"
        }
        (false, false) => "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL",
        (false, true) => {
            "NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, \
             NULL::boolean, NULL::boolean, NULL::boolean, NULL::boolean"
        }
    }
}

/// The columns after the shape's, in the order `Flat` is read.
pub(crate) const ATTEMPT_COLUMNS: &str = "a.seq, a.provider, a.upstream_model, a.jurisdiction, \
     a.billing, a.cost_basis, a.input_tokens, a.output_tokens, a.cost, a.worst_case";
