//! `purser diff`: fixture pairs under `tests/fixtures/diff/<case>/{old,new}`, one per
//! kind of change, with snapshots of the text and markdown output
//! (`expected.txt`, `expected.md`; `PURSER_BLESS=1` rewrites them), the tag each change
//! must carry, the CI gate's exit code, and the `--git` old side.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::Command;

use purser::policy::diff::{self, Tag};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/diff")
}

fn plan_diff(case: &str) -> diff::PlanDiff {
    let dir = fixtures().join(case);
    let old = purser::policy::compile_dir(&dir.join("old")).unwrap();
    let new = purser::policy::compile_dir(&dir.join("new")).unwrap();
    diff::diff(&old, &new)
}

/// An expected change: (tag, "policy" or "policy/model", what).
type Expected = (Tag, &'static str, &'static str);

/// Each fixture with the changes it must produce.
fn cases() -> Vec<(&'static str, Vec<Expected>)> {
    use Tag::{Narrows as N, Widens as W};
    vec![
        ("reformatted", vec![]),
        (
            "ceiling-raised",
            vec![(W, "finance", "ceiling per request")],
        ),
        (
            "ceiling-lowered",
            vec![(N, "analytics", "ceiling per request")],
        ),
        ("hard-to-soft", vec![(W, "finance", "mode")]),
        ("soft-to-hard", vec![(N, "analytics", "mode")]),
        ("budget-raised", vec![(W, "finance", "day budget")]),
        ("budget-removed", vec![(W, "finance", "day budget")]),
        ("budget-added", vec![(N, "analytics", "month budget")]),
        (
            "new-vendor",
            vec![
                (W, "analytics/gpt-4o-mini", "vendor"),
                (W, "finance/gpt-4o-mini", "vendor"),
            ],
        ),
        ("new-jurisdiction", vec![(W, "analytics", "jurisdiction")]),
        (
            "new-alternate",
            vec![
                (W, "finance/gpt-4o", "alternate"),
                (W, "finance/gpt-4o", "vendor"),
            ],
        ),
        (
            "alternate-removed",
            vec![
                (N, "finance/gpt-4o-mini", "alternate"),
                (N, "finance/gpt-4o-mini", "vendor"),
            ],
        ),
        ("new-client", vec![(W, "analytics", "client")]),
        // A raised price makes the same ceilings and budgets admit less spend.
        (
            "price-raised",
            vec![(
                N,
                "finance/gpt-4o",
                "output price per Mtok of openai-us/gpt-4o",
            )],
        ),
        // A lowered price makes them admit more: it widens, wherever the model is used.
        (
            "price-lowered",
            vec![
                (
                    W,
                    "analytics/gpt-4o-mini",
                    "input price per Mtok of openai-us/gpt-4o-mini",
                ),
                (
                    W,
                    "finance/gpt-4o-mini",
                    "input price per Mtok of openai-us/gpt-4o-mini",
                ),
            ],
        ),
        // A fee per call listed costs every call more; an audio rate listed lets audio
        // be bounded where it was refused.
        (
            "fee-added",
            vec![
                (
                    W,
                    "finance/gpt-4o",
                    "audio input price per Mtok of openai-us/gpt-4o",
                ),
                (N, "finance/gpt-4o", "fee per call of openai-us/gpt-4o"),
            ],
        ),
        ("model-removed", vec![(N, "finance", "model")]),
        ("policy-added", vec![(W, "support", "policy")]),
    ]
}

#[test]
fn every_kind_of_change_is_tagged() {
    let on_disk: Vec<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    let listed: Vec<&str> = cases().iter().map(|c| c.0).collect();
    for d in &on_disk {
        assert!(
            listed.contains(&d.as_str()),
            "fixture {d} has no expectation"
        );
    }
    for (case, want) in cases() {
        let d = plan_diff(case);
        let got: Vec<(Tag, String, String)> = d
            .changes
            .iter()
            .map(|c| {
                let scope = match &c.model {
                    Some(m) => format!("{}/{m}", c.policy),
                    None => c.policy.clone(),
                };
                (c.tag, scope, c.what.clone())
            })
            .collect();
        let want: Vec<(Tag, String, String)> = want
            .into_iter()
            .map(|(t, s, w)| (t, s.to_string(), w.to_string()))
            .collect();
        assert_eq!(got, want, "{case}");
        // Widening changes lead.
        let first_narrow = d.changes.iter().position(|c| c.tag == Tag::Narrows);
        if let Some(i) = first_narrow {
            assert!(
                d.changes[i..].iter().all(|c| c.tag == Tag::Narrows),
                "{case}"
            );
        }
    }
}

