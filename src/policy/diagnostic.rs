//! Compile diagnostics: every problem in a policy set, each pointing at file:line:col.

use std::fmt;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// A position in a source file, 1-based.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct SourceRef {
    pub file: String,
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// One problem found while compiling a policy set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable code, e.g. `unknown-field`; tools and tests match on it.
    pub code: &'static str,
    pub at: SourceRef,
    pub message: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(code: &'static str, at: SourceRef, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            at,
            message: message.into(),
            help: None,
        }
    }

    pub fn warning(code: &'static str, at: SourceRef, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, at, message)
        }
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn with_help_opt(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}[{}]: {}", self.at, self.code, self.message)?;
        if let Some(h) = &self.help {
            write!(f, "\n  help: {h}")?;
        }
        Ok(())
    }
}

/// Every diagnostic of a failed compile (at least one error among them).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", render(.0))]
pub struct Diagnostics(pub Vec<Diagnostic>);

fn render(d: &[Diagnostic]) -> String {
    let errors = d.iter().filter(|d| d.severity == Severity::Error).count();
    let mut out = String::new();
    for x in d {
        out.push_str(&x.to_string());
        out.push('\n');
    }
    out.push_str(&format!(
        "{errors} error{} found",
        if errors == 1 { "" } else { "s" }
    ));
    out
}

/// "did you mean" for an unknown name: the closest candidate, if close enough.
pub fn did_you_mean<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(unknown, c), c))
        .filter(|(score, _)| *score >= 0.75)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| format!("did you mean `{c}`?"))
}
