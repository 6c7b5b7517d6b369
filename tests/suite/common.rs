//! A deterministic test double of `ferry::engine::Backend` for the HTTP tests, and request
//! helpers. It is NOT a model: it tokenises text as bytes (BOS = 256 when special tokens are
//! added), renders chat as `<|role|>content\n...<|assistant|>`, and answers every request with
//! the fixed continuation [`CONTINUATION`], one token per piece, honouring `max_tokens`.
//!
//! Models: `test-model` (ready), `loading-model` (stays loading; only in
//! [`TestBackend::with_loading`]), `broken-model` (one token then a failure), `slow-model` (a
//! token every 10 ms until the receiver is dropped, which sets [`TestBackend::cancelled`]),
//! `oom-model` (its first step runs out of device memory, as a CUDA out-of-memory error does),
//! `stuck-model` (one token, then nothing until the receiver is dropped: a request that stays
//! in flight).
//!
//! Embeddings: `test-model` embeds each input as [`fake_embedding`] ([`EMBEDDING_WIDTH`] values,
//! unit norm, a function of its token ids); the other models give none.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tower::ServiceExt;

use ferry::engine::{
    Backend, ChatMessage, EmbeddingReply, EmbeddingRequest, EngineError, EngineResult,
    FinishReason, GenerationEvent, GenerationRequest, ModelCard, ModelPlacement, ModelStatus,
    SamplingParams, TokenLogprob, TokenOutput, Usage,
};
use ferry::metrics::Metrics;

pub const READY: &str = "test-model";
pub const LOADING: &str = "loading-model";
pub const BROKEN: &str = "broken-model";
pub const SLOW: &str = "slow-model";
pub const OUT_OF_MEMORY: &str = "oom-model";
pub const STUCK: &str = "stuck-model";
pub const MAX_CONTEXT: usize = 64;
pub const BOS: u32 = 256;

/// Every test model's sampling defaults (what a request that sends no sampling fields gets):
/// unlike OpenAI's and llama.cpp's, so a test sees whose were applied.
pub fn model_sampling_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_p: 0.8,
        top_k: 20,
        min_p: 0.1,
        repetition_penalty: 1.05,
        ..SamplingParams::default()
    }
}
/// Token ids of the continuation start here.
pub const FIRST_GENERATED_ID: u32 = 1000;
pub const CONTINUATION: [&str; 8] = ["Hello", ",", " world", "!", " How", " are", " you", "?"];
pub const CREATED: u64 = 1_700_000_000;
/// The width of `test-model`'s embeddings.
pub const EMBEDDING_WIDTH: usize = 8;

