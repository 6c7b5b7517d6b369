//! Device-memory accounting and streaming counters of the offload engine (DESIGN.md 4.1, issue
//! item 8): what ferry holds on the compute device, per kind, next to what the plan allows, and
//! how much the copy engine moved and the forward loop waited.
//!
//! On the CPU device, "device memory" is the RAM ferry uses for resident weights and the slot
//! ring; it is counted as the engine allocates it. KV is the largest single-sequence cache seen
//! (the engine owns the caches); workspace is the plan's estimate (activations are transient).
//! All counters are atomics behind an `Arc`, so the metrics work can read them from any thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::cost::TierCounts;
use super::expert_routes::RouteCounter;
use super::experts_steps::ExpertStepCounts;
use super::plan::Plan;
use super::units::format_bytes;

/// Device bytes the plan allows, per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedBytes {
    /// Fixed parts + resident layers.
    pub weights: u64,
    /// The whole slot ring.
    pub slots: u64,
    /// KV cache on the device (0 when it lives on the host).
    pub kv: u64,
    /// Activation workspace.
    pub workspace: u64,
    /// Device total (including the reserve).
    pub total: u64,
}

impl PlannedBytes {
    /// The per-kind limits of `plan`.
    pub fn of(plan: &Plan) -> Self {
        Self {
            weights: plan.fixed_bytes.saturating_add(plan.resident_layer_bytes),
            slots: plan.slot_ring_bytes(),
            kv: plan.device_kv_bytes(),
            workspace: plan.workspace_bytes,
            total: plan.device_bytes,
        }
    }
}

/// Live counters.
#[derive(Debug)]
pub struct Accounting {
    planned: PlannedBytes,
    weights: AtomicU64,
    slots: AtomicU64,
    kv_peak: AtomicU64,
    workspace: AtomicU64,
    bytes_copied: AtomicU64,
    copies: AtomicU64,
    copy_nanos: AtomicU64,
    wait_nanos: AtomicU64,
    max_slots_busy: AtomicU64,
    expert_hits: AtomicU64,
    expert_misses: AtomicU64,
    expert_host: AtomicU64,
    expert_bytes: AtomicU64,
    expert_prefetched: AtomicU64,
    expert_prefetch_hits: AtomicU64,
    tier_decisions: TierCounts,
    expert_steps: ExpertStepCounts,
    routes: RouteCounter,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountingSnapshot {
    /// What the plan allows.
    pub planned: PlannedBytes,
    /// Resident weight bytes (fixed parts + resident layers) held on the device.
    pub weights: u64,
    /// Slot ring bytes held on the device.
    pub slots: u64,
    /// Largest KV cache of one sequence seen so far.
    pub kv_peak: u64,
    /// Activation workspace (the plan's estimate).
    pub workspace: u64,
    /// Bytes the copy engine has moved host-to-device.
    pub bytes_copied: u64,
    /// Layer copies done.
    pub copies: u64,
    /// Time the copy engine spent copying (including the link throttle).
    pub copy_time: Duration,
    /// Time the forward loop waited for a copy to land.
    pub wait_time: Duration,
    /// Most slots holding or receiving a layer at the same time.
    pub max_slots_busy: u64,
    /// Routed experts of a step found on the device (resident or in the expert cache).
    pub expert_hits: u64,
    /// Routed experts copied into an expert slot.
    pub expert_misses: u64,
    /// Routed experts computed where they live, on the host.
    pub expert_host: u64,
    /// Bytes of the expert copies, routed and predicted (also counted in `bytes_copied`).
    pub expert_bytes: u64,
    /// Experts copied ahead of their layer's router, on a prediction (pre-gating).
    pub expert_prefetched: u64,
    /// Routed experts found on the device because a prediction copied them (also hits).
    pub expert_prefetch_hits: u64,
}

impl AccountingSnapshot {
    /// Device bytes held: weights + slots + KV + workspace.
    pub fn device_bytes(&self) -> u64 {
        self.weights + self.slots + self.kv_peak + self.workspace
    }

