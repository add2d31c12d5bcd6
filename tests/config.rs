//! Policy compiler acceptance: every bad-input fixture gives its exact message, the
//! plan id is stable under reordering and reformatting, and the CLI's exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::Command;

use purser::policy::{self, Severity};

const CASES: &str = "tests/fixtures/config";

fn render(dir: &Path) -> String {
    match policy::compile_dir(dir) {
        Ok(plan) => format!("ok {}\n", plan.id()),
        Err(d) => format!("{d}\n"),
    }
}

/// Each fixture directory holds a policy set and `expected.txt`, the exact
/// diagnostics. `PURSER_BLESS=1 cargo test` rewrites them after a deliberate change.
#[test]
fn every_bad_input_fixture_gives_its_exact_message() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(CASES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 15, "fixtures missing");
    let mut failures = vec![];
    for dir in dirs {
        let got = render(&dir);
        let expected_path = dir.join("expected.txt");
        if std::env::var_os("PURSER_BLESS").is_some() {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if got != expected {
            failures.push(format!(
                "--- {}\nexpected:\n{expected}\ngot:\n{got}",
                dir.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn errors_of(case: &str) -> Vec<policy::Diagnostic> {
    match policy::compile_dir(&Path::new(CASES).join(case)) {
        Ok(_) => panic!("{case} compiled"),
        Err(d) => {
            d.0.into_iter()
                .filter(|d| d.severity == Severity::Error)
                .collect()
        }
    }
}

#[test]
fn messages_carry_position_value_and_suggestion() {
    let e = errors_of("unknown-field");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].code, "unknown-field");
    assert_eq!((e[0].at.line, e[0].at.col), (9, 3));
    assert!(e[0].message.contains("per_requst"));
    assert_eq!(e[0].help.as_deref(), Some("did you mean `per_request`?"));

    let e = errors_of("money-float");
    assert_eq!(e[0].code, "money-not-string");
    assert_eq!(
        e[0].help.as_deref(),
        Some("write prices as strings: \"0.15\"")
    );

    let e = errors_of("alternate-unknown-provider");
    assert_eq!(e[0].code, "unknown-provider");
    assert_eq!(e[0].help.as_deref(), Some("did you mean `anthropic-eu`?"));

    let e = errors_of("not-utf8");
    assert_eq!(e[0].code, "not-utf8");
    assert_eq!((e[0].at.line, e[0].at.col), (2, 26));
}

#[test]
fn all_errors_in_one_run() {
    let e = errors_of("multiple-errors");
    let codes: Vec<_> = e.iter().map(|d| d.code).collect();
    assert!(
        codes.contains(&"unknown-field") && codes.contains(&"money-not-string"),
        "{codes:?}"
    );
}

fn copy_dir(from: &Path, to: &Path, rename: impl Fn(&str) -> String) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let name = rename(p.file_name().unwrap().to_str().unwrap());
            std::fs::copy(&p, to.join(name)).unwrap();
        }
    }
}

fn plan_id(dir: &Path) -> String {
    policy::compile_dir(dir).unwrap().id().to_string()
}

#[test]
fn plan_id_is_stable_across_file_order_and_formatting() {
    let base = plan_id(Path::new("policies"));
    let tmp = tempfile::tempdir().unwrap();
    // Same documents, different file names (so a different read order) ...
    copy_dir(
        Path::new("policies/providers"),
        &tmp.path().join("z"),
        |n| format!("0-{n}"),
    );
    copy_dir(Path::new("policies/teams"), &tmp.path().join("a"), |n| {
        format!("9-{n}")
    });
    copy_dir(Path::new("policies"), tmp.path(), |n| n.to_string());
    assert_eq!(plan_id(tmp.path()), base);

    // ... and all in one multi-document file, with comments and flow style.
    let one = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for f in [
        "policies/teams/research.yaml",
        "policies/providers/gemini.yaml",
        "policies/gateway.yaml",
        "policies/teams/finance.yaml",
        "policies/providers/anthropic.yaml",
        "policies/providers/openai.yaml",
        "policies/teams/eu-analytics.yaml",
        "policies/providers/pool.yaml",
    ] {
        text.push_str("# reordered\n---\n");
        text.push_str(&std::fs::read_to_string(f).unwrap());
        text.push('\n');
    }
    text = text.replace("mode: hard", "mode: 'hard'   # same value, other quoting");
    std::fs::write(one.path().join("all.yml"), text).unwrap();
    assert_eq!(plan_id(one.path()), base);
}

