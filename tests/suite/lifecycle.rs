//! The `ferry serve` process: on SIGTERM it stops accepting connections, lets the request in
//! flight finish within `server.shutdown_timeout` and exits 0; past the timeout the stream ends
//! with an error event and `[DONE]` and the exit code (3) says work was cut short; a second
//! SIGTERM exits at once. A burst of oversized prompts leaves its memory where it was.

use crate::real_model;
use crate::serve_process::ServeProcess;

use std::ffi::OsString;
use std::io::Write;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

/// A response body being read.
type Body = futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>;

/// The server process (killed if a test fails half-way) and its configuration file.
struct Server {
    process: ServeProcess,
    _config: tempfile::NamedTempFile,
}

impl std::ops::Deref for Server {
    type Target = ServeProcess;
    fn deref(&self) -> &ServeProcess {
        &self.process
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut ServeProcess {
        &mut self.process
    }
}

impl Server {
    /// Starts `ferry serve` with `shutdown_timeout` and waits (bounded) until /health is 200.
    async fn start(shutdown_timeout: &str) -> Self {
        let mut config = tempfile::NamedTempFile::new().expect("temp file");
        write!(
            config,
            "[server]\nshutdown_timeout = \"{shutdown_timeout}\"\n\n\
             [[models]]\nname = \"{}\"\nsource = \"{}\"\nmax_context = 4096\n\n\
             [models.offload]\nmode = \"none\"\n",
            real_model::MODEL,
            real_model::model_path().display()
        )
        .expect("write config");
        let args: Vec<OsString> = vec!["--config".into(), config.path().into()];
        Self {
            process: ServeProcess::start(&args).await,
            _config: config,
        }
    }

    /// Starts a streamed completion of `max_tokens` and returns it once its first token arrived.
    async fn stream_in_flight(&self, max_tokens: usize) -> (Body, String) {
        let response = reqwest::Client::new()
            .post(format!("{}/v1/completions", self.base))
            .json(
                &json!({"model": real_model::MODEL, "prompt": "Tell me about the sea.",
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "stream": true,
                "stream_options": {"include_usage": true}}),
            )
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
        let mut body = response
            .bytes_stream()
            .map(|r| r.map(|b| b.to_vec()))
            .boxed();
        let mut seen = String::new();
        while !seen.contains("\"text\"") {
            let chunk = body.next().await.expect("data").expect("chunk");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        (body, seen)
    }
}

/// Reads the rest of a stream (bounded by `within`).
async fn drain(mut body: Body, mut seen: String, within: Duration) -> String {
    let read = async {
        while let Some(Ok(chunk)) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        seen
    };
    tokio::time::timeout(within, read)
        .await
        .expect("the stream ended in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_then_exits_zero() {
    let mut server = Server::start("60s").await;
    let (body, seen) = server.stream_in_flight(60).await;
    server.sigterm();

    // New connections are refused while the old one is still being served.
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.get(format!("{}/health", server.base)).send().await {
            Err(e) if e.is_connect() => break,
            _ => {
                assert!(Instant::now() < deadline, "still accepting after SIGTERM");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "exited with a request in flight"
    );

    let text = drain(body, seen, Duration::from_secs(120)).await;
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream was cut: {text}"
    );
    assert!(text.contains("\"completion_tokens\":60"), "{text}");
    let exit = server.wait_exit(Duration::from_secs(20));
    assert!(exit.success(), "exit status {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_shutdown_timeout_the_stream_gets_an_error_event_and_the_exit_code_says_so() {
    let mut server = Server::start("1s").await;
    let (body, seen) = server.stream_in_flight(3000).await;
    let signalled = Instant::now();
    server.sigterm();
    let text = drain(body, seen, Duration::from_secs(20)).await;
    let exit = server.wait_exit(Duration::from_secs(20));
    assert_eq!(exit.code(), Some(3), "exit status {exit:?}");
    assert!(
        signalled.elapsed() >= Duration::from_millis(900),
        "exited before the grace period: {:?}",
        signalled.elapsed()
    );
    assert!(
        !text.contains("\"completion_tokens\":3000"),
        "a 3000-token answer cannot finish in 1 s"
    );
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream was cut: {text}"
    );
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let error = events[events.len() - 2]
        .strip_prefix("data: ")
        .expect("a data event");
    let error: serde_json::Value = serde_json::from_str(error).expect("JSON");
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
    assert_eq!(error["error"]["type"], "server_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once() {
    let mut server = Server::start("600s").await;
    let (_body, _seen) = server.stream_in_flight(3000).await;
    server.sigterm();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "the first SIGTERM waits for the stream"
    );
    let second = Instant::now();
    server.sigterm();
    let exit = server.wait_exit(Duration::from_secs(10));
    assert!(second.elapsed() < Duration::from_secs(10));
    assert_eq!(exit.code(), Some(3), "exit status {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_oversized_prompts_leaves_memory_where_it_was() {
    let server = Server::start("5s").await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", server.base);
    let huge = "a".repeat(10 * 1024 * 1024);
    let send = || {
        client
            .post(&url)
            .json(&json!({"model": real_model::MODEL, "prompt": huge, "max_tokens": 1}))
            .timeout(Duration::from_secs(120))
            .send()
    };
    // One round first so the allocator and the runtime have their working set, then measure.
    assert_eq!(send().await.expect("answer").status(), 400);
    std::thread::sleep(Duration::from_millis(500));
    let before = server.rss_bytes();
    let started = Instant::now();
    let replies = futures::future::join_all((0..8).map(|_| send())).await;
    for reply in replies {
        let reply = reply.expect("answer");
        assert_eq!(reply.status(), 400);
        let v: serde_json::Value = reply.json().await.expect("json");
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let after = server.rss_bytes();
    println!("RSS before {before} after {after}; 8 rejections took {took:?}");
    // Less than one of the 10 MiB bodies may stay: an absolute bound, since the release
    // binary's whole resident set is only ~30 MiB (10% of it is allocator noise after a burst).
    const SLACK: u64 = 8 << 20;
    assert!(
        after <= before + SLACK,
        "RSS went from {before} to {after} bytes (more than {SLACK} bytes kept)"
    );
}
