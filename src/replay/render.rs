//! A replay report for people: plain text for a terminal, markdown short enough for a
//! pull-request comment. Amounts in the currency's minor units, exact (never rounded).

use std::fmt::Write;

use super::Report;
use crate::money::Money;

fn jurisdiction_change(from: Option<&str>, to: &str) -> String {
    match from {
        Some(f) if f != to => format!("{f} → {to}"),
        Some(_) => "same".into(),
        None => to.into(),
    }
}

fn signed(m: Money, currency: &str) -> String {
    if m.is_negative() {
        format!("-{}", (Money::ZERO - m).for_people(currency))
    } else {
        format!("+{}", m.for_people(currency))
    }
}

pub fn text(r: &Report) -> String {
    let c = r.currency.as_str();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "replay against plan {}: {} request(s) read, {} replayed, {} skipped (recorded without a shape)",
        r.plan_id,
        r.read,
        r.read - r.skipped_no_shape,
        r.skipped_no_shape
    );
    let _ = writeln!(s, "changes: {}", r.changes());
    let _ = writeln!(s, "  same destination: {}", r.same_destination);
    let _ = writeln!(s, "  refused as before: {}", r.still_refused);
    for m in &r.moved {
        let _ = writeln!(
            s,
            "  another destination: {} → {} (jurisdiction {}): {}",
            m.route.from,
            m.route.to,
            jurisdiction_change(
                m.route.from_jurisdiction.as_deref(),
                &m.route.to_jurisdiction
            ),
            m.requests
        );
    }
    for x in &r.refused {
        let _ = writeln!(s, "  refused ({}): {}", x.code.as_str(), x.requests);
    }
    let _ = writeln!(s, "  clamped: {}", r.clamped);
    if r.unknown > 0 {
        let _ = writeln!(
            s,
            "  admitted, shape without an input bound (not guessed): {}",
            r.unknown
        );
    }
    let sp = &r.spend;
    let _ = writeln!(
        s,
        "billed: {} → {} {c} ({})",
        sp.billed_before.for_people(c),
        sp.billed_after.for_people(c),
        signed(sp.delta, c)
    );
    let _ = writeln!(
        s,
        "charged at worst case, not billed: {} → {} {c}",
        sp.worst_case_before.for_people(c),
        sp.worst_case_after.for_people(c)
    );
    for b in &r.budgets {
        let _ = writeln!(
            s,
            "budget {} {} limit {} {c}: ran out in {} of {} window(s)",
            b.policy,
            b.period,
            b.limit.for_people(c),
            b.exhausted.len(),
            b.windows
        );
        for e in &b.exhausted {
            let _ = writeln!(
                s,
                "  window {}: ran out at {} after {} {c}, {} request(s) refused",
                e.window_start,
                e.ran_out_at,
                e.charged.for_people(c),
                e.refused
            );
        }
    }
    s
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Rows of a table shown before it is cut (a PR comment stays short).
const ROWS: usize = 10;

pub fn markdown(r: &Report) -> String {
    let c = r.currency.as_str();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### purser replay\n\n{} recorded request(s) replayed against plan `{}`: **{} change(s)**; {} skipped (recorded without a shape).\n",
        r.read - r.skipped_no_shape,
        r.plan_id,
        r.changes(),
        r.skipped_no_shape
    );
    let _ = writeln!(s, "| Outcome | Requests |\n|---|---:|");
    let _ = writeln!(s, "| same destination | {} |", r.same_destination);
    let _ = writeln!(s, "| refused as before | {} |", r.still_refused);
    let moved: u64 = r.moved.iter().map(|m| m.requests).sum();
    let _ = writeln!(s, "| another destination | {moved} |");
    for x in &r.refused {
        let _ = writeln!(s, "| refused `{}` | {} |", x.code.as_str(), x.requests);
    }
    let _ = writeln!(s, "| clamped | {} |", r.clamped);
    if r.unknown > 0 {
        let _ = writeln!(s, "| admitted, input bound unknown | {} |", r.unknown);
    }
    if !r.moved.is_empty() {
        let _ = writeln!(
            s,
            "\n| From | To | Jurisdiction | Requests |\n|---|---|---|---:|"
        );
        for m in r.moved.iter().take(ROWS) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                cell(&m.route.from),
                cell(&m.route.to),
                cell(&jurisdiction_change(
                    m.route.from_jurisdiction.as_deref(),
                    &m.route.to_jurisdiction
                )),
                m.requests
            );
        }
        if r.moved.len() > ROWS {
            let _ = writeln!(s, "| … {} more | | | |", r.moved.len() - ROWS);
        }
    }
    let sp = &r.spend;
    let _ = writeln!(
        s,
        "\n| Spend ({c}) | Before | After | Delta |\n|---|---:|---:|---:|"
    );
    let _ = writeln!(
        s,
        "| billed | {} | {} | {} |",
        sp.billed_before.for_people(c),
        sp.billed_after.for_people(c),
        signed(sp.delta, c)
    );
    let _ = writeln!(
        s,
        "| at worst case, not billed | {} | {} | |",
        sp.worst_case_before.for_people(c),
        sp.worst_case_after.for_people(c)
    );
    let runs: Vec<_> = r
        .budgets
        .iter()
        .filter(|b| !b.exhausted.is_empty())
        .collect();
    if !runs.is_empty() {
        let _ = writeln!(
            s,
            "\n| Budget | Window | Ran out at | Refused |\n|---|---|---|---:|"
        );
        let mut shown = 0;
        for b in &runs {
            for e in &b.exhausted {
                shown += 1;
                if shown > ROWS {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} {} {} | {} | {} | {} |",
                    cell(&b.policy),
                    b.period,
                    b.limit.for_people(c),
                    e.window_start,
                    e.ran_out_at,
                    e.refused
                );
            }
        }
        if shown > ROWS {
            let _ = writeln!(s, "| … {} more window(s) | | | |", shown - ROWS);
        }
    }
    let _ = writeln!(
        s,
        "\nRecorded tokens repriced at the new destination's prices; no call made. Budget windows start empty at the replay's start."
    );
    s
}
