//! Recorded requests for a replay, from an SQLite ledger, in commit order.

use rusqlite::{Connection, Row, params_from_iter};

use super::audit::Clause;
use super::ops::money_col;
use crate::ledger::LedgerError;
use crate::ledger::recorded::{
    ATTEMPT_COLUMNS, Flat, FlatAttempt, Folder, Recorded, Sent, Span, shape, shape_columns,
};
use crate::money::Money;

/// Every request of `span` in commit order (`ledger_seq`: the order its budgets saw
/// them, and the table's own key, so nothing is sorted), handed to `each`, which
/// answers false to stop.
pub fn each(
    c: &Connection,
    span: &Span,
    mut each: impl FnMut(Recorded) -> bool,
) -> Result<(), LedgerError> {
    let has_shape = c
        .prepare("SELECT 1 FROM pragma_table_info('requests') WHERE name = 'shape_choices'")?
        .exists([])?;
    let mut w = Clause::new();
    let ms = |t: time::OffsetDateTime| {
        i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
    };
    if let Some(t) = span.since {
        w.push("r.received_ms >= ?", ms(t));
    }
    if let Some(t) = span.until {
        w.push("r.received_ms < ?", ms(t));
    }
    if let Some(p) = &span.policy {
        w.push("r.policy = ?", p.clone());
    }
    // The inner side is read through the attempts' key (request_id, seq), so a
    // request's attempts arrive together and in order without a sort.
    let sql = format!(
        "SELECT r.id, r.received_ms, r.client, r.policy, r.model, r.outcome, r.error_code, {shape}, {ATTEMPT_COLUMNS}
         FROM requests r LEFT JOIN attempts a ON a.request_id = r.id {where_}
         ORDER BY r.ledger_seq",
        shape = shape_columns(has_shape, false),
        where_ = w.render(),
    );
    let mut st = c.prepare(&sql)?;
    let mut rows = st.query(params_from_iter(w.args.iter()))?;
    let mut folder = Folder::default();
    while let Some(r) = rows.next()? {
        if let Some(done) = folder.push(flat(r)?)?
            && !each(done)
        {
            return Ok(());
        }
    }
    if let Some(last) = folder.finish() {
        each(last);
    }
    Ok(())
}

fn flat(r: &Row<'_>) -> Result<Flat, LedgerError> {
    let ms: i64 = r.get(1)?;
    let received_at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map_err(|e| LedgerError::Corrupt(format!("received_ms {ms}: {e}")))?;
    let request = Recorded {
        id: r.get(0)?,
        received_at,
        client: r.get(2)?,
        policy: r.get(3)?,
        model: r.get(4)?,
        outcome: r.get(5)?,
        error_code: r.get(6)?,
        shape: shape(
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
            r.get(10)?,
            r.get(11)?,
            r.get(12)?,
            r.get(13)?,
            r.get(14)?,
        ),
        primary: None,
        input_tokens: 0,
        output_tokens: 0,
        billed: Money::ZERO,
        worst_case: Money::ZERO,
    };
    let seq: Option<u32> = r.get(15)?;
    let attempt = match seq {
        None => None,
        Some(seq) => Some(FlatAttempt {
            seq,
            sent: Sent {
                provider: r.get(16)?,
                upstream_model: r.get(17)?,
                jurisdiction: r.get(18)?,
            },
            billing: r.get(19)?,
            cost_basis: r.get(20)?,
            input_tokens: r.get(21)?,
            output_tokens: r.get(22)?,
            cost: money_col(r.get(23)?)?,
            worst_case: money_col(r.get(24)?)?,
        }),
    };
    Ok(Flat { request, attempt })
}
