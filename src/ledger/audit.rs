//! Audit queries: the read side that answers "which vendor billed which call, and
//! which policy allowed it". This module holds the engine-neutral filters and answers;
//! each engine's queries (`sqlite::audit`, `postgres::read`) bind every value as a
//! parameter, never splicing it into SQL.
//!
//! Time filters select requests by when they were received (`requests`) and attempts
//! by when they started (`spend`, `attempts.csv`): an attempt belongs to the window it
//! was sent in, even when its request began a moment earlier.

use serde::Serialize;

use super::read::{AttemptRow, BudgetRow, RequestRow};
use super::{LedgerError, Outcome};
use crate::money::Money;

/// Largest page of `requests`.
pub const MAX_LIMIT: u32 = 1000;
pub const DEFAULT_LIMIT: u32 = 100;

/// A request row's `outcome` column: in flight, ended on its own path (the
/// `Outcome` the gateway records), or interrupted (recovered after a crash, or given
/// up on) until an operator settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    InFlight,
    Ended(Outcome),
    Interrupted,
}

impl RequestOutcome {
    pub const ALL: [RequestOutcome; 5] = [
        RequestOutcome::InFlight,
        RequestOutcome::Ended(Outcome::Served),
        RequestOutcome::Ended(Outcome::Refused),
        RequestOutcome::Ended(Outcome::Failed),
        RequestOutcome::Interrupted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::InFlight => "in_flight",
            RequestOutcome::Ended(o) => o.as_str(),
            RequestOutcome::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<RequestOutcome> {
        RequestOutcome::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// A validated filter; every field narrows, `None` means "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Inclusive lower bound, as `rfc3339` text and milliseconds.
    pub since: Option<Instant>,
    /// Exclusive upper bound.
    pub until: Option<Instant>,
    pub provider: Option<String>,
    pub policy: Option<String>,
    pub client: Option<String>,
    pub model: Option<String>,
    /// `success` or a failure class name.
    pub class: Option<String>,
    pub outcome: Option<RequestOutcome>,
    pub ingress: Option<crate::ingress::Ingress>,
}

/// One instant in both stored forms: milliseconds (requests) and the canonical
/// RFC 3339 text (attempts; fixed width, so text order is time order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instant {
    pub ms: i64,
    pub text: String,
    /// The instant itself (PostgreSQL binds it as timestamptz).
    pub at: time::OffsetDateTime,
}

impl Instant {
    pub fn new(t: time::OffsetDateTime) -> Instant {
        let ms = i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        Instant {
            ms,
            text: super::rfc3339(t),
            at: t,
        }
    }
}

/// Where the previous page ended: the commit sequence of its last request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor(pub i64);

impl Cursor {
    /// Opaque to clients (and versioned, should paging ever change): hex of `v1:<seq>`.
    pub fn encode(self) -> String {
        hex::encode(format!("v1:{}", self.0))
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        let raw = String::from_utf8(hex::decode(s).ok()?).ok()?;
        let seq: i64 = raw.strip_prefix("v1:")?.parse().ok()?;
        (seq >= 0).then_some(Cursor(seq))
    }
}

pub struct RequestPage {
    pub requests: Vec<RequestRow>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Provider,
    Policy,
    Client,
    Model,
    /// The client API (`chat`, `messages`, `responses`).
    Ingress,
    Day,
}

impl GroupBy {
    pub const ALL: [GroupBy; 6] = [
        GroupBy::Provider,
        GroupBy::Policy,
        GroupBy::Client,
        GroupBy::Model,
        GroupBy::Day,
        GroupBy::Ingress,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Provider => "provider",
            GroupBy::Policy => "policy",
            GroupBy::Client => "client",
            GroupBy::Model => "model",
            GroupBy::Ingress => "ingress",
            GroupBy::Day => "day",
        }
    }

    pub fn parse(s: &str) -> Option<GroupBy> {
        GroupBy::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

/// One group of attempts: exact billed cost, and separately what may have been billed
/// without proof (the worst cases of `maybe_billed` attempts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpendRow {
    pub key: String,
    pub cost: Money,
    pub maybe_billed_cost: Money,
    pub attempts: u64,
    pub billed: u64,
    pub maybe_billed: u64,
    pub not_billed: u64,
}

/// One attempt with its request's context, as a CSV row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptLine {
    pub request_id: String,
    pub received_at: String,
    pub policy: String,
    pub client: String,
    pub model: String,
    pub plan_id: String,
    pub ingress: String,
    #[serde(flatten)]
    pub attempt: AttemptRow,
}

