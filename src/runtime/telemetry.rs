//! Feeds the offload engine's accounting and the swap manager's residency into the Prometheus
//! metrics. Gauges are set to the current values; counters advance by what changed since the
//! previous publish, so `/metrics` counters stay monotonic and exact. A model's numbers are
//! published the moment it is added, so a scrape right after it turns ready sees them.
//!
//! While the server is busy, every [`THROUGHPUT_EVERY`] one publish also writes a throughput
//! line (prompt and generation tokens per second over that window, requests running and
//! waiting, KV cache usage), like vLLM's periodic stats line:
//!
//! ```text
//! INFO ferry::runtime::telemetry: throughput prompt_tok_s=120.4 generation_tok_s=48.2 running=3 waiting=0 kv_cache_usage=0.012
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferry_metrics::{MemoryKind, Metrics};
use ferry_offload::{Accounting, Location, StepKind, StepKindSnapshot, SwapManager, Tier};

/// How often a busy server logs its throughput.
pub const THROUGHPUT_EVERY: Duration = Duration::from_secs(10);

/// Token totals at the start of the current throughput window.
#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    prompt_tokens: u64,
    generated_tokens: u64,
}

/// One throughput report: rates over a window and the queue at its end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Prompt tokens prefilled per second.
    pub prompt_tok_s: f64,
    /// Tokens generated per second.
    pub generation_tok_s: f64,
    /// Requests running.
    pub running: i64,
    /// Requests waiting.
    pub waiting: i64,
    /// `ferry_kv_cache_usage_ratio`.
    pub kv_cache_usage: f64,
}

/// Totals already published, so the next publish adds only the difference.
#[derive(Debug, Default)]
struct Published {
    bytes_copied: u64,
    wait: Duration,
    /// MoE experts: hits, misses, host-computed, bytes copied, prefetched, prefetch hits.
    experts: [u64; 6],
    swaps: u64,
    /// Tier decisions, in [`Tier::ALL`] order.
    tier_decisions: [u64; 2],
    /// Expert counters per step kind, in [`StepKind::ALL`] order.
    expert_steps: [StepKindSnapshot; 2],
}

