//! The tier cost model: for one offloaded unit (an expert, or an offloaded dense layer) and one
//! step, whether to stream its weights to the compute device and run it there ([`Tier::Stream`])
//! or to run it on the host where its weights already live and move only the activations
//! ([`Tier::Host`]). A pure function of the unit's work ([`UnitWork`]), the rows the step runs
//! through it and four measured (or configured) rates ([`CostModel`]); it needs no device.
//!
//! The two estimates, in seconds, for `r` rows of a unit of `B` weight bytes, `F` flops per row
//! and `A` activation bytes per row:
//!
//! - stream: `B / link + r * F / device_flops`. The copy and the compute of one unit are
//!   serial (the unit's matmuls need all its weights on the device); that the copy of one unit
//!   overlaps the compute of the one before is ignored, which charges streaming the full copy.
//!   A unit already cached on the device costs only its compute ([`CostModel::choose_cached`]).
//! - host: `max(B / host_read, r * F / host_flops) + 2 * r * A / link`. The host kernels read
//!   the weights while they compute, so the slower of the two bounds the unit (a roofline); the
//!   activations cross the link twice (the rows in, the results back), serially, at the link's
//!   rate, or at [`CostModel::activation_bytes_per_s`] where it is set: on CUDA the
//!   calibration's measured round trip of a few rows (small copies are mostly latency, so it is
//!   well below the link's rate); on the CPU device the rows are already on the host and cost
//!   nothing (its calibration sets an infinite rate), so the host tier, with the same compute
//!   and no copy, is never the slower there. The MoE forward moves a layer's host-expert rows
//!   once for all its host experts; charging each expert its own rows overestimates that a
//!   little where rows pick several host experts.
//!
//! Rules: a tie goes to [`Tier::Stream`] (the device is the reference path, and a streamed unit
//! may stay in the device cache for later steps); a unit cached on the device always streams,
//! whatever is forced; a forced tier ([`CostModel::forced`]) decides every other unit; zero rows
//! cost nothing on either tier. A rate that is zero, negative or not finite makes whatever
//! moves through it infinitely slow (never a division by zero or a panic).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_config::TierChoice;

/// Where an offloaded unit runs for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Copy the weights to the compute device, compute there.
    Stream,
    /// Compute on the host, on the weights where they live; move only the activations.
    Host,
}

impl Tier {
    /// Both tiers, in the order metrics and `ferry plan` list them.
    pub const ALL: [Tier; 2] = [Tier::Stream, Tier::Host];

    /// The tier's name in settings, logs, metrics labels and `ferry plan`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Stream => "stream",
            Tier::Host => "host",
        }
    }
}

impl Tier {
    /// The tier `offload.tier` forces (`None` for `auto`: decide by cost).
    pub fn forced_by(choice: TierChoice) -> Option<Tier> {
        match choice {
            TierChoice::Auto => None,
            TierChoice::Stream => Some(Tier::Stream),
            TierChoice::Host => Some(Tier::Host),
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decisions taken, by tier: the offload engine records each unit-step's tier here (through
/// [`super::Accounting::tier_decisions`]) and the metrics publish the totals
/// (`ferry_offload_tier_decisions_total{tier}`).
#[derive(Debug, Default)]
pub struct TierCounts {
    stream: AtomicU64,
    host: AtomicU64,
}

impl TierCounts {
    /// Counts `n` decisions for `tier`.
    pub fn record(&self, tier: Tier, n: u64) {
        self.counter(tier).fetch_add(n, Ordering::Relaxed);
    }

    /// Decisions for `tier` so far.
    pub fn get(&self, tier: Tier) -> u64 {
        self.counter(tier).load(Ordering::Relaxed)
    }

    fn counter(&self, tier: Tier) -> &AtomicU64 {
        match tier {
            Tier::Stream => &self.stream,
            Tier::Host => &self.host,
        }
    }
}

/// The work of one offloaded unit for one row (token) of a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnitWork {
    /// Bytes of the unit's weights as they are stored (what a stream copies, what the host
    /// kernels read).
    pub weight_bytes: u64,
    /// Floating-point operations per row (2 per weight element for matmuls).
    pub flops_per_row: f64,
    /// Activation bytes per row in one direction (the input rows sent to the host; the same
    /// count comes back).
    pub activation_bytes_per_row: u64,
}

impl UnitWork {
    /// A unit made of matmuls over `weight_elems` weights stored in `weight_bytes`, whose rows
    /// are `activation_bytes_per_row` wide: one multiply and one add per weight element.
    pub fn matmuls(weight_bytes: u64, weight_elems: u64, activation_bytes_per_row: u64) -> Self {
        UnitWork {
            weight_bytes,
            flops_per_row: 2.0 * weight_elems as f64,
            activation_bytes_per_row,
        }
    }
}

/// The rates the estimates divide by, and a forced tier. Every rate is per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Host-to-device link bandwidth, bytes/s.
    pub link_bytes_per_s: f64,
    /// Host compute throughput of the CPU kernels for the unit's weight type, flop/s.
    pub host_flops_per_s: f64,
    /// Host memory bandwidth while the CPU kernels read the unit's weights, bytes/s.
    pub host_read_bytes_per_s: f64,
    /// Compute device throughput, flop/s.
    pub device_flops_per_s: f64,
    /// `Some` forces that tier for every unit not cached on the device (`offload.tier`);
    /// `None` decides by cost.
    pub forced: Option<Tier>,
    /// The rate a host-computed unit's activations move at, bytes/s; `None`: the link's (a GPU:
    /// the rows cross it both ways). CUDA's calibration measures the round trip; the CPU
    /// device's sets it infinite: the rows are already where the host computes.
    pub activation_bytes_per_s: Option<f64>,
}

/// Seconds to move or compute `amount` at `rate`: zero for no work, infinite for a rate that
/// is not a positive finite number.
fn seconds(amount: f64, rate: f64) -> f64 {
    if amount <= 0.0 {
        0.0
    } else if rate.is_finite() && rate > 0.0 {
        amount / rate
    } else {
        f64::INFINITY
    }
}

impl CostModel {
    /// Seconds `bytes` of a host-computed unit's activations take to move: at the link's rate,
    /// or at [`CostModel::activation_bytes_per_s`] (an infinite one: no time at all).
    fn activation_seconds(&self, bytes: f64) -> f64 {
        match self.activation_bytes_per_s {
            Some(rate) if rate == f64::INFINITY => 0.0,
            Some(rate) => seconds(bytes, rate),
            None => seconds(bytes, self.link_bytes_per_s),
        }
    }

