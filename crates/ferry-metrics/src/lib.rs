//! # ferry-metrics
//!
//! The bottom layer of ferry's observability (docs/ARCHITECTURE.md, "Crates"): the Prometheus
//! registry every layer above feeds, one request's tracking and log line ([`tracker`]), and a log
//! writer that never panics ([`log_sink`]). It depends on no other ferry crate and may know
//! nothing of models, the engine or HTTP: callers hand it numbers and names. A reuser creates one
//! [`Metrics`], clones it into whatever counts, and renders it with [`Metrics::render`].
//!
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
//! | `ferry_model_prompt_tokens_total{model}` | counter | engine: the same, per served model |
//! | `ferry_model_generated_tokens_total{model}` | counter | engine: the same, per served model |
//! | `ferry_time_to_first_token_seconds` | histogram | engine: from acceptance to the first sampled token |
//! | `ferry_inter_token_latency_seconds` | histogram | engine: between two sampled tokens of a sequence |
//! | `ferry_request_queue_seconds` | histogram | engine: from acceptance to joining the running batch |
//! | `ferry_request_duration_seconds{model}` | histogram | engine: end to end, acceptance to the last token, finished requests |
//! | `ferry_kv_cache_usage_ratio` | gauge | engine: KV entries of running sequences / (max_batch x max_context), all models |
//! | `ferry_device_memory_bytes{kind}` | gauge | offload engine (`kind` = weights, slots, kv, workspace) |
//! | `ferry_device_memory_budget_bytes` | gauge | offload engine |
//! | `ferry_offload_bytes_copied_total` | counter | offload engine: bytes copied host -> device |
//! | `ferry_offload_wait_seconds_total` | counter | offload engine: time compute waited for a copy |
//! | `ferry_offload_experts_total{kind}` | counter | offload engine: routed MoE experts by where they came from (`kind` = hit: on the device, miss: copied into the expert pool, host: computed on the host; and prefetched: copied ahead on a prediction, prefetch_hit: a hit a prediction supplied) |
//! | `ferry_offload_expert_bytes_copied_total` | counter | offload engine: bytes of expert copies (part of `ferry_offload_bytes_copied_total`) |
//! | `ferry_offload_tier_decisions_total{tier}` | counter | offload engine: one per offloaded unit and step, by the tier the cost model chose (`stream`, `host`) |
//! | `ferry_offload_expert_decisions_total{tier,step}` | counter | offload engine: routed MoE experts (one per layer and step) by where they were served (`tier` = resident, cache_hit, streamed, host) and step kind (`step` = prefill, decode; [`expert_steps`]) |
//! | `ferry_offload_expert_link_bytes_total{step}` | counter | offload engine: bytes of expert copies issued over the link, by step kind |
//! | `ferry_offload_expert_step_tokens_total{step}` | counter | offload engine: tokens of the steps of a model with offloaded experts, by step kind |
//! | `ferry_offload_expert_cache_hit_rate{step}` | gauge | offload engine: cache_hit / (cache_hit + streamed + host) so far, by step kind |
//! | `ferry_offload_expert_link_bytes_per_token{step}` | gauge | offload engine: expert link bytes / tokens so far, by step kind |
//! | `ferry_model_swaps_total` | counter | residency manager (mode `model`) |
//! | `ferry_model_resident{model}` | gauge | engine (1 once loaded); in mode `model` the swap manager's location |
//! | `ferry_prefix_cache_queries_total{model}` | counter | engine: prompt tokens looked up in the prefix cache ([`prefix_cache`]) |
//! | `ferry_prefix_cache_hits_total{model}` | counter | engine: prompt tokens the prefix cache supplied |
//! | `ferry_prefix_cache_tokens{model}` | gauge | engine: prompt tokens the prefix cache holds |
//! | `ferry_spec_draft_tokens_total{model}` | counter | engine: tokens speculative decoding proposed for verification ([`speculative`]) |
//! | `ferry_spec_accepted_tokens_total{model}` | counter | engine: proposed tokens the model accepted |
//! | `ferry_spec_draft_kv_bytes{model}` | gauge | runtime telemetry: bytes the draft model's KV caches hold now (method `draft`; [`speculative`]) |
//!
//! Every series exists from the start: the per-model ones from [`Metrics::register_model`]
//! (the engine calls it for each configured model before any is loaded), the device-memory
//! kinds at 0 until the offload engine publishes them (`runtime::telemetry`).
//!
//! The Gateway API Inference Extension's Endpoint Picker (and KEDA or HPA rules written for
//! vLLM) read vLLM's names, so three gauges are also exported under them, without the prefix
//! and with the same values (the picker's Model Server Protocol; `:` is legal in Prometheus
//! names and prometheus-client writes names as given):
//!
//! | alias | same value as | meaning the picker expects |
//! |---|---|---|
//! | `vllm:num_requests_waiting` | `ferry_requests_waiting` | requests queued, not yet running |
//! | `vllm:num_requests_running` | `ferry_requests_running` | requests in the running batch |
//! | `vllm:kv_cache_usage_perc` | `ferry_kv_cache_usage_ratio` | a fraction in [0, 1] despite the name (1 = full) |
//!
//! They are process-wide totals with no labels: the picker takes the first series of a family,
//! so one series per pod is what it can use.
//!
//! Per-request bookkeeping and the request log line live in [`tracker`].

