//! `purser audit`: the audit API's answers straight from a ledger file, for operators
//! without HTTP access. Options become the same query pairs the HTTP API parses, so
//! both validate alike.

use std::io::Write;
use std::process::ExitCode;

use super::{AuditArgs, AuditFormat, AuditWhat, EXIT_INVALID};
use crate::audit::{self, AuditError};
use crate::ledger::{Ledger, Target};

pub async fn audit(args: &AuditArgs) -> ExitCode {
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn pairs(args: &AuditArgs) -> Vec<(String, String)> {
    let f = &args.filters;
    [
        ("since", &f.since),
        ("until", &f.until),
        ("provider", &f.provider),
        ("policy", &f.policy),
        ("client", &f.client),
        ("model", &f.model),
        ("class", &f.class),
        ("outcome", &f.outcome),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_string(), v.clone())))
    .collect()
}

async fn open(db: &Target) -> Result<Ledger, AuditError> {
    if db.path().is_some_and(|p| !p.exists()) {
        return Err(AuditError::InvalidParam {
            name: "--db".into(),
            value: db.to_string(),
            expected: "an existing purser ledger file, or a postgres:// URL".into(),
        });
    }
    Ok(Ledger::open_reader(db).await?)
}

async fn run(args: &AuditArgs) -> Result<(), AuditError> {
    let ledger = open(&args.db).await?;
    let mut pairs = pairs(args);
    let out = std::io::stdout();
    let mut out = out.lock();
    match args.what {
        AuditWhat::Requests => {
            if let Some(n) = args.limit {
                pairs.push(("limit".into(), n.to_string()));
            }
            if let Some(c) = &args.cursor {
                pairs.push(("cursor".into(), c.clone()));
            }
            let query = audit::requests_query(&pairs)?;
            let page = ledger
                .requests(query.filter, query.limit, query.cursor)
                .await?;
            match args.format {
                AuditFormat::Json => {
                    let v = serde_json::json!({"requests": page.requests, "next_cursor": page.next_cursor});
                    writeln!(out, "{v:#}")?;
                }
                AuditFormat::Table | AuditFormat::Csv => {
                    let rows: Vec<Vec<String>> = page
                        .requests
                        .iter()
                        .map(|r| {
                            vec![
                                r.id.clone(),
                                r.received_at.clone(),
                                r.policy.clone(),
                                r.client.clone(),
                                r.model.clone(),
                                r.outcome.clone(),
                                r.served_by.clone().unwrap_or_default(),
                                r.attempts
                                    .iter()
                                    .map(|a| {
                                        format!(
                                            "{}:{}",
                                            a.provider,
                                            a.class.as_deref().unwrap_or("in_flight")
                                        )
                                    })
                                    .collect::<Vec<_>>()
                                    .join(" > "),
                                r.cost.clone(),
                            ]
                        })
                        .collect();
                    let header = [
                        "id",
                        "received_at",
                        "policy",
                        "client",
                        "model",
                        "outcome",
                        "served_by",
                        "attempts",
                        "cost",
                    ];
                    emit(&mut out, args.format, &header, &rows)?;
                    if let Some(c) = page.next_cursor {
                        eprintln!("more: --cursor {c}");
                    }
                }
            }
        }
        AuditWhat::Spend => {
            if let Some(g) = &args.group_by {
                pairs.push(("group_by".into(), g.clone()));
            }
            let query = audit::spend_query(&pairs)?;
            let rows = ledger.spend(query.filter.clone(), query.group_by).await?;
            match args.format {
                AuditFormat::Json => {
                    let v = serde_json::json!({
                        "group_by": query.group_by.as_str(),
                        "since": query.filter.since.as_ref().map(|i| &i.text),
                        "until": query.filter.until.as_ref().map(|i| &i.text),
                        "rows": rows,
                    });
                    writeln!(out, "{v:#}")?;
                }
                AuditFormat::Table | AuditFormat::Csv => {
                    let table: Vec<Vec<String>> = rows
                        .iter()
                        .map(|r| {
                            vec![
                                r.key.clone(),
                                r.cost.to_string(),
                                r.maybe_billed_cost.to_string(),
                                r.attempts.to_string(),
                                r.billed.to_string(),
                                r.maybe_billed.to_string(),
                                r.not_billed.to_string(),
                            ]
                        })
                        .collect();
                    let header = [
                        query.group_by.as_str(),
                        "cost",
                        "maybe_billed_cost",
                        "attempts",
                        "billed",
                        "maybe_billed",
                        "not_billed",
                    ];
                    emit(&mut out, args.format, &header, &table)?;
                }
            }
        }
        AuditWhat::Focus => {
            let filter = audit::attempts_query(&pairs)?;
            let mut lines = ledger.attempt_lines(filter);
            let mut w = csv::Writer::from_writer(&mut out);
            w.write_record(audit::focus::HEADER)
                .map_err(std::io::Error::other)?;
            while let Some(line) = lines.recv().await {
                if let Some(record) = audit::focus::record(&line?, &args.currency) {
                    w.write_record(record).map_err(std::io::Error::other)?;
                }
            }
            w.flush()?;
        }
        AuditWhat::Budgets => {
            if !pairs.is_empty() {
                return Err(AuditError::UnknownParam(
                    "filters".into(),
                    "none (budgets lists every stored window)".into(),
                ));
            }
            let rows = ledger.stored_budgets().await?;
            match args.format {
                AuditFormat::Json => {
                    writeln!(out, "{:#}", serde_json::json!({"budgets": rows}))?;
                }
                AuditFormat::Table | AuditFormat::Csv => {
                    let table: Vec<Vec<String>> = rows
                        .iter()
                        .map(|b| {
                            vec![
                                b.policy.clone(),
                                b.period.clone(),
                                b.window_start.clone(),
                                b.limit.to_string(),
                                b.spent.to_string(),
                                b.reserved.to_string(),
                                b.remaining.to_string(),
                            ]
                        })
                        .collect();
                    let header = [
                        "policy",
                        "period",
                        "window_start",
                        "limit",
                        "spent",
                        "reserved",
                        "remaining",
                    ];
                    emit(&mut out, args.format, &header, &table)?;
                }
            }
        }
    }
    Ok(())
}

/// A table with aligned columns, or guarded CSV.
fn emit(
    out: &mut impl Write,
    format: AuditFormat,
    header: &[&str],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    match format {
        AuditFormat::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record(header)?;
            for r in rows {
                w.write_record(r.iter().cloned().map(audit::guard_cell))?;
            }
            w.flush()
        }
        AuditFormat::Table | AuditFormat::Json => {
            let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
            for r in rows {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let line = |cells: Vec<&str>| {
                cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_string()
            };
            writeln!(out, "{}", line(header.to_vec()))?;
            for r in rows {
                writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
            }
            Ok(())
        }
    }
}

pub async fn settle(db: &Target, request_id: &str, cost: &str) -> ExitCode {
    let cost: crate::money::Money = match cost.parse() {
        Ok(c) if !crate::money::Money::is_negative(c) => c,
        _ => {
            eprintln!("error: --cost `{cost}` is not a non-negative decimal amount such as 0.0042");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    match crate::ledger::settle_at(db, request_id, cost).await {
        Ok(()) => {
            println!(
                "settled {request_id} at {cost}; its budget reservations now count {cost} plus any billed attempts and the worst case of any other attempt that may have been billed"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}
