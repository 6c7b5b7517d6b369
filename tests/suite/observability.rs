//! What an operator sees: one log line per request with its `x-request-id`, the id round trip,
//! and /metrics complete before the first request (per-model series, vLLM-named aliases, the
//! metric names deploy/ reads). The request lines are read from the stderr of a real
//! `ferry serve` on the real model (the binary's own logging setup, nothing shared with other
//! tests).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use ferry::engine::{Backend, EngineHandle, EngineOptions};
use ferry::metrics::Metrics;
use ferry::server::{app, ServerOptions};

use crate::common::{get, metric, TestBackend};
use crate::real_model::{self, MODEL};

/// `ferry serve` on the real model with its stderr in a file; killed when dropped.
struct Served {
    child: Child,
    base: String,
    log: tempfile::NamedTempFile,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// Starts the server and waits (bounded) until /health is 200.
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let log = tempfile::NamedTempFile::new().expect("temp file");
        let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("serve")
            .arg("--model")
            .arg(real_model::model_path())
            .args([
                "--served-name",
                MODEL,
                "--device",
                "cpu",
                "--max-context",
                "2048",
            ])
            .args(["--port", &port.to_string()])
            .env("RUST_LOG", "info")
            .stderr(Stdio::from(log.reopen().expect("log file")))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawns");
        let served = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let health = reqwest::get(format!("{}/health", served.base)).await;
            if health.is_ok_and(|r| r.status() == 200) {
                return served;
            }
            assert!(Instant::now() < deadline, "not ready:\n{}", served.text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// The log lines containing `needle`, waiting (bounded) until there are `n` of them.
    async fn lines_with(&self, needle: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let lines: Vec<String> = self
                .text()
                .lines()
                .filter(|l| l.contains(needle))
                .map(str::to_owned)
                .collect();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The value of `name=` in a log line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        + name.len()
        + 2;
    line[start..].split(' ').next().unwrap_or_default()
}

#[tokio::test]
async fn each_request_logs_one_line_with_its_id_and_gets_the_id_back() {
    let served = Served::start().await;
    let base = &served.base;
    let client = reqwest::Client::new();
    let completion = |id: Option<&str>, max_tokens: usize| {
        let mut request = client
            .post(format!("{base}/v1/completions"))
            .timeout(Duration::from_secs(300))
            .json(
                &json!({"model": MODEL, "prompt": "The capital of France is",
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}),
            );
        if let Some(id) = id {
            request = request.header("x-request-id", id);
        }
        request.send()
    };

    // A client's id comes back and names the request's line.
    let reply = completion(Some("client-id-7"), 6).await.expect("POST");
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-request-id"], "client-id-7");
    let body: serde_json::Value = reply.json().await.expect("json");
    assert_eq!(body["usage"]["completion_tokens"], 6);
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().expect("usage");

    // Without one (or with an unusable one), a fresh id is made and returned.
    let reply = completion(None, 3).await.expect("POST");
    let made = reply.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_eq!(made.len(), 32, "{made}");
    reply.bytes().await.expect("body");
    let reply = completion(Some("bad id with spaces"), 2)
        .await
        .expect("POST");
    let replaced = reply.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert_ne!(replaced, "bad id with spaces");
    assert_ne!(replaced, made);
    reply.bytes().await.expect("body");

    // Refused before the engine (here: an unknown model): a "request rejected" line with the
    // id instead; other routes carry the header too.
    let reply = client
        .post(format!("{base}/v1/completions"))
        .header("x-request-id", "refused-1")
        .json(&json!({"model": "no-such-model", "prompt": "x"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(reply.status(), 404);
    assert_eq!(reply.headers()["x-request-id"], "refused-1");
    let health = client
        .get(format!("{base}/health"))
        .send()
        .await
        .expect("GET");
    assert!(health.headers().contains_key("x-request-id"));

    let lines = served.lines_with("request finished", 3).await;
    assert_eq!(lines.len(), 3, "{}", served.text());
    let first: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("request_id=client-id-7"))
        .collect();
    assert_eq!(first.len(), 1, "one line for the request: {lines:?}");
    let line = first[0];
    assert!(line.contains(" INFO "), "{line}");
    assert_eq!(field(line, "model"), MODEL);
    assert_eq!(field(line, "prompt_tokens"), prompt_tokens.to_string());
    assert_eq!(field(line, "completion_tokens"), "6");
    assert_eq!(field(line, "status"), "finished");
    assert_eq!(field(line, "finish_reason"), "length");
    for timing in ["queue_ms", "ttft_ms", "e2e_ms", "tok_s"] {
        let value: f64 = field(line, timing).parse().expect(timing);
        assert!(
            value.is_finite() && value >= 0.0,
            "{timing}={value} in {line}"
        );
    }
    let ttft: f64 = field(line, "ttft_ms").parse().expect("ttft");
    let e2e: f64 = field(line, "e2e_ms").parse().expect("e2e");
    assert!(ttft <= e2e, "{line}");
    assert!(
        field(line, "tok_s").parse::<f64>().expect("tok_s") > 0.0,
        "{line}"
    );
    for id in [made.as_str(), replaced.as_str()] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("request_id={id} "))),
            "{id}: {lines:?}"
        );
    }

