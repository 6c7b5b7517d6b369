//! The `ferry` binary end to end: `generate` prints only the text on stdout; `serve` answers real
//! HTTP requests, reports readiness on /health and exits 0 on SIGTERM; bad input gives a readable
//! message and a non-zero exit, never a panic.

use crate::real_model as common;

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
        .args(["--temperature", "0"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    assert!(stdout.starts_with(" Paris"), "stdout was {stdout:?}");
    assert!(
        stderr.contains("temperature=0 (setting)"),
        "greedy because asked: {stderr}"
    );
    assert!(
        !stdout.contains("INFO"),
        "logs leaked to stdout: {stdout:?}"
    );
    assert!(
        stderr.contains("tok/s"),
        "statistics go to stderr: {stderr}"
    );
    // The finish reason as the API spells it (issue 24 item 14), not the enum's `Length`.
    assert!(
        stderr.contains("| finish_reason length"),
        "the API's finish_reason: {stderr}"
    );
}

/// `generate` samples as the server does for a request that sends no sampling fields: the
/// model's defaults (SmolLM2's file recommends none, so llama.cpp's), seeded runs repeat.
#[test]
fn generate_samples_with_the_models_defaults() {
    let run = |seed: &str| {
        let output = ferry()
            .args(["generate", "--model"])
            .arg(common::model_path())
            .args(["--prompt", "Once upon a time", "--max-tokens", "24"])
            .args(["--seed", seed])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "stderr: {stderr}");
        (String::from_utf8(output.stdout).expect("utf-8"), stderr)
    };
    let (first, stderr) = run("7");
    assert!(
        stderr.contains(
            "temperature=0.8 (llama.cpp default), top_p=0.95 (llama.cpp default), \
             top_k=40 (llama.cpp default), min_p=0.05 (llama.cpp default), \
             repetition_penalty=1 (llama.cpp default)"
        ),
        "the load log names each default and its origin: {stderr}"
    );
    assert_eq!(run("7").0, first, "the same seed, the same text");
    let others: Vec<String> = ["8", "9", "10"].iter().map(|s| run(s).0).collect();
    assert!(
        others.iter().any(|text| *text != first),
        "sampling, not greedy: seeds 7-10 all wrote {first:?}"
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

/// Runs `ferry ARGS` with `env` set, in `dir`; returns (success, stdout, stderr).
fn run_in(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = ferry();
    command
        .current_dir(dir)
        .args(args)
        .env_remove("RUST_BACKTRACE");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn default_config() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml")
}

#[test]
fn start_up_errors_are_said_once_in_the_users_terms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_string_lossy().into_owned()
    };
    let single = write("single.toml", "[models]\nsource = \"a.gguf\"\n");
    let no_models = write("no-models.toml", "[server]\nport = 9000\n");
    let fraction = write(
        "fraction.toml",
        "[[models]]\nsource = \"a.gguf\"\n[models.offload]\ngpu_memory = \"0.9\"\n",
    );
    let port = free_port().to_string();
    // (arguments, a phrase of the one error)
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "serve",
                "--model",
                "/nonexistent/model.gguf",
                "--device",
                "cpu",
                "--port",
                &port,
            ],
            "is neither an existing file",
        ),
        (
            vec![
                "generate",
                "--model",
                "/nonexistent/model.gguf",
                "--prompt",
                "x",
            ],
            "is neither an existing file",
        ),
        (vec!["plan", "--config", &single], "write `[[models]]`"),
        (
            vec!["serve", "--config", &no_models],
            "no `[[models]]` table",
        ),
        (
            vec!["config", "--config", &fraction],
            "not a whole number of bytes",
        ),
        (
            vec!["serve", "--config", "/nonexistent/ferry.toml"],
            "cannot read config file",
        ),
    ];
    for (args, phrase) in cases {
        let (ok, _, stderr) = run_in(dir.path(), &args, &[]);
        assert!(!ok, "{args:?} should fail");
        assert_eq!(
            stderr.matches(phrase).count(),
            1,
            "{args:?}: said once?\n{stderr}"
        );
        assert_eq!(stderr.matches("error:").count(), 1, "{args:?}:\n{stderr}");
        assert!(!stderr.contains("internal error"), "{args:?}:\n{stderr}");
        assert!(
            !stderr.contains("ERROR"),
            "{args:?}: no error log besides the message\n{stderr}"
        );
        assert!(
            !stderr.contains("listening on"),
            "{args:?}: fails before listening\n{stderr}"
        );
        for forbidden in ["struct", "Raw"] {
            assert!(
                !stderr.contains(forbidden),
                "{args:?}: Rust type names\n{stderr}"
            );
        }
    }
}