#[test]
fn reformatting_gives_an_empty_diff_and_the_same_plan() {
    let d = plan_diff("reformatted");
    assert!(d.changes.is_empty(), "{:?}", d.changes);
    assert_eq!(d.old_plan, d.new_plan);
    assert!(diff::text(&d).starts_with("No change"));
}

#[test]
fn text_and_markdown_match_their_snapshots() {
    let bless = std::env::var_os("PURSER_BLESS").is_some();
    for (case, _) in cases() {
        let d = plan_diff(case);
        for (file, got) in [
            ("expected.txt", diff::text(&d)),
            ("expected.md", diff::markdown(&d)),
        ] {
            let path = fixtures().join(case).join(file);
            if bless {
                std::fs::write(&path, &got).unwrap();
            }
            let want = std::fs::read_to_string(&path)
                .unwrap_or_else(|_| panic!("{} missing; run with PURSER_BLESS=1", path.display()));
            assert_eq!(got, want, "{case}/{file}");
        }
        // Stable: a second run renders the same bytes.
        assert_eq!(diff::markdown(&plan_diff(case)), diff::markdown(&d));
    }
}

fn purser(args: &[&str], cwd: Option<&Path>) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_purser"));
    c.args(args);
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    c.output().unwrap()
}

#[test]
fn fail_on_widen_is_a_ci_gate() {
    let f = fixtures();
    let dirs = |case: &str| {
        (
            f.join(case).join("old").display().to_string(),
            f.join(case).join("new").display().to_string(),
        )
    };
    let (o, n) = dirs("hard-to-soft");
    let out = purser(&["diff", &o, &n, "--fail-on", "widen"], None);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("finance: mode: hard → soft"));
    let out = purser(&["diff", &o, &n], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "without the gate a widening diff is not an error"
    );
    // A price lowered from 0.15 to 0.10 per Mtok widens and fails the gate; a raised
    // one narrows and passes it.
    let (o, n) = dirs("price-lowered");
    let out = purser(&["diff", &o, &n, "--fail-on", "widen"], None);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("0.15 → 0.10"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (o, n) = dirs("price-raised");
    assert_eq!(
        purser(&["diff", &o, &n, "--fail-on", "widen"], None)
            .status
            .code(),
        Some(0)
    );
    let (o, n) = dirs("soft-to-hard");
    assert_eq!(
        purser(&["diff", &o, &n, "--fail-on", "widen"], None)
            .status
            .code(),
        Some(0)
    );
    // A side that does not compile is an error (1), not a diff.
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(bad.path().join("x.yaml"), "kind: nope\n").unwrap();
    let out = purser(&["diff", &o, &bad.path().display().to_string()], None);
    assert_eq!(out.status.code(), Some(1));
    let out = purser(&["diff", &o, &n, "--format", "json"], None);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["changes"][0]["tag"], "narrows");
}

#[test]
fn git_reads_the_old_side_from_a_revision() {
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let copy = |from: &Path, to: &Path| {
        let _ = std::fs::remove_dir_all(to);
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    let policies = repo.path().join("config/policies");
    git(&["init", "-q"]);
    copy(&fixtures().join("ceiling-raised/old"), &policies);
    git(&["add", "."]);
    git(&["commit", "-qm", "old"]);
    copy(&fixtures().join("ceiling-raised/new"), &policies);
    let by_git = purser(
        &[
            "diff",
            "--git",
            "HEAD",
            "config/policies",
            "--format",
            "markdown",
        ],
        Some(repo.path()),
    );
    assert!(
        by_git.status.success(),
        "{}",
        String::from_utf8_lossy(&by_git.stderr)
    );
    let want = std::fs::read_to_string(fixtures().join("ceiling-raised/expected.md")).unwrap();
    assert_eq!(String::from_utf8_lossy(&by_git.stdout), want);
    let missing = purser(
        &["diff", "--git", "no-such-rev", "config/policies"],
        Some(repo.path()),
    );
    assert_eq!(missing.status.code(), Some(1));
}