    let rejected = served.lines_with("request rejected", 1).await;
    assert_eq!(rejected.len(), 1, "{}", served.text());
    assert!(rejected[0].contains("request_id=refused-1"), "{rejected:?}");
    assert_eq!(field(&rejected[0], "status"), "404");
    assert!(
        !served
            .text()
            .lines()
            .any(|l| l.contains("request_id=refused-1") && l.contains("request finished")),
        "a refused request has no engine line"
    );
}

#[tokio::test]
async fn metrics_are_complete_before_the_first_request() {
    // A model that is still loading: nothing has run, and every series is already there.
    let metrics = Metrics::new();
    let engine = EngineHandle::with_options(
        ["loading-model"],
        EngineOptions {
            metrics: metrics.clone(),
            ..EngineOptions::default()
        },
    );
    let router = app(
        Arc::new(engine) as Arc<dyn Backend>,
        ServerOptions::default(),
    );
    let page = get(&router, "/metrics").await.text();
    for name in [
        r#"ferry_model_prompt_tokens_total{model="loading-model"}"#,
        r#"ferry_model_generated_tokens_total{model="loading-model"}"#,
        r#"ferry_request_duration_seconds_count{model="loading-model"}"#,
        "ferry_request_queue_seconds_count",
        "ferry_kv_cache_usage_ratio",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ] {
        assert_eq!(metric(&page, name), 0.0, "{name}");
        assert!(
            page.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} missing:\n{page}"
        );
    }
    assert!(
        page.contains("# TYPE vllm:num_requests_waiting gauge"),
        "{page}"
    );
    assert!(page.contains("# TYPE ferry_request_duration_seconds histogram"));
}

#[tokio::test]
async fn the_aliases_move_with_the_gauges_they_alias() {
    let backend = TestBackend::new();
    let metrics = backend.metrics();
    metrics.request_queued();
    metrics.request_queued();
    metrics.request_started();
    metrics.set_kv_usage("a", 30, 100);
    metrics.set_kv_usage("b", 10, 100);
    let router = app(backend, ServerOptions::default());
    let page = get(&router, "/metrics").await.text();
    assert_eq!(metric(&page, "ferry_requests_waiting"), 1.0);
    assert_eq!(metric(&page, "vllm:num_requests_waiting"), 1.0);
    assert_eq!(metric(&page, "ferry_requests_running"), 1.0);
    assert_eq!(metric(&page, "vllm:num_requests_running"), 1.0);
    assert_eq!(metric(&page, "ferry_kv_cache_usage_ratio"), 0.2);
    assert_eq!(metric(&page, "vllm:kv_cache_usage_perc"), 0.2);
}

#[tokio::test]
async fn the_metric_names_deploy_reads_are_exported() {
    // deploy/'s HPA and Endpoint Picker name these; a rename here must fail a test.
    let root = env!("CARGO_MANIFEST_DIR");
    let mut wanted = Vec::new();
    for file in [
        "deploy/kubernetes/hpa.yaml",
        "deploy/inference-gateway/epp.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).expect(file);
        for line in text.lines() {
            let line = line.trim();
            let value = [
                "name: ",
                "queuedRequestsSpec: ",
                "runningRequestsSpec: ",
                "kvUsageSpec: ",
            ]
            .iter()
            .find_map(|key| line.strip_prefix(key))
            .map(|v| v.trim_matches('"'));
            if let Some(v) = value.filter(|v| v.starts_with("ferry_") || v.starts_with("vllm:")) {
                wanted.push(v.to_owned());
            }
        }
    }
    assert!(wanted.len() >= 7, "{wanted:?}");
    let backend = TestBackend::new();
    let router = app(backend, ServerOptions::default());
    let page = get(&router, "/metrics").await.text();
    for name in &wanted {
        assert!(
            page.contains(&format!("# TYPE {name} gauge")),
            "{name} (read by deploy/) is not an exported gauge"
        );
    }
}