    /// `Err` naming the first kind that holds more than the plan allows.
    pub fn check_within_plan(&self) -> Result<(), String> {
        let p = &self.planned;
        let kinds = [
            ("weights", self.weights, p.weights),
            ("slots", self.slots, p.slots),
            ("kv", self.kv_peak, p.kv),
            ("workspace", self.workspace, p.workspace),
            ("device total", self.device_bytes(), p.total),
        ];
        for (kind, held, allowed) in kinds {
            if held > allowed {
                return Err(format!(
                    "{kind}: ferry holds {held} bytes on the device, the plan allows {allowed}"
                ));
            }
        }
        Ok(())
    }

    /// Achieved copy bandwidth in bytes/s (0 before the first copy).
    pub fn copy_bandwidth(&self) -> f64 {
        let secs = self.copy_time.as_secs_f64();
        if secs > 0.0 {
            self.bytes_copied as f64 / secs
        } else {
            0.0
        }
    }
}

impl Accounting {
    /// Counters for a run of `plan`, with the workspace estimate already counted.
    pub fn new(plan: &Plan) -> Self {
        Self {
            planned: PlannedBytes::of(plan),
            weights: AtomicU64::new(0),
            slots: AtomicU64::new(0),
            kv_peak: AtomicU64::new(0),
            workspace: AtomicU64::new(plan.workspace_bytes),
            bytes_copied: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            copy_nanos: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
            max_slots_busy: AtomicU64::new(0),
            expert_hits: AtomicU64::new(0),
            expert_misses: AtomicU64::new(0),
            expert_host: AtomicU64::new(0),
            expert_bytes: AtomicU64::new(0),
            expert_prefetched: AtomicU64::new(0),
            expert_prefetch_hits: AtomicU64::new(0),
            tier_decisions: TierCounts::default(),
            expert_steps: ExpertStepCounts::default(),
            routes: RouteCounter::default(),
        }
    }

    /// Rows routed to each expert of each layer (the expert store counts them; the server
    /// keeps them across runs, [`super::expert_routes`]).
    pub fn routes(&self) -> &RouteCounter {
        &self.routes
    }

    /// The tier cost model's decisions, one per offloaded unit and step (record them here).
    pub fn tier_decisions(&self) -> &TierCounts {
        &self.tier_decisions
    }

    /// What the expert store did per step kind (prefill, decode): routed experts by where they
    /// were served, expert bytes over the link, tokens.
    pub fn expert_steps(&self) -> &ExpertStepCounts {
        &self.expert_steps
    }

