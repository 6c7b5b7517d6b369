//! The Prometheus metrics of a ferry process: one [`Metrics`] registry, a cheap `Clone` handle
//! shared by the HTTP layer (request counts by status), the engine threads (tokens, queue
//! depth, latencies) and the offload engine (device memory, copies, swaps), rendered by
//! `GET /metrics` in the Prometheus text format (0.0.4). Every name starts with `ferry_`.
//!
//! | metric | type | updated by |
//! |---|---|---|
//! | `ferry_requests_total{model,status}` | counter | HTTP layer: one per generation request, `status` = HTTP status code |
//! | `ferry_prompt_tokens_total` | counter | engine: prompt tokens prefilled (= the `usage` field) |
//! | `ferry_generated_tokens_total` | counter | engine: tokens sampled (= `completion_tokens`, EOS included) |
//! | `ferry_requests_running` | gauge | engine: sequences being generated |
//! | `ferry_requests_waiting` | gauge | engine: accepted requests not started yet |
//! | `ferry_time_to_first_token_seconds` | histogram | engine: from acceptance to the first sampled token |
//! | `ferry_inter_token_latency_seconds` | histogram | engine: between two sampled tokens of a sequence |
//! | `ferry_device_memory_bytes{kind}` | gauge | offload engine (`kind` = weights, slots, kv, workspace) |
//! | `ferry_device_memory_budget_bytes` | gauge | offload engine |
//! | `ferry_offload_bytes_copied_total` | counter | offload engine: bytes copied host -> device |
//! | `ferry_offload_wait_seconds_total` | counter | offload engine: time compute waited for a copy |
//! | `ferry_model_swaps_total` | counter | residency manager (mode `model`) |
//! | `ferry_model_resident{model}` | gauge | engine (1 once loaded); the residency manager later |
//!
//! The device-memory, offload and swap metrics have setters here but nothing calls them until
//! the offload engine is wired in: until then they read 0, which is the truth for a process
//! that streams nothing, not an estimate.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of the time-to-first-token buckets.
const TTFT_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];

