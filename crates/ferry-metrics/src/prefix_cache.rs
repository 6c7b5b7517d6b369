//! The prefix cache's metrics, per served model: prompt tokens looked up and found
//! (`ferry_prefix_cache_queries_total`, `ferry_prefix_cache_hits_total`, in tokens, as vLLM
//! counts its `prefix_cache_queries` / `prefix_cache_hits`, whose names they are also exported
//! under as process-wide totals) and tokens held (`ferry_prefix_cache_tokens`). The hit rate is
//! hits over queries; the prompt tokens the model computed are `ferry_prompt_tokens_total` less
//! the hits.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{Metrics, ModelLabels};

/// The prefix cache's series.
pub(super) struct PrefixCacheMetrics {
    queries: Family<ModelLabels, Counter>,
    hits: Family<ModelLabels, Counter>,
    held: Family<ModelLabels, Gauge>,
    all_queries: Counter,
    all_hits: Counter,
}

impl PrefixCacheMetrics {
    /// Registers the series in `registry` (prefixed `ferry_`) and the vLLM-named totals in
    /// `aliases`.
    pub(super) fn register(registry: &mut Registry, aliases: &mut Registry) -> Self {
        let this = Self {
            queries: Family::default(),
            hits: Family::default(),
            held: Family::default(),
            all_queries: Counter::default(),
            all_hits: Counter::default(),
        };
        registry.register(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache, by served model",
            this.queries.clone(),
        );
        registry.register(
            "prefix_cache_hits",
            "Prompt tokens whose KV state the prefix cache supplied (not computed), by served model",
            this.hits.clone(),
        );
        registry.register(
            "prefix_cache_tokens",
            "Prompt tokens the prefix cache holds, by served model",
            this.held.clone(),
        );
        aliases.register(
            "vllm:prefix_cache_queries",
            "Alias of the sum of ferry_prefix_cache_queries_total (vLLM's name)",
            this.all_queries.clone(),
        );
        aliases.register(
            "vllm:prefix_cache_hits",
            "Alias of the sum of ferry_prefix_cache_hits_total (vLLM's name)",
            this.all_hits.clone(),
        );
        this
    }

    /// Creates `model`'s series at zero.
    pub(super) fn register_model(&self, labels: &ModelLabels) {
        drop(self.queries.get_or_create(labels));
        drop(self.hits.get_or_create(labels));
        drop(self.held.get_or_create(labels));
    }
}

impl Metrics {
    fn prefix(&self) -> &PrefixCacheMetrics {
        &self.inner.prefix_cache
    }

    /// `model`'s prefix cache was asked for a prompt of `queried` tokens and supplied `hits`.
    pub fn prefix_cache_lookup(&self, model: &str, queried: usize, hits: usize) {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        let prefix = self.prefix();
        prefix.queries.get_or_create(&labels).inc_by(queried as u64);
        prefix.hits.get_or_create(&labels).inc_by(hits as u64);
        prefix.all_queries.inc_by(queried as u64);
        prefix.all_hits.inc_by(hits as u64);
    }

    /// Sets the tokens `model`'s prefix cache holds.
    pub fn set_prefix_cache_tokens(&self, model: &str, tokens: usize) {
        self.prefix()
            .held
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .set(i64::try_from(tokens).unwrap_or(i64::MAX));
    }

    /// `ferry_prefix_cache_tokens{model}`: prompt tokens `model`'s prefix cache holds.
    pub fn prefix_cache_tokens(&self, model: &str) -> u64 {
        let held = self
            .prefix()
            .held
            .get_or_create(&ModelLabels {
                model: model.to_owned(),
            })
            .get();
        u64::try_from(held).unwrap_or(0)
    }

    /// `ferry_prefix_cache_queries_total{model}` and `ferry_prefix_cache_hits_total{model}`.
    pub fn prefix_cache_counts(&self, model: &str) -> (u64, u64) {
        let labels = ModelLabels {
            model: model.to_owned(),
        };
        let prefix = self.prefix();
        (
            prefix.queries.get_or_create(&labels).get(),
            prefix.hits.get_or_create(&labels).get(),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::Metrics;

    #[test]
    fn lookups_count_per_model_and_under_vllm_names() {
        let metrics = Metrics::new();
        metrics.register_model("a");
        let page = metrics.render();
        assert!(
            page.contains("ferry_prefix_cache_hits_total{model=\"a\"} 0"),
            "{page}"
        );
        metrics.prefix_cache_lookup("a", 100, 64);
        metrics.prefix_cache_lookup("b", 10, 0);
        metrics.set_prefix_cache_tokens("a", 96);
        assert_eq!(metrics.prefix_cache_counts("a"), (100, 64));
        let page = metrics.render();
        for line in [
            "ferry_prefix_cache_queries_total{model=\"a\"} 100",
            "ferry_prefix_cache_hits_total{model=\"a\"} 64",
            "ferry_prefix_cache_queries_total{model=\"b\"} 10",
            "ferry_prefix_cache_tokens{model=\"a\"} 96",
            "vllm:prefix_cache_queries_total 110",
            "vllm:prefix_cache_hits_total 64",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
        }
    }
}
