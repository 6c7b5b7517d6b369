//! Reading values back out of the registry, for callers that show them other than as
//! Prometheus text (`GET /v1/ferry/status`): the device memory, the offload engine's copies
//! and expert routing, and one model's tokens and KV use. Each read is one atomic load (or one
//! short lock for the per-model KV map); nothing here changes a value.

use std::sync::PoisonError;

use super::{KindLabels, MemoryKind, Metrics, ModelLabels};

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl Metrics {
    /// `ferry_device_memory_bytes{kind}`.
    pub fn device_memory(&self, kind: MemoryKind) -> u64 {
        unsigned(
            self.inner
                .device_memory
                .get_or_create(&KindLabels {
                    kind: kind.as_str().to_owned(),
                })
                .get(),
        )
    }

    /// `ferry_device_memory_budget_bytes`.
    pub fn device_memory_budget(&self) -> u64 {
        unsigned(self.inner.device_budget.get())
    }

    /// `ferry_offload_bytes_copied_total`.
    pub fn offload_bytes_copied(&self) -> u64 {
        self.inner.offload_bytes.get()
    }

    /// `ferry_offload_wait_seconds_total`: the time compute waited for a copy.
    pub fn offload_wait_seconds(&self) -> f64 {
        self.inner.offload_wait.get()
    }

    /// `ferry_offload_experts_total{kind}` for `kind` = `hit`, `miss`, `host`, `prefetched` or
    /// `prefetch_hit` (0 for any other).
    pub fn offload_experts(&self, kind: &str) -> u64 {
        self.inner
            .offload_experts
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .get()
    }

    /// `ferry_model_prompt_tokens_total{model}`.
    pub fn model_prompt_tokens(&self, model: &str) -> u64 {
        self.inner
            .model_prompt_tokens
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .get()
    }

    /// `model`'s KV entries held by running sequences and its capacity, in tokens, as last set
    /// by [`Metrics::set_kv_usage`]; `(0, 0)` before that.
    pub fn model_kv_usage(&self, model: &str) -> (u64, u64) {
        self.inner
            .kv_by_model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(model)
            .copied()
            .unwrap_or((0, 0))
    }
}
