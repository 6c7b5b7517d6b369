//! The prepared GPU check (scripts/gpu-check.sh) cannot rot unseen: its CPU dry run, with the
//! real ferry binary, writes its whole result as at most 8 files in the output folder (the most a
//! device run brings back): the table, the JSON, the appended rows and one archive of the logs.
//! Steps that need Python packages this machine lacks become SKIP/ERROR rows, not a lost report.

use std::path::Path;
use std::process::Command;

#[test]
fn the_dry_run_of_the_gpu_check_returns_at_most_eight_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().expect("out");
    let work = tempfile::tempdir().expect("work");
    let output = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .args(["--dry-run", "--steps", "c,d,g,h", "--deadline", "120"])
        .arg("--ferry")
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .arg("--out")
        .arg(out.path())
        .arg("--work")
        .arg(work.path())
        .output()
        .expect("runs bash");
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "gpu-check.sh failed:\n{log}");

    let mut names: Vec<String> = walk(out.path());
    names.sort();
    assert!(
        names.len() <= 8,
        "{} files come back: {names:?}",
        names.len()
    );
    assert_eq!(
        names,
        [
            "gpu-check.json",
            "gpu-check.md",
            "logs.tar.xz",
            "results.jsonl"
        ],
        "{log}"
    );
    let table = std::fs::read_to_string(out.path().join("gpu-check.md")).expect("table");
    assert!(table.contains("| 0 setup | ferry binary |"), "{table}");
    assert!(table.contains("| c bandwidth |"), "{table}");
    assert!(table.contains("| d decode |"), "{table}");
    assert!(table.contains("| g moe |"), "{table}");
    assert!(table.contains("| h speculation |"), "{table}");
    let rows = std::fs::read_to_string(out.path().join("results.jsonl")).expect("rows");
    for line in rows.lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("one JSON row per line");
    }
    let listing = Command::new("tar")
        .arg("-tJf")
        .arg(out.path().join("logs.tar.xz"))
        .output()
        .expect("tar");
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("logs/"), "{listing}");
}

/// Every file under `dir`, relative, with `/` separators.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("under dir");
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out
}
