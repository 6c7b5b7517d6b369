//! Steps of a MoE model by kind, and what the expert store did in each kind (issue 30, item 2).
//!
//! A *prefill* step feeds some sequence more than [`DECODE_MAX_ROWS`] rows (a prompt chunk);
//! every other step is a *decode* step (one row per sequence, or a speculative step's few).
//! The kinds behave differently in [`super::ExpertStore`]: a prefill's streamed experts pass
//! through the pool's scratch slots and never enter its cache of hot experts, so a prompt does
//! not evict what decoding keeps using.
//!
//! [`ExpertStepCounts`] counts, per kind, every routed expert by where it was served
//! (resident, a cache hit, streamed over the link, computed on the host), the expert bytes that
//! crossed the link, and the rows (tokens) of the steps; the metrics publish them
//! (`ferry_offload_expert_decisions_total{tier, step}` and the rates derived from them).

use std::sync::atomic::{AtomicU64, Ordering};

use ferry_model::decoder::{flash_cpu, StepRows};

use super::experts::Served;

/// Most rows one sequence feeds in a step still counted as decoding (a speculative step
/// verifies a few proposals per sequence): the bound under which the CPU's attention runs a
/// chunk row by row as decode steps would ([`flash_cpu::ROW_BY_ROW`]).
pub const DECODE_MAX_ROWS: usize = flash_cpu::ROW_BY_ROW;

/// The kind of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StepKind {
    /// A prompt chunk: some sequence feeds more than [`DECODE_MAX_ROWS`] rows.
    Prefill,
    /// One row per sequence (or a speculative step's few).
    #[default]
    Decode,
}

impl StepKind {
    /// Both kinds, in the order metrics list them.
    pub const ALL: [StepKind; 2] = [StepKind::Prefill, StepKind::Decode];

    /// The kind of a pass of this shape.
    pub fn of(step: StepRows) -> Self {
        if step.longest > DECODE_MAX_ROWS {
            StepKind::Prefill
        } else {
            StepKind::Decode
        }
    }

    /// The kind's name in metrics labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Prefill => "prefill",
            StepKind::Decode => "decode",
        }
    }

    fn index(self) -> usize {
        match self {
            StepKind::Prefill => 0,
            StepKind::Decode => 1,
        }
    }
}

impl Served {
    /// Every way a routed expert is served, in the order metrics list them.
    pub const ALL: [Served; 4] = [Served::Resident, Served::Hit, Served::Copied, Served::Host];

    /// Its name in the metrics' `tier` label: `resident`, `cache_hit`, `streamed`, `host`.
    pub fn name(self) -> &'static str {
        match self {
            Served::Resident => "resident",
            Served::Hit => "cache_hit",
            Served::Copied => "streamed",
            Served::Host => "host",
        }
    }

    fn index(self) -> usize {
        match self {
            Served::Resident => 0,
            Served::Hit => 1,
            Served::Copied => 2,
            Served::Host => 3,
        }
    }
}

/// One kind's counters.
#[derive(Debug, Default)]
struct KindCounts {
    served: [AtomicU64; 4],
    link_bytes: AtomicU64,
    tokens: AtomicU64,
    steps: AtomicU64,
}

/// What the expert store did, per step kind.
#[derive(Debug, Default)]
pub struct ExpertStepCounts {
    kinds: [KindCounts; 2],
}

/// One kind's counters at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepKindSnapshot {
    /// Routed experts (one per layer and step) by where they were served, in [`Served::ALL`]
    /// order.
    pub served: [u64; 4],
    /// Expert bytes issued over the link (routed copies and predictions).
    pub link_bytes: u64,
    /// Rows (tokens) of the steps of this kind.
    pub tokens: u64,
    /// Steps of this kind.
    pub steps: u64,
}

impl StepKindSnapshot {
    /// Routed experts served as `served`.
    pub fn get(&self, served: Served) -> u64 {
        self.served[served.index()]
    }

