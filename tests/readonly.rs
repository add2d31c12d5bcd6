//! Fail closed when the ledger becomes read-only under a running gateway: the file and
//! its WAL are made immutable (`chattr +i`, which stops root too), and the next request
//! gets `503 ledger_unavailable` with no upstream call. Where the filesystem or the
//! sandbox does not support immutable files the test says so and checks nothing else;
//! `tests/ledger.rs` and the disk-full test in `tests/gateway.rs` cover the same path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly on purpose

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{provider, sha};

const KEY: &str = "key-readonly";

fn chattr(flag: &str, files: &[PathBuf]) -> bool {
    Command::new("chattr")
        .arg(flag)
        .args(files)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Immutable flags are cleared even when an assertion fails, so the temp dir can go.
struct Unfreeze(Vec<PathBuf>);

impl Drop for Unfreeze {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

fn immutable_supported(dir: &Path) -> bool {
    let probe = dir.join("probe");
    std::fs::write(&probe, "x").unwrap();
    let ok = chattr("+i", std::slice::from_ref(&probe))
        && std::fs::OpenOptions::new()
            .append(true)
            .open(&probe)
            .is_err();
    chattr("-i", std::slice::from_ref(&probe));
    ok
}

#[tokio::test]
async fn a_read_only_ledger_fails_closed_with_no_upstream_call() {
    let g = common::start(|vendors| {
        vec![
            provider(vendors, "p", "openai", "us", &[("m", "0.15", "0.60")]),
            format!(
                "kind: policy\nid: pol\nclients:\n  - {{ id: bot, key_sha256: \"{}\" }}\nmodels: [m]\njurisdictions: [us]\nceiling: {{ per_request: \"0.05\", mode: hard }}\nmax_output_tokens: 100\n",
                sha(KEY)
            ),
        ]
    })
    .await;
    if !immutable_supported(g.dir.path()) {
        eprintln!("skipped: this filesystem or sandbox cannot make files immutable");
        return;
    }
    assert_eq!(g.chat(KEY, "m").await.0, 200);
    assert_eq!(g.vendors.calls("p"), 1);

    // Not the -shm file: SQLite maps it into memory, and an immutable mapping is a
    // SIGBUS, not a refusal.
    let files: Vec<PathBuf> = ["", "-wal"]
        .iter()
        .map(|s| PathBuf::from(format!("{}{s}", g.db.display())))
        .filter(|p| p.exists())
        .collect();
    let _guard = Unfreeze(files.clone());
    assert!(chattr("+i", &files));

    let (status, id, body) = g.chat(KEY, "m").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "ledger_unavailable");
    assert!(id.is_some(), "the refusal names its request id");
    assert_eq!(
        g.vendors.calls("p"),
        1,
        "no upstream call without a ledger row"
    );
    let (ready, text) = g.get_as("/readyz", None).await;
    assert_eq!(ready, 503, "{text}");
    assert_eq!(g.get_as("/healthz", None).await.0, 200, "the process is up");

    // Writable again: the gateway recovers without a restart.
    assert!(chattr("-i", &files));
    assert_eq!(g.chat(KEY, "m").await.0, 200);
    assert_eq!(g.vendors.calls("p"), 2);
    assert_eq!(g.get_as("/readyz", None).await.0, 200);
}
