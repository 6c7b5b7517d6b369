//! Issue 24 item 15: the tier calibration's cache, as a real `ferry serve` with offloaded layers
//! (the real SmolLM2, `--offload sequential`) uses it. The start log says whether it measured
//! or read the cache (which file, when it was measured, how to measure again); a run whose
//! probes spread beyond `calibration_spread` is used but not cached; `--recalibrate` measures
//! again. The cache lives under a temporary `XDG_CACHE_HOME`.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;

use serde_json::json;

use crate::real_model::{model_path, MODEL};
use crate::serve_process::ServeProcess;

/// Starts the server with `extra` flags and the cache under `cache_home`, checks it answers a
/// completion, stops it and returns its log.
async fn serve_log(cache_home: &Path, extra: &[&str]) -> String {
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut args: Vec<OsString> = vec!["--model".into(), model_path().into()];
    for arg in [
        "--served-name",
        MODEL,
        "--offload",
        "sequential",
        "--max-context",
        "512",
    ] {
        args.push(arg.into());
    }
    args.extend(extra.iter().map(OsString::from));
    let stderr = log.reopen().expect("log file");
    let server = ServeProcess::start_with(&args, |command| {
        command
            .env("XDG_CACHE_HOME", cache_home)
            .env_remove("FERRY_RECALIBRATE")
            .env_remove("FERRY_CALIBRATION_SPREAD")
            .stderr(Stdio::from(stderr));
    })
    .await;
    let reply: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/completions", server.base))
        // Greedy past end-of-sequence: always the two tokens counted below.
        .json(&json!({"model": MODEL, "prompt": "Hello", "max_tokens": 2,
                      "temperature": 0, "ignore_eos": true}))
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    assert_eq!(reply["usage"]["completion_tokens"], 2, "{reply}");
    drop(server);
    std::fs::read_to_string(log.path()).expect("log")
}

/// The one line of `log` containing `needle`.
fn line<'a>(log: &'a str, needle: &str) -> &'a str {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
    assert_eq!(lines.len(), 1, "one {needle:?} line in:\n{log}");
    lines[0]
}

#[tokio::test]
async fn the_start_log_says_where_the_calibration_came_from_and_unsteady_runs_are_not_kept() {
    let home = tempfile::tempdir().expect("tempdir");
    let cache = home.path().join("ferry").join("calibration.json");

    // A limit no run meets (as on a busy machine): measured, used, not written.
    let log = serve_log(home.path(), &["--calibration-spread", "0%"]).await;
    line(&log, "measuring calibration for q4_1");
    let summary = line(&log, "calibration: link ");
    assert!(
        summary.contains("(probe spread ")
            && summary.contains("not cached: the probes spread beyond calibration_spread 0%"),
        "{summary}"
    );
    assert!(!cache.exists(), "an unsteady calibration is not cached");

    // A limit every run meets: measured and saved.
    let log = serve_log(home.path(), &["--calibration-spread", "100000%"]).await;
    line(&log, "measuring calibration for q4_1");
    let summary = line(&log, "calibration: link ");
    assert!(
        summary.contains(&format!(", saved to {}", cache.display())),
        "{summary}"
    );
    assert!(cache.is_file());

    // The next start reads it, and says from where, since when and how to measure again.
    let log = serve_log(home.path(), &[]).await;
    assert!(!log.contains("measuring calibration"), "{log}");
    let summary = line(&log, "calibration from ");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    assert!(
        summary.contains(&format!(
            "calibration from {} (measured {today} ",
            cache.display()
        )) && summary.contains(" UTC); --recalibrate to measure again: link "),
        "{summary}"
    );

    // `--recalibrate` alone measures again (and keeps the new rates, the run being steady).
    let log = serve_log(
        home.path(),
        &["--recalibrate", "--calibration-spread", "100000%"],
    )
    .await;
    line(&log, "measuring calibration for q4_1");
    assert!(!log.contains("calibration from "), "{log}");
    assert!(
        line(&log, "calibration: link ").contains(&format!(", saved to {}", cache.display())),
        "{log}"
    );
}
