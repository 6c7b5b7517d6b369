//! Issue 24 item 9: damaged model files. A copy of the real SmolLM2 with NaN written into an f32
//! norm starts and serves silently, but `--verify-weights` refuses it at load, naming the
//! tensor and the element; a truncated copy is refused at load with a message naming the
//! tensor past the end (an exit code, not SIGBUS).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use ferry::model::checkpoint::Checkpoint;
use ferry::model::header::GgufType;
use ferry::model::source::ModelFiles;
use ferry::model::tensors::StoredType;

use crate::real_model::model_path;
use crate::serve_process::{free_port, ServeProcess};

/// `ferry serve` on `model` with `extra` flags until it exits: whether it succeeded, how it
/// ended, and its stderr. (A port is given; the server is expected to fail before listening.)
fn serve_failing(model: &Path, extra: &[&str]) -> (std::process::ExitStatus, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--device", "cpu", "--port", &free_port().to_string()])
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("RUST_BACKTRACE")
        .env_remove("FERRY_VERIFY_WEIGHTS")
        .output()
        .expect("runs");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn nan_weights_are_refused_with_verify_and_a_truncated_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let original = model_path();
    // The first f32 tensor (a norm), and element 7 of it overwritten with NaN.
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf {
        path: original.clone(),
    })
    .expect("opens");
    let norm = checkpoint
        .tensors()
        .records()
        .find(|r| r.stored == StoredType::Gguf(GgufType::F32))
        .expect("an f32 tensor")
        .clone();
    drop(checkpoint);
    let mut bytes = std::fs::read(&original).expect("the model");
    let at = norm.range.start + 7 * 4;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let corrupted = dir.path().join("nan.gguf");
    std::fs::write(&corrupted, &bytes).expect("write");

    // Without the check the damage goes unnoticed: the server starts and answers.
    let args: Vec<OsString> = vec!["--model".into(), corrupted.clone().into()];
    let server = ServeProcess::start_with(&args, |c| {
        c.env_remove("FERRY_VERIFY_WEIGHTS");
    })
    .await;
    let health = reqwest::get(format!("{}/health", server.base))
        .await
        .expect("GET");
    assert_eq!(health.status(), 200);
    drop(server);

    let (status, stderr) = serve_failing(&corrupted, &["--verify-weights"]);
    assert!(!status.success(), "{stderr}");
    assert_eq!(
        status.code(),
        Some(1),
        "an error exit, not a signal: {stderr}"
    );
    let said = format!(
        "the weights are corrupted (verify_weights): tensor `{}` (f32) holds a non-finite value at element 7",
        norm.name
    );
    assert_eq!(stderr.matches(&said).count(), 1, "{said}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The intact model passes the check, says so, and serves.
    let log = tempfile::NamedTempFile::new().expect("log file");
    let stderr = log.reopen().expect("log file");
    let args: Vec<OsString> = vec!["--model".into(), original.into(), "--verify-weights".into()];
    let server = ServeProcess::start_with(&args, |c| {
        c.stderr(std::process::Stdio::from(stderr));
    })
    .await;
    drop(server);
    let text = std::fs::read_to_string(log.path()).expect("log");
    assert!(
        text.contains("weights verified: every float value and block scale is finite"),
        "{text}"
    );

    // A truncated copy: refused at load with the tensor that lies past the end.
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).expect("write");
    let (status, stderr) = serve_failing(&truncated, &[]);
    assert_eq!(
        status.code(),
        Some(1),
        "an error exit, not SIGBUS: {stderr}"
    );
    assert!(
        stderr.contains("lies past the end of the file") && stderr.contains("truncated.gguf"),
        "{stderr}"
    );
}
