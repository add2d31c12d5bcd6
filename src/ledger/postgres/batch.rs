//! One group's operations turned into columns: every kind of operation becomes one
//! statement over arrays (`unnest`), so a group of hundreds of requests costs half a
//! dozen statements, sent together and answered together, instead of hundreds.
//!
//! Within a group no two operations concern the same request (a request's task waits
//! for each answer before its next write), and none of its callers has been answered,
//! so any order inside it is one the callers could have seen. Settlements come before
//! admissions: what they give back is room the admissions may use.

use deadpool_postgres::Client;
use rust_decimal::Decimal;
use time::OffsetDateTime;
use tokio_postgres::types::ToSql;

use super::{later, sql, window_start_at};
use crate::ledger::{
    AttemptResult, BudgetLimit, LedgerError, NewAttempt, NewRequest, Op, RequestResult,
};
use crate::money::Money;

type Param<'a> = &'a (dyn ToSql + Sync);

/// Request rows (admissions and refusals), a column each.
#[derive(Default)]
struct Requests<'a> {
    id: Vec<&'a str>,
    received_at: Vec<OffsetDateTime>,
    client: Vec<&'a str>,
    policy: Vec<&'a str>,
    plan_id: Vec<&'a str>,
    model: Vec<&'a str>,
    mode: Vec<&'static str>,
    ceiling: Vec<Decimal>,
    worst_case: Vec<Decimal>,
    /// Sent after the statement's other parameters (its last), not in `params`.
    ingress: Vec<&'static str>,
    /// The shape columns, sent after `ingress` (`shape_params`).
    shape_input: Vec<Option<i64>>,
    shape_requested: Vec<Option<i64>>,
    shape_output: Vec<Option<i64>>,
    shape_choices: Vec<Option<i64>>,
    shape_stream: Vec<Option<bool>>,
    shape_tools: Vec<Option<bool>>,
    shape_media: Vec<Option<bool>>,
    shape_unbounded: Vec<Option<bool>>,
}

impl<'a> Requests<'a> {
    fn push(&mut self, r: &'a NewRequest) {
        self.id.push(&r.id);
        self.received_at.push(r.received_at);
        self.client.push(&r.client);
        self.policy.push(&r.policy);
        self.plan_id.push(&r.plan_id);
        self.model.push(&r.model);
        self.mode.push(r.mode.as_str());
        self.ceiling.push(r.ceiling.decimal());
        self.worst_case.push(r.worst_case.decimal());
        self.ingress.push(r.ingress.as_str());
        let sh = r.shape.as_ref();
        self.shape_input
            .push(tokens(sh.and_then(|s| s.input_tokens)));
        self.shape_requested
            .push(tokens(sh.and_then(|s| s.requested_output)));
        self.shape_output
            .push(tokens(sh.and_then(|s| s.output_bound)));
        self.shape_choices.push(tokens(sh.map(|s| s.choices)));
        self.shape_stream.push(sh.map(|s| s.stream));
        self.shape_tools.push(sh.map(|s| s.tools));
        self.shape_media.push(sh.map(|s| s.media));
        self.shape_unbounded.push(sh.map(|s| s.unbounded));
    }

    /// The shape columns, in the order the statements number them after `ingress`.
    fn shape_params(&self) -> [Param<'_>; 8] {
        [
            &self.shape_input,
            &self.shape_requested,
            &self.shape_output,
            &self.shape_choices,
            &self.shape_stream,
            &self.shape_tools,
            &self.shape_media,
            &self.shape_unbounded,
        ]
    }

    fn params(&self) -> [Param<'_>; 9] {
        [
            &self.id,
            &self.received_at,
            &self.client,
            &self.policy,
            &self.plan_id,
            &self.model,
            &self.mode,
            &self.ceiling,
            &self.worst_case,
        ]
    }
}

/// New attempt rows, a column each.
#[derive(Default)]
struct Attempts<'a> {
    request_id: Vec<&'a str>,
    seq: Vec<i32>,
    provider: Vec<&'a str>,
    upstream_model: Vec<&'a str>,
    jurisdiction: Vec<&'a str>,
    started_at: Vec<OffsetDateTime>,
    worst_case: Vec<Decimal>,
}

impl<'a> Attempts<'a> {
    fn push(&mut self, a: &'a NewAttempt) {
        self.request_id.push(&a.request_id);
        self.seq.push(seq(a.seq));
        self.provider.push(&a.provider);
        self.upstream_model.push(&a.upstream_model);
        self.jurisdiction.push(&a.jurisdiction);
        self.started_at.push(a.started_at);
        self.worst_case.push(a.worst_case.decimal());
    }

