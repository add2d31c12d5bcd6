//! Recorded requests for a replay, from a PostgreSQL ledger, in commit order.

use deadpool_postgres::Client;
use futures_util::{StreamExt, pin_mut};
use rust_decimal::Decimal;
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::ledger::LedgerError;
use crate::ledger::recorded::{
    ATTEMPT_COLUMNS, BATCH, Flat, FlatAttempt, Folder, Recorded, Sent, Span, shape, shape_columns,
};
use crate::money::Money;

/// Every request of `span` in commit order (`ledger_seq`, the order its budgets saw
/// them), streamed as PostgreSQL yields the rows and sent to `tx` in batches of
/// `BATCH`; stops when the receiver is gone. The bounded channel holds the query back
/// while the replay is behind.
pub async fn send(
    c: &Client,
    span: &Span,
    tx: &mpsc::Sender<Result<Vec<Recorded>, LedgerError>>,
) -> Result<(), LedgerError> {
    let has_shape = c
        .query_opt(
            "SELECT 1 FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = 'requests' AND column_name = 'shape_choices'",
            &[],
        )
        .await?
        .is_some();
    let mut conds: Vec<String> = Vec::new();
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
    if let Some(t) = span.since {
        params.push(Box::new(t));
        conds.push(format!("r.received_at >= ${}", params.len()));
    }
    if let Some(t) = span.until {
        params.push(Box::new(t));
        conds.push(format!("r.received_at < ${}", params.len()));
    }
    if let Some(p) = &span.policy {
        params.push(Box::new(p.clone()));
        conds.push(format!("r.policy = ${}", params.len()));
    }
    let where_ = if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    };
    let sql = format!(
        "SELECT r.id, r.received_at, r.client, r.policy, r.model, r.outcome, r.error_code, {shape}, {ATTEMPT_COLUMNS}
         FROM requests r LEFT JOIN attempts a ON a.request_id = r.id {where_}
         ORDER BY r.ledger_seq, a.seq",
        shape = shape_columns(has_shape, true),
    );
    let rows = c
        .query_raw(
            &sql,
            params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)),
        )
        .await?;
    pin_mut!(rows);
    let mut folder = Folder::default();
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(r) = rows.next().await {
        if let Some(done) = folder.push(flat(&r?)?)? {
            batch.push(done);
            if batch.len() >= BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                if tx.send(Ok(full)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
    batch.extend(folder.finish());
    if !batch.is_empty() {
        let _ = tx.send(Ok(batch)).await;
    }
    Ok(())
}

fn flat(r: &Row) -> Result<Flat, LedgerError> {
    let money = |i: usize| -> Result<Money, LedgerError> {
        let d: Decimal = r.try_get(i)?;
        Ok(Money::new(d))
    };
    let request = Recorded {
        id: r.try_get(0)?,
        received_at: r.try_get::<_, OffsetDateTime>(1)?,
        client: r.try_get(2)?,
        policy: r.try_get(3)?,
        model: r.try_get(4)?,
        outcome: r.try_get(5)?,
        error_code: r.try_get(6)?,
        shape: shape(
            r.try_get(7)?,
            r.try_get(8)?,
            r.try_get(9)?,
            r.try_get(10)?,
            r.try_get(11)?,
            r.try_get(12)?,
            r.try_get(13)?,
            r.try_get(14)?,
        ),
        primary: None,
        input_tokens: 0,
        output_tokens: 0,
        billed: Money::ZERO,
        worst_case: Money::ZERO,
    };
    let seq: Option<i32> = r.try_get(15)?;
    let attempt = match seq {
        None => None,
        Some(seq) => Some(FlatAttempt {
            seq: u32::try_from(seq).unwrap_or(0),
            sent: Sent {
                provider: r.try_get(16)?,
                upstream_model: r.try_get(17)?,
                jurisdiction: r.try_get(18)?,
            },
            billing: r.try_get(19)?,
            cost_basis: r.try_get(20)?,
            input_tokens: r.try_get(21)?,
            output_tokens: r.try_get(22)?,
            cost: money(23)?,
            worst_case: money(24)?,
        }),
    };
    Ok(Flat { request, attempt })
}
