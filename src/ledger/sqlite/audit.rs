//! Audit queries on an SQLite ledger. Only validated filters reach here, and every value
//! is bound as a parameter, never spliced into SQL.
//!
//! Time filters select requests by when they were received (`requests`) and attempts
//! by when they started (`spend`, `attempts.csv`): an attempt belongs to the window it
//! was sent in, even when its request began a moment earlier.

use rusqlite::types::ToSql;
use rusqlite::{Connection, Row, params_from_iter};

use crate::ledger::LedgerError;
use crate::ledger::audit::{
    AttemptLine, BudgetState, Cursor, Filter, GroupBy, MAX_LIMIT, RequestPage, Source, SpendRow,
    attempts_rollup_filters, merge_spend, parse_money, split,
};
use crate::ledger::read::RequestRow;
use crate::money::Money;

/// A `WHERE` clause with its bound values.
pub(super) struct Clause {
    pub(super) sql: Vec<String>,
    pub(super) args: Vec<Box<dyn ToSql>>,
}

impl Clause {
    pub(super) fn new() -> Clause {
        Clause {
            sql: vec![],
            args: vec![],
        }
    }

    /// `sql` holds one `?`, which becomes the next numbered parameter bound to `arg`.
    pub(super) fn push(&mut self, sql: &str, arg: impl ToSql + 'static) {
        self.args.push(Box::new(arg));
        self.sql
            .push(sql.replacen('?', &format!("?{}", self.args.len()), 1));
    }

    pub(super) fn render(&self) -> String {
        if self.sql.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.sql.join(" AND "))
        }
    }
}

/// Conditions on the request row `r`, shared by every endpoint.
pub(super) fn request_conditions(c: &mut Clause, f: &Filter) {
    for (col, v) in [
        ("r.policy", &f.policy),
        ("r.client", &f.client),
        ("r.model", &f.model),
    ] {
        if let Some(v) = v {
            c.push(&format!("{col} = ?"), v.clone());
        }
    }
    if let Some(i) = f.ingress {
        c.push("r.ingress = ?", i.as_str());
    }
    if let Some(o) = f.outcome {
        c.push("r.outcome = ?", o.as_str());
    }
}

/// Requests newest first (by commit order), one page. Keyset pagination: a page starts
/// strictly after the cursor, and rows committed meanwhile sort above it, so pages
/// neither repeat nor skip a request.
pub fn requests(
    conn: &Connection,
    f: &Filter,
    limit: u32,
    cursor: Option<Cursor>,
) -> Result<RequestPage, LedgerError> {
    let limit = limit.clamp(1, MAX_LIMIT);
    let mut c = Clause::new();
    if let Some(s) = &f.since {
        c.push("r.received_ms >= ?", s.ms);
    }
    if let Some(u) = &f.until {
        c.push("r.received_ms < ?", u.ms);
    }
    request_conditions(&mut c, f);
    // "Any attempt's" provider/class: an EXISTS on the attempts of this request (primary
    // key lookup), so the newest-first index walk stays in charge.
    if let Some(p) = &f.provider {
        c.push(
            "EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id AND a.provider = ?)",
            p.clone(),
        );
    }
    if let Some(k) = &f.class {
        c.push(
            "EXISTS (SELECT 1 FROM attempts a WHERE a.request_id = r.id AND a.class = ?)",
            k.clone(),
        );
    }
    if let Some(cur) = cursor {
        c.push("r.ledger_seq < ?", cur.0);
    }
    let sql = format!(
        "SELECT {}, r.ledger_seq FROM requests r {} ORDER BY r.ledger_seq DESC LIMIT {}",
        super::read::REQUEST_COLUMNS_R,
        c.render(),
        limit + 1
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows: Vec<(RequestRow, i64)> = stmt
        .query_map(params_from_iter(c.args.iter()), |r| {
            Ok((super::read::request_from_row(r)?, r.get(14)?))
        })?
        .collect::<Result<_, _>>()?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_cursor = if more {
        rows.last().map(|(_, seq)| Cursor(*seq).encode())
    } else {
        None
    };
    let mut requests = Vec::with_capacity(rows.len());
    for (mut r, _) in rows {
        r.attempts = super::read::attempts_of(conn, &r.id)?;
        requests.push(r);
    }
    Ok(RequestPage {
        requests,
        next_cursor,
    })
}

pub(super) fn key_sql(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Provider => "a.provider",
        GroupBy::Policy => "r.policy",
        GroupBy::Client => "r.client",
        GroupBy::Model => "r.model",
        GroupBy::Ingress => "r.ingress",
        GroupBy::Day => "substr(a.started_at, 1, 10)",
    }
}

/// Conditions on attempts `a` joined to their request `r`.
pub(super) fn attempt_conditions(f: &Filter) -> (Clause, bool) {
    let mut c = Clause::new();
    if let Some(s) = &f.since {
        c.push("a.started_at >= ?", s.text.clone());
    }
    if let Some(u) = &f.until {
        c.push("a.started_at < ?", u.text.clone());
    }
    if let Some(p) = &f.provider {
        c.push("a.provider = ?", p.clone());
    }
    if let Some(k) = &f.class {
        c.push("a.class = ?", k.clone());
    }
    let before = c.sql.len();
    request_conditions(&mut c, f);
    let needs_request = c.sql.len() > before;
    (c, needs_request)
}

/// Spend per group, from the rollups where they answer (`spend_from`).
pub fn spend(conn: &Connection, f: &Filter, by: GroupBy) -> Result<Vec<SpendRow>, LedgerError> {
    spend_from(conn, f, by, Source::Rollups)
}