    /// The share of the routed experts that were offloaded and found in the device cache:
    /// hits over hits, streamed and host-computed (resident experts excluded); `None` before
    /// any offloaded expert was routed.
    pub fn cache_hit_rate(&self) -> Option<f64> {
        let hits = self.get(Served::Hit);
        let offloaded = hits + self.get(Served::Copied) + self.get(Served::Host);
        (offloaded > 0).then(|| hits as f64 / offloaded as f64)
    }

    /// Expert bytes over the link per token; `None` before the first token.
    pub fn link_bytes_per_token(&self) -> Option<f64> {
        (self.tokens > 0).then(|| self.link_bytes as f64 / self.tokens as f64)
    }
}

impl ExpertStepCounts {
    /// Counts one step of `kind` with `rows` rows.
    pub fn record_step(&self, kind: StepKind, rows: usize) {
        let k = &self.kinds[kind.index()];
        k.tokens.fetch_add(rows as u64, Ordering::Relaxed);
        k.steps.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one routed expert of a step of `kind`, served as `served`.
    pub fn record_served(&self, kind: StepKind, served: Served) {
        self.kinds[kind.index()].served[served.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `bytes` of expert copies issued in a step of `kind`.
    pub fn record_link_bytes(&self, kind: StepKind, bytes: u64) {
        self.kinds[kind.index()]
            .link_bytes
            .fetch_add(bytes, Ordering::Relaxed);
    }

    /// The counters of `kind` now.
    pub fn snapshot(&self, kind: StepKind) -> StepKindSnapshot {
        let k = &self.kinds[kind.index()];
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StepKindSnapshot {
            served: std::array::from_fn(|i| load(&k.served[i])),
            link_bytes: load(&k.link_bytes),
            tokens: load(&k.tokens),
            steps: load(&k.steps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_a_prefill_when_one_sequence_feeds_more_than_decode_rows() {
        let of = |rows, longest| StepKind::of(StepRows { rows, longest });
        assert_eq!(of(1, 1), StepKind::Decode);
        assert_eq!(of(8, 1), StepKind::Decode);
        assert_eq!(of(64, DECODE_MAX_ROWS), StepKind::Decode);
        assert_eq!(
            of(DECODE_MAX_ROWS + 1, DECODE_MAX_ROWS + 1),
            StepKind::Prefill
        );
        assert_eq!(of(520, 512), StepKind::Prefill);
    }

    #[test]
    fn rates_come_from_the_kind_s_own_counts() {
        let counts = ExpertStepCounts::default();
        assert_eq!(counts.snapshot(StepKind::Decode).cache_hit_rate(), None);
        assert_eq!(
            counts.snapshot(StepKind::Decode).link_bytes_per_token(),
            None
        );
        counts.record_step(StepKind::Decode, 1);
        counts.record_step(StepKind::Decode, 1);
        counts.record_step(StepKind::Prefill, 512);
        for served in [Served::Resident, Served::Hit, Served::Hit, Served::Host] {
            counts.record_served(StepKind::Decode, served);
        }
        counts.record_served(StepKind::Prefill, Served::Copied);
        counts.record_link_bytes(StepKind::Prefill, 1024);
        let decode = counts.snapshot(StepKind::Decode);
        assert_eq!(decode.served, [1, 2, 0, 1]);
        assert_eq!((decode.tokens, decode.steps), (2, 2));
        // Resident experts are not cache lookups: 2 hits of 3 offloaded.
        assert_eq!(decode.cache_hit_rate(), Some(2.0 / 3.0));
        assert_eq!(decode.link_bytes_per_token(), Some(0.0));
        let prefill = counts.snapshot(StepKind::Prefill);
        assert_eq!(prefill.cache_hit_rate(), Some(0.0));
        assert_eq!(prefill.link_bytes_per_token(), Some(2.0));
    }
}