/// `test-model`'s embedding of `tokens`: value `j` sums `(t + 1) * (j + 1) mod 17 - 8` over the
/// tokens, then the vector is scaled to unit norm (an all-zero sum stays zero).
pub fn fake_embedding(tokens: &[u32]) -> Vec<f32> {
    let raw: Vec<f32> = (0..EMBEDDING_WIDTH as u64)
        .map(|j| {
            tokens
                .iter()
                .map(|&t| ((u64::from(t) + 1) * (j + 1) % 17) as f32 - 8.0)
                .sum()
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    raw.iter()
        .map(|x| if norm > 0.0 { x / norm } else { 0.0 })
        .collect()
}

/// The test double.
pub struct TestBackend {
    cards: Vec<ModelCard>,
    /// Every request submitted, in order.
    pub submitted: Mutex<Vec<GenerationRequest>>,
    /// Every embedding request, in order.
    pub embedded: Mutex<Vec<EmbeddingRequest>>,
    /// Set when a generation task found its receiver dropped.
    pub cancelled: Arc<AtomicBool>,
    /// Calls to `tokenize` and `encode_chat` (the tokeniser's work) so far.
    pub tokenize_calls: AtomicUsize,
    /// While set, `check_capacity` and `submit` answer `Overloaded`.
    pub overloaded: AtomicBool,
    /// The registry `/metrics` renders; the double counts prompt and generated tokens of the
    /// ready model as the engine does (the usage it reports).
    pub metrics: Metrics,
    /// What `placement` answers, per model (none unless a test sets one).
    pub placements: Mutex<Vec<(String, ModelPlacement)>>,
}

fn card(id: &str, status: ModelStatus) -> ModelCard {
    ModelCard {
        id: id.to_owned(),
        created: CREATED,
        status,
        max_context: (status == ModelStatus::Ready).then_some(MAX_CONTEXT),
        residency: None,
    }
}

impl TestBackend {
    /// Ready models only.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            cards: vec![
                card(READY, ModelStatus::Ready),
                card(BROKEN, ModelStatus::Ready),
                card(SLOW, ModelStatus::Ready),
                card(OUT_OF_MEMORY, ModelStatus::Ready),
                card(STUCK, ModelStatus::Ready),
            ],
            submitted: Mutex::new(Vec::new()),
            embedded: Mutex::new(Vec::new()),
            cancelled: Arc::new(AtomicBool::new(false)),
            tokenize_calls: AtomicUsize::new(0),
            overloaded: AtomicBool::new(false),
            metrics: Metrics::new(),
            placements: Mutex::new(Vec::new()),
        })
    }

    /// A ready model plus one that stays loading.
    pub fn with_loading() -> Arc<Self> {
        Self::with_cards(vec![
            card(READY, ModelStatus::Ready),
            card(LOADING, ModelStatus::Loading),
        ])
    }

    /// A ready model plus one that failed to load (`LOADING`'s name, status failed).
    pub fn with_failed() -> Arc<Self> {
        Self::with_cards(vec![
            card(READY, ModelStatus::Ready),
            card(LOADING, ModelStatus::Failed),
        ])
    }

    fn with_cards(cards: Vec<ModelCard>) -> Arc<Self> {
        Arc::new(Self {
            cards,
            submitted: Mutex::new(Vec::new()),
            embedded: Mutex::new(Vec::new()),
            cancelled: Arc::new(AtomicBool::new(false)),
            tokenize_calls: AtomicUsize::new(0),
            overloaded: AtomicBool::new(false),
            metrics: Metrics::new(),
            placements: Mutex::new(Vec::new()),
        })
    }

    /// The last submitted request.
    pub fn last(&self) -> GenerationRequest {
        self.submitted
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("nothing submitted")
    }

    fn ready(&self, model: &str) -> EngineResult<()> {
        match self.cards.iter().find(|c| c.id == model) {
            None => Err(EngineError::ModelNotFound(model.to_owned())),
            Some(c) if c.status != ModelStatus::Ready => {
                Err(EngineError::NotReady(model.to_owned()))
            }
            Some(_) => Ok(()),
        }
    }
}

/// The chat rendering the double uses (tests compute expected prompt lengths with it).
pub fn render(messages: &[ChatMessage]) -> String {
    let mut out: String = messages
        .iter()
        .map(|m| format!("<|{}|>{}\n", m.role, m.content))
        .collect();
    out.push_str("<|assistant|>");
    out
}

fn logprob(id: u32, token: &str, logprob: f32) -> TokenLogprob {
    TokenLogprob {
        id,
        token: token.to_owned(),
        logprob,
        bytes: token.as_bytes().to_vec(),
    }
}

/// The output for continuation token `i` with `k` alternatives when logprobs are asked for.
pub fn output(i: usize, logprobs: Option<usize>) -> TokenOutput {
    let text = CONTINUATION[i % CONTINUATION.len()];
    let id = FIRST_GENERATED_ID + i as u32;
    let lp = -0.25 * (i as f32 + 1.0);
    TokenOutput {
        text: text.to_owned(),
        token_id: id,
        logprob: logprobs.map(|_| logprob(id, text, lp)),
        top_logprobs: (0..logprobs.unwrap_or(0))
            .map(|j| {
                if j == 0 {
                    logprob(id, text, lp)
                } else {
                    logprob(j as u32, &format!("alt{j}"), lp - j as f32)
                }
            })
            .collect(),
    }
}

impl Backend for TestBackend {
    fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    fn models(&self) -> Vec<ModelCard> {
        self.cards.clone()
    }

    fn placement(&self, model: &str) -> Option<ModelPlacement> {
        let placements = self.placements.lock().unwrap();
        placements
            .iter()
            .find(|(name, _)| name == model)
            .map(|(_, p)| p.clone())
    }

    fn max_context(&self, model: &str) -> EngineResult<usize> {
        self.ready(model).map(|_| MAX_CONTEXT)
    }

    fn sampling_defaults(&self, model: &str) -> EngineResult<SamplingParams> {
        self.ready(model).map(|_| model_sampling_defaults())
    }

    fn tokenize(
        &self,
        model: &str,
        text: &str,
        add_special_tokens: bool,
    ) -> EngineResult<Vec<u32>> {
        self.ready(model)?;
        self.tokenize_calls.fetch_add(1, Ordering::SeqCst);
        let bos = add_special_tokens.then_some(BOS);
        Ok(bos.into_iter().chain(text.bytes().map(u32::from)).collect())
    }

    fn token_bytes(&self, model: &str, tokens: &[u32]) -> EngineResult<Vec<Vec<u8>>> {
        tokens
            .iter()
            .map(|&t| self.detokenize(model, &[t]).map(String::into_bytes))
            .collect()
    }