    fn params(&self) -> [Param<'_>; 7] {
        [
            &self.request_id,
            &self.seq,
            &self.provider,
            &self.upstream_model,
            &self.jurisdiction,
            &self.started_at,
            &self.worst_case,
        ]
    }
}

/// Admissions: their requests, their windows (grouped by request) and first attempts.
#[derive(Default)]
struct Admissions<'a> {
    at: Vec<usize>,
    requests: Requests<'a>,
    periods: Vec<String>,
    w_req: Vec<i32>,
    w_period: Vec<&'static str>,
    w_start: Vec<OffsetDateTime>,
    w_limit: Vec<Decimal>,
    a_req: Vec<i32>,
    firsts: Attempts<'a>,
}

impl<'a> Admissions<'a> {
    fn push(&mut self, at: usize, req: &'a NewRequest, budgets: &[BudgetLimit]) {
        self.at.push(at);
        self.requests.push(req);
        let n = position(self.at.len());
        let names: Vec<&str> = budgets.iter().map(|b| b.period.as_str()).collect();
        self.periods.push(names.join(","));
        for b in budgets {
            self.w_req.push(n);
            self.w_period.push(b.period.as_str());
            self.w_start
                .push(window_start_at(b.period, req.received_at));
            self.w_limit.push(b.limit.decimal());
        }
    }

    fn first(&mut self, a: &'a NewAttempt) {
        self.a_req.push(position(self.at.len()));
        self.firsts.push(a);
    }
}

/// Attempt completions, a column each.
#[derive(Default)]
struct Finished<'a> {
    at: Vec<usize>,
    request_id: Vec<&'a str>,
    seq: Vec<i32>,
    finished_at: Vec<OffsetDateTime>,
    status: Vec<Option<i32>>,
    class: Vec<&'static str>,
    billing: Vec<&'static str>,
    decision: Vec<&'static str>,
    reason: Vec<&'a str>,
    input_tokens: Vec<Option<i64>>,
    output_tokens: Vec<Option<i64>>,
    cost: Vec<Decimal>,
    cost_basis: Vec<Option<&'static str>>,
    message: Vec<Option<&'a str>>,
    cache_read: Vec<Option<i64>>,
    cache_write: Vec<Option<i64>>,
    cache_write_5m: Vec<Option<i64>>,
    cache_write_1h: Vec<Option<i64>>,
    response_id: Vec<Option<&'a str>>,
    response_items: Vec<Option<i64>>,
}

impl<'a> Finished<'a> {
    fn push(&mut self, at: usize, r: &'a AttemptResult) {
        let cols = super::AttemptColumns::of(r);
        self.at.push(at);
        self.request_id.push(&r.request_id);
        self.seq.push(seq(r.seq));
        self.finished_at.push(r.finished_at);
        self.status.push(r.status.map(i32::from));
        self.class.push(cols.class);
        self.billing.push(r.billing.as_str());
        self.decision.push(cols.decision);
        self.reason.push(&r.reason);
        self.input_tokens.push(tokens(r.input_tokens));
        self.output_tokens.push(tokens(r.output_tokens));
        self.cost.push(r.cost.decimal());
        self.cost_basis.push(cols.cost_basis);
        self.message.push(r.message.as_deref());
        self.cache_read.push(tokens(r.cache.read));
        self.cache_write.push(tokens(r.cache.write));
        self.cache_write_5m.push(tokens(r.cache.write_5m));
        self.cache_write_1h.push(tokens(r.cache.write_1h));
        self.response_id
            .push(r.stored.as_ref().map(|s| s.id.as_str()));
        self.response_items
            .push(tokens(r.stored.as_ref().map(|s| s.output_items)));
    }
}

/// Request completions, a column each.
#[derive(Default)]
struct Ended<'a> {
    at: Vec<usize>,
    id: Vec<&'a str>,
    outcome: Vec<&'static str>,
    error_code: Vec<Option<&'a str>>,
    served_by: Vec<Option<&'a str>>,
    cost: Vec<Decimal>,
    charged: Vec<Decimal>,
}

impl<'a> Ended<'a> {
    fn push(&mut self, at: usize, r: &'a RequestResult) {
        self.at.push(at);
        self.id.push(&r.request_id);
        self.outcome.push(r.outcome.as_str());
        self.error_code.push(r.error_code.as_deref());
        self.served_by.push(r.served_by.as_deref());
        self.cost.push(r.cost.decimal());
        self.charged.push(r.charged.decimal());
    }
}

/// A group, split by kind of operation; `at` fields map a row back to its operation.
#[derive(Default)]
struct Batch<'a> {
    refusal_at: Vec<usize>,
    refusals: Requests<'a>,
    refusal_codes: Vec<&'a str>,
    admissions: Admissions<'a>,
    begin_at: Vec<usize>,
    begins: Attempts<'a>,
    finished: Finished<'a>,
    ended: Ended<'a>,
    probe: bool,
    /// Operations that read before they decide, run one at a time afterwards.
    later: Vec<usize>,
}

