//! The official `openai` and `anthropic` Python packages, as the SDK tests use them:
//! the installed clients (from `tests/requirements.txt`, which `.ci/run` installs) and
//! their own source distributions, downloaded by name from PyPI with pip, never copied
//! into the repo, whose generated `tests/api_resources/` suites run through purser.
//!
//! With `CI=true` a missing prerequisite fails the test; otherwise the test prints
//! that it skipped and why, so `cargo test` stays usable without Python.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::path::{Path, PathBuf};
use std::process::Command;

/// One pinned SDK: its PyPI name (also its import name) and version.
#[derive(Debug, Clone, Copy)]
pub struct Sdk {
    pub name: &'static str,
    pub version: &'static str,
}

/// The pinned `openai` release; `tests/requirements.txt` installs the same version.
pub const OPENAI: Sdk = Sdk {
    name: "openai",
    version: "3.57.0",
};
/// The pinned `anthropic` release; `tests/requirements.txt` installs the same version.
pub const ANTHROPIC: Sdk = Sdk {
    name: "anthropic",
    version: "2.15.0",
};

/// The pinned SDK release; `tests/requirements.txt` installs the same version.
pub const OPENAI_VERSION: &str = OPENAI.version;

/// The Python that runs the SDK (`PURSER_PYTHON`, else `python3`).
pub fn python() -> String {
    std::env::var("PURSER_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Skip (print why and return false), or fail under CI, when a prerequisite is missing.
pub fn prerequisite(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "CI=true and a prerequisite is missing: {what} (pip install -r tests/requirements.txt; .ci/run does)"
        );
    }
    eprintln!("SKIPPED: {what} (pip install -r tests/requirements.txt; with CI=true this fails)");
    false
}

/// True when the Python can import these modules and has the pinned `openai`.
pub fn python_has(modules: &[&str]) -> Result<(), String> {
    python_has_sdk(OPENAI, modules)
}

/// True when the Python can import these modules and has `sdk` at its pinned version.
pub fn python_has_sdk(sdk: Sdk, modules: &[&str]) -> Result<(), String> {
    let Sdk { name, version } = sdk;
    let script = format!(
        "import importlib, sys\nfor m in {modules:?}: importlib.import_module(m)\nimport {name}\nassert {name}.__version__ == {version:?}, {name}.__version__\n"
    );
    match Command::new(python()).arg("-c").arg(&script).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{} cannot run the {name} SDK: {}",
            python(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{} not found: {e}", python())),
    }
}

/// The `openai` SDK's source tree (see [`sdist_of`]).
pub fn sdist() -> Result<PathBuf, String> {
    sdist_of(OPENAI)
}

/// The SDK's source tree (its `tests/` included), downloaded once into cargo's target
/// temp dir: `pip download --no-deps --no-binary :all: NAME==VERSION`.
///
/// Tests of one binary ask for it at once (two threads once unpacked into the same
/// directory together, and tar failed with "Cannot open"), and test binaries may run
/// side by side (nextest): one thread of a process fetches at a time, into a staging
/// directory of its own, and the finished tree is moved into place whole.
pub fn sdist_of(sdk: Sdk) -> Result<PathBuf, String> {
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let Sdk { name, version } = sdk;
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-sdist"));
    let tree = base.join(format!("{name}-{version}"));
    let ready = |tree: &Path| tree.join("tests/api_resources").is_dir();
    let _one = FETCH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if ready(&tree) {
        return Ok(tree);
    }
    let stage = base.join(format!("staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).map_err(|e| e.to_string())?;
    let out = Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-deps", "--no-binary", ":all:"])
        .arg(format!("{name}=={version}"))
        .arg("-d")
        .arg(&stage)
        .output()
        .map_err(|e| e.to_string())?;
    let archive = stage.join(format!("{name}-{version}.tar.gz"));
    if !archive.is_file() {
        return Err(format!(
            "pip download of {name}=={version} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let out = Command::new("tar")
        .arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&stage)
        .output()
        .map_err(|e| e.to_string())?;
    let staged = stage.join(format!("{name}-{version}"));
    if !out.status.success() || !ready(&staged) {
        return Err(format!(
            "cannot unpack {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // Another process may have moved its tree in first; either tree is the same SDK.
    if std::fs::rename(&staged, &tree).is_err() && !ready(&tree) {
        return Err(format!("cannot move {} into place", staged.display()));
    }
    let _ = std::fs::remove_dir_all(&stage);
    Ok(tree)
}

/// What one pytest run over an SDK's tests reported.
pub struct Run {
    /// pytest exited 0 and its closing line names no failure or error.
    pub passed: bool,
    /// pytest's closing line (`12 passed, 3 deselected in 4.2s`).
    pub summary: String,
    pub stdout: String,
    pub stderr: String,
}

/// Run `files` of the SDK tree with pytest, `TEST_API_BASE_URL` pointing at `base`,
/// without the tests in `deselect` and with any `extra` arguments (`-k …`).
pub async fn pytest(
    tree: &Path,
    files: &[&str],
    deselect: &[(String, &'static str)],
    base: String,
    extra: &[&str],
) -> Run {
    let mut cmd = Command::new(python());
    cmd.current_dir(tree)
        .arg("-m")
        .arg("pytest")
        .args(files)
        // The sdists' own addopts ask for pytest-xdist (and, for anthropic, a plugin
        // that aliases httpx for respx, which the API tests do not use); one process
        // is enough here.
        .args(["-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rfE"])
        .args(["--tb=short", "--color=no"])
        .args(deselect.iter().map(|(id, _)| format!("--deselect={id}")))
        .args(extra)
        .env("TEST_API_BASE_URL", base);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" in "))
        .unwrap_or_default()
        .to_string();
    Run {
        passed: out.status.success()
            && summary.contains("passed")
            && !summary.contains("failed")
            && !summary.contains("error"),
        summary,
        stdout,
        stderr,
    }
}
