//! Speculative decoding's metrics, per served model: tokens proposed for the model to verify
//! (`ferry_spec_draft_tokens_total`) and tokens of them it accepted
//! (`ferry_spec_accepted_tokens_total`); the acceptance rate is the second over the first. They
//! are also exported as process-wide totals under vLLM's names,
//! `vllm:spec_decode_num_draft_tokens_total` and `vllm:spec_decode_num_accepted_tokens_total`.
//! With a draft model, `ferry_spec_draft_kv_bytes` is what its KV caches hold right now (0 once
//! every sequence is done or cancelled).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{Metrics, ModelLabels};

/// Speculation's series.
pub(super) struct SpeculativeMetrics {
    drafted: Family<ModelLabels, Counter>,
    accepted: Family<ModelLabels, Counter>,
    all_drafted: Counter,
    all_accepted: Counter,
    draft_kv: Family<ModelLabels, Gauge>,
}

impl SpeculativeMetrics {
    /// Registers the series in `registry` (prefixed `ferry_`) and the vLLM-named totals in
    /// `aliases`.
    pub(super) fn register(registry: &mut Registry, aliases: &mut Registry) -> Self {
        let this = Self {
            drafted: Family::default(),
            accepted: Family::default(),
            all_drafted: Counter::default(),
            all_accepted: Counter::default(),
            draft_kv: Family::default(),
        };
        registry.register(
            "spec_draft_kv_bytes",
            "Bytes the draft model's KV caches hold now, all sequences together, by served model (speculative method draft)",
            this.draft_kv.clone(),
        );
        registry.register(
            "spec_draft_tokens",
            "Tokens proposed by speculative decoding for the model to verify, by served model",
            this.drafted.clone(),
        );
        registry.register(
            "spec_accepted_tokens",
            "Proposed tokens the model accepted (sampled itself), by served model",
            this.accepted.clone(),
        );
        aliases.register(
            "vllm:spec_decode_num_draft_tokens",
            "Alias of the sum of ferry_spec_draft_tokens_total (vLLM's name)",
            this.all_drafted.clone(),
        );
        aliases.register(
            "vllm:spec_decode_num_accepted_tokens",
            "Alias of the sum of ferry_spec_accepted_tokens_total (vLLM's name)",
            this.all_accepted.clone(),
        );
        this
    }

    /// Creates `model`'s series at zero.
    pub(super) fn register_model(&self, labels: &ModelLabels) {
        drop(self.drafted.get_or_create(labels));
        drop(self.accepted.get_or_create(labels));
    }
}

impl Metrics {
    /// `model` verified `drafted` proposed tokens and accepted `accepted` of them.
    pub fn speculated(&self, model: &str, drafted: usize, accepted: usize) {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        let spec = &self.inner.speculative;
        spec.drafted.get_or_create(&labels).inc_by(drafted as u64);
        spec.accepted.get_or_create(&labels).inc_by(accepted as u64);
        spec.all_drafted.inc_by(drafted as u64);
        spec.all_accepted.inc_by(accepted as u64);
    }

    /// Sets `ferry_spec_draft_kv_bytes{model}`: what `model`'s draft model's KV caches hold now.
    pub fn set_draft_kv_bytes(&self, model: &str, bytes: u64) {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        self.inner
            .speculative
            .draft_kv
            .get_or_create(&labels)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// `ferry_spec_draft_kv_bytes{model}`.
    pub fn draft_kv_bytes(&self, model: &str) -> i64 {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        self.inner.speculative.draft_kv.get_or_create(&labels).get()
    }

    /// `ferry_spec_draft_tokens_total{model}` and `ferry_spec_accepted_tokens_total{model}`.
    pub fn speculation_counts(&self, model: &str) -> (u64, u64) {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        let spec = &self.inner.speculative;
        (
            spec.drafted.get_or_create(&labels).get(),
            spec.accepted.get_or_create(&labels).get(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::Metrics;

    #[test]
    fn proposals_count_per_model_and_under_vllm_names() {
        let metrics = Metrics::new();
        metrics.register_model("a");
        let page = metrics.render();
        assert!(
            page.contains("ferry_spec_draft_tokens_total{model=\"a\"} 0"),
            "{page}"
        );
        metrics.speculated("a", 8, 5);
        metrics.speculated("b", 4, 1);
        assert_eq!(metrics.speculation_counts("a"), (8, 5));
        let page = metrics.render();
        for line in [
            "ferry_spec_draft_tokens_total{model=\"a\"} 8",
            "ferry_spec_accepted_tokens_total{model=\"a\"} 5",
            "ferry_spec_draft_tokens_total{model=\"b\"} 4",
            "vllm:spec_decode_num_draft_tokens_total 12",
            "vllm:spec_decode_num_accepted_tokens_total 6",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
        }
        metrics.set_draft_kv_bytes("a", 4096);
        assert_eq!(metrics.draft_kv_bytes("a"), 4096);
        metrics.set_draft_kv_bytes("a", 0);
        let page = metrics.render();
        let line = "ferry_spec_draft_kv_bytes{model=\"a\"} 0";
        assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
    }
}
