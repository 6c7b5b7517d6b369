//! The expert offload's metrics by step kind (issue 30): every routed MoE expert of a step,
//! counted by where it was served and whether the step was a prefill (a prompt chunk) or a
//! decode step (`ferry_offload_expert_decisions_total{tier, step}`), the expert bytes issued over
//! the link and the tokens of those steps, and two gauges derived from those counters (the
//! process's totals so far): the expert cache's hit rate and the link bytes per token, prefill
//! and decode apart.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

/// The `step` labels: a prompt chunk or a decode step (`offload::StepKind::name`).
pub const STEP_LABELS: [&str; 2] = ["prefill", "decode"];

/// The `tier` labels of `ferry_offload_expert_decisions_total` (`offload::Served::name`):
/// resident on the device, found in the device's expert cache, copied over the link, computed
/// on the host.
pub const EXPERT_SERVED_LABELS: [&str; 4] = ["resident", "cache_hit", "streamed", "host"];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServedLabels {
    tier: String,
    step: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StepLabels {
    step: String,
}

/// The series.
pub(super) struct ExpertStepMetrics {
    decisions: Family<ServedLabels, Counter>,
    link_bytes: Family<StepLabels, Counter>,
    tokens: Family<StepLabels, Counter>,
    hit_rate: Family<StepLabels, Gauge<f64, AtomicU64>>,
    bytes_per_token: Family<StepLabels, Gauge<f64, AtomicU64>>,
}

fn step(step: &str) -> StepLabels {
    StepLabels {
        step: step.to_owned(),
    }
}

fn served(tier: &str, step: &str) -> ServedLabels {
    ServedLabels {
        tier: tier.to_owned(),
        step: step.to_owned(),
    }
}

impl ExpertStepMetrics {
    /// Registers the series in `registry` (prefixed `ferry_`), every label pair at 0.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            decisions: Family::default(),
            link_bytes: Family::default(),
            tokens: Family::default(),
            hit_rate: Family::default(),
            bytes_per_token: Family::default(),
        };
        for s in STEP_LABELS {
            for tier in EXPERT_SERVED_LABELS {
                drop(this.decisions.get_or_create(&served(tier, s)));
            }
            drop(this.link_bytes.get_or_create(&step(s)));
            drop(this.tokens.get_or_create(&step(s)));
            drop(this.hit_rate.get_or_create(&step(s)));
            drop(this.bytes_per_token.get_or_create(&step(s)));
        }
        registry.register(
            "offload_expert_decisions",
            "Routed MoE experts (one per layer and step) by where they were served (tier: resident, cache_hit, streamed, host) and step kind (prefill: a prompt chunk, decode)",
            this.decisions.clone(),
        );
        registry.register(
            "offload_expert_link_bytes",
            "Bytes of MoE expert copies issued over the host-to-device link, by step kind",
            this.link_bytes.clone(),
        );
        registry.register(
            "offload_expert_step_tokens",
            "Tokens (rows) of the steps of a model with offloaded experts, by step kind",
            this.tokens.clone(),
        );
        registry.register(
            "offload_expert_cache_hit_rate",
            "Offloaded routed experts found in the device's expert cache so far, over all offloaded routed experts (cache_hit / (cache_hit + streamed + host)), by step kind",
            this.hit_rate.clone(),
        );
        registry.register(
            "offload_expert_link_bytes_per_token",
            "Expert bytes over the link per token so far (offload_expert_link_bytes / offload_expert_step_tokens), by step kind",
            this.bytes_per_token.clone(),
        );
        this
    }

    /// Sets the gauges of `s` from its counters.
    fn refresh(&self, s: &str) {
        let count = |tier| self.decisions.get_or_create(&served(tier, s)).get();
        let hits = count("cache_hit");
        let offloaded = hits + count("streamed") + count("host");
        if offloaded > 0 {
            self.hit_rate
                .get_or_create(&step(s))
                .set(hits as f64 / offloaded as f64);
        }
        let tokens = self.tokens.get_or_create(&step(s)).get();
        if tokens > 0 {
            let bytes = self.link_bytes.get_or_create(&step(s)).get();
            self.bytes_per_token
                .get_or_create(&step(s))
                .set(bytes as f64 / tokens as f64);
        }
    }
}

impl Metrics {
    fn expert_steps(&self) -> &ExpertStepMetrics {
        &self.inner.expert_steps
    }

    /// Adds, for steps of kind `step` (one of [`STEP_LABELS`]): `served[i]` routed experts
    /// served as [`EXPERT_SERVED_LABELS`]`[i]`, `link_bytes` of expert copies and `tokens`
    /// tokens; the gauges follow.
    pub fn add_expert_step_counts(
        &self,
        step: &str,
        served_counts: [u64; 4],
        link_bytes: u64,
        tokens: u64,
    ) {
        let m = self.expert_steps();
        for (tier, n) in EXPERT_SERVED_LABELS.into_iter().zip(served_counts) {
            m.decisions.get_or_create(&served(tier, step)).inc_by(n);
        }
        m.link_bytes
            .get_or_create(&self::step(step))
            .inc_by(link_bytes);
        m.tokens.get_or_create(&self::step(step)).inc_by(tokens);
        m.refresh(step);
    }

    /// `ferry_offload_expert_decisions_total{tier, step}`.
    pub fn expert_decisions(&self, tier: &str, step: &str) -> u64 {
        self.expert_steps()
            .decisions
            .get_or_create(&served(tier, step))
            .get()
    }

    /// `ferry_offload_expert_cache_hit_rate{step}` and
    /// `ferry_offload_expert_link_bytes_per_token{step}`.
    pub fn expert_step_rates(&self, step: &str) -> (f64, f64) {
        let m = self.expert_steps();
        (
            m.hit_rate.get_or_create(&self::step(step)).get(),
            m.bytes_per_token.get_or_create(&self::step(step)).get(),
        )
    }
}
