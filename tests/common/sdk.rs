//! The official `openai` Python package, as the SDK tests use it: the installed client
//! (from `tests/requirements.txt`, which `.ci/run` installs) and its own source
//! distribution, downloaded by name from PyPI with pip, never copied into the repo.
//!
//! With `CI=true` a missing prerequisite fails the test; otherwise the test prints
//! that it skipped and why, so `cargo test` stays usable without Python.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned SDK release; `tests/requirements.txt` installs the same version.
pub const OPENAI_VERSION: &str = "3.57.0";

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
    let script = format!(
        "import importlib, sys\nfor m in {modules:?}: importlib.import_module(m)\nimport openai\nassert openai.__version__ == {OPENAI_VERSION:?}, openai.__version__\n"
    );
    match Command::new(python()).arg("-c").arg(&script).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{} cannot run the SDK: {}",
            python(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{} not found: {e}", python())),
    }
}

/// The SDK's source tree (its `tests/` included), downloaded once into cargo's target
/// temp dir: `pip download --no-deps --no-binary :all: openai==VERSION`.
pub fn sdist() -> Result<PathBuf, String> {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-sdist");
    let tree = base.join(format!("openai-{OPENAI_VERSION}"));
    if tree.join("tests/api_resources").is_dir() {
        return Ok(tree);
    }
    std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    let out = Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--no-deps", "--no-binary", ":all:"])
        .arg(format!("openai=={OPENAI_VERSION}"))
        .arg("-d")
        .arg(&base)
        .output()
        .map_err(|e| e.to_string())?;
    let archive = base.join(format!("openai-{OPENAI_VERSION}.tar.gz"));
    if !archive.is_file() {
        return Err(format!(
            "pip download of openai=={OPENAI_VERSION} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let out = Command::new("tar")
        .arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&base)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() || !tree.join("tests/api_resources").is_dir() {
        return Err(format!(
            "cannot unpack {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(tree)
}
