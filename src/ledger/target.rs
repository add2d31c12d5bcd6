//! Where the ledger lives, as `--db` / `PURSER_DB` give it: a `postgres://` (or
//! `postgresql://`) URL, or else the path of an SQLite file.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    Sqlite(PathBuf),
    /// A libpq-style URL; may hold a password, so it is never printed whole.
    Postgres(String),
}

impl Target {
    pub fn parse(s: &str) -> Target {
        let lower = s.get(..13).unwrap_or(s).to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Target::Postgres(s.to_string())
        } else {
            Target::Sqlite(PathBuf::from(s))
        }
    }

    /// The SQLite file, if the ledger is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Target::Sqlite(p) => Some(p),
            Target::Postgres(_) => None,
        }
    }
}

impl FromStr for Target {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Target::parse(s))
    }
}

impl From<&Path> for Target {
    fn from(p: &Path) -> Self {
        Target::Sqlite(p.to_path_buf())
    }
}

impl From<PathBuf> for Target {
    fn from(p: PathBuf) -> Self {
        Target::Sqlite(p)
    }
}

/// For logs and messages: the URL with any password replaced.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Sqlite(p) => write!(f, "{}", p.display()),
            Target::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({self})")
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`, and a
/// `password=` query parameter likewise.
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_postgres_and_anything_else_a_file() {
        assert!(matches!(
            Target::parse("postgres://h/db"),
            Target::Postgres(_)
        ));
        assert!(matches!(
            Target::parse("PostgreSQL://h/db"),
            Target::Postgres(_)
        ));
        assert!(matches!(Target::parse("purser.db"), Target::Sqlite(_)));
        assert!(matches!(Target::parse("./postgres.db"), Target::Sqlite(_)));
    }

    #[test]
    fn passwords_never_print() {
        let t = Target::parse("postgres://u:hunter2@h:5432/db?password=x&sslmode=disable");
        let shown = t.to_string();
        assert!(
            !shown.contains("hunter2") && !shown.contains("=x"),
            "{shown}"
        );
        assert_eq!(
            shown,
            "postgres://u:***@h:5432/db?password=***&sslmode=disable"
        );
    }
}
