//! Feeds the offload engine's accounting and the swap manager's residency into the Prometheus
//! metrics. Gauges are set to the current values; counters advance by what changed since the
//! previous publish, so `/metrics` counters stay monotonic and exact.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::metrics::{MemoryKind, Metrics};
use crate::offload::{Accounting, Location, SwapManager};

/// Totals already published, so the next publish adds only the difference.
#[derive(Debug, Default)]
struct Published {
    bytes_copied: u64,
    wait: Duration,
    swaps: u64,
}

#[derive(Default)]
struct Sources {
    models: Vec<(String, Arc<Accounting>)>,
    published: Published,
}

/// Publishes offload and residency numbers into `metrics`; share it with an `Arc`.
pub struct Telemetry {
    metrics: Metrics,
    swap: Option<Arc<SwapManager>>,
    /// Registered models and what was published: a plain mutex, touched a few times a second.
    sources: Mutex<Sources>,
}

impl Telemetry {
    /// Publishes into `metrics`; `swap` is the residency manager of mode `model`, if any.
    pub fn new(metrics: Metrics, swap: Option<Arc<SwapManager>>) -> Arc<Self> {
        Arc::new(Self {
            metrics,
            swap,
            sources: Mutex::new(Sources::default()),
        })
    }

    /// Adds a loaded model's accounting (called once per model when it is ready).
    pub fn add_model(&self, name: &str, accounting: Arc<Accounting>) {
        self.lock().models.push((name.to_string(), accounting));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the memory gauges and advances the offload counters to the current totals.
    pub fn publish(&self) {
        let mut sources = self.lock();
        let (mut weights, mut slots, mut kv, mut workspace, mut budget) = (0, 0, 0, 0, 0);
        let (mut copied, mut wait) = (0, Duration::ZERO);
        for (_, accounting) in &sources.models {
            let snapshot = accounting.snapshot();
            weights += snapshot.weights;
            slots += snapshot.slots;
            kv += snapshot.kv_peak;
            workspace += snapshot.workspace;
            budget += snapshot.planned.total;
            copied += snapshot.bytes_copied;
            wait += snapshot.wait_time;
        }
        self.metrics.set_device_memory(MemoryKind::Weights, weights);
        self.metrics.set_device_memory(MemoryKind::Slots, slots);
        self.metrics.set_device_memory(MemoryKind::Kv, kv);
        self.metrics
            .set_device_memory(MemoryKind::Workspace, workspace);

        let published = &mut sources.published;
        self.metrics
            .add_offload_bytes_copied(copied.saturating_sub(published.bytes_copied));
        self.metrics
            .add_offload_wait(wait.saturating_sub(published.wait));
        published.bytes_copied = published.bytes_copied.max(copied);
        published.wait = published.wait.max(wait);

        match &self.swap {
            Some(swap) => {
                let stats = swap.stats();
                self.metrics.set_device_memory_budget(stats.budget_bytes);
                for _ in published.swaps..stats.swaps_in {
                    self.metrics.model_swapped();
                }
                published.swaps = published.swaps.max(stats.swaps_in);
                for model in swap.models() {
                    self.metrics
                        .set_model_resident(&model.name, model.location == Location::Device);
                }
            }
            None => self.metrics.set_device_memory_budget(budget),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric_value(text: &str, name: &str) -> f64 {
        text.lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in:\n{text}"))
    }

    #[test]
    fn accounting_reaches_the_metrics_and_counters_advance_by_deltas() {
        use crate::config::OffloadMode;
        use crate::offload::{plan, PlanInput};
        let plan = plan(&PlanInput::new(
            OffloadMode::Sequential,
            vec![100; 4],
            50,
            10_000,
        ))
        .expect("plans");
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        let accounting = Arc::new(Accounting::new(&plan));
        accounting.add_weights(50);
        accounting.add_slots(300);
        accounting.record_copy(100, Duration::from_millis(1));
        accounting.record_wait(Duration::from_millis(2));
        telemetry.add_model("m", Arc::clone(&accounting));
        telemetry.publish();
        accounting.record_copy(50, Duration::from_millis(1));
        accounting.record_wait(Duration::from_millis(3));
        telemetry.publish();
        telemetry.publish();

        let text = metrics.render();
        let gauge = |kind: &str| {
            metric_value(
                &text,
                &format!("ferry_device_memory_bytes{{kind=\"{kind}\"}}"),
            )
        };
        assert_eq!(gauge("weights"), 50.0);
        assert_eq!(gauge("slots"), 300.0);
        assert_eq!(
            metric_value(&text, "ferry_device_memory_budget_bytes"),
            plan.device_bytes as f64
        );
        assert_eq!(
            metric_value(&text, "ferry_offload_bytes_copied_total"),
            150.0
        );
        let waited = metric_value(&text, "ferry_offload_wait_seconds_total");
        assert!((waited - 0.005).abs() < 1e-9, "{waited}");
    }
}
