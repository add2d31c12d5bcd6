use std::fmt::Write;
use std::path::Path;
use std::process::ExitCode;

use super::EXIT_INVALID;
use super::check::compile_or_report;
use crate::decide::fails_over;
use crate::failure::FailureClass;
use crate::policy::plan::{Destination, Mode};
use crate::selection::{self, Refusal, TokenBounds, Verdict, arithmetic};

pub fn explain(
    dir: &Path,
    policy: &str,
    model: &str,
    input_bytes: u64,
    messages: u64,
    max_tokens: Option<u64>,
) -> ExitCode {
    let Some(plan) = compile_or_report(dir) else {
        return ExitCode::from(EXIT_INVALID);
    };
    let Some(p) = plan.policy(policy) else {
        let names: Vec<&str> = plan.policies().map(|p| p.id.as_str()).collect();
        eprintln!(
            "error: no policy `{policy}` (policies: {}){}",
            names.join(", "),
            crate::policy::diagnostic::did_you_mean(policy, names.iter().copied())
                .map(|h| format!("; {h}"))
                .unwrap_or_default()
        );
        return ExitCode::from(EXIT_INVALID);
    };
    let cur = plan.currency();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "plan {}; policy {}: ceiling {} {cur} per request, mode {}",
        plan.id(),
        p.id,
        p.ceiling.per_request.for_people(cur),
        p.ceiling.mode.as_str()
    );
    let Some(route) = p.routes.get(model) else {
        let _ = writeln!(
            s,
            "1. model `{model}` is not allowed by policy `{}` → refused: model_not_allowed (403)",
            p.id
        );
        print!("{s}");
        return ExitCode::SUCCESS;
    };
    let bounds = TokenBounds {
        input: selection::input_bound(input_bytes, messages),
        output: max_tokens.unwrap_or(p.max_output_tokens),
        choices: 1,
    };
    let _ = writeln!(
        s,
        "1. bounds: input ≤ {} tokens ({input_bytes} bytes + {messages} × {} per message + {} per request), output ≤ {} tokens ({})",
        bounds.input,
        selection::PER_MESSAGE_OVERHEAD,
        selection::PER_REQUEST_OVERHEAD,
        bounds.output,
        if max_tokens.is_some() {
            "the request's max_tokens"
        } else {
            "the policy's max_output_tokens"
        }
    );
    let _ = writeln!(
        s,
        "2. candidates in order (pool first, then accounts cheapest-first for these bounds):"
    );
    match selection::select(route, &p.ceiling, bounds, |_| false) {
        Err(Refusal::NoDestination) => {
            let _ = writeln!(
                s,
                "   none in jurisdictions [{}] → refused: no_destination",
                p.jurisdictions
                    .iter()
                    .map(|j| j.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Some(h) = plan.no_destination_hint() {
                let _ = writeln!(s, "   hint: {h}");
            }
        }
        Err(Refusal::DoesNotFit { considered, .. }) => {
            for c in &considered {
                let _ = writeln!(
                    s,
                    "   - {}: {}",
                    c.destination.label(),
                    verdict_text(&c.verdict, &c.destination, bounds, cur)
                );
            }
            let _ = writeln!(
                s,
                "3. no candidate fits → refused: ceiling_exceeded (402){}",
                if p.ceiling.on_exceed == crate::policy::plan::OnExceed::Clamp {
                    " (even clamping max_tokens cannot fit)"
                } else {
                    ""
                }
            );
        }
        Ok(sel) => {
            for c in &sel.considered {
                let _ = writeln!(
                    s,
                    "   - {}: {}",
                    c.destination.label(),
                    verdict_text(&c.verdict, &c.destination, sel.bounds, cur)
                );
            }
            if let Some(orig) = sel.clamped_from {
                let _ = writeln!(
                    s,
                    "   (on_exceed: clamp lowered max_tokens from {orig} to {})",
                    sel.bounds.output
                );
            }
            let _ = writeln!(
                s,
                "3. primary: {} — worst case {} {cur} ≤ ceiling {} {cur}",
                sel.primary.label(),
                sel.worst_case.for_people(cur),
                p.ceiling.per_request.for_people(cur)
            );
            match &sel.alternate {
                None => {
                    let _ = writeln!(
                        s,
                        "4. alternate: none — any failure ends the request (no failover)"
                    );
                }
                Some(a) => {
                    let _ = writeln!(
                        s,
                        "4. alternate: {} — worst case {} {cur}, {}",
                        a.destination.label(),
                        selection::arithmetic(&a.destination, sel.bounds, cur),
                        if a.fits {
                            "fits the ceiling"
                        } else {
                            "does NOT fit the ceiling: it will not be used"
                        }
                    );
                    let reach: Vec<&str> = FailureClass::ALL
                        .into_iter()
                        .filter(|c| fails_over(*c, p.ceiling.mode))
                        .map(FailureClass::as_str)
                        .collect();
                    let never: Vec<&str> = FailureClass::ALL
                        .into_iter()
                        .filter(|c| !fails_over(*c, p.ceiling.mode))
                        .map(FailureClass::as_str)
                        .collect();
                    let _ = writeln!(
                        s,
                        "5. under mode {}, these failures of the primary reach the alternate: {}",
                        p.ceiling.mode.as_str(),
                        reach.join(", ")
                    );
                    let _ = writeln!(s, "   these never do: {}", never.join(", "));
                    if p.ceiling.mode == Mode::Hard {
                        let _ = writeln!(
                            s,
                            "   (hard: a failure that may have been billed — timeout, dropped, unclassified — stops the request)"
                        );
                    }
                }
            }
        }
    }
    print!("{s}");
    ExitCode::SUCCESS
}

fn verdict_text(v: &Verdict, d: &Destination, b: TokenBounds, cur: &str) -> String {
    match v {
        Verdict::Chosen => format!("fits: {} {cur} → chosen", arithmetic(d, b, cur)),
        Verdict::NotNeeded => format!(
            "fits: {} {cur} (not needed: an earlier candidate was chosen)",
            arithmetic(d, b, cur)
        ),
        Verdict::ContextTooSmall { needed, window } => {
            format!("does not fit: needs {needed} tokens, context window is {window}")
        }
        Verdict::OverCeiling {
            worst_case,
            ceiling,
        } => format!(
            "does not fit: {} {cur}; {} > ceiling {}",
            arithmetic(d, b, cur),
            worst_case.for_people(cur),
            ceiling.for_people(cur)
        ),
        Verdict::CircuitOpen => "circuit open: skipped".into(),
    }
}
