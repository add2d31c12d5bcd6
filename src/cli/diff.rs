//! `purser diff`: what a policy change does, for a pull-request review.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use super::check::compile_or_report;
use super::replay::When;
use super::{DiffFormat, EXIT_INVALID};
use crate::ledger::Target;
use crate::policy::diff;

/// `--fail-on widen` found a widening change.
pub const EXIT_WIDENS: u8 = 3;
use super::EXIT_USAGE;

pub fn diff(
    dirs: &[PathBuf],
    git: Option<&str>,
    format: DiffFormat,
    fail_on_widen: bool,
    replay: Option<(Target, Option<String>)>,
) -> ExitCode {
    let (old_dir, new_dir, _guard) = match (git, dirs) {
        (None, [old, new]) => (old.clone(), new.clone(), None),
        (Some(rev), [dir]) => match at_revision(rev, dir) {
            Ok(tmp) => (tmp.0.clone(), dir.clone(), Some(tmp)),
            Err(e) => {
                eprintln!("error: cannot read {} at {rev}: {e}", dir.display());
                return ExitCode::from(EXIT_INVALID);
            }
        },
        (None, _) => {
            eprintln!("usage: purser diff OLD_DIR NEW_DIR, or purser diff --git REV DIR");
            return ExitCode::from(EXIT_USAGE);
        }
        (Some(_), _) => {
            eprintln!(
                "usage: with --git REV give one directory: purser diff --git origin/main policies/"
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let Some(old) = compile_or_report(&old_dir) else {
        eprintln!("error: the old policy set does not compile");
        return ExitCode::from(EXIT_INVALID);
    };
    let Some(new) = compile_or_report(&new_dir) else {
        eprintln!("error: the new policy set does not compile");
        return ExitCode::from(EXIT_INVALID);
    };
    let d = diff::diff(&old, &new);
    // The replay runs before anything is printed: a ledger that cannot be read fails
    // the command rather than leave a diff that looks complete.
    let replayed = match replay {
        None => None,
        Some((db, since)) => {
            let when = When {
                since,
                ..When::default()
            };
            let got = match when.span(None) {
                Ok(span) => super::runtime_value(super::replay::report(&db, &new, span)),
                Err(e) => Err(e),
            };
            match got {
                Ok(r) => Some(r),
                Err(e) => {
                    eprintln!("error: replay: {e}");
                    return ExitCode::from(EXIT_INVALID);
                }
            }
        }
    };
    match format {
        DiffFormat::Text => print!("{}", diff::text(&d)),
        DiffFormat::Markdown => print!("{}", diff::markdown(&d)),
        DiffFormat::Json => {
            let v = match &replayed {
                None => serde_json::to_string_pretty(&d),
                Some(r) => serde_json::to_string_pretty(&serde_json::json!({
                    "diff": &d,
                    "replay": r,
                })),
            };
            match v {
                Ok(s) => println!("{s}"),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if let Some(r) = &replayed {
        match format {
            DiffFormat::Text => print!("\n{}", crate::replay::text(r)),
            DiffFormat::Markdown => print!("\n{}", crate::replay::markdown(r)),
            DiffFormat::Json => {}
        }
    }
    if fail_on_widen && d.widens() > 0 {
        eprintln!(
            "purser diff: {} widening change(s); failing as --fail-on widen asks",
            d.widens()
        );
        return ExitCode::from(EXIT_WIDENS);
    }
    ExitCode::SUCCESS
}

/// A temporary copy of `dir`'s policy files as they are at `rev`; removed on drop.
struct Snapshot(PathBuf);

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn git(cwd: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(cwd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(out.stdout)
}

fn at_revision(rev: &str, dir: &Path) -> Result<Snapshot, String> {
    let abs = dir.canonicalize().map_err(|e| e.to_string())?;
    let top = String::from_utf8_lossy(&git(&abs, &["rev-parse", "--show-toplevel"])?)
        .trim()
        .to_string();
    let top = PathBuf::from(top)
        .canonicalize()
        .map_err(|e| e.to_string())?;
    let rel = abs.strip_prefix(&top).map_err(|e| e.to_string())?;
    let rel_str = rel.to_string_lossy().replace('\\', "/");
    let spec = if rel_str.is_empty() {
        ".".to_string()
    } else {
        rel_str.clone()
    };
    let listing = git(
        &top,
        &["ls-tree", "-r", "-z", "--name-only", rev, "--", &spec],
    )?;
    let snap =
        Snapshot(std::env::temp_dir().join(format!("purser-diff-{}", ulid::Ulid::generate())));
    std::fs::create_dir_all(&snap.0).map_err(|e| e.to_string())?;
    let mut found = 0;
    for name in listing.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).to_string();
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let content = git(&top, &["show", &format!("{rev}:{name}")])?;
        let inner = Path::new(&name)
            .strip_prefix(rel)
            .unwrap_or(Path::new(&name));
        let dest = snap.0.join(inner);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&dest, content).map_err(|e| e.to_string())?;
        found += 1;
    }
    if found == 0 {
        return Err(format!("no *.yaml files under {spec} at {rev}"));
    }
    Ok(snap)
}