mod expert_steps;
pub mod log_sink;
mod prefix_cache;
mod readings;
mod speculative;
mod tracker;

pub use expert_steps::{EXPERT_SERVED_LABELS, STEP_LABELS};
pub use tracker::{RequestContext, RequestEnd, RequestTracker, TrackedRequest};

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// Upper bounds (seconds) of the end-to-end request latency buckets.
const E2E_BUCKETS: [f64; 15] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Upper bounds (seconds) of the queue-time buckets.
const QUEUE_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

fn e2e_histogram() -> Histogram {
    Histogram::new(E2E_BUCKETS)
}

/// Where device memory goes (the `kind` label of `ferry_device_memory_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Resident layer weights and the fixed parts (embeddings, norm, head).
    Weights,
    /// The slot ring streamed layers are copied into.
    Slots,
    /// Key/value caches: the largest one sequence has reached (a peak, not the sum in use).
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
struct TierLabels {
    tier: String,
}

/// The `tier` labels of `ferry_offload_tier_decisions_total` (`offload::cost::Tier::name`).
pub const TIER_LABELS: [&str; 2] = ["stream", "host"];

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
    model_prompt_tokens: Family<ModelLabels, Counter>,
    model_generated_tokens: Family<ModelLabels, Counter>,
    ttft: Histogram,
    itl: Histogram,
    queue_time: Histogram,
    request_duration: Family<ModelLabels, Histogram, fn() -> Histogram>,
    kv_usage: Gauge<f64, AtomicU64>,
    /// KV entries held and KV capacity per model (tokens); a plain mutex, set once per step.
    kv_by_model: Mutex<BTreeMap<String, (u64, u64)>>,
    /// vLLM-named aliases of three gauges, outside the `ferry_` prefix.
    aliases: Registry,
    device_memory: Family<KindLabels, Gauge>,
    device_budget: Gauge,
    offload_bytes: Counter,
    offload_wait: Counter<f64, AtomicU64>,
    offload_experts: Family<KindLabels, Counter>,
    offload_expert_bytes: Counter,
    tier_decisions: Family<TierLabels, Counter>,
    swaps: Counter,
    resident: Family<ModelLabels, Gauge>,
    prefix_cache: prefix_cache::PrefixCacheMetrics,
    expert_steps: expert_steps::ExpertStepMetrics,
    speculative: speculative::SpeculativeMetrics,
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
        let model_prompt_tokens = Family::<ModelLabels, Counter>::default();
        let model_generated_tokens = Family::<ModelLabels, Counter>::default();
        let ttft = Histogram::new(TTFT_BUCKETS);
        let itl = Histogram::new(ITL_BUCKETS);
        let queue_time = Histogram::new(QUEUE_BUCKETS);
        let request_duration =
            Family::<ModelLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                e2e_histogram,
            );
        let kv_usage = Gauge::<f64, AtomicU64>::default();
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
        let offload_experts = Family::<KindLabels, Counter>::default();
        for kind in ["hit", "miss", "host", "prefetched", "prefetch_hit"] {
            drop(offload_experts.get_or_create(&KindLabels {
                kind: kind.to_owned(),
            }));
        }
        let offload_expert_bytes = Counter::default();
        let tier_decisions = Family::<TierLabels, Counter>::default();
        for tier in TIER_LABELS {
            // Both tiers are exported (at 0) before the first decision.
            drop(tier_decisions.get_or_create(&TierLabels {
                tier: tier.to_owned(),
            }));
        }
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
            "model_prompt_tokens",
            "Prompt tokens prefilled, by served model",
            model_prompt_tokens.clone(),
        );
        r.register(
            "model_generated_tokens",
            "Tokens generated (sampled), by served model",
            model_generated_tokens.clone(),
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
            "request_queue_seconds",
            "Time from accepting a request to its joining the running batch",
            queue_time.clone(),
        );
        r.register(
            "request_duration_seconds",
            "End-to-end time of finished requests, from acceptance to the last token, by served model",
            request_duration.clone(),
        );
        r.register(
            "kv_cache_usage_ratio",
            "KV cache entries held by running requests over the capacity max_batch x max_context (0 to 1)",
            kv_usage.clone(),
        );
        r.register(
            "device_memory_bytes",
            "Compute-device memory by kind: weights, slots and workspace as allocated; kv the largest KV cache one sequence has reached",
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
            "offload_experts",
            "Routed MoE experts by where they came from: hit (on the device), miss (copied into the expert pool), host (computed on the host)",
            offload_experts.clone(),
        );
        r.register(
            "offload_expert_bytes_copied",
            "Bytes of MoE expert copies from host to device",
            offload_expert_bytes.clone(),
        );
        r.register(
            "offload_tier_decisions",
            "Offloaded unit-steps by the tier the cost model chose: stream (weights copied to the device) or host (computed where the weights live)",
            tier_decisions.clone(),
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
        let mut aliases = Registry::default();
        aliases.register(
            "vllm:num_requests_waiting",
            "Alias of ferry_requests_waiting (vLLM's name, read by the Gateway API Inference Extension)",
            waiting.clone(),
        );
        aliases.register(
            "vllm:num_requests_running",
            "Alias of ferry_requests_running (vLLM's name)",
            running.clone(),
        );
        aliases.register(
            "vllm:kv_cache_usage_perc",
            "Alias of ferry_kv_cache_usage_ratio (vLLM's name; a fraction, 1 means full)",
            kv_usage.clone(),
        );
        let prefix_cache = prefix_cache::PrefixCacheMetrics::register(r, &mut aliases);
        let expert_steps = expert_steps::ExpertStepMetrics::register(r);
        let speculative = speculative::SpeculativeMetrics::register(r, &mut aliases);
        Self {
            inner: Arc::new(Inner {
                registry,
                requests,
                prompt_tokens,
                generated_tokens,
                running,
                waiting,
                model_prompt_tokens,
                model_generated_tokens,
                ttft,
                itl,
                queue_time,
                request_duration,
                kv_usage,
                kv_by_model: Mutex::new(BTreeMap::new()),
                aliases,
                device_memory,
                device_budget,
                offload_bytes,
                offload_wait,
                offload_experts,
                offload_expert_bytes,
                tier_decisions,
                swaps,
                resident,
                prefix_cache,
                expert_steps,
                speculative,
            }),
        }
    }

    /// Everything in the Prometheus text format (see [`CONTENT_TYPE`]): the `ferry_` metrics,
    /// then the vLLM-named aliases (the 0.0.4 text format has no end marker, so the two pages
    /// concatenate into one).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for registry in [&self.inner.registry, &self.inner.aliases] {
            // Writing into a String cannot fail; an encoder error would leave a partial page.
            if let Err(e) = prometheus_text::encode(&mut out, registry) {
                tracing::error!("cannot encode metrics: {e}");
            }
        }
        out
    }

    /// Creates `model`'s series at zero, so they are on the page before its first request.
    pub fn register_model(&self, model: &str) {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        let inner = &self.inner;
        drop(inner.model_prompt_tokens.get_or_create(&labels));
        drop(inner.model_generated_tokens.get_or_create(&labels));
        drop(inner.request_duration.get_or_create(&labels));
        inner.prefix_cache.register_model(&labels);
        inner.speculative.register_model(&labels);
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

    /// Adds prefilled prompt tokens of `model` (to its series and to the total).
    pub fn add_model_prompt_tokens(&self, model: &str, n: usize) {
        self.add_prompt_tokens(n);
        self.inner
            .model_prompt_tokens
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .inc_by(n as u64);
    }

    /// Adds generated tokens of `model` (to its series and to the total).
    pub fn add_model_generated_tokens(&self, model: &str, n: usize) {
        self.add_generated_tokens(n);
        self.inner
            .model_generated_tokens
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .inc_by(n as u64);
    }

    /// `ferry_model_generated_tokens_total{model}`.
    pub fn model_generated_tokens(&self, model: &str) -> u64 {
        self.inner
            .model_generated_tokens
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .get()
    }

    /// Records the time a request waited before joining the running batch.
    pub fn observe_queue_time(&self, waited: Duration) {
        self.inner.queue_time.observe(waited.as_secs_f64());
    }

    /// Records the end-to-end time of a finished request for `model`.
    pub fn observe_request_duration(&self, model: &str, elapsed: Duration) {
        self.inner
            .request_duration
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets `model`'s KV entries held by running sequences and its capacity (both in tokens);
    /// `ferry_kv_cache_usage_ratio` becomes the sum of entries over the sum of capacities.
    pub fn set_kv_usage(&self, model: &str, used_tokens: usize, capacity_tokens: usize) {
        let mut by_model = self
            .inner
            .kv_by_model
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        by_model.insert(
            model.to_owned(),
            (used_tokens as u64, capacity_tokens as u64),
        );
        let (used, capacity) = by_model
            .values()
            .fold((0u64, 0u64), |(u, c), &(mu, mc)| (u + mu, c + mc));
        let ratio = if capacity == 0 {
            0.0
        } else {
            (used as f64 / capacity as f64).min(1.0)
        };
        self.inner.kv_usage.set(ratio);
    }

    /// `ferry_kv_cache_usage_ratio`.
    pub fn kv_usage(&self) -> f64 {
        self.inner.kv_usage.get()
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

    // ---- offload engine and residency (published by runtime::telemetry) ----

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

    /// Adds routed MoE experts found on the device (`hits`), copied into the expert pool
    /// (`misses`, `bytes` of copies) and computed on the host (`host`).
    pub fn add_offload_experts(&self, hits: u64, misses: u64, host: u64, bytes: u64) {
        for (kind, n) in [("hit", hits), ("miss", misses), ("host", host)] {
            self.inner
                .offload_experts
                .get_or_create(&KindLabels {
                    kind: kind.to_owned(),
                })
                .inc_by(n);
        }
        self.inner.offload_expert_bytes.inc_by(bytes);
    }

    /// Adds experts copied on a prediction and routed experts such copies supplied.
    pub fn add_offload_expert_prefetch(&self, prefetched: u64, hits: u64) {
        for (kind, n) in [("prefetched", prefetched), ("prefetch_hit", hits)] {
            self.inner
                .offload_experts
                .get_or_create(&KindLabels {
                    kind: kind.to_owned(),
                })
                .inc_by(n);
        }
    }

    /// Adds `n` tier decisions for `tier` (one of [`TIER_LABELS`]).
    pub fn add_tier_decisions(&self, tier: &str, n: u64) {
        self.inner
            .tier_decisions
            .get_or_create(&TierLabels {
                tier: tier.to_owned(),
            })
            .inc_by(n);
    }

    /// Tier decisions for `tier` so far.
    pub fn tier_decisions(&self, tier: &str) -> u64 {
        self.inner
            .tier_decisions
            .get_or_create(&TierLabels {
                tier: tier.to_owned(),
            })
            .get()
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

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
