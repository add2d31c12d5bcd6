use std::fmt::Write;
use std::path::Path;
use std::process::ExitCode;

use super::EXIT_INVALID;
use super::check::compile_or_report;
use crate::decide::fails_over;
use crate::failure::FailureClass;
use crate::gateway::request::{Bearing, bearing};
use crate::policy::plan::{Destination, MediaKind, Mode};
use crate::selection::{self, Refusal, TierAsk, TokenBounds, Unbounded, Verdict, arithmetic};
use crate::upstream::bound::{Per, overhead};

/// The request `explain` imagines.
pub struct Imagined {
    pub input_bytes: u64,
    pub messages: u64,
    pub max_tokens: Option<u64>,
    /// `n`: choices asked for.
    pub choices: u64,
    /// Top-level request fields beyond model and messages.
    pub fields: Vec<String>,
    /// Why each field a real body's reading judged unbounded is so (a tool, a context
    /// edit, `speed`): named in that reading's words rather than the field table's.
    pub reasons: Vec<(String, &'static str)>,
    /// Media parts the request carries, by kind (`--part image`).
    pub parts: Vec<MediaKind>,
    /// A real body (`--body`): bounded as the gateway bounds it, per destination.
    pub body: Option<crate::upstream::ChatRequest>,
}

/// `explain --body FILE`: the request read from a file (a body, or a recorded request
/// with its path), explained with the gateway's own bounds.
pub fn explain_body(
    dir: &Path,
    policy: &str,
    model: &str,
    file: &Path,
    ingress: Option<crate::ingress::Ingress>,
) -> ExitCode {
    use crate::ingress::Ingress;
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {} is not JSON: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    // A recorded request says by its path which API it was sent to.
    let (recorded_path, mut body) = match (v.get("path").and_then(|p| p.as_str()), v.get("body")) {
        (Some(p), Some(b)) => (Some(p.to_string()), b.clone()),
        _ => (None, v),
    };
    let ingress = ingress.unwrap_or(match recorded_path.as_deref() {
        Some(p) if p.starts_with("/v1/messages") => Ingress::Messages,
        Some(p) if p.starts_with("/v1/responses") => Ingress::Responses,
        Some(_) | None => Ingress::Chat,
    });
    if let Some(o) = body.as_object_mut() {
        o.insert("model".into(), serde_json::Value::String(model.to_string()));
    }
    let parsed = match crate::gateway::ingress::parse(ingress, &body) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: the body cannot be read as a {ingress} request: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let messages = body
        .get("messages")
        .and_then(|m| m.as_array())
        .map_or(0, |a| a.len() as u64);
    println!(
        "request: {} ({ingress} API, {} bytes, {messages} messages, max_tokens {})",
        file.display(),
        body.to_string().len(),
        parsed
            .max_tokens
            .map_or_else(|| "absent".to_string(), |n| n.to_string())
    );
    let req = crate::upstream::ChatRequest {
        body,
        max_tokens: 0,
        stream: parsed.stream,
        ingress,
        headers: Vec::new(),
        chat: Default::default(),
        raw: None,
    };
    explain(
        dir,
        policy,
        model,
        &Imagined {
            input_bytes: 0,
            messages,
            max_tokens: parsed.max_tokens,
            choices: parsed.choices,
            fields: parsed.unbounded.iter().map(|(f, _)| f.clone()).collect(),
            reasons: parsed.unbounded,
            parts: Vec::new(),
            body: Some(req),
        },
    )
}

use crate::gateway::SOFT_MEDIA_TOKENS;

/// The imagined request's bounds at `d`, as the gateway computes them: text bytes, the
/// API's overheads (`upstream::bound::OVERHEADS`), each media part at its declared
/// bound, reasoning beyond the cap.
fn imagined_bounds(
    d: &Destination,
    req: &Imagined,
    output: u64,
    strict: bool,
) -> Result<TokenBounds, Unbounded> {
    if strict && d.unpriced_call_fee() {
        return Err(selection::unpriced_call_fee());
    }
    if let Some(body) = &req.body {
        let undeclared = if strict {
            crate::upstream::bound::Undeclared::Refuse
        } else {
            crate::upstream::bound::Undeclared::StandIn(SOFT_MEDIA_TOKENS)
        };
        if let Err((param, what)) = crate::gateway::ingress::check_request(body, d.api)
            && body.ingress != crate::ingress::Ingress::Chat
        {
            return Err(Unbounded { param, what });
        }
        return Ok(TokenBounds {
            input: crate::upstream::bound::input_tokens(d, body, undeclared)?,
            output,
            reasoning: d.reasoning_budget().unwrap_or(0),
            choices: req.choices.max(1),
            tier: TierAsk::VendorPicks,
            cache_marked: crate::upstream::bound::cache_marked(d, body),
            audio: crate::upstream::bound::sends_audio(d, body),
        });
    }
    let tools = u64::from(req.fields.iter().any(|f| f == "tools" || f == "functions"));
    let mut input = req
        .input_bytes
        .saturating_add(req.messages.saturating_mul(overhead(d.api, Per::Message)))
        .saturating_add(overhead(d.api, Per::Request))
        .saturating_add(tools * (overhead(d.api, Per::Tool) + overhead(d.api, Per::ToolUsePrompt)));
    let audio = req
        .parts
        .iter()
        .any(|k| crate::upstream::bound::may_be_audio(d.api, Some(*k)));
    if audio && strict && d.terms.audio_input_per_mtok.is_none() {
        return Err(crate::upstream::bound::audio_unpriced("audio part".into()));
    }
    for (i, k) in req.parts.iter().enumerate() {
        let t = match (d.terms.media_tokens.get(*k), strict) {
            (Some(t), _) => t,
            (None, false) => SOFT_MEDIA_TOKENS,
            (None, true) => {
                return Err(Unbounded {
                    param: format!("part {} ({})", i + 1, k.as_str()),
                    what: format!(
                        "no declared bound (`media_tokens.{}` in the model entry)",
                        k.as_str()
                    ),
                });
            }
        };
        input = input.saturating_add(t);
    }
    Ok(TokenBounds {
        input,
        output,
        reasoning: d.reasoning_budget().unwrap_or(0),
        choices: req.choices.max(1),
        tier: TierAsk::VendorPicks,
        // Counted from sizes only: no body to look for marks in.
        cache_marked: false,
        audio: audio && d.terms.audio_input_per_mtok.is_some(),
    })
}

pub fn explain(dir: &Path, policy: &str, model: &str, req: &Imagined) -> ExitCode {
    let (input_bytes, messages, max_tokens) = (req.input_bytes, req.messages, req.max_tokens);
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
    let output = max_tokens.unwrap_or(p.max_output_tokens);
    let strict = p.needs_proof();
    if req.body.is_some() {
        let _ = writeln!(
            s,
            "1. bounds, per destination over the body as its API receives it (the gateway's own bound: every byte sent + that API's overheads per request, message and tool); output ≤ {output} tokens per choice ({})",
            if max_tokens.is_some() {
                "the request's max_tokens"
            } else {
                "the policy's max_output_tokens"
            }
        );
    } else {
        let _ = writeln!(
            s,
            "1. bounds, per destination over the request as its API receives it: input ≤ {input_bytes} bytes + {messages} × per-message + per-request overhead of that API{}; output ≤ {output} tokens per choice ({})",
            if req.parts.is_empty() {
                String::new()
            } else {
                format!(
                    " + each media part at its declared bound ({})",
                    req.parts
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            if max_tokens.is_some() {
                "the request's max_tokens"
            } else {
                "the policy's max_output_tokens"
            }
        );
    }
    if req.choices > 1 {
        let _ = writeln!(
            s,
            "   n = {}: each choice may reach the output bound, so the output side counts {} × the per-choice bound",
            req.choices, req.choices
        );
    }
    if strict {
        let _ = writeln!(
            s,
            "   the bound must be a proof here ({}): a part or field it cannot count is refused with invalid_request (400)",
            match p.ceiling.mode {
                Mode::Hard => "hard ceiling",
                Mode::Soft =>
                    "soft ceiling with a budget: soft relaxes failover, never the budget, and the worst case below is what is reserved",
            }
        );
    }
    for f in &req.fields {
        let judged = req
            .reasons
            .iter()
            .find(|(r, _)| r == f)
            .map(|(_, why)| *why);
        let risk = match judged.map(Bearing::Unbounded).or_else(|| bearing(f)) {
            Some(Bearing::Unbounded(why)) => Some(why),
            None => Some("purser does not know what this field costs"),
            Some(Bearing::Tier) => {
                let _ = writeln!(
                    s,
                    "   field `{f}`: bounded only where the model entry declares the tier's rates (`service_tiers`); elsewhere {}",
                    if strict {
                        "it cannot be bounded"
                    } else {
                        "priced at the standard rates (a RISK, not a bound)"
                    }
                );
                None
            }
            Some(Bearing::Neutral | Bearing::Input | Bearing::OutputCap | Bearing::Choices) => {
                let _ = writeln!(s, "   field `{f}`: bounded (counted in the bounds above)");
                None
            }
        };
        match (risk, strict) {
            (None, _) => {}
            (Some(why), true) => {
                let _ = writeln!(
                    s,
                    "   field `{f}`: cannot be bounded ({why}) → refused: invalid_request (400)"
                );
                print!("{s}");
                return ExitCode::SUCCESS;
            }
            (Some(why), false) => {
                let _ = writeln!(
                    s,
                    "   field `{f}`: RISK — cannot be bounded ({why}); allowed under a soft ceiling with no budget, and the worst case below does not include it"
                );
            }
        }
    }
    if !strict && !req.parts.is_empty() {
        let _ = writeln!(
            s,
            "   a media part with no declared bound is counted at {SOFT_MEDIA_TOKENS} tokens: a RISK, not a bound (allowed only under a soft ceiling with no budget)"
        );
    }
    let bounds_of = |d: &Destination| imagined_bounds(d, req, output, strict);
    let _ = writeln!(
        s,
        "2. candidates in order (pool first, then accounts cheapest-first for these bounds):"
    );
    match selection::select(route, &p.ceiling, bounds_of, |_| false) {
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
        Err(Refusal::Unbounded(u)) => {
            let _ = writeln!(
                s,
                "   no destination can bound the request: `{}` has {} → refused: invalid_request (400)",
                u.param, u.what
            );
        }
        Err(Refusal::DoesNotFit { considered, .. }) => {
            for c in &considered {
                let _ = writeln!(
                    s,
                    "   - {}: {}",
                    c.destination.label(),
                    verdict_text(&c.verdict, &c.destination, c.bounds, cur)
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
                    verdict_text(&c.verdict, &c.destination, c.bounds, cur)
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
            if !p.budgets.is_empty() {
                let _ = writeln!(
                    s,
                    "   reserved in every budget before the call: {} {cur} (mode {}: soft relaxes failover, never the budget)",
                    sel.worst_case.for_people(cur),
                    p.ceiling.mode.as_str()
                );
            }
            match &sel.alternate {
                None => {
                    let _ = writeln!(
                        s,
                        "4. alternate: none — any failure ends the request (no failover)"
                    );
                }
                Some(a) => {
                    let _ = match &a.bounds {
                        Ok(b) => writeln!(
                            s,
                            "4. alternate: {} — worst case {} {cur}, {}",
                            a.destination.label(),
                            selection::arithmetic(&a.destination, *b, cur),
                            if a.fits {
                                "fits the ceiling"
                            } else {
                                "does NOT fit the ceiling: it will not be used"
                            }
                        ),
                        Err(u) => writeln!(
                            s,
                            "4. alternate: {} — `{}` cannot be bounded there ({}): it will not be used",
                            a.destination.label(),
                            u.param,
                            u.what
                        ),
                    };
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

fn verdict_text(v: &Verdict, d: &Destination, b: Option<TokenBounds>, cur: &str) -> String {
    let sum =
        |b: Option<TokenBounds>| b.map_or_else(|| "no bound".into(), |b| arithmetic(d, b, cur));
    match v {
        Verdict::Chosen => format!("fits: {} {cur} → chosen", sum(b)),
        Verdict::NotNeeded => format!(
            "fits: {} {cur} (not needed: an earlier candidate was chosen)",
            sum(b)
        ),
        Verdict::ContextTooSmall { needed, window } => {
            format!("does not fit: needs {needed} tokens, context window is {window}")
        }
        Verdict::OverCeiling {
            worst_case,
            ceiling,
        } => format!(
            "does not fit: {} {cur}; {} > ceiling {}",
            sum(b),
            worst_case.for_people(cur),
            ceiling.for_people(cur)
        ),
        Verdict::CircuitOpen => "circuit open: skipped".into(),
        Verdict::Unbounded(u) => {
            format!("cannot be bounded: `{}` has {} → not used", u.param, u.what)
        }
    }
}
