//! The layering of the workspace: each layer is a crate, `scripts/check-layering.sh` checks the
//! dependencies between them against the layer table, and the checks fail on a planted
//! dependency: sideways (the script) and upward (Cargo itself, a cycle).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(workspace: &Path) -> Output {
    Command::new(root().join("scripts/check-layering.sh"))
        .arg(workspace)
        .output()
        .expect("runs scripts/check-layering.sh")
}

/// The workspace's manifests (and lock file) copied to `to`, with every Rust file present but
/// empty: enough for Cargo to read and resolve the workspace, nothing to compile.
fn copy_manifests(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        let target = to.join(&name);
        if entry.file_type().expect("file type").is_dir() {
            if !matches!(
                name.to_str(),
                Some("target" | ".git" | "models" | "fixtures")
            ) {
                copy_manifests(&entry.path(), &target);
            }
        } else if matches!(name.to_str(), Some("Cargo.toml" | "Cargo.lock")) {
            std::fs::copy(entry.path(), target).expect("copy");
        } else if target.extension().is_some_and(|e| e == "rs") {
            std::fs::write(target, "").expect("write");
        }
    }
}

/// A copy of the workspace's manifests in which `crate_dir`'s crate also depends on `dependency`.
fn planted(crate_dir: &str, dependency: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_manifests(&root(), dir.path());
    let manifest = dir.path().join(crate_dir).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("read");
    let text = text.replacen(
        "[dependencies]\n",
        &format!("[dependencies]\n{dependency}.workspace = true\n"),
        1,
    );
    std::fs::write(&manifest, text).expect("write");
    dir
}

#[test]
fn the_workspace_depends_downward_only() {
    let output = check(&root());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("every dependency runs downward"),
        "{stdout}"
    );
}

#[test]
fn a_sideways_dependency_fails_the_check() {
    // Both are layer 1 and the model does not depend on the engine: no cycle, so Cargo accepts
    // it; the engine knows models only through its traits.
    let dir = planted("crates/ferry-engine", "ferry-model");
    let output = check(dir.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ferry-engine (layer 1) depends on ferry-model (layer 1)"),
        "{stderr}"
    );
}

#[test]
fn a_test_helper_as_a_normal_dependency_fails_the_check() {
    let dir = planted("crates/ferry-server", "ferry-testkit");
    let output = check(dir.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ferry-server depends on ferry-testkit (normal)"),
        "{stderr}"
    );
}

#[test]
fn an_upward_dependency_fails_the_build() {
    // The configuration naming the model, which names the configuration: Cargo refuses to
    // resolve the cycle.
    let dir = planted("crates/ferry-config", "ferry-model");
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(dir.path().join("Cargo.toml"))
        .output()
        .expect("runs cargo metadata");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "cargo accepted the cycle");
    assert!(stderr.contains("cyclic package dependency"), "{stderr}");
    // The script names it too (its read of the manifests does not resolve them).
    let output = check(dir.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ferry-config (layer 0) depends on ferry-model (layer 1)"),
        "{stderr}"
    );
}