    fn detokenize(&self, model: &str, tokens: &[u32]) -> EngineResult<String> {
        self.ready(model)?;
        let mut bytes = Vec::new();
        for &t in tokens {
            match t {
                0..=255 => bytes.push(t as u8),
                BOS => bytes.extend_from_slice(b"<s>"),
                t if (FIRST_GENERATED_ID..FIRST_GENERATED_ID + 8).contains(&t) => bytes
                    .extend_from_slice(CONTINUATION[(t - FIRST_GENERATED_ID) as usize].as_bytes()),
                t => {
                    return Err(EngineError::InvalidRequest {
                        message: format!("token id {t} is out of range"),
                        param: Some("tokens".into()),
                    })
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String> {
        self.ready(model)?;
        assert!(add_generation_prompt);
        Ok(render(messages))
    }

    fn encode_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        _parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        let text = self.render_chat(model, messages, add_generation_prompt)?;
        self.tokenize_calls.fetch_add(1, Ordering::SeqCst);
        Ok(text.bytes().map(u32::from).collect())
    }

    /// Renders no tools (this template folds them); the template variables go first as
    /// `<|v|>{json}\n`, so a test can see what reached the template.
    fn encode_chat_with_tools(
        &self,
        model: &str,
        messages: &[ChatMessage],
        tools: &[Value],
        variables: &serde_json::Map<String, Value>,
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        assert!(tools.is_empty(), "the test double's template folds tools");
        let mut ids: Vec<u32> = format!("<|v|>{}\n", Value::Object(variables.clone()))
            .bytes()
            .map(u32::from)
            .collect();
        ids.extend(self.encode_chat(
            model,
            messages,
            add_generation_prompt,
            parse_special_in_content,
        )?);
        Ok(ids)
    }

    fn check_capacity(&self, model: &str) -> EngineResult<()> {
        self.ready(model)?;
        if self.overloaded.load(Ordering::SeqCst) {
            return Err(EngineError::Overloaded("the test backend is full".into()));
        }
        Ok(())
    }

    fn embedding_size(&self, model: &str) -> EngineResult<usize> {
        self.ready(model)?;
        if model != READY {
            return Err(ferry::engine::no_embeddings(model));
        }
        Ok(EMBEDDING_WIDTH)
    }

    fn embed(&self, request: EmbeddingRequest) -> EngineResult<oneshot::Receiver<EmbeddingReply>> {
        self.embedding_size(&request.model)?;
        self.check_capacity(&request.model)?;
        self.embedded.lock().unwrap().push(request.clone());
        let (tx, rx) = oneshot::channel();
        let vectors = request.inputs.iter().map(|i| fake_embedding(i)).collect();
        let _ = tx.send(Ok(vectors));
        Ok(rx)
    }

    fn submit(&self, request: GenerationRequest) -> EngineResult<mpsc::Receiver<GenerationEvent>> {
        self.check_capacity(&request.model)?;
        self.submitted.lock().unwrap().push(request.clone());
        let (tx, rx) = mpsc::channel(4);
        let cancelled = Arc::clone(&self.cancelled);
        let prompt_tokens = request.prompt.len();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let params = &request.params;
            let send = |event| {
                let tx = tx.clone();
                async move { tx.send(event).await.is_ok() }
            };
            match request.model.as_str() {
                BROKEN => {
                    send(GenerationEvent::Token(output(0, params.logprobs))).await;
                    send(GenerationEvent::Failed(EngineError::Internal(
                        "the test model broke".into(),
                    )))
                    .await;
                }
                STUCK => {
                    send(GenerationEvent::Token(output(0, None))).await;
                    tx.closed().await;
                    cancelled.store(true, Ordering::SeqCst);
                }
                OUT_OF_MEMORY => {
                    send(GenerationEvent::Failed(EngineError::OutOfMemory(
                        "CUDA_ERROR_OUT_OF_MEMORY".into(),
                    )))
                    .await;
                }
                SLOW => {
                    for i in 0..params.max_tokens {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        if !send(GenerationEvent::Token(output(i, None))).await {
                            cancelled.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
                _ => {
                    let n = params.max_tokens.min(CONTINUATION.len());
                    metrics.add_prompt_tokens(prompt_tokens);
                    for i in 0..n {
                        metrics.add_generated_tokens(1);
                        if !send(GenerationEvent::Token(output(i, params.logprobs))).await {
                            cancelled.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                    let reason = if n < CONTINUATION.len() {
                        FinishReason::Length
                    } else {
                        FinishReason::Stop
                    };
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens: n,
                        total_tokens: prompt_tokens + n,
                        prompt_tokens_details: None,
                        completion_tokens_details: None,
                    };
                    send(GenerationEvent::Finished {
                        reason,
                        usage,
                        trailing_text: String::new(),
                    })
                    .await;
                }
            }
        });
        Ok(rx)
    }
}

/// A response, fully read.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).expect("body is not UTF-8")
    }
}

/// Sends one request through the router in process.
pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app
        .clone()
        .oneshot(request)
        .await
        .expect("router is infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// A request with a raw body and an optional content type.
pub fn raw(
    method: Method,
    uri: &str,
    content_type: Option<&str>,
    body: impl Into<Body>,
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        builder = builder.header(header::CONTENT_TYPE, ct);
    }
    builder.body(body.into()).expect("request")
}

/// POSTs JSON.
pub async fn post(app: &Router, uri: &str, body: Value) -> Reply {
    send(
        app,
        raw(
            Method::POST,
            uri,
            Some("application/json"),
            body.to_string(),
        ),
    )
    .await
}

/// GETs a path.
pub async fn get(app: &Router, uri: &str) -> Reply {
    send(app, raw(Method::GET, uri, None, Body::empty())).await
}

/// Splits an SSE body into its events' data, checking the framing byte for byte: every event is
/// exactly one `data: ` line followed by a blank line, and nothing else is in the body but
/// keep-alive comments (skipped).
pub fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "body must end with a blank line: {body:?}"
    );
    let events: Vec<&str> = body[..body.len() - 2].split("\n\n").collect();
    events
        .iter()
        // A comment (a line starting with `:`) is the stream's keep-alive, sent when a token
        // takes longer than `sse_keep_alive` (a loaded machine); SSE clients ignore it.
        .filter(|event| !event.starts_with(':'))
        .map(|event| {
            assert!(!event.contains('\n'), "one line per event: {event:?}");
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without `data: ` prefix: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// The value of one sample line of a Prometheus text page, `name` including its labels exactly
/// as rendered (`ferry_requests_total{model="m",status="200"}`); 0 when absent.
pub fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A server on a loopback port (`ferry::server::run`) with its stop trigger.
pub struct Loopback {
    pub addr: std::net::SocketAddr,
    pub stop: ferry::server::ShutdownTrigger,
    pub served: tokio::task::JoinHandle<std::io::Result<ferry::server::ServeReport>>,
}

impl Loopback {
    /// Serves `backend` with `options` on 127.0.0.1.
    pub async fn start(backend: Arc<dyn Backend>, options: ferry::server::ServerOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let (stop, signal) = ferry::server::shutdown_channel();
        let served = tokio::spawn(ferry::server::run(backend, options, listener, signal));
        Self { addr, stop, served }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A new TCP connection.
    pub async fn connect(&self) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect")
    }

    /// Waits for the server to stop and returns its report.
    pub async fn stopped(self) -> ferry::server::ServeReport {
        self.served
            .await
            .expect("the server task")
            .expect("the server")
    }
}

/// Writes `request` (raw HTTP/1.1) on a new connection and reads until the server closes it.
pub async fn raw_exchange(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads from `stream` until the server closes it (EOF or reset); returns what was read.
pub async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The Python that has the openai SDK and LangChain (`scripts/client-venv.sh` installs them;
/// `scripts/test.sh` exports `FERRY_CLIENT_PYTHON`). Panics, naming the script, without it.
pub fn client_python() -> std::path::PathBuf {
    let path = std::env::var_os("FERRY_CLIENT_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            std::path::Path::new(&home).join(".cache/ferry/client-venv/bin/python")
        });
    assert!(
        path.exists(),
        "{} is missing: run scripts/client-venv.sh (scripts/test.sh does) to install the Python clients",
        path.display()
    );
    path
}

/// Runs `script` (Python source) with [`client_python`], `base_url` (e.g. `http://127.0.0.1:PORT/v1`)
/// in the variable `FERRY_BASE_URL`, off the async runtime; returns its stdout, or panics with
/// its stderr when it fails. The script prints what the test asserts on (JSON is easiest).
pub async fn run_python_client(script: &str, base_url: &str) -> String {
    let python = client_python();
    let script = script.to_owned();
    let base_url = base_url.to_owned();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(&python)
            .arg("-c")
            .arg(&script)
            .env("FERRY_BASE_URL", &base_url)
            .env("OPENAI_API_KEY", "unused")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .output()
            .expect("start the Python client");
        assert!(
            output.status.success(),
            "the Python client failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("the client's output is UTF-8")
    })
    .await
    .expect("the client thread")
}