    /// The tier for `rows` rows of a unit that is not on the device.
    pub fn choose(&self, unit: &UnitWork, rows: usize) -> Tier {
        self.choose_cached(unit, rows, false)
    }

    /// The tier for `rows` rows of a unit; `cached` says its weights are already on the device
    /// (a hit in the device expert cache), which always streams: it costs no copy.
    pub fn choose_cached(&self, unit: &UnitWork, rows: usize, cached: bool) -> Tier {
        if cached {
            return Tier::Stream;
        }
        if let Some(tier) = self.forced {
            return tier;
        }
        self.cheaper(unit, rows)
    }

    /// The tier with the lower estimate, ignoring any forced tier (ties stream).
    pub fn cheaper(&self, unit: &UnitWork, rows: usize) -> Tier {
        let stream = self.seconds(unit, rows, Tier::Stream, false);
        let host = self.seconds(unit, rows, Tier::Host, false);
        if host < stream {
            Tier::Host
        } else {
            Tier::Stream
        }
    }

    /// Estimated time for `rows` rows of a unit (not on the device) on `tier`; saturates at
    /// [`Duration::MAX`] for a rate that makes it infinite.
    pub fn estimate(&self, unit: &UnitWork, rows: usize, tier: Tier) -> Duration {
        let secs = self.seconds(unit, rows, tier, false);
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }

    /// [`CostModel::estimate`] in seconds; `cached` drops the copy of a unit already on the
    /// device from the stream estimate.
    pub fn seconds(&self, unit: &UnitWork, rows: usize, tier: Tier, cached: bool) -> f64 {
        if rows == 0 {
            return 0.0;
        }
        let rows = rows as f64;
        let flops = rows * unit.flops_per_row;
        match tier {
            Tier::Stream => {
                let copy = if cached {
                    0.0
                } else {
                    seconds(unit.weight_bytes as f64, self.link_bytes_per_s)
                };
                copy + seconds(flops, self.device_flops_per_s)
            }
            Tier::Host => {
                let read = seconds(unit.weight_bytes as f64, self.host_read_bytes_per_s);
                let compute = seconds(flops, self.host_flops_per_s);
                let activations = 2.0 * rows * unit.activation_bytes_per_row as f64;
                read.max(compute) + self.activation_seconds(activations)
            }
        }
    }

    /// The smallest row count (at least 1) at which [`CostModel::choose`] streams the unit,
    /// `None` when it never does (host compute wins at every batch, or host is forced). Both
    /// estimates are linear in the rows (the host one piecewise), so this is solved, not
    /// searched.
    pub fn crossover(&self, unit: &UnitWork) -> Option<usize> {
        match self.forced {
            Some(Tier::Stream) => return Some(1),
            Some(Tier::Host) => return None,
            None => {}
        }
        // host - stream = max(read, r * host_compute) + r * act - copy - r * device_compute,
        // the larger of two lines in r; streaming wins where either line is >= 0.
        let copy = seconds(unit.weight_bytes as f64, self.link_bytes_per_s);
        let read = seconds(unit.weight_bytes as f64, self.host_read_bytes_per_s);
        let host_row = seconds(unit.flops_per_row, self.host_flops_per_s);
        let device_row = seconds(unit.flops_per_row, self.device_flops_per_s);
        let act_row = self.activation_seconds(2.0 * unit.activation_bytes_per_row as f64);
        let lines = [
            (read - copy, act_row - device_row),
            (-copy, host_row + act_row - device_row),
        ];
        let first = lines
            .iter()
            .filter_map(|&(at0, slope)| first_nonnegative(at0, slope))
            .min()?;
        // The solved row count can be one off after rounding: settle it on the real decision.
        let mut rows = first.saturating_sub(1).max(1);
        while self.choose(unit, rows) != Tier::Stream {
            rows = rows.checked_add(1)?;
            if rows > first.saturating_add(2) {
                return None;
            }
        }
        Some(rows)
    }
}

/// The smallest integer `r >= 1` with `at0 + slope * r >= 0`, if any (and if representable).
fn first_nonnegative(at0: f64, slope: f64) -> Option<usize> {
    if at0.is_nan() || slope.is_nan() {
        return None;
    }
    if at0 + slope >= 0.0 {
        return Some(1);
    }
    if slope <= 0.0 || (!slope.is_finite() && at0.is_infinite()) {
        return None;
    }
    let rows = (-at0 / slope).ceil();
    (rows.is_finite() && rows < usize::MAX as f64).then(|| (rows as usize).max(1))
}

#[cfg(test)]
#[path = "cost_tests.rs"]
mod tests;
