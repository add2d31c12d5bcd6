//! `purser replay`: recorded traffic through a proposed policy set, no calls made; and
//! the summary `purser diff --replay` appends.

use std::path::Path;
use std::process::ExitCode;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::check::compile_or_report;
use super::{DiffFormat, EXIT_INVALID};
use crate::ledger::recorded::Span;
use crate::ledger::{Ledger, Target};
use crate::policy::Plan;
use crate::replay::{self, Report};

/// Which recorded requests, as the flags give them.
#[derive(Debug, Clone, Default)]
pub struct When {
    /// `30d`, `12h`: this long before now.
    pub since: Option<String>,
    /// RFC 3339 or a date (`2026-11-01`), inclusive.
    pub from: Option<String>,
    /// RFC 3339 or a date, exclusive.
    pub to: Option<String>,
}

/// `30d`, `12h`, `90m`: a span of time.
fn duration(s: &str) -> Result<time::Duration, String> {
    let bad = || format!("`{s}`: expected a number and a unit, like 30d, 12h or 90m");
    let unit = s.chars().last().ok_or_else(bad)?;
    let n: i64 = s[..s.len() - unit.len_utf8()].parse().map_err(|_| bad())?;
    match unit {
        'd' => Ok(time::Duration::days(n)),
        'h' => Ok(time::Duration::hours(n)),
        'm' => Ok(time::Duration::minutes(n)),
        _ => Err(bad()),
    }
}

/// RFC 3339, or a date meaning its midnight UTC.
fn instant(s: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(s, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(&format!("{s}T00:00:00Z"), &Rfc3339))
        .map_err(|_| {
            format!("`{s}`: expected RFC 3339 (2026-11-01T00:00:00Z) or a date (2026-11-01)")
        })
}

impl When {
    pub fn span(&self, policy: Option<String>) -> Result<Span, String> {
        let since = match (&self.since, &self.from) {
            (Some(_), Some(_)) => return Err("give --since or --from, not both".into()),
            (Some(d), None) => Some(OffsetDateTime::now_utc() - duration(d)?),
            (None, Some(f)) => Some(instant(f)?),
            (None, None) => None,
        };
        let until = self.to.as_deref().map(instant).transpose()?;
        Ok(Span {
            since,
            until,
            policy,
        })
    }
}

/// The report of `db` replayed through `plan`, or a message for the user.
pub async fn report(db: &Target, plan: &Plan, span: Span) -> Result<Report, String> {
    if db.path().is_some_and(|p| !p.exists()) {
        return Err(format!(
            "--db {db}: expected an existing purser ledger file (for example a copy taken with `purser backup`), or a postgres:// URL"
        ));
    }
    let ledger = Ledger::open_reader(db).await.map_err(|e| e.to_string())?;
    replay::over(&ledger, plan, span)
        .await
        .map_err(|e| e.to_string())
}

pub async fn run(
    db: &Target,
    config: &Path,
    when: &When,
    policy: Option<String>,
    format: DiffFormat,
) -> ExitCode {
    let Some(plan) = compile_or_report(config) else {
        eprintln!(
            "error: the policy set {} does not compile",
            config.display()
        );
        return ExitCode::from(EXIT_INVALID);
    };
    let span = match when.span(policy) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::EXIT_USAGE);
        }
    };
    match report(db, &plan, span).await {
        Ok(r) => match render(&r, format) {
            Ok(s) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

pub fn render(r: &Report, format: DiffFormat) -> Result<String, String> {
    match format {
        DiffFormat::Text => Ok(replay::text(r)),
        DiffFormat::Markdown => Ok(replay::markdown(r)),
        DiffFormat::Json => serde_json::to_string_pretty(r)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string()),
    }
}
