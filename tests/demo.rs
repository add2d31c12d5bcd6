//! `purser demo --once` runs offline, exits 0, and its table matches the ledger.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

use std::process::Command;

#[test]
fn demo_once_prints_what_the_ledger_holds() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let out = Command::new(env!("CARGO_BIN_EXE_purser"))
        .args(["demo", "--once", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let conn = purser::ledger::read::open_reader(&db).unwrap();
    let mut st = conn
        .prepare("SELECT id FROM requests ORDER BY rowid")
        .unwrap();
    let ids: Vec<String> = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let rows: Vec<&str> = stdout
        .lines()
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 16, "{stdout}");
    // Every scenario is in the ledger, in order.
    assert_eq!(ids.len(), 16, "refusals are recorded too");
    for (line, id) in rows.iter().zip(&ids) {
        let r = purser::ledger::read::request(&conn, id).unwrap().unwrap();
        let cells: Vec<&str> = line.split('│').map(str::trim).collect();
        assert_eq!(cells[1], format!("{} ({})", r.policy, r.mode), "{line}");
        assert_eq!(cells[5], r.served_by.as_deref().unwrap_or("—"), "{line}");
        // A call that may have been billed without proof shows its worst case as
        // exposure beside the billed cost, never a bare 0.
        let exposure: rust_decimal::Decimal = r
            .attempts
            .iter()
            .filter(|a| a.billing == "maybe_billed")
            .map(|a| a.worst_case.parse::<rust_decimal::Decimal>().unwrap())
            .sum();
        if exposure.is_zero() {
            assert_eq!(cells[6], r.cost, "{line}");
        } else {
            assert_eq!(
                cells[6],
                format!("{} + up to {exposure} unproven", r.cost),
                "{line}"
            );
        }
        let attempts = if r.attempts.is_empty() {
            "no call".to_string()
        } else {
            r.attempts
                .iter()
                .map(|a| format!("{}: {}", a.provider, a.class.as_deref().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(" → ")
        };
        assert_eq!(cells[3], attempts, "{line}");
    }
    assert!(stdout.contains("rate limit → alternate"));
    // The agent-shaped scenarios: the recorded Claude Code and Codex requests.
    let row = |name: &str| {
        rows.iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}: {stdout}"))
            .to_string()
    };
    assert!(
        row("timeout, hard ceiling: stop").contains("+ up to"),
        "a hard-ceiling timeout shows its exposure: {stdout}"
    );
    assert!(row("Claude Code turn: 128k cap clamped").contains("anthropic-eu: success"));
    assert!(row("Claude Code turn, hard ceiling").contains("ceiling_exceeded"));
    assert!(row("Codex turn (Responses API)").contains("openai-us: success"));
    assert!(stdout.contains("openai-us: rate_limited → anthropic-eu: success"));
    assert!(stdout.contains("openai-us: timeout → anthropic-us: success"));
    assert!(stdout.contains("anthropic-eu: auth → anthropic-eu: success"));
}