#[test]
fn ferry_config_shows_every_value_with_its_origin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = [("FERRY_MAX_BATCH", "3"), ("FERRY_GPU_MEM", "1GiB")];
    let (ok, stdout, stderr) = run_in(
        dir.path(),
        &["config", "--config", default_config(), "--port", "9123"],
        &env,
    );
    assert!(ok, "{stderr}");
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} ")))
            .unwrap_or_else(|| panic!("no line for {key}:\n{stdout}"))
            .to_string()
    };
    assert!(
        line("port").contains("9123") && line("port").ends_with("# flag --port"),
        "{stdout}"
    );
    assert!(
        line("max_batch").ends_with("# env FERRY_MAX_BATCH"),
        "{stdout}"
    );
    assert!(line("host").ends_with("# file"), "{stdout}");
    assert!(line("api_key").ends_with("# default"), "{stdout}");
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .canonicalize()
        .expect("the model");
    assert!(
        line("source").contains(&*model.to_string_lossy()),
        "relative to the config file, not the working directory: {stdout}"
    );
    assert!(
        stderr.contains("FERRY_GPU_MEM ") && stderr.contains("did you mean FERRY_GPU_MEMORY"),
        "{stderr}"
    );

    let (ok, stdout, stderr) = run_in(
        dir.path(),
        &[
            "config",
            "--json",
            "--config",
            default_config(),
            "--port",
            "9123",
        ],
        &env,
    );
    assert!(ok, "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(doc["server"]["port"]["value"], 9123);
    assert_eq!(doc["server"]["port"]["origin"], "flag");
    assert_eq!(doc["server"]["port"]["from"], "--port");
    assert_eq!(doc["models"][0]["max_batch"]["origin"], "env");
    assert_eq!(doc["models"][0]["offload"]["mode"]["origin"], "file");
    assert_eq!(
        doc["device"]["link_bandwidth"]["value"],
        serde_json::Value::Null
    );
    // The API key is never printed.
    let (ok, stdout, _) = run_in(dir.path(), &["config", "--api-key", "sk-secret-1"], &[]);
    assert!(ok && !stdout.contains("sk-secret-1"), "{stdout}");
}

#[test]
fn plan_reads_a_config_file_from_another_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stdout, stderr) = run_in(
        dir.path(),
        &["plan", "--config", default_config(), "--device", "cpu"],
        &[],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("model smollm2"), "{stdout}");
    assert!(stdout.contains("together on cpu"), "{stdout}");
}

/// A failure found only while loading (after planning, once the server listens) is the
/// start-up error, said once and in the loader's words: not "internal error", not logged and
/// then repeated.
#[test]
fn a_load_failure_after_planning_is_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bytes = std::fs::read(crate::real_model::model_path()).expect("the default model");
    let key = bytes
        .windows(18)
        .position(|w| w == b"tokenizer.ggml.pre")
        .expect("the model names its pre-tokenizer");
    let value = key
        + bytes[key..]
            .windows(6)
            .position(|w| w == b"smollm")
            .expect("SmolLM2's pre-tokenizer is `smollm`");
    bytes[value..value + 6].copy_from_slice(b"zzzzzz");
    let model = dir.path().join("bad-pre.gguf");
    std::fs::write(&model, bytes).expect("write");
    let port = free_port().to_string();
    let model = model.to_string_lossy().into_owned();
    let args = [
        "serve", "--model", &model, "--device", "cpu", "--port", &port,
    ];
    let (ok, _, stderr) = run_in(dir.path(), &args, &[]);
    assert!(!ok, "serve must fail:\n{stderr}");
    assert_eq!(stderr.matches("zzzzzz").count(), 1, "said once?\n{stderr}");
    assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
    assert!(!stderr.contains("internal error"), "{stderr}");
    assert!(
        !stderr.contains("ERROR"),
        "no error log besides the message\n{stderr}"
    );
}