/// A period budget's current state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetState {
    pub policy: String,
    pub period: String,
    pub window_start: String,
    pub limit: Money,
    pub spent: Money,
    pub reserved: Money,
    pub remaining: Money,
}

impl TryFrom<BudgetRow> for BudgetState {
    type Error = LedgerError;
    fn try_from(b: BudgetRow) -> Result<BudgetState, LedgerError> {
        let (limit, spent, reserved) = (
            parse_money(&b.limit)?,
            parse_money(&b.spent)?,
            parse_money(&b.reserved)?,
        );
        Ok(BudgetState {
            policy: b.policy,
            period: b.period,
            window_start: b.window_start,
            limit,
            spent,
            reserved,
            remaining: limit.saturating_sub(spent + reserved),
        })
    }
}

pub(super) fn parse_money(s: &str) -> Result<Money, LedgerError> {
    s.parse()
        .map_err(|e| LedgerError::Corrupt(format!("amount `{s}`: {e}")))
}

/// The width of one step of a spend series. Buckets are UTC calendar units, labelled
/// by their start (`2026-11-03T00:00:00Z`), so a bucket's label sorts as its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    Hour,
    Day,
    Month,
}

impl Bucket {
    pub const ALL: [Bucket; 3] = [Bucket::Hour, Bucket::Day, Bucket::Month];

    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Hour => "hour",
            Bucket::Day => "day",
            Bucket::Month => "month",
        }
    }

    pub fn parse(s: &str) -> Option<Bucket> {
        Bucket::ALL.into_iter().find(|b| b.as_str() == s)
    }

    /// How many leading characters of purser's RFC 3339 text name the bucket
    /// (`2026-11-03T14` for an hour), and what completes that prefix into the
    /// bucket's start.
    pub fn prefix(self) -> (usize, &'static str) {
        match self {
            Bucket::Hour => (13, ":00:00Z"),
            Bucket::Day => (10, "T00:00:00Z"),
            Bucket::Month => (7, "-01T00:00:00Z"),
        }
    }
}

/// One (bucket, group) cell of a spend series: the same sums as `SpendRow`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesRow {
    pub bucket: String,
    #[serde(flatten)]
    pub spend: SpendRow,
}

/// Attempts that ended in one class at one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureRow {
    pub provider: String,
    /// `success`, a failure class, or `in_flight` for an attempt with no class yet.
    pub class: String,
    pub attempts: u64,
}

/// How requests ended, for the page's failure panel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    pub total: u64,
    pub served: u64,
    pub refused: u64,
    pub failed: u64,
    pub in_flight: u64,
    pub interrupted: u64,
    /// Served requests whose answer came from an attempt after the first: what the
    /// alternates saved.
    pub served_after_failover: u64,
}

impl RequestCounts {
    /// Count `n` requests with stored outcome `outcome`.
    pub(super) fn add(&mut self, outcome: &str, n: u64) -> Result<(), LedgerError> {
        self.total += n;
        let slot = match RequestOutcome::ALL
            .into_iter()
            .find(|o| o.as_str() == outcome)
        {
            Some(RequestOutcome::InFlight) => &mut self.in_flight,
            Some(RequestOutcome::Ended(Outcome::Served)) => &mut self.served,
            Some(RequestOutcome::Ended(Outcome::Refused)) => &mut self.refused,
            Some(RequestOutcome::Ended(Outcome::Failed)) => &mut self.failed,
            Some(RequestOutcome::Interrupted) => &mut self.interrupted,
            None => return Err(LedgerError::Corrupt(format!("request outcome `{outcome}`"))),
        };
        *slot += n;
        Ok(())
    }
}

/// Failures by provider and class, and how requests ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failures {
    pub attempts: Vec<FailureRow>,
    pub requests: RequestCounts,
}

impl SpendRow {
    pub(super) fn empty(key: String) -> SpendRow {
        SpendRow {
            key,
            cost: Money::ZERO,
            maybe_billed_cost: Money::ZERO,
            attempts: 0,
            billed: 0,
            maybe_billed: 0,
            not_billed: 0,
        }
    }

    /// Add `n` attempts in billing state `billing`, with their summed cost and worst
    /// case; the worst case counts only for `maybe_billed` (exposure, not spend).
    pub(super) fn add(
        &mut self,
        billing: &str,
        n: u64,
        cost: Money,
        worst_case: Money,
    ) -> Result<(), LedgerError> {
        let overflow = || LedgerError::Corrupt("spend total overflows a decimal".into());
        self.attempts += n;
        self.cost = self.cost.checked_add(cost).ok_or_else(overflow)?;
        match billing {
            "billed" => self.billed += n,
            "maybe_billed" => {
                self.maybe_billed += n;
                self.maybe_billed_cost = self
                    .maybe_billed_cost
                    .checked_add(worst_case)
                    .ok_or_else(overflow)?;
            }
            "not_billed" => self.not_billed += n,
            other => return Err(LedgerError::Corrupt(format!("billing state `{other}`"))),
        }
        Ok(())
    }
}

