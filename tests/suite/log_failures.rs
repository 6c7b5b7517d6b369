//! A server whose log cannot be written keeps serving: a real `ferry serve` with its stderr on
//! `/dev/full` (every write fails with ENOSPC) and debug logging, so every request logs lines
//! that are lost. (tracing's formatter reported a failed write with `eprintln!`, which panics
//! when stderr fails: the process exited 101 at start, and a disk filling later killed the
//! engine thread while `/health` still said ok.)

use crate::real_model;
use crate::serve_process::ServeProcess;

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::time::Duration;

use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_logging_to_a_full_device_keeps_serving() {
    let full = OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let args: Vec<OsString> = vec![
        "--model".into(),
        real_model::model_path().into(),
        "--served-name".into(),
        real_model::MODEL.into(),
    ];
    let server = ServeProcess::start_with(&args, |command| {
        command.env("RUST_LOG", "debug").stderr(full);
    })
    .await;
    let client = reqwest::Client::new();
    for round in 0..3 {
        let response = client
            .post(format!("{}/v1/completions", server.base))
            .json(
                &json!({"model": real_model::MODEL, "prompt": format!("Round {round}: the sky is"),
                "max_tokens": 4, "ignore_eos": true}),
            )
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), 200, "round {round}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");
        let health = client
            .get(format!("{}/health", server.base))
            .send()
            .await
            .expect("health");
        assert_eq!(health.status(), 200, "round {round}");
    }
}
