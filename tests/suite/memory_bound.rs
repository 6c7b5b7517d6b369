//! What the default server keeps across requests stays within what it says it keeps: a real
//! `ferry serve --config config/default.toml` (prefix cache on, as shipped) answers many
//! distinct long prompts, completions and chats, and its resident memory grows by no more than
//! the prefix cache's tokens (`ferry_prefix_cache_tokens`) times the KV bytes of a token, plus
//! a fixed allowance. (A prefix cache whose blocks kept their sequences' whole KV buffers
//! alive took ~0.8 MB per cached token instead of 23 KB, and 24 GB for one 4k-token prompt.)

use crate::real_model;
use crate::serve_process::ServeProcess;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use ferry::model::checkpoint::Checkpoint;
use ferry::model::source::ModelFiles;
use serde_json::{json, Value};

/// Words the prompts are made of.
const WORDS: &[&str] = &[
    "river", "stone", "harbor", "lantern", "copper", "meadow", "signal", "orchard", "velvet",
    "engine", "glacier", "pepper", "summit", "thunder", "window", "ribbon", "canyon", "marble",
    "falcon", "pillow", "saddle", "tunnel", "violet", "wander", "basket", "cedar", "dolphin",
];

/// A prompt of `words` words that no other `index` shares from its first token on.
fn distinct_prompt(index: u64, words: usize) -> String {
    let mut state = index
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut text = format!("Note {index}:");
    for _ in 0..words {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push(' ');
        text.push_str(WORDS[(state >> 33) as usize % WORDS.len()]);
    }
    text
}

/// KV bytes of one cached position: keys and values of every layer, f16 (the default kv_dtype).
fn kv_bytes_per_token() -> u64 {
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf {
        path: real_model::model_path(),
    })
    .expect("opens");
    let spec = checkpoint.spec();
    (2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * 2) as u64
}

async fn post(server: &ServeProcess, path: &str, body: Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .json(&body)
        .timeout(Duration::from_secs(600))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_long_prompts_grow_memory_by_the_prefix_caches_tokens_only() {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
    let args: Vec<OsString> = vec!["--config".into(), config.into()];
    let server = ServeProcess::start(&args).await;
    // A short request first, so the runtime, the allocator and the kernels have their working
    // set, then measure.
    post(
        &server,
        "/v1/completions",
        json!({"model": real_model::MODEL, "prompt": "Hello", "max_tokens": 1}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_bytes();

    let mut prompt_tokens = 0;
    for index in 0..6 {
        let reply = post(
            &server,
            "/v1/completions",
            json!({"model": real_model::MODEL, "prompt": distinct_prompt(index, 600),
                "max_tokens": 1, "temperature": 0}),
        )
        .await;
        prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().expect("usage");
    }
    for index in 100..102 {
        let reply = post(
            &server,
            "/v1/chat/completions",
            json!({"model": real_model::MODEL, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": distinct_prompt(index, 600)}]}),
        )
        .await;
        prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().expect("usage");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = server.rss_bytes();

    let cached = server.metric("ferry_prefix_cache_tokens").await as u64;
    let per_token = kv_bytes_per_token();
    let allowance: u64 = 64 << 20;
    let bound = before + cached * per_token * 5 / 4 + allowance;
    println!(
        "{prompt_tokens} prompt tokens, {cached} cached x {per_token} B; RSS {} -> {} MiB \
         (bound {} MiB)",
        before >> 20,
        after >> 20,
        bound >> 20
    );
    assert!(
        cached >= prompt_tokens / 2,
        "the cache kept {cached} of {prompt_tokens} tokens: this test needs it to keep them"
    );
    assert!(
        after <= bound,
        "RSS grew from {before} to {after} bytes with {cached} tokens cached ({per_token} B each)"
    );
}

/// The Responses API keeps what it stores (`store` defaults to true) in memory for
/// `previous_response_id`: a real default server answering distinct long stored responses
/// grows by no more than the prefix cache's KV plus a few times the text it was sent and
/// answered (the store keeps each response's JSON and its conversation), plus the allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_grow_memory_by_their_text_and_the_prefix_cache_only() {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
    let args: Vec<OsString> = vec!["--config".into(), config.into()];
    let server = ServeProcess::start(&args).await;
    post(
        &server,
        "/v1/responses",
        json!({"model": real_model::MODEL, "input": "Hello", "max_output_tokens": 1}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.rss_bytes();

    let mut text_bytes = 0u64;
    let mut ids = Vec::new();
    for index in 200..212 {
        let input = distinct_prompt(index, 600);
        let reply = post(
            &server,
            "/v1/responses",
            json!({"model": real_model::MODEL, "input": input, "max_output_tokens": 1,
                "temperature": 0}),
        )
        .await;
        assert_eq!(reply["store"], true, "{reply}");
        text_bytes += (input.len() + reply.to_string().len()) as u64;
        ids.push(reply["id"].as_str().expect("an id").to_string());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = server.rss_bytes();

    // Every response is still there to continue from.
    for id in [&ids[0], &ids[ids.len() - 1]] {
        let status = reqwest::Client::new()
            .get(format!("{}/v1/responses/{id}", server.base))
            .send()
            .await
            .expect("request")
            .status();
        assert_eq!(status, 200, "{id}");
    }
    let cached = server.metric("ferry_prefix_cache_tokens").await as u64;
    let allowance: u64 = 64 << 20;
    let bound = before + cached * kv_bytes_per_token() * 5 / 4 + 4 * text_bytes + allowance;
    println!(
        "{} stored responses of {text_bytes} bytes of text, {cached} tokens cached; RSS {} -> {} \
         MiB (bound {} MiB)",
        ids.len(),
        before >> 20,
        after >> 20,
        bound >> 20
    );
    assert!(
        after <= bound,
        "RSS grew from {before} to {after} bytes for {text_bytes} bytes of stored text"
    );
}
