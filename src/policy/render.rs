//! Human and machine renderings of a compiled plan (`purser plan`).

use std::fmt::Write;

use super::plan::{Destination, Plan, Tier};

fn dest_line(d: &Destination, currency: &str) -> String {
    let tier = match d.tier {
        Tier::Pool => "pool",
        Tier::Account => "account",
    };
    // Cache rates only when listed, so plans without them render as before.
    let mut cache = String::new();
    if let Some(r) = d.cached_input_per_mtok {
        let _ = write!(cache, " / cached in {r}");
    }
    if let Some(r) = d.cache_write_per_mtok {
        let _ = write!(cache, " / cache write {r}");
    }
    format!(
        "{} ({}, {tier}, in {}{cache} / out {} per Mtok, window {})",
        d.label(),
        d.jurisdiction,
        d.input_per_mtok.for_people(currency),
        d.output_per_mtok.for_people(currency),
        d.context_window
    )
}

pub fn text(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "plan {} (currency {})", plan.id(), plan.currency());
    for p in plan.policies() {
        let _ = writeln!(
            s,
            "\npolicy {}: ceiling {} {} per request ({}), jurisdictions [{}], max_output_tokens {}",
            p.id,
            p.ceiling.per_request.for_people(plan.currency()),
            plan.currency(),
            p.ceiling.mode.as_str(),
            p.jurisdictions
                .iter()
                .map(|j| j.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            p.max_output_tokens
        );
        for b in &p.budgets {
            let _ = writeln!(
                s,
                "  budget: {} {} per {}",
                b.limit.for_people(plan.currency()),
                plan.currency(),
                b.period.as_str()
            );
        }
        let _ = writeln!(
            s,
            "  clients: {}",
            p.clients
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (model, r) in &p.routes {
            let _ = writeln!(s, "  model {model}:");
            if r.is_empty() {
                let _ = writeln!(s, "    (no destination: refused)");
            }
            for (i, d) in r.pool.iter().chain(&r.accounts).enumerate() {
                let _ = writeln!(s, "    {}. {}", i + 1, dest_line(d, plan.currency()));
            }
            match &r.alternate {
                Some(a) => {
                    let _ = writeln!(s, "    alternate: {}", dest_line(a, plan.currency()));
                }
                None => {
                    let _ = writeln!(s, "    alternate: none (no failover)");
                }
            }
        }
    }
    s
}

pub fn json(plan: &Plan) -> String {
    serde_json::to_string_pretty(&plan.to_json()).unwrap_or_default()
}

pub fn markdown(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### purser plan `{}` ({})\n", plan.id(), plan.currency());
    let _ = writeln!(
        s,
        "| policy | model | ceiling | mode | jurisdictions | destinations (in order) | alternate |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for p in plan.policies() {
        let j = p
            .jurisdictions
            .iter()
            .map(|j| j.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        for (model, r) in &p.routes {
            let dests = if r.is_empty() {
                "_none: refused_".to_string()
            } else {
                r.pool
                    .iter()
                    .chain(&r.accounts)
                    .map(|d| format!("`{}`", d.label()))
                    .collect::<Vec<_>>()
                    .join(" → ")
            };
            let alt = r
                .alternate
                .as_ref()
                .map(|a| format!("`{}`", a.label()))
                .unwrap_or_else(|| "—".into());
            let _ = writeln!(
                s,
                "| `{}` | `{model}` | {} | {} | {j} | {dests} | {alt} |",
                p.id,
                p.ceiling.per_request.for_people(plan.currency()),
                p.ceiling.mode.as_str()
            );
        }
    }
    s
}