/// Issue 24 item 14: the start log says what a newcomer needs (the weights' types and the
/// kernels that run them, not only the compute dtype; what `planned_total` counts; the chat
/// template, tool-call format and offload tier), and a request line says the `finish_reason`
/// the API answered, with the reply's `tool_calls` when tools were offered.
#[tokio::test]
async fn the_logs_say_what_runs_and_what_the_api_answered() {
    let served = Served::start().await;
    let loaded = served.lines_with("model loaded", 1).await;
    let loaded = loaded
        .first()
        .unwrap_or_else(|| panic!("{}", served.text()));
    assert_eq!(field(loaded, "compute_dtype"), "\"f32\"", "{loaded}");
    assert!(!loaded.contains(" dtype=F32"), "{loaded}");
    // SmolLM2's Q4_1 matrices run on ferry's kernels; its norms stay f32.
    assert!(
        loaded.contains("weights=\"q4_1 matrices x")
            && loaded.contains(", ferry CPU kernels (")
            && loaded.contains("f32 vectors x"),
        "{loaded}"
    );
    assert!(
        loaded.contains("chat_template=\"chatml, from the GGUF (tokenizer.chat_template)\""),
        "{loaded}"
    );
    assert!(
        loaded.contains("tool_calls=\"hermes markup")
            && loaded.contains("tools folded into the system message"),
        "{loaded}"
    );
    assert!(
        loaded.contains("offload_tier=\"none: nothing is offloaded\""),
        "{loaded}"
    );
    let placed = served.lines_with("placement planned", 1).await;
    let placed = placed.first().expect("placement line");
    let memory = served.lines_with("device memory", 1).await;
    let memory = memory.first().expect("memory line");
    let counts = format!(
        "planned_total adds the KV cache for {} sequences of {} tokens (f16, filled as they grow), \
         the workspace and the reserve",
        field(placed, "max_batch"),
        field(placed, "max_context")
    );
    assert!(memory.contains(&counts), "{counts}\n{memory}");

    // With tools offered, the line says what the API answered and how many calls it made.
    let client = reqwest::Client::new();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}]);
    let chat = |id: &'static str, choice: serde_json::Value| {
        client
            .post(format!("{}/v1/chat/completions", served.base))
            .header("x-request-id", id)
            .json(&json!({"model": MODEL, "max_tokens": 60, "temperature": 0,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": tools, "tool_choice": choice, "parallel_tool_calls": false}))
            .send()
    };
    let reply: serde_json::Value = chat("tools-required", json!("required"))
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    assert_eq!(
        reply["choices"][0]["finish_reason"], "tool_calls",
        "{reply}"
    );
    let reply: serde_json::Value = chat("tools-none", json!("none"))
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    let plain_reason = reply["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish_reason")
        .to_owned();
    let lines = served.lines_with("request finished", 2).await;
    let line = |id: &str| {
        lines
            .iter()
            .find(|l| l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("no line for {id}: {lines:?}"))
            .clone()
    };
    let called = line("tools-required");
    assert_eq!(field(&called, "finish_reason"), "tool_calls", "{called}");
    assert_eq!(field(&called, "tool_calls"), "1", "{called}");
    // `tool_choice: none` offers nothing: no count, the engine's reason.
    let plain = line("tools-none");
    assert_eq!(field(&plain, "finish_reason"), plain_reason, "{plain}");
    assert!(!plain.contains(" tool_calls="), "{plain}");
}

/// An embedding request through `ferry serve`: one `request finished` line with its id and
/// its tokens, and a count in `ferry_requests_total` under its model.
#[tokio::test]
async fn an_embedding_request_logs_one_line_and_is_counted() {
    let served = Served::start().await;
    let base = &served.base;
    let client = reqwest::Client::new();
    let reply = client
        .post(format!("{base}/v1/embeddings"))
        .header("x-request-id", "embed-1")
        .timeout(Duration::from_secs(300))
        .json(&json!({"model": MODEL, "input": ["The capital of France", "is Paris"]}))
        .send()
        .await
        .expect("POST");
    assert_eq!(reply.status(), 200);
    let body: serde_json::Value = reply.json().await.expect("json");
    assert_eq!(body["data"].as_array().map(Vec::len), Some(2), "{body}");
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().expect("usage");

    let lines = served.lines_with("request_id=embed-1", 1).await;
    assert_eq!(lines.len(), 1, "{}", served.text());
    let line = &lines[0];
    assert!(
        line.contains("request finished") && line.contains(" INFO "),
        "{line}"
    );
    assert_eq!(field(line, "model"), MODEL);
    assert_eq!(field(line, "prompt_tokens"), prompt_tokens.to_string());
    assert_eq!(field(line, "completion_tokens"), "0");
    assert_eq!(field(line, "status"), "finished");

    let page = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("text");
    let name = format!("ferry_requests_total{{model=\"{MODEL}\",status=\"200\"}}");
    assert_eq!(metric(&page, &name), 1.0, "{page}");
}
