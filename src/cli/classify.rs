//! `purser classify`: JSON Lines of upstream answers in, one verdict per line out;
//! with `--explain`, each verdict also names the signal that decided it.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use serde::Deserialize;
use serde_json::{Value, json};

use super::EXIT_INVALID;
use crate::decide::fails_over;
use crate::failure::{self, Billing, Outcome};
use crate::policy::plan::{Api, Mode};

#[derive(Deserialize)]
struct Line {
    api: Option<Api>,
    status: u16,
    #[serde(default)]
    headers: serde_json::Map<String, Value>,
    #[serde(default)]
    body: String,
}

/// The verdict for one answer, as printed.
pub fn verdict(api: Api, status: u16, headers: &[(String, String)], body: &str) -> Value {
    verdict_of(&failure::classify(api, status, headers, body))
}

/// The verdict with the signal that decided it (`--explain`): the same fields plus
/// `signal` (where it was read, what it held, how deep in relayed errors).
pub fn explained_verdict(api: Api, status: u16, headers: &[(String, String)], body: &str) -> Value {
    let e = failure::explain(api, status, headers, body);
    let mut v = verdict_of(&e.outcome);
    if let Value::Object(m) = &mut v {
        m.insert(
            "signal".to_string(),
            json!({
                "source": e.signal.source,
                "value": e.signal.value,
                "depth": e.signal.depth,
                "basis": e.signal.basis,
                "text": e.signal.to_string(),
            }),
        );
    }
    v
}

fn verdict_of(outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Success => json!({
            "class": "success",
            "billing": Billing::Billed.as_str(),
            "fails_over": {"hard": false, "soft": false},
            "reason": outcome.reason(),
        }),
        Outcome::Failure { class, reason } => json!({
            "class": class.as_str(),
            "billing": class.billing().as_str(),
            "fails_over": {"hard": fails_over(*class, Mode::Hard), "soft": fails_over(*class, Mode::Soft)},
            "reason": reason,
        }),
    }
}

pub fn classify(default_api: Option<Api>, explain: bool) -> ExitCode {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut bad = false;
    for (n, line) in stdin.lock().lines().enumerate() {
        let Ok(line) = line else {
            eprintln!("line {}: not UTF-8", n + 1);
            bad = true;
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let v = match serde_json::from_str::<Line>(&line) {
            Err(e) => {
                eprintln!("line {}: {e}", n + 1);
                bad = true;
                let _ = writeln!(out, "{}", json!({"error": format!("line {}: {e}", n + 1)}));
                continue;
            }
            Ok(l) => {
                let Some(api) = l.api.or(default_api) else {
                    eprintln!("line {}: no `api` in the line and no --api given", n + 1);
                    bad = true;
                    let _ = writeln!(
                        out,
                        "{}",
                        json!({"error": format!("line {}: no api", n + 1)})
                    );
                    continue;
                };
                let headers: Vec<(String, String)> = l
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| v.to_string()),
                        )
                    })
                    .collect();
                if explain {
                    explained_verdict(api, l.status, &headers, &l.body)
                } else {
                    verdict(api, l.status, &headers, &l.body)
                }
            }
        };
        let _ = writeln!(out, "{v}");
    }
    if bad {
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    }
}
