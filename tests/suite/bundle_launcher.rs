//! The CUDA bundle's launcher (scripts/bundle/ferry-launcher.sh), run for real: with a binary
//! whose shared library is missing it names the library and exits 127 instead of the dynamic
//! loader's bare error; with one whose libraries are all found it execs it with the arguments
//! untouched. The "missing" binary is a copy of `/bin/true` whose `libc.so.6` dependency is
//! renamed to `libq.so.6`, a real ELF file with a real unresolved DT_NEEDED entry.

use std::path::{Path, PathBuf};
use std::process::Command;

fn launcher() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bundle/ferry-launcher.sh")
}

/// A bundle folder holding the launcher as `ferry` and `binary` as `ferry-bin`.
fn bundle(binary: &[u8]) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::fs::Permissions::from_mode(0o755);
    std::fs::copy(launcher(), dir.path().join("ferry")).expect("copy launcher");
    std::fs::set_permissions(dir.path().join("ferry"), exe.clone()).expect("chmod launcher");
    std::fs::write(dir.path().join("ferry-bin"), binary).expect("write binary");
    std::fs::set_permissions(dir.path().join("ferry-bin"), exe).expect("chmod binary");
    dir
}

fn renamed_dependency(elf: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = elf
        .windows(from.len())
        .position(|w| w == from)
        .expect("the binary names the library");
    let mut out = elf.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

#[test]
fn a_missing_library_is_named_and_the_binary_is_not_started() {
    let elf = std::fs::read("/bin/true").expect("/bin/true");
    let dir = bundle(&renamed_dependency(&elf, b"libc.so.6\0", b"libq.so.6\0"));
    let out = Command::new(dir.path().join("ferry"))
        .arg("--help")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run the launcher");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "stderr: {stderr}");
    assert!(
        stderr.contains("shared libraries not found: libq.so.6"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{}/lib", dir.path().display())),
        "{stderr}"
    );
    assert!(!stderr.contains("libcuda.so.1 comes with"), "{stderr}");
}

#[test]
fn a_complete_binary_is_executed_with_its_arguments() {
    let elf = std::fs::read("/bin/echo").expect("/bin/echo");
    let dir = bundle(&elf);
    let out = Command::new(dir.path().join("ferry"))
        .args(["serve", "--port", "8 0"])
        .output()
        .expect("run the launcher");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "serve --port 8 0\n");
}
