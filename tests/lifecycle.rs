//! The `ferry serve` process on SIGTERM: it stops accepting connections, lets the request in
//! flight finish within `server.shutdown_timeout`, and exits 0; past the timeout it drops the
//! request and still exits 0.

mod real_model;

use std::io::Write;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

/// A response body being read.
type Body = futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>;

/// The server process; killed if a test fails half-way.
struct Server {
    child: Child,
    base: String,
    _config: tempfile::NamedTempFile,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `ferry serve` with `shutdown_timeout` and waits (bounded) until /health is 200.
    async fn start(shutdown_timeout: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut config = tempfile::NamedTempFile::new().expect("temp file");
        write!(
            config,
            "[server]\nport = {port}\nshutdown_timeout = \"{shutdown_timeout}\"\n\n\
             [[models]]\nname = \"{}\"\nsource = \"{}\"\nmax_context = 4096\n\n\
             [models.offload]\nmode = \"none\"\n",
            real_model::MODEL,
            real_model::model_path().display()
        )
        .expect("write config");
        let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["serve", "--config"])
            .arg(config.path())
            .args(["--device", "cpu"])
            .env("RUST_LOG", "info")
            .env_remove("FERRY_PORT")
            .stderr(Stdio::null())
            .spawn()
            .expect("spawns");
        let server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _config: config,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            assert!(Instant::now() < deadline, "server never became healthy");
            if let Ok(r) = client.get(format!("{}/health", server.base)).send().await {
                if r.status() == 200 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
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

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit.
    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                return exit;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
async fn past_the_shutdown_timeout_it_exits_zero_anyway() {
    let mut server = Server::start("1s").await;
    let (body, seen) = server.stream_in_flight(3000).await;
    let signalled = Instant::now();
    server.sigterm();
    let exit = server.wait_exit(Duration::from_secs(20));
    assert!(exit.success(), "exit status {exit:?}");
    assert!(
        signalled.elapsed() >= Duration::from_millis(900),
        "exited before the grace period: {:?}",
        signalled.elapsed()
    );
    let text = drain(body, seen, Duration::from_secs(10)).await;
    assert!(
        !text.contains("[DONE]"),
        "a 3000-token answer cannot finish in 1 s"
    );
}
