//! The import-direction check (`scripts/check-layering.sh`): the crate's layers import downward
//! only, and the check fails on a planted upward import.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(src: &Path) -> Output {
    Command::new(root().join("scripts/check-layering.sh"))
        .arg(src)
        .output()
        .expect("runs scripts/check-layering.sh")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

#[test]
fn the_crate_imports_downward_only() {
    let output = check(&root().join("src"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn an_upward_import_fails_the_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    copy_tree(&root().join("src"), &src);
    let spec = src.join("model/spec.rs");
    let mut text = std::fs::read_to_string(&spec).expect("read");
    text.push_str("\n#[allow(unused_imports)]\nuse crate::engine::EngineHandle;\n");
    std::fs::write(&spec, text).expect("write");

    let output = check(&src);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("model/spec.rs:") && stderr.contains("imports crate::engine"),
        "{stderr}"
    );
}
