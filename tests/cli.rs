//! The `ferry` binary end to end: `generate` prints only the text on stdout; `serve` answers real
//! HTTP requests, reports readiness on /health and exits 0 on SIGTERM; bad input gives a readable
//! message and a non-zero exit, never a panic.

mod real_model;
use real_model as common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ferry() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ferry"));
    command.env("RUST_LOG", "info").env_remove("FERRY_PORT");
    command
}

#[test]
fn generate_writes_only_the_text_to_stdout() {
    let output = ferry()
        .args(["generate", "--model"])
        .arg(common::model_path())
        .args(["--prompt", "The capital of France is", "--max-tokens", "3"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    assert!(stdout.starts_with(" Paris"), "stdout was {stdout:?}");
    assert!(
        !stdout.contains("INFO"),
        "logs leaked to stdout: {stdout:?}"
    );
    assert!(
        stderr.contains("tok/s"),
        "statistics go to stderr: {stderr}"
    );
}

#[test]
fn bad_input_is_a_readable_error_not_a_panic() {
    let cases: [&[&str]; 4] = [
        &[
            "generate",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "x",
        ],
        &[
            "serve",
            "--model",
            "/nonexistent/model.gguf",
            "--port",
            "notaport",
        ],
        &["generate", "--prompt", "x", "--device", "tpu:0"],
        &["serve", "--config", "/nonexistent/ferry.toml"],
    ];
    for args in cases {
        let output = ferry().args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} should fail");
        assert!(stderr.contains("error:"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn serve_answers_and_shuts_down_cleanly_on_sigterm() {
    let port = free_port();
    let child = ferry()
        .args(["serve", "--config"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"))
        .arg("--model")
        .arg(common::model_path())
        .args(["--served-name", "smollm2", "--port", &port.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    let mut server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "server never became healthy");
        if let Ok(response) = client.get(format!("{base}/health")).send().await {
            if response.status() == 200 {
                break;
            }
            assert_eq!(response.status(), 503, "health is 503 until ready");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let body: serde_json::Value = client
        .post(format!("{base}/v1/completions"))
        .json(&serde_json::json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    assert!(
        body["choices"][0]["text"]
            .as_str()
            .unwrap_or("")
            .starts_with(" Paris"),
        "{body}"
    );

    let pid = server.0.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = server.0.try_wait().expect("wait") {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "server did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "exit status {exit:?}");
    let stderr = server.0.stderr.take().expect("stderr");
    let lines: Vec<String> = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("listening on")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("shutting down")),
        "{lines:?}"
    );
}