    /// Counts resident weight bytes placed on the device.
    pub fn add_weights(&self, bytes: u64) {
        self.weights.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Uncounts resident weight bytes freed on the device (mode `model` moving a model out).
    pub fn sub_weights(&self, bytes: u64) {
        let _ = self
            .weights
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w.saturating_sub(bytes))
            });
    }

    /// Counts slot bytes allocated on the device.
    pub fn add_slots(&self, bytes: u64) {
        self.slots.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records one sequence's KV-cache size.
    pub fn observe_kv(&self, bytes: u64) {
        self.kv_peak.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Records one layer copy.
    pub fn record_copy(&self, bytes: u64, took: Duration) {
        self.bytes_copied.fetch_add(bytes, Ordering::Relaxed);
        self.copies.fetch_add(1, Ordering::Relaxed);
        self.copy_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Records routed experts found on the device.
    pub fn record_expert_hits(&self, n: u64) {
        self.expert_hits.fetch_add(n, Ordering::Relaxed);
    }

    /// Records one expert copied into an expert slot (`bytes` in `took`, counted as a copy).
    pub fn record_expert_miss(&self, bytes: u64, took: Duration) {
        self.expert_misses.fetch_add(1, Ordering::Relaxed);
        self.expert_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.record_copy(bytes, took);
    }

    /// Records one expert copied on a prediction (`bytes` in `took`, counted as a copy).
    pub fn record_expert_prefetch(&self, bytes: u64, took: Duration) {
        self.expert_prefetched.fetch_add(1, Ordering::Relaxed);
        self.expert_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.record_copy(bytes, took);
    }

    /// Records routed experts found on the device thanks to a prediction.
    pub fn record_expert_prefetch_hits(&self, n: u64) {
        self.expert_prefetch_hits.fetch_add(n, Ordering::Relaxed);
    }

    /// Records routed experts computed on the host.
    pub fn record_expert_host(&self, n: u64) {
        self.expert_host.fetch_add(n, Ordering::Relaxed);
    }

    /// Records time the forward loop waited for a slot.
    pub fn record_wait(&self, took: Duration) {
        self.wait_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Records how many slots are busy right now.
    pub fn observe_slots_busy(&self, busy: usize) {
        self.max_slots_busy
            .fetch_max(busy as u64, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> AccountingSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AccountingSnapshot {
            planned: self.planned,
            weights: load(&self.weights),
            slots: load(&self.slots),
            kv_peak: load(&self.kv_peak),
            workspace: load(&self.workspace),
            bytes_copied: load(&self.bytes_copied),
            copies: load(&self.copies),
            copy_time: Duration::from_nanos(load(&self.copy_nanos)),
            wait_time: Duration::from_nanos(load(&self.wait_nanos)),
            max_slots_busy: load(&self.max_slots_busy),
            expert_hits: load(&self.expert_hits),
            expert_misses: load(&self.expert_misses),
            expert_host: load(&self.expert_host),
            expert_bytes: load(&self.expert_bytes),
            expert_prefetched: load(&self.expert_prefetched),
            expert_prefetch_hits: load(&self.expert_prefetch_hits),
        }
    }

    /// Logs the device bytes per kind against `plan` (the one this accounting was made for),
    /// saying what the total counts: most of it is usually the KV cache planned for `max_batch`
    /// full-context sequences, which is only filled as sequences grow.
    pub fn log(&self, model: &str, plan: &Plan) {
        let s = self.snapshot();
        tracing::info!(
            model,
            weights = %format_bytes(s.weights),
            slots = %format_bytes(s.slots),
            kv_planned = %format_bytes(s.planned.kv),
            workspace = %format_bytes(s.workspace),
            reserve = %format_bytes(plan.reserve_bytes),
            planned_total = %format_bytes(s.planned.total),
            "device memory (host RAM on the CPU device): the weights and slots are held now; \
             planned_total adds the KV cache for {} sequences of {} tokens ({}, filled as they \
             grow), the workspace and the reserve",
            plan.max_batch,
            plan.max_context,
            plan.kv_dtype.as_str()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, PlanInput};
    use ferry_config::OffloadMode;

    #[test]
    fn flags_the_kind_that_exceeds_the_plan() {
        let mut input = PlanInput::new(OffloadMode::Sequential, vec![100; 4], 50, 1_000);
        input.prefetch = 1;
        let p = plan(&input).expect("fits");
        let acc = Accounting::new(&p);
        acc.add_weights(50);
        acc.add_slots(200);
        assert_eq!(acc.snapshot().check_within_plan(), Ok(()));
        acc.add_slots(1);
        let err = acc
            .snapshot()
            .check_within_plan()
            .expect_err("one byte too many");
        assert!(err.starts_with("slots"), "{err}");
    }

    #[test]
    fn copy_bandwidth_is_bytes_over_copy_time() {
        let p = plan(&PlanInput::new(OffloadMode::None, vec![1], 0, 10)).expect("fits");
        let acc = Accounting::new(&p);
        assert_eq!(acc.snapshot().copy_bandwidth(), 0.0);
        acc.record_copy(1000, Duration::from_millis(500));
        assert!((acc.snapshot().copy_bandwidth() - 2000.0).abs() < 1e-6);
    }
}