/// Where a spend-page query reads: the hourly rollups the writers keep (migration
/// `0009_rollups` / PostgreSQL `0005_rollups`) for the whole hours of its window, or
/// the raw rows only. Both give the same answer to the last decimal; `Rows` is there
/// to prove it (`tests/rollups.rs`) and to measure what the rollups save.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    #[default]
    Rollups,
    Rows,
}

/// How a filter's window divides between the rollups and the raw rows: the whole UTC
/// hours `[from, to)` (`None`: unbounded on that side) from the rollups, and the ragged
/// head and tail (the parts of an hour a bound cuts) from the rows, as filters of
/// their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub from: Option<Instant>,
    pub to: Option<Instant>,
    pub ragged: Vec<Filter>,
}

/// The start of the UTC hour holding `t`.
fn hour_floor(t: time::OffsetDateTime) -> time::OffsetDateTime {
    let t = t.to_offset(time::UtcOffset::UTC);
    t.replace_time(time::Time::MIDNIGHT) + time::Duration::hours(i64::from(t.hour()))
}

/// The start of the first whole UTC hour at or after `t`.
fn hour_ceil(t: time::OffsetDateTime) -> time::OffsetDateTime {
    let floor = hour_floor(t);
    if floor == t {
        floor
    } else {
        floor + time::Duration::HOUR
    }
}

/// What of `f`'s window the rollups can answer. `None` when they cannot answer any of
/// it: a filter the rollup has no column for (`rollup_can_filter` says which), or a
/// window holding no whole hour. Attempts are placed by when they started, requests by
/// when they were received; both rollups keep the hour of that instant.
pub fn split(f: &Filter, source: Source, rollup_can_filter: bool) -> Option<Split> {
    match source {
        Source::Rows => return None,
        Source::Rollups => {}
    }
    if !rollup_can_filter {
        return None;
    }
    let from = f.since.as_ref().map(|s| hour_ceil(s.at));
    let to = f.until.as_ref().map(|u| hour_floor(u.at));
    if let (Some(a), Some(b)) = (from, to)
        && a >= b
    {
        return None;
    }
    let mut ragged = Vec::new();
    if let (Some(s), Some(a)) = (&f.since, from)
        && s.at != a
    {
        ragged.push(Filter {
            until: Some(Instant::new(a)),
            ..f.clone()
        });
    }
    if let (Some(u), Some(b)) = (&f.until, to)
        && u.at != b
    {
        ragged.push(Filter {
            since: Some(Instant::new(b)),
            ..f.clone()
        });
    }
    Some(Split {
        from: from.map(Instant::new),
        to: to.map(Instant::new),
        ragged,
    })
}

/// Whether the attempts rollup can apply `f`: it keeps every filtered column of an
/// attempt and its request except the request's outcome. (An in-flight attempt is kept
/// under class '', which no filter may name.)
pub fn attempts_rollup_filters(f: &Filter) -> bool {
    f.outcome.is_none() && f.class.as_deref() != Some("")
}

/// Whether the requests rollup can apply `f`: provider and class are the attempts'.
pub fn requests_rollup_filters(f: &Filter) -> bool {
    f.provider.is_none() && f.class.is_none()
}

impl SpendRow {
    /// Fold `other` (the same group, from another part of the window) into this row.
    pub(super) fn merge(&mut self, other: &SpendRow) -> Result<(), LedgerError> {
        let overflow = || LedgerError::Corrupt("spend total overflows a decimal".into());
        self.attempts += other.attempts;
        self.billed += other.billed;
        self.maybe_billed += other.maybe_billed;
        self.not_billed += other.not_billed;
        self.cost = self.cost.checked_add(other.cost).ok_or_else(overflow)?;
        self.maybe_billed_cost = self
            .maybe_billed_cost
            .checked_add(other.maybe_billed_cost)
            .ok_or_else(overflow)?;
        Ok(())
    }
}