/// Spend per group: the whole hours of the window from the rollups, the ragged ends
/// (and filters the rollup lacks) from the attempts; only the attempts with
/// `Source::Rows`.
pub fn spend_from(
    conn: &Connection,
    f: &Filter,
    by: GroupBy,
    source: Source,
) -> Result<Vec<SpendRow>, LedgerError> {
    match split(f, source, attempts_rollup_filters(f)) {
        None => spend_rows(conn, f, by),
        Some(s) => {
            let mut parts = vec![super::rollup::spend(conn, &s, f, by)?];
            for r in &s.ragged {
                parts.push(spend_rows(conn, r, by)?);
            }
            merge_spend(parts)
        }
    }
}

/// Spend per group from the attempts. The rows stream out of the covering index and
/// are totalled here in exact decimals: with a handful of groups this beats SQL's
/// GROUP BY, which would sort every attempt of the window first.
fn spend_rows(conn: &Connection, f: &Filter, by: GroupBy) -> Result<Vec<SpendRow>, LedgerError> {
    let (c, mut join) = attempt_conditions(f);
    join |= matches!(
        by,
        GroupBy::Policy | GroupBy::Client | GroupBy::Model | GroupBy::Ingress
    );
    let sql = format!(
        "SELECT {key}, a.billing, a.cost, a.worst_case FROM attempts a {join} {where_}",
        key = key_sql(by),
        join = if join {
            "JOIN requests r ON r.id = a.request_id"
        } else {
            ""
        },
        where_ = c.render(),
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    let mut groups: std::collections::BTreeMap<String, SpendRow> = Default::default();
    while let Some(r) = rows.next()? {
        let key = text(r, 0)?;
        let row = match groups.get_mut(key) {
            Some(row) => row,
            None => groups.entry(key.to_string()).or_insert(SpendRow {
                key: key.to_string(),
                cost: Money::ZERO,
                maybe_billed_cost: Money::ZERO,
                attempts: 0,
                billed: 0,
                maybe_billed: 0,
                not_billed: 0,
            }),
        };
        row.attempts += 1;
        let overflow = || LedgerError::Corrupt("spend total overflows a decimal".into());
        row.cost = row
            .cost
            .checked_add(parse_money(text(r, 2)?)?)
            .ok_or_else(overflow)?;
        match text(r, 1)? {
            "billed" => row.billed += 1,
            "maybe_billed" => {
                row.maybe_billed += 1;
                row.maybe_billed_cost = row
                    .maybe_billed_cost
                    .checked_add(parse_money(text(r, 3)?)?)
                    .ok_or_else(overflow)?;
            }
            "not_billed" => row.not_billed += 1,
            other => return Err(LedgerError::Corrupt(format!("billing state `{other}`"))),
        }
    }
    Ok(groups.into_values().collect())
}

/// Column `i` as borrowed text (no copy per row).
pub(super) fn text<'r>(r: &'r Row<'_>, i: usize) -> Result<&'r str, LedgerError> {
    r.get_ref(i)?
        .as_str()
        .map_err(|e| LedgerError::Corrupt(format!("column {i}: {e}")))
}

/// Every attempt matching `f`, oldest first, handed to `each` one at a time so the
/// caller can stream them without holding the whole set.
pub fn each_attempt(
    conn: &Connection,
    f: &Filter,
    mut each: impl FnMut(AttemptLine) -> bool,
) -> Result<(), LedgerError> {
    let (c, _) = attempt_conditions(f);
    let sql = format!(
        "SELECT r.id, r.received_at, r.policy, r.client, r.model, r.plan_id, r.ingress, {cols}
         FROM attempts a JOIN requests r ON r.id = a.request_id {where_}
         ORDER BY a.started_at, a.request_id, a.seq",
        cols = super::read::ATTEMPT_COLUMNS_A,
        where_ = c.render(),
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query(params_from_iter(c.args.iter()))?;
    while let Some(r) = rows.next()? {
        let line = AttemptLine {
            request_id: r.get(0)?,
            received_at: r.get(1)?,
            policy: r.get(2)?,
            client: r.get(3)?,
            model: r.get(4)?,
            plan_id: r.get(5)?,
            ingress: r.get(6)?,
            attempt: super::read::attempt_from_row(r, 7)?,
        };
        if !each(line) {
            break;
        }
    }
    Ok(())
}

/// The budgets a plan configures, each in the window containing `now` (zero when no
/// request has touched it yet).
pub fn current_budgets(
    conn: &Connection,
    configured: &[(String, crate::policy::plan::Budget)],
    now: time::OffsetDateTime,
) -> Result<Vec<BudgetState>, LedgerError> {
    let mut out = Vec::with_capacity(configured.len());
    let mut stmt = conn.prepare_cached(
        "SELECT spent, reserved FROM budget_windows WHERE policy = ?1 AND period = ?2 AND window_start = ?3",
    )?;
    for (policy, b) in configured {
        let start = crate::ledger::window_start(b.period, now);
        let stored: Option<(String, String)> = {
            use rusqlite::OptionalExtension;
            stmt.query_row(rusqlite::params![policy, b.period.as_str(), start], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
        };
        let (spent, reserved) = match stored {
            Some((s, r)) => (parse_money(&s)?, parse_money(&r)?),
            // Not created yet: it will start from what the ledger already charges.
            None => {
                let (seed, _) = super::books::count_window(
                    conn,
                    &super::books::WindowKey {
                        policy: policy.clone(),
                        period: b.period,
                        start: start.clone(),
                    },
                )?;
                (seed.spent, seed.reserved)
            }
        };
        out.push(BudgetState {
            policy: policy.clone(),
            period: b.period.as_str().to_string(),
            window_start: start,
            limit: b.limit,
            spent,
            reserved,
            remaining: b.limit.saturating_sub(spent + reserved),
        });
    }
    Ok(out)
}
