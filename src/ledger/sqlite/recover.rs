//! Start-up recovery on SQLite: what a previous process left in flight.

use rusqlite::{Connection, params};

use super::books::Books;
use super::ops::holding;
use crate::ledger::{LedgerError, Recovered};

/// Rows a previous process left in flight become `interrupted` / `maybe_billed`, and
/// their reservations stay counted (moved to spent) until an operator settles them.
pub fn recover(conn: &mut Connection) -> Result<Recovered, LedgerError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut books = Books::default();
    let attempts = tx.execute(
        "UPDATE attempts SET state = 'interrupted', billing = 'maybe_billed', decision = 'stop',
         reason = 'the gateway stopped while this attempt was in flight; the upstream may have billed it'
         WHERE state = 'in_flight'",
        [],
    )?;
    let ids: Vec<String> = tx
        .prepare("SELECT id FROM requests WHERE outcome = 'in_flight'")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for id in &ids {
        // Still in flight here, so what it holds is in `reserved`: move it to spent.
        if let Some(h) = holding(&tx, id)? {
            for key in h.windows {
                let w = books.window(&tx, &key)?;
                w.spent = w.spent + h.amount;
                w.reserved = w.reserved.saturating_sub(h.amount);
                w.dirty = true;
            }
        }
        tx.execute(
            "UPDATE requests SET outcome = 'interrupted' WHERE id = ?1",
            params![id],
        )?;
    }
    books.write(&tx)?;
    tx.commit()?;
    Ok(Recovered {
        attempts,
        requests: ids.len(),
    })
}
