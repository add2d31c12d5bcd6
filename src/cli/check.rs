use std::path::Path;
use std::process::ExitCode;

use super::{EXIT_INVALID, PlanFormat};
use crate::policy::{self, Plan, render};

/// Compile `dir`, printing diagnostics to stderr; `None` when it does not compile.
pub(crate) fn compile_or_report(dir: &Path) -> Option<Plan> {
    match policy::compile_dir(dir) {
        Ok(plan) => {
            for w in plan.warnings() {
                eprintln!("{w}");
            }
            Some(plan)
        }
        Err(diags) => {
            eprintln!("{diags}");
            None
        }
    }
}

pub fn check(dir: &Path) -> ExitCode {
    match compile_or_report(dir) {
        Some(plan) => {
            let policies = plan.policies().count();
            let providers = plan.providers().count();
            println!(
                "ok: {} is valid: {policies} policies, {providers} providers, plan {}",
                dir.display(),
                plan.id()
            );
            ExitCode::SUCCESS
        }
        None => ExitCode::from(EXIT_INVALID),
    }
}

pub fn plan(dir: &Path, format: PlanFormat) -> ExitCode {
    let Some(plan) = compile_or_report(dir) else {
        return ExitCode::from(EXIT_INVALID);
    };
    let out = match format {
        PlanFormat::Text => render::text(&plan),
        PlanFormat::Json => render::json(&plan),
        PlanFormat::Markdown => render::markdown(&plan),
    };
    println!("{out}");
    ExitCode::SUCCESS
}