/// Upper bounds (seconds) of the inter-token-latency buckets.
const ITL_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Where device memory goes (the `kind` label of `ferry_device_memory_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Resident layer weights and the fixed parts (embeddings, norm, head).
    Weights,
    /// The slot ring streamed layers are copied into.
    Slots,
    /// Key/value caches.
    Kv,
    /// Activations and scratch buffers.
    Workspace,
}

impl MemoryKind {
    /// Every kind, in label order.
    pub const ALL: [MemoryKind; 4] = [Self::Weights, Self::Slots, Self::Kv, Self::Workspace];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Weights => "weights",
            Self::Slots => "slots",
            Self::Kv => "kv",
            Self::Workspace => "workspace",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    model: String,
    status: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

/// The metric handles. Each is internally atomic (or a lock-protected map for label families),
/// so the whole struct is shared behind one `Arc` without a lock of its own.
struct Inner {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    running: Gauge,
    waiting: Gauge,
    ttft: Histogram,
    itl: Histogram,
    device_memory: Family<KindLabels, Gauge>,
    device_budget: Gauge,
    offload_bytes: Counter,
    offload_wait: Counter<f64, AtomicU64>,
    swaps: Counter,
    resident: Family<ModelLabels, Gauge>,
}

/// The process's metrics registry. Cheap to clone; every clone updates the same values.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Two handles are equal when they update the same registry.
impl PartialEq for Metrics {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Metrics {}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ferry");
        let requests = Family::<RequestLabels, Counter>::default();
        let prompt_tokens = Counter::default();
        let generated_tokens = Counter::default();
        let running = Gauge::default();
        let waiting = Gauge::default();
        let ttft = Histogram::new(TTFT_BUCKETS);
        let itl = Histogram::new(ITL_BUCKETS);
        let device_memory = Family::<KindLabels, Gauge>::default();
        for kind in MemoryKind::ALL {
            // Created up front so every kind is exported (at 0) before anything reports.
            drop(device_memory.get_or_create(&KindLabels {
                kind: kind.as_str().to_owned(),
            }));
        }
        let device_budget = Gauge::default();
        let offload_bytes = Counter::default();
        let offload_wait = Counter::<f64, AtomicU64>::default();
        let swaps = Counter::default();
        let resident = Family::<ModelLabels, Gauge>::default();

        let r = &mut registry;
        r.register(
            "requests",
            "Generation requests answered, by served model and HTTP status",
            requests.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens prefilled",
            prompt_tokens.clone(),
        );
        r.register(
            "generated_tokens",
            "Tokens generated (sampled), end-of-sequence tokens included",
            generated_tokens.clone(),
        );
        r.register(
            "requests_running",
            "Requests being generated",
            running.clone(),
        );
        r.register(
            "requests_waiting",
            "Requests accepted and waiting to start",
            waiting.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "Time from accepting a request to its first generated token",
            ttft.clone(),
        );
        r.register(
            "inter_token_latency_seconds",
            "Time between two generated tokens of one request",
            itl.clone(),
        );
        r.register(
            "device_memory_bytes",
            "Compute-device memory in use, by kind",
            device_memory.clone(),
        );
        r.register(
            "device_memory_budget_bytes",
            "Compute-device memory the offload plan may use",
            device_budget.clone(),
        );
        r.register(
            "offload_bytes_copied",
            "Weight bytes copied from host to device",
            offload_bytes.clone(),
        );
        r.register(
            "offload_wait_seconds",
            "Time compute waited for a weight copy",
            offload_wait.clone(),
        );
        r.register(
            "model_swaps",
            "Whole-model moves onto the compute device",
            swaps.clone(),
        );
        r.register(
            "model_resident",
            "1 while the model's weights are on the compute device",
            resident.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                requests,
                prompt_tokens,
                generated_tokens,
                running,
                waiting,
                ttft,
                itl,
                device_memory,
                device_budget,
                offload_bytes,
                offload_wait,
                swaps,
                resident,
            }),
        }
    }

    /// Everything in the Prometheus text format (see [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would leave a partial page.
        if let Err(e) = prometheus_text::encode(&mut out, &self.inner.registry) {
            tracing::error!("cannot encode metrics: {e}");
        }
        out
    }

    // ---- HTTP layer ----

    /// Counts one answered generation request for `model` with HTTP `status`.
    pub fn record_request(&self, model: &str, status: u16) {
        self.inner
            .requests
            .get_or_create(&RequestLabels {
                model: model.to_owned(),
                status: status.to_string(),
            })
            .inc();
    }

    /// `ferry_requests_total` for one label pair.
    pub fn requests(&self, model: &str, status: u16) -> u64 {
        self.inner
            .requests
            .get_or_create(&RequestLabels {
                model: model.to_owned(),
                status: status.to_string(),
            })
            .get()
    }

    // ---- engine ----

    /// A request was accepted into a queue.
    pub fn request_queued(&self) {
        self.inner.waiting.inc();
    }

    /// A queued request was dropped before it started (its client went away).
    pub fn request_dequeued(&self) {
        self.inner.waiting.dec();
    }

    /// A queued request started generating.
    pub fn request_started(&self) {
        self.inner.waiting.dec();
        self.inner.running.inc();
    }

    /// A running request ended (finished, failed or cancelled).
    pub fn request_ended(&self) {
        self.inner.running.dec();
    }

    /// Adds prefilled prompt tokens.
    pub fn add_prompt_tokens(&self, n: usize) {
        self.inner.prompt_tokens.inc_by(n as u64);
    }

    /// Adds generated tokens.
    pub fn add_generated_tokens(&self, n: usize) {
        self.inner.generated_tokens.inc_by(n as u64);
    }

    /// Records a time to first token.
    pub fn observe_time_to_first_token(&self, elapsed: Duration) {
        self.inner.ttft.observe(elapsed.as_secs_f64());
    }

    /// Records a time between two tokens.
    pub fn observe_inter_token_latency(&self, elapsed: Duration) {
        self.inner.itl.observe(elapsed.as_secs_f64());
    }

    /// `ferry_prompt_tokens_total`.
    pub fn prompt_tokens(&self) -> u64 {
        self.inner.prompt_tokens.get()
    }

    /// `ferry_generated_tokens_total`.
    pub fn generated_tokens(&self) -> u64 {
        self.inner.generated_tokens.get()
    }

    /// `ferry_requests_running`.
    pub fn running(&self) -> i64 {
        self.inner.running.get()
    }

    /// `ferry_requests_waiting`.
    pub fn waiting(&self) -> i64 {
        self.inner.waiting.get()
    }

    // ---- offload engine and residency (not called yet: these stay 0 until it is wired) ----

    /// Sets the device bytes used for `kind`.
    pub fn set_device_memory(&self, kind: MemoryKind, bytes: u64) {
        self.inner
            .device_memory
            .get_or_create(&KindLabels {
                kind: kind.as_str().to_owned(),
            })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets the device memory budget in bytes.
    pub fn set_device_memory_budget(&self, bytes: u64) {
        self.inner
            .device_budget
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Adds bytes copied host -> device.
    pub fn add_offload_bytes_copied(&self, bytes: u64) {
        self.inner.offload_bytes.inc_by(bytes);
    }

    /// Adds time the compute stream waited for a copy.
    pub fn add_offload_wait(&self, waited: Duration) {
        self.inner.offload_wait.inc_by(waited.as_secs_f64());
    }

    /// Counts one whole-model move onto the device.
    pub fn model_swapped(&self) {
        self.inner.swaps.inc();
    }

    /// Marks `model` as on (or off) the compute device.
    pub fn set_model_resident(&self, model: &str, resident: bool) {
        self.inner
            .resident
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .set(i64::from(resident));
    }
}

/// Per-request latency bookkeeping on the engine thread: feeds the token counters and the
/// two latency histograms. A detached tracker ([`RequestTracker::detached`]) records nothing.
#[derive(Debug)]
pub struct RequestTracker {
    metrics: Option<Metrics>,
    accepted: Instant,
    last_token: Option<Instant>,
}

impl RequestTracker {
    /// Tracks a request accepted at `accepted`.
    pub fn new(metrics: &Metrics, accepted: Instant) -> Self {
        Self {
            metrics: Some(metrics.clone()),
            accepted,
            last_token: None,
        }
    }

    /// A tracker that records nothing (unit tests, one-off generation).
    pub fn detached() -> Self {
        Self {
            metrics: None,
            accepted: Instant::now(),
            last_token: None,
        }
    }

    /// The prompt (`n` tokens) went through the model.
    pub fn prefilled(&mut self, n: usize) {
        if let Some(m) = &self.metrics {
            m.add_prompt_tokens(n);
        }
    }

    /// One token was sampled.
    pub fn token(&mut self) {
        let now = Instant::now();
        if let Some(m) = &self.metrics {
            m.add_generated_tokens(1);
            match self.last_token {
                None => m.observe_time_to_first_token(now - self.accepted),
                Some(last) => m.observe_inter_token_latency(now - last),
            }
        }
        self.last_token = Some(now);
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