impl<'a> Batch<'a> {
    fn of(ops: &[&'a Op]) -> Batch<'a> {
        let mut b = Batch::default();
        for (at, op) in ops.iter().enumerate() {
            match op {
                Op::Admit {
                    req,
                    budgets,
                    first,
                } => {
                    b.admissions.push(at, req, budgets);
                    if let Some(a) = first {
                        b.admissions.first(a);
                    }
                }
                Op::Refusal { req, error_code } => {
                    b.refusal_at.push(at);
                    b.refusals.push(req);
                    b.refusal_codes.push(error_code);
                }
                Op::BeginAttempt(a) => {
                    b.begin_at.push(at);
                    b.begins.push(a);
                }
                Op::FinishAttempt(r) => b.finished.push(at, r),
                Op::FinishRequest(r) => b.ended.push(at, r),
                Op::Finish(a, r) => {
                    b.finished.push(at, a);
                    b.ended.push(at, r);
                }
                Op::Probe => b.probe = true,
                Op::Settle { .. }
                | Op::TopUp { .. }
                | Op::Interrupt { .. }
                | Op::ReseedWindows { .. } => b.later.push(at),
            }
        }
        b
    }
}

/// Who opens and ends the transaction `apply` runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tx {
    /// The caller has begun it and commits it after (the group has operations that
    /// read before they decide, run here one at a time after the statements).
    Open,
    /// `apply` sends `BEGIN`, the statements and `COMMIT` together: one round trip.
    Whole,
}

/// Whether `op` reads before it decides, and so needs `Tx::Open`.
pub fn reads_first(op: &Op) -> bool {
    matches!(
        op,
        Op::Settle { .. } | Op::TopUp { .. } | Op::Interrupt { .. } | Op::ReseedWindows { .. }
    )
}

/// Apply `ops` in one transaction. The outer `Err` means nothing was applied (a
/// statement failed and the transaction was rolled back, or is spoiled for the caller
/// to roll back); the inner results are each operation's own fate (a refused
/// admission, an unknown request).
pub async fn apply(
    client: &Client,
    replica: &str,
    ops: &[&Op],
    tx: Tx,
) -> Result<Vec<Result<(), LedgerError>>, LedgerError> {
    let b = Batch::of(ops);
    if tx == Tx::Whole && !b.later.is_empty() {
        return Err(LedgerError::Corrupt(
            "an operation that reads first, in a group sent whole".into(),
        ));
    }
    let mut results: Vec<Result<(), LedgerError>> = ops.iter().map(|_| Ok(())).collect();

    // Prepared first (cached after the first group), so that the statements below
    // leave in the order they are written when polled together.
    let refusals = client.prepare_cached(sql::REFUSALS).await?;
    let finished = client.prepare_cached(sql::FINISH_ATTEMPTS).await?;
    let ended = client.prepare_cached(sql::FINISH_REQUESTS).await?;
    let admit = client.prepare_cached(sql::ADMIT).await?;
    let begins = client.prepare_cached(sql::BEGIN_ATTEMPTS).await?;
    let probe = client.prepare_cached(sql::PROBE).await?;

    let r = &b.refusals;
    let refusal_params: Vec<Param<'_>> = r
        .params()
        .into_iter()
        .chain([&b.refusal_codes as Param<'_>, &replica, &r.ingress])
        .chain(r.shape_params())
        .collect();
    let f = &b.finished;
    let finished_params: [Param<'_>; 19] = [
        &f.request_id,
        &f.seq,
        &f.finished_at,
        &f.status,
        &f.class,
        &f.billing,
        &f.decision,
        &f.reason,
        &f.input_tokens,
        &f.output_tokens,
        &f.cost,
        &f.cost_basis,
        &f.message,
        &f.cache_read,
        &f.cache_write,
        &f.cache_write_5m,
        &f.cache_write_1h,
        &f.response_id,
        &f.response_items,
    ];
    let e = &b.ended;
    let ended_params: [Param<'_>; 6] = [
        &e.id,
        &e.outcome,
        &e.error_code,
        &e.served_by,
        &e.cost,
        &e.charged,
    ];
    let a = &b.admissions;
    let admit_params: Vec<Param<'_>> = a
        .requests
        .params()
        .into_iter()
        .chain([
            &a.periods as Param<'_>,
            &replica,
            &a.w_req,
            &a.w_period,
            &a.w_start,
            &a.w_limit,
            &a.a_req,
        ])
        .chain(a.firsts.params())
        .chain([&a.requests.ingress as Param<'_>])
        .chain(a.requests.shape_params())
        .collect();
    let begin_params: Vec<Param<'_>> = b
        .begins
        .params()
        .into_iter()
        .chain([&replica as Param<'_>])
        .collect();

    let probe_params: [Param<'_>; 1] = [&replica];
    let whole = tx == Tx::Whole;
    // Polled together, each sends at its first poll, in this order. Should a statement
    // fail, the ones after it fail too (the transaction is aborted) and a `COMMIT`
    // sent with them only rolls back.
    let (begun, statements, committed) = tokio::join!(
        when(whole, client.batch_execute(sql::BEGIN_WRITE)),
        async {
            tokio::try_join!(
                when(
                    !b.refusal_at.is_empty(),
                    client.execute(&refusals, &refusal_params)
                ),
                when(!f.at.is_empty(), client.query(&finished, &finished_params)),
                when(!e.at.is_empty(), client.query(&ended, &ended_params)),
                when(!a.at.is_empty(), client.query_one(&admit, &admit_params)),
                when(
                    !b.begin_at.is_empty(),
                    client.execute(&begins, &begin_params)
                ),
                when(b.probe, client.execute(&probe, &probe_params)),
            )
        },
        when(whole, client.batch_execute("COMMIT")),
    );
    begun?;
    let (_, found_attempts, found_requests, refused, _, _) = statements?;
    committed?;

    if let Some(rows) = found_attempts {
        for at in missing(&f.at, &rows)? {
            let r = &f.request_id[at];
            results[f.at[at]] = Err(LedgerError::UnknownRequest(format!("{r}#{}", f.seq[at])));
        }
    }
    if let Some(rows) = found_requests {
        for at in missing(&e.at, &rows)? {
            results[e.at[at]] = Err(LedgerError::UnknownRequest(e.id[at].to_string()));
        }
    }
    if let Some(row) = refused {
        let refused: Vec<Option<String>> = row.try_get(0)?;
        let spent: Vec<Option<Decimal>> = row.try_get(1)?;
        let reserved: Vec<Option<Decimal>> = row.try_get(2)?;
        for (n, period) in refused.iter().enumerate() {
            let (Some(period), Some(&at)) = (period, a.at.get(n)) else {
                continue;
            };
            if let Op::Admit { req, budgets, .. } = ops[at] {
                let figure = |v: &[Option<Decimal>]| {
                    Money::new(v.get(n).copied().flatten().unwrap_or_default())
                };
                results[at] = Err(exhausted(
                    req,
                    budgets,
                    period,
                    figure(&spent),
                    figure(&reserved),
                ));
            }
        }
    }
    for &at in &b.later {
        results[at] = later::apply(client, ops[at]).await?;
    }
    Ok(results)
}

/// The refusal of an admission that `period`'s window had no room for, as
/// `purser_admit` reported it (having given back what the other windows took).
fn exhausted(
    req: &NewRequest,
    budgets: &[BudgetLimit],
    period: &str,
    spent: Money,
    reserved: Money,
) -> LedgerError {
    let Some(culprit) = budgets.iter().find(|b| b.period.as_str() == period) else {
        return LedgerError::Corrupt(format!("refused by a period it does not have: {period}"));
    };
    LedgerError::BudgetExhausted {
        policy: req.policy.clone(),
        period: culprit.period.as_str(),
        limit: culprit.limit,
        spent,
        reserved,
        remaining: culprit.limit.saturating_sub(spent + reserved),
        needed: req.worst_case,
    }
}

/// Run `fut` only when `needed`: an empty kind sends no statement.
async fn when<T>(
    needed: bool,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<Option<T>, tokio_postgres::Error> {
    if needed {
        fut.await.map(Some)
    } else {
        Ok(None)
    }
}

/// The rows of `at` (0-based) that a statement answering 1-based positions left out.
fn missing(at: &[usize], rows: &[tokio_postgres::Row]) -> Result<Vec<usize>, LedgerError> {
    let mut found = vec![false; at.len()];
    for row in rows {
        let n: i64 = row.try_get(0)?;
        if let Some(f) = usize::try_from(n - 1).ok().and_then(|i| found.get_mut(i)) {
            *f = true;
        }
    }
    Ok(found
        .iter()
        .enumerate()
        .filter(|(_, f)| !**f)
        .map(|(i, _)| i)
        .collect())
}

/// A row's 1-based position in its statement's arrays.
fn position(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

fn tokens(v: Option<u64>) -> Option<i64> {
    v.map(|t| i64::try_from(t).unwrap_or(i64::MAX))
}

fn seq(s: u32) -> i32 {
    i32::try_from(s).unwrap_or(i32::MAX)
}