/// Spend rows of several parts of a window, one row per group, in key order.
pub(super) fn merge_spend(
    parts: impl IntoIterator<Item = Vec<SpendRow>>,
) -> Result<Vec<SpendRow>, LedgerError> {
    let mut groups: std::collections::BTreeMap<String, SpendRow> = Default::default();
    for row in parts.into_iter().flatten() {
        match groups.get_mut(&row.key) {
            Some(g) => g.merge(&row)?,
            None => {
                groups.insert(row.key.clone(), row);
            }
        }
    }
    Ok(groups.into_values().collect())
}

/// Series rows of several parts of a window, one per (bucket, group), oldest first.
pub(super) fn merge_series(
    parts: impl IntoIterator<Item = Vec<SeriesRow>>,
) -> Result<Vec<SeriesRow>, LedgerError> {
    let mut cells: std::collections::BTreeMap<(String, String), SeriesRow> = Default::default();
    for row in parts.into_iter().flatten() {
        let key = (row.bucket.clone(), row.spend.key.clone());
        match cells.get_mut(&key) {
            Some(c) => c.spend.merge(&row.spend)?,
            None => {
                cells.insert(key, row);
            }
        }
    }
    Ok(cells.into_values().collect())
}

/// Attempt counts per (provider, class, after the first attempt), and requests per
/// outcome: what `failures` adds up from each part of a window.
#[derive(Debug, Default)]
pub(super) struct FailureTally {
    attempts: std::collections::BTreeMap<(String, String), u64>,
    after_failover: u64,
    requests: RequestCounts,
}

impl FailureTally {
    pub(super) fn attempts(&mut self, provider: &str, class: &str, later: bool, n: u64) {
        if later && class == "success" {
            self.after_failover += n;
        }
        *self
            .attempts
            .entry((provider.to_string(), class.to_string()))
            .or_default() += n;
    }

    pub(super) fn requests(&mut self, outcome: &str, n: u64) -> Result<(), LedgerError> {
        self.requests.add(outcome, n)
    }

    pub(super) fn done(self) -> Failures {
        Failures {
            attempts: self
                .attempts
                .into_iter()
                .map(|((provider, class), attempts)| FailureRow {
                    provider,
                    class,
                    attempts,
                })
                .collect(),
            requests: RequestCounts {
                served_after_failover: self.after_failover,
                ..self.requests
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Instant {
        Instant::new(
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
        )
    }

    #[test]
    fn a_window_splits_into_whole_hours_and_ragged_ends() {
        let f = Filter {
            since: Some(at("2026-11-01T10:20:00Z")),
            until: Some(at("2026-11-01T13:05:00.5Z")),
            ..Filter::default()
        };
        let s = split(&f, Source::Rollups, true);
        assert_eq!(
            s.as_ref()
                .and_then(|s| s.from.as_ref())
                .map(|i| i.text.as_str()),
            Some("2026-11-01T11:00:00.000Z")
        );
        assert_eq!(
            s.as_ref()
                .and_then(|s| s.to.as_ref())
                .map(|i| i.text.as_str()),
            Some("2026-11-01T13:00:00.000Z")
        );
        let ragged: Vec<_> = s
            .map(|s| s.ragged)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.since.map(|i| i.text), r.until.map(|i| i.text)))
            .collect();
        assert_eq!(
            ragged,
            [
                (
                    Some("2026-11-01T10:20:00.000Z".to_string()),
                    Some("2026-11-01T11:00:00.000Z".to_string())
                ),
                (
                    Some("2026-11-01T13:00:00.000Z".to_string()),
                    Some("2026-11-01T13:05:00.500Z".to_string())
                ),
            ]
        );
    }

    #[test]
    fn whole_hours_and_open_ends_need_no_rows() {
        let f = Filter {
            since: Some(at("2026-11-01T00:00:00Z")),
            ..Filter::default()
        };
        let s = split(&f, Source::Rollups, true);
        assert!(
            s.as_ref()
                .is_some_and(|s| s.ragged.is_empty() && s.to.is_none())
        );
        assert!(split(&Filter::default(), Source::Rollups, true).is_some());
    }

    #[test]
    fn no_whole_hour_or_an_unkept_filter_reads_the_rows() {
        let f = Filter {
            since: Some(at("2026-11-01T10:20:00Z")),
            until: Some(at("2026-11-01T11:10:00Z")),
            ..Filter::default()
        };
        assert_eq!(split(&f, Source::Rollups, true), None);
        assert_eq!(split(&Filter::default(), Source::Rollups, false), None);
        assert_eq!(split(&Filter::default(), Source::Rows, true), None);
        let f = Filter {
            outcome: Some(RequestOutcome::Interrupted),
            ..Filter::default()
        };
        assert!(!attempts_rollup_filters(&f));
    }
}