struct Sources {
    models: Vec<(String, Arc<Accounting>)>,
    /// Each served model's draft model's live KV bytes (speculative method `draft`).
    drafts: Vec<(String, Arc<AtomicUsize>)>,
    published: Published,
    window: Window,
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
            swap,
            sources: Mutex::new(Sources {
                models: Vec::new(),
                drafts: Vec::new(),
                published: Published::default(),
                window: Window {
                    started: Instant::now(),
                    prompt_tokens: 0,
                    generated_tokens: 0,
                },
            }),
            metrics,
        })
    }

    /// Adds a loaded model's accounting (called once per model when it is ready) and
    /// publishes at once.
    pub fn add_model(&self, name: &str, accounting: Arc<Accounting>) {
        self.lock().models.push((name.to_string(), accounting));
        self.publish();
    }

    /// Adds `model`'s draft model: its accounting (weights on the device, as `<model>/draft`)
    /// and the live bytes of its KV caches (`ferry_spec_draft_kv_bytes{model}`).
    pub fn add_draft(&self, model: &str, accounting: Arc<Accounting>, live_kv: Arc<AtomicUsize>) {
        {
            let mut sources = self.lock();
            sources.models.push((format!("{model}/draft"), accounting));
            sources.drafts.push((model.to_string(), live_kv));
        }
        self.publish();
    }

    /// The throughput since the window started, if the window is [`THROUGHPUT_EVERY`] old
    /// (at `now`); starts a new window then. `None` while the window is younger, or when the
    /// window saw no tokens and nothing runs or waits (an idle server stays quiet).
    pub fn throughput(&self, now: Instant) -> Option<Throughput> {
        let mut sources = self.lock();
        let window = sources.window;
        let elapsed = now.saturating_duration_since(window.started);
        if elapsed < THROUGHPUT_EVERY {
            return None;
        }
        let (prompt, generated) = (
            self.metrics.prompt_tokens(),
            self.metrics.generated_tokens(),
        );
        sources.window = Window {
            started: now,
            prompt_tokens: prompt,
            generated_tokens: generated,
        };
        let report = Throughput {
            prompt_tok_s: rate(prompt.saturating_sub(window.prompt_tokens), elapsed),
            generation_tok_s: rate(generated.saturating_sub(window.generated_tokens), elapsed),
            running: self.metrics.running(),
            waiting: self.metrics.waiting(),
            kv_cache_usage: self.metrics.kv_usage(),
        };
        let busy = prompt > window.prompt_tokens
            || generated > window.generated_tokens
            || report.running > 0
            || report.waiting > 0;
        busy.then_some(report)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the memory gauges and advances the offload counters to the current totals; logs
    /// the throughput line when one is due.
    pub fn publish(&self) {
        self.publish_accounting();
        self.log_throughput(Instant::now());
    }

    /// Logs the throughput line if one is due at `now` (see [`Telemetry::throughput`]).
    pub fn log_throughput(&self, now: Instant) -> Option<Throughput> {
        let t = self.throughput(now)?;
        tracing::info!(
            prompt_tok_s = t.prompt_tok_s,
            generation_tok_s = t.generation_tok_s,
            running = t.running,
            waiting = t.waiting,
            kv_cache_usage = (t.kv_cache_usage * 1000.0).round() / 1000.0,
            "throughput"
        );
        Some(t)
    }

    fn publish_accounting(&self) {
        let mut sources = self.lock();
        for (model, live) in &sources.drafts {
            self.metrics
                .set_draft_kv_bytes(model, live.load(Ordering::Relaxed) as u64);
        }
        let (mut weights, mut slots, mut kv, mut workspace, mut budget) = (0, 0, 0, 0, 0);
        let (mut copied, mut wait) = (0, Duration::ZERO);
        let mut experts = [0u64; 6];
        let mut tiers = [0u64; 2];
        let mut steps = [StepKindSnapshot::default(); 2];
        for (_, accounting) in &sources.models {
            for (total, kind) in steps.iter_mut().zip(StepKind::ALL) {
                let s = accounting.expert_steps().snapshot(kind);
                total
                    .served
                    .iter_mut()
                    .zip(s.served)
                    .for_each(|(t, n)| *t += n);
                total.link_bytes += s.link_bytes;
                total.tokens += s.tokens;
                total.steps += s.steps;
            }
            for (i, tier) in Tier::ALL.into_iter().enumerate() {
                tiers[i] += accounting.tier_decisions().get(tier);
            }
            let snapshot = accounting.snapshot();
            weights += snapshot.weights;
            slots += snapshot.slots;
            kv += snapshot.kv_peak;
            workspace += snapshot.workspace;
            budget += snapshot.planned.total;
            copied += snapshot.bytes_copied;
            wait += snapshot.wait_time;
            let e = [
                snapshot.expert_hits,
                snapshot.expert_misses,
                snapshot.expert_host,
                snapshot.expert_bytes,
                snapshot.expert_prefetched,
                snapshot.expert_prefetch_hits,
            ];
            experts.iter_mut().zip(e).for_each(|(t, n)| *t += n);
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
        let new: Vec<u64> = experts
            .iter()
            .zip(&published.experts)
            .map(|(now, then)| now.saturating_sub(*then))
            .collect();
        self.metrics
            .add_offload_experts(new[0], new[1], new[2], new[3]);
        self.metrics.add_offload_expert_prefetch(new[4], new[5]);
        for (then, now) in published.experts.iter_mut().zip(experts) {
            *then = (*then).max(now);
        }
        for (i, tier) in Tier::ALL.into_iter().enumerate() {
            self.metrics.add_tier_decisions(
                tier.name(),
                tiers[i].saturating_sub(published.tier_decisions[i]),
            );
            published.tier_decisions[i] = published.tier_decisions[i].max(tiers[i]);
        }
        for ((now, then), kind) in steps
            .iter()
            .zip(published.expert_steps.iter_mut())
            .zip(StepKind::ALL)
        {
            let served = std::array::from_fn(|i| now.served[i].saturating_sub(then.served[i]));
            self.metrics.add_expert_step_counts(
                kind.name(),
                served,
                now.link_bytes.saturating_sub(then.link_bytes),
                now.tokens.saturating_sub(then.tokens),
            );
            then.served
                .iter_mut()
                .zip(now.served)
                .for_each(|(t, n)| *t = (*t).max(n));
            then.link_bytes = then.link_bytes.max(now.link_bytes);
            then.tokens = then.tokens.max(now.tokens);
        }

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

/// `tokens` per second over `elapsed`, to one decimal.
fn rate(tokens: u64, elapsed: Duration) -> f64 {
    let per_second = tokens as f64 / elapsed.as_secs_f64().max(f64::EPSILON);
    (per_second * 10.0).round() / 10.0
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
        use ferry_config::OffloadMode;
        use ferry_offload::{plan, PlanInput};
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

    #[test]
    fn expert_hits_misses_and_host_computes_reach_the_metrics() {
        let accounting = Arc::new(Accounting::new(&sequential_plan()));
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        telemetry.add_model("m", Arc::clone(&accounting));
        accounting.record_expert_hits(3);
        accounting.record_expert_miss(40, Duration::from_millis(1));
        telemetry.publish();
        accounting.record_expert_miss(40, Duration::from_millis(1));
        accounting.record_expert_host(5);
        accounting.record_expert_prefetch(40, Duration::from_millis(1));
        accounting.record_expert_prefetch_hits(1);
        telemetry.publish();
        telemetry.publish();
        let text = metrics.render();
        let experts = |kind: &str| {
            metric_value(
                &text,
                &format!("ferry_offload_experts_total{{kind=\"{kind}\"}}"),
            )
        };
        assert_eq!(
            (experts("hit"), experts("miss"), experts("host")),
            (3.0, 2.0, 5.0)
        );
        assert_eq!((experts("prefetched"), experts("prefetch_hit")), (1.0, 1.0));
        let bytes = metric_value(&text, "ferry_offload_expert_bytes_copied_total");
        assert_eq!(bytes, 120.0);
        assert_eq!(
            metric_value(&text, "ferry_offload_bytes_copied_total"),
            120.0
        );
    }

    #[test]
    fn tier_decisions_reach_the_metrics_by_tier_as_deltas() {
        let metrics = Metrics::new();
        let text = metrics.render();
        for tier in ["stream", "host"] {
            let name = format!("ferry_offload_tier_decisions_total{{tier=\"{tier}\"}}");
            assert_eq!(
                metric_value(&text, &name),
                0.0,
                "exported before any decision"
            );
        }
        let telemetry = Telemetry::new(metrics.clone(), None);
        let (a, b) = (
            Arc::new(Accounting::new(&sequential_plan())),
            Arc::new(Accounting::new(&sequential_plan())),
        );
        a.tier_decisions().record(Tier::Host, 3);
        b.tier_decisions().record(Tier::Stream, 2);
        telemetry.add_model("a", Arc::clone(&a));
        telemetry.add_model("b", Arc::clone(&b));
        a.tier_decisions().record(Tier::Stream, 1);
        b.tier_decisions().record(Tier::Host, 4);
        telemetry.publish();
        telemetry.publish();
        assert_eq!(metrics.tier_decisions("stream"), 3);
        assert_eq!(metrics.tier_decisions("host"), 7);
        let text = metrics.render();
        assert_eq!(
            metric_value(&text, "ferry_offload_tier_decisions_total{tier=\"host\"}"),
            7.0
        );
    }

    #[test]
    fn expert_counts_reach_the_metrics_by_step_kind_as_deltas() {
        use ferry_offload::Served;
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        let accounting = Arc::new(Accounting::new(&sequential_plan()));
        telemetry.add_model("m", Arc::clone(&accounting));
        let steps = accounting.expert_steps();
        steps.record_step(StepKind::Prefill, 512);
        for _ in 0..6 {
            steps.record_served(StepKind::Prefill, Served::Copied);
        }
        steps.record_served(StepKind::Prefill, Served::Hit);
        steps.record_link_bytes(StepKind::Prefill, 6 * 1024);
        telemetry.publish();
        steps.record_step(StepKind::Decode, 1);
        steps.record_step(StepKind::Decode, 1);
        steps.record_served(StepKind::Decode, Served::Host);
        steps.record_served(StepKind::Decode, Served::Hit);
        steps.record_served(StepKind::Decode, Served::Resident);
        telemetry.publish();
        telemetry.publish();
        assert_eq!(metrics.expert_decisions("streamed", "prefill"), 6);
        assert_eq!(metrics.expert_decisions("cache_hit", "prefill"), 1);
        assert_eq!(metrics.expert_decisions("host", "prefill"), 0);
        assert_eq!(metrics.expert_decisions("host", "decode"), 1);
        assert_eq!(metrics.expert_decisions("resident", "decode"), 1);
        assert_eq!(metrics.expert_step_rates("prefill"), (1.0 / 7.0, 12.0));
        assert_eq!(metrics.expert_step_rates("decode"), (0.5, 0.0));
        let text = metrics.render();
        assert_eq!(
            metric_value(
                &text,
                "ferry_offload_expert_step_tokens_total{step=\"decode\"}"
            ),
            2.0
        );
    }

    fn sequential_plan() -> ferry_offload::Plan {
        use ferry_config::OffloadMode;
        use ferry_offload::{plan, PlanInput};
        plan(&PlanInput::new(
            OffloadMode::Sequential,
            vec![100; 4],
            50,
            10_000,
        ))
        .expect("plans")
    }

    #[test]
    fn a_model_is_on_the_page_as_soon_as_it_is_added() {
        let plan = sequential_plan();
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        let accounting = Arc::new(Accounting::new(&plan));
        accounting.add_weights(50);
        accounting.add_slots(300);
        // No publish() call: adding the model publishes.
        telemetry.add_model("m", accounting);
        let text = metrics.render();
        assert_eq!(
            metric_value(&text, "ferry_device_memory_bytes{kind=\"slots\"}"),
            300.0
        );
        assert_eq!(
            metric_value(&text, "ferry_device_memory_budget_bytes"),
            plan.device_bytes as f64
        );
    }

    #[test]
    fn throughput_is_reported_per_window_and_only_while_busy() {
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        let start = Instant::now();
        assert_eq!(telemetry.throughput(start + THROUGHPUT_EVERY / 2), None);
        // A whole window with nothing to do: quiet, and the window restarts.
        assert_eq!(telemetry.throughput(start + THROUGHPUT_EVERY * 2), None);
        metrics.add_prompt_tokens(300);
        metrics.add_generated_tokens(50);
        metrics.request_queued();
        metrics.request_started();
        let report = telemetry
            .throughput(start + THROUGHPUT_EVERY * 3)
            .expect("a busy window is reported");
        let seconds = THROUGHPUT_EVERY.as_secs_f64();
        assert_eq!(
            report.prompt_tok_s,
            (300.0 / seconds * 10.0_f64).round() / 10.0
        );
        assert_eq!(
            report.generation_tok_s,
            (50.0 / seconds * 10.0_f64).round() / 10.0
        );
        assert_eq!((report.running, report.waiting), (1, 0));
        // Still running, no new tokens: reported (busy), at zero rates.
        let idle_rates = telemetry
            .throughput(start + THROUGHPUT_EVERY * 4)
            .expect("a running request keeps the line");
        assert_eq!(
            (idle_rates.prompt_tok_s, idle_rates.generation_tok_s),
            (0.0, 0.0)
        );
        metrics.request_ended();
        assert_eq!(telemetry.throughput(start + THROUGHPUT_EVERY * 5), None);
    }

    #[test]
    fn the_throughput_line_is_logged() {
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        metrics.add_generated_tokens(25);
        let start = Instant::now();
        let ((), text) = ferry_testkit::capture_logs(|| {
            assert!(telemetry.log_throughput(start).is_none(), "not due yet");
            telemetry
                .log_throughput(start + THROUGHPUT_EVERY)
                .expect("due and busy");
        });
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("throughput")).collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line = lines[0];
        assert!(line.contains(" INFO "), "{line}");
        let rate = (25.0 / THROUGHPUT_EVERY.as_secs_f64() * 10.0_f64).round() / 10.0;
        for field in [
            format!("generation_tok_s={rate}"),
            "prompt_tok_s=0".to_owned(),
            "running=0".to_owned(),
            "waiting=0".to_owned(),
            "kv_cache_usage=0".to_owned(),
        ] {
            assert!(line.contains(&field), "{field} not in {line}");
        }
    }
}