#[test]
fn plan_id_changes_with_a_price_or_a_ceiling() {
    let base = plan_id(Path::new("policies"));
    for (file, from, to) in [
        (
            "providers/openai.yaml",
            "input_per_mtok: \"0.15\"",
            "input_per_mtok: \"0.16\"",
        ),
        (
            "teams/finance.yaml",
            "per_request: \"0.02\"",
            "per_request: \"0.03\"",
        ),
        // Numerically equal amounts are the same plan.
        (
            "teams/finance.yaml",
            "per_request: \"0.02\"",
            "per_request: \"0.020\"",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(Path::new("policies"), tmp.path(), |n| n.to_string());
        copy_dir(
            Path::new("policies/providers"),
            &tmp.path().join("providers"),
            |n| n.to_string(),
        );
        copy_dir(
            Path::new("policies/teams"),
            &tmp.path().join("teams"),
            |n| n.to_string(),
        );
        let p = tmp.path().join(file);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains(from));
        std::fs::write(&p, text.replace(from, to)).unwrap();
        let id = plan_id(tmp.path());
        if to.ends_with("0.020\"") {
            assert_eq!(id, base, "an equal amount must not change the id");
        } else {
            assert_ne!(id, base, "{file}: {to}");
        }
    }
}

fn purser(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_exit_codes_and_outputs() {
    let ok = purser(&["check", "policies"]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = purser(&["check", "tests/fixtures/config/unknown-field"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("policy.yaml:9:3"));
    let usage = purser(&["check", "--no-such-flag"]);
    assert_eq!(usage.status.code(), Some(2));

    let json = purser(&["plan", "policies", "--format", "json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("plan json is valid JSON");
    assert_eq!(v["policies"]["finance"]["ceiling"]["per_request"], "0.02");
    assert_eq!(v["plan_id"].as_str().unwrap().len(), 16);

    let md =
        String::from_utf8(purser(&["plan", "policies", "--format", "markdown"]).stdout).unwrap();
    assert!(md.contains("| policy | model | ceiling | mode |"));
    assert!(md.contains("| `finance` | `gpt-4o-mini` | 0.02 | hard |"));

    let ex = String::from_utf8(
        purser(&[
            "explain",
            "policies",
            "--policy",
            "finance",
            "--model",
            "gpt-4o-mini",
            "--input-bytes",
            "2000",
        ])
        .stdout,
    )
    .unwrap();
    assert!(ex.contains("openai-us/gpt-4o-mini: fits: 2096 in × 0.15/M + 1024 out × 0.60/M = 0.0009288 USD → chosen"), "{ex}");
    assert!(
        ex.contains(
            "reach the alternate: connect, rate_limited, overloaded, server_error, circuit_open"
        ),
        "{ex}"
    );
    let over = String::from_utf8(
        purser(&[
            "explain",
            "policies",
            "--policy",
            "finance",
            "--model",
            "gpt-4o-mini",
            "--max-tokens",
            "100000",
        ])
        .stdout,
    )
    .unwrap();
    assert!(over.contains("ceiling_exceeded"), "{over}");
}

/// A key sent over plain HTTP to another machine can be read by anyone on the path:
/// `check` warns (file:line:col, exit 0) and still compiles; https and loopback do not.
#[test]
fn a_key_over_plain_http_off_this_machine_is_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let valid = Path::new(CASES).join("valid");
    for f in ["gateway.yaml", "policy.yaml", "providers.yaml"] {
        std::fs::copy(valid.join(f), tmp.path().join(f)).unwrap();
    }
    let providers = tmp.path().join("providers.yaml");
    let text = std::fs::read_to_string(&providers).unwrap();
    std::fs::write(
        &providers,
        text.replace(
            "base_url: https://api.openai.com/v1",
            "base_url: http://api.openai.example:8080/v1",
        )
        .replace(
            "base_url: https://api.anthropic.com/v1",
            "base_url: http://127.0.0.1:9000/v1",
        ),
    )
    .unwrap();

    let plan = policy::compile_dir(tmp.path()).expect("a warning does not stop the compile");
    let w: Vec<_> = plan
        .warnings()
        .iter()
        .filter(|d| d.code == "cleartext-credential")
        .collect();
    assert_eq!(w.len(), 1, "only the non-loopback provider: {w:?}");
    assert_eq!(w[0].severity, Severity::Warning);
    assert!(w[0].at.file.ends_with("providers.yaml"), "{:?}", w[0].at);
    assert_eq!((w[0].at.line, w[0].at.col), (4, 11));
    assert!(w[0].message.contains("openai-us"), "{}", w[0].message);
    assert!(
        w[0].message.contains("api.openai.example"),
        "{}",
        w[0].message
    );

    let out = purser(&["check", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("providers.yaml:4:11: warning[cleartext-credential]: provider `openai-us`"),
        "{stderr}"
    );
    assert!(stderr.contains("help: use https://"), "{stderr}");

    // The shipped example (an http:// pool without a key) and https stay quiet.
    let quiet = policy::compile_dir(Path::new("policies")).unwrap();
    assert!(
        quiet
            .warnings()
            .iter()
            .all(|d| d.code != "cleartext-credential"),
        "{:?}",
        quiet.warnings()
    );
}
