//! The README's `curl` examples, run as written against `ferry serve --config
//! config/default.toml` (the README's run command) with the default model: each answers, and
//! with the default config's sampling defaults the answers are not degenerate: they end on
//! their own (`finish_reason` `stop`, or a response `completed`, before `max_tokens`) and hold
//! no run of one short piece repeated over and over; embeddings come back as unit vectors.
//! Sampled examples run several times.

use std::ffi::OsString;
use std::path::PathBuf;

use serde_json::Value;

use crate::serve_process::ServeProcess;

/// The `curl` commands of README.md's shell blocks, continuation lines joined.
fn readme_curl_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .expect("README.md");
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut current: Option<String> = None;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_shell = line == "```sh";
            continue;
        }
        if !in_shell {
            continue;
        }
        let joined = match current.take() {
            Some(mut command) => {
                command.push(' ');
                command.push_str(line.trim());
                command
            }
            None if line.starts_with("curl ") && line.contains("127.0.0.1:8080") => {
                line.to_string()
            }
            None => continue,
        };
        match joined.strip_suffix('\\') {
            Some(open) => current = Some(open.trim_end().to_string()),
            None => commands.push(joined),
        }
    }
    commands
}

/// The length of the longest run of one piece of 1 to 8 characters repeated back to back, in
/// repetitions (`"ab ab ab"` has 1; `"Mmmmmmmm"` has 7).
fn longest_repeat(text: &str) -> usize {
    let chars: Vec<char> = text.chars().collect();
    let mut longest = 1;
    for unit in 1..=8 {
        for start in 0..chars.len() {
            let mut reps = 1;
            while start + (reps + 1) * unit <= chars.len()
                && chars[start..start + unit]
                    == chars[start + reps * unit..start + (reps + 1) * unit]
            {
                reps += 1;
            }
            longest = longest.max(reps);
        }
    }
    longest
}

/// The text and finish reason of a reply: a JSON body, or an SSE stream of chunks. A Responses
/// API reply finishes `stop` when its status is `completed`.
fn read_reply(body: &str) -> (String, String) {
    if body.trim_start().starts_with('{') {
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert!(v["error"].is_null(), "an error: {body}");
        if v["object"] == "response" {
            let text: String = v["output"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|item| item["content"].as_array().into_iter().flatten())
                .filter_map(|part| part["text"].as_str())
                .collect();
            let finish = if v["status"] == "completed" {
                "stop"
            } else {
                "length"
            };
            return (text, finish.into());
        }
        let choice = &v["choices"][0];
        let text = choice["text"]
            .as_str()
            .or_else(|| choice["message"]["content"].as_str())
            .unwrap_or_else(|| panic!("no text: {body}"));
        return (
            text.to_string(),
            choice["finish_reason"].as_str().unwrap_or("").into(),
        );
    }
    let mut text = String::new();
    let mut finish = String::new();
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        let choice = &v["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    assert!(body.contains("data: [DONE]"), "the stream ends: {body}");
    (text, finish)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_curl_examples_give_sensible_answers() {
    let commands = readme_curl_commands();
    assert!(
        commands.iter().any(|c| c.contains("/v1/completions"))
            && commands.iter().any(|c| c.contains("/v1/chat/completions")),
        "README.md lost its curl examples: {commands:?}"
    );
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
    let args: Vec<OsString> = vec!["--config".into(), config.into()];
    let server = ServeProcess::start(&args).await;
    for command in &commands {
        let command = command.replace("http://127.0.0.1:8080", &server.base);
        // Greedy examples answer the same every time; sampled ones get several tries.
        let runs = if command.contains("\"temperature\":0") {
            1
        } else {
            5
        };
        for run in 0..runs {
            let output = tokio::process::Command::new("sh")
                .args(["-c", &command])
                .output()
                .await
                .expect("curl runs");
            assert!(output.status.success(), "{command}: {output:?}");
            let body = String::from_utf8(output.stdout).expect("UTF-8");
            if command.contains("/v1/embeddings") {
                check_embeddings(&body);
                continue;
            }
            let (text, finish) = read_reply(&body);
            println!("{command}\n  run {run}: {finish} {text:?}");
            assert!(!text.trim().is_empty(), "an empty answer to {command}");
            assert_eq!(
                finish, "stop",
                "the answer ran to max_tokens: {text:?} ({command})"
            );
            assert!(
                longest_repeat(&text) < 6,
                "a degenerate answer (a piece repeated {} times): {text:?} ({command})",
                longest_repeat(&text)
            );
            if command.contains("capital of France") {
                assert!(text.contains("Paris"), "{text:?}");
            }
        }
    }
}

/// An embeddings reply: one unit-length vector per input, in order.
fn check_embeddings(body: &str) {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let data = v["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data: {body}"));
    assert!(!data.is_empty(), "{body}");
    for (index, item) in data.iter().enumerate() {
        assert_eq!(item["index"], index, "{body}");
        let vector: Vec<f64> = item["embedding"]
            .as_array()
            .unwrap_or_else(|| panic!("no vector: {body}"))
            .iter()
            .map(|x| x.as_f64().expect("a number"))
            .collect();
        let norm = vector.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-3, "norm {norm}");
    }
}

#[test]
fn a_repeated_piece_is_found() {
    assert_eq!(longest_repeat("Hello there!"), 2); // "ll"
    assert_eq!(longest_repeat("Mmmmmmmm"), 7);
    assert_eq!(longest_repeat("I'shere'shere'shere."), 3);
    assert_eq!(longest_repeat(""), 1);
}
