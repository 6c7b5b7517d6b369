//! What `ferry plan` says about the tiers of a model's offloaded units: the calibrated rates,
//! and per unit kind (an offloaded decoder layer; an expert of an offloaded MoE layer) its work,
//! the tier the cost model ([`super::cost`]) picks at batch 1 and at the planned `max_batch`,
//! and the row count from which streaming wins. Built from a layer's slab layout
//! ([`LayerLayout`]) and a [`Calibration`]; rendered as text lines and as JSON.

use std::fmt::Write as _;

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use serde_json::{json, Value};

use super::calibrate::{type_name, Calibration};
use super::cost::{Tier, UnitWork};
use super::layout::LayerLayout;
use super::units::format_bytes;
use ferry_model::loader::TensorKind;
use ferry_model::spec::MoeSpec;

/// Bytes per activation element a host-computed unit receives and returns (the CPU kernels
/// take and give f32 rows).
pub const ACTIVATION_BYTES: u64 = 4;

/// One kind of offloaded unit.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitKind {
    /// `layer` or `expert`.
    pub name: &'static str,
    /// How many of them are offloaded.
    pub count: usize,
    /// One unit's work per row.
    pub work: UnitWork,
    /// Rows one unit computes in a decode step of `max_batch` sequences (an expert: the
    /// batch's routed rows spread over the experts, `ceil(max_batch * top_k / n_experts)`).
    pub rows_at_max_batch: usize,
}

/// What a plan keeps on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offloaded {
    /// Whole decoder layers (each MoE layer with all its experts).
    Layers(usize),
    /// Single experts, every layer's other parts on the device (experts as placement units).
    Experts(usize),
}

/// The offloaded unit kinds of a model whose decoder layers `layout` (one of them) describes,
/// `offloaded` of them on the host, with rows `hidden` wide and `max_batch` sequences per step.
/// An offloaded MoE layer is one `layer` unit (attention, router and its top-k experts per row)
/// and `n_experts` `expert` units; offloaded experts are `expert` units only; a layer without
/// experts in a MoE model is a dense one.
pub fn unit_kinds(
    layout: &LayerLayout,
    offloaded: Offloaded,
    moe: Option<&MoeSpec>,
    hidden: usize,
    max_batch: usize,
) -> Vec<UnitKind> {
    // A MoE model's dense layers (GLM-4.5's leading ones) are dense units.
    let moe = moe.filter(|_| layout.entries.iter().any(|e| e.part.is_expert()));
    let host_layers = match offloaded {
        Offloaded::Layers(n) => n,
        Offloaded::Experts(_) => 0,
    };
    let host_experts = match (offloaded, moe) {
        (Offloaded::Layers(n), Some(moe)) => n * moe.n_experts,
        (Offloaded::Experts(n), Some(_)) => n,
        (_, None) => 0,
    };
    if host_layers == 0 && host_experts == 0 {
        return Vec::new();
    }
    let activation = hidden as u64 * ACTIVATION_BYTES;
    let bytes = |expert: Option<usize>| -> (u64, u64) {
        layout
            .entries
            .iter()
            .filter(|e| match expert {
                Some(unit) => e.part.is_expert() && e.unit == unit,
                None => true,
            })
            .fold((0, 0), |(bytes, elems), e| {
                let matrix = e.part.is_matrix() || e.part.is_expert();
                let elems = elems + if matrix { e.elem_count() as u64 } else { 0 };
                (bytes + e.len as u64, elems)
            })
    };
    let (layer_bytes, layer_elems) = bytes(None);
    let mut kinds = Vec::new();
    match moe {
        Some(moe) => {
            let (expert_bytes, expert_elems) = bytes(Some(0));
            // Per row a MoE layer multiplies its dense part and its top-k experts.
            let all_experts = expert_elems * moe.n_experts as u64;
            let per_row =
                layer_elems.saturating_sub(all_experts) + expert_elems * moe.n_used as u64;
            if host_layers > 0 {
                kinds.push(UnitKind {
                    name: "layer",
                    count: host_layers,
                    work: UnitWork {
                        weight_bytes: layer_bytes,
                        flops_per_row: 2.0 * per_row as f64,
                        activation_bytes_per_row: activation,
                    },
                    rows_at_max_batch: max_batch.max(1),
                });
            }
            kinds.push(UnitKind {
                name: "expert",
                count: host_experts,
                work: UnitWork::matmuls(expert_bytes, expert_elems, activation),
                rows_at_max_batch: (max_batch * moe.n_used).div_ceil(moe.n_experts).max(1),
            });
        }
        None => kinds.push(UnitKind {
            name: "layer",
            count: host_layers,
            work: UnitWork::matmuls(layer_bytes, layer_elems, activation),
            rows_at_max_batch: max_batch.max(1),
        }),
    }
    kinds
}

/// The weight type the host kernels of `layout`'s units mostly read: the type holding the most
/// bytes of its matrices (its experts' for a MoE layer).
pub fn weight_type(layout: &LayerLayout) -> GgmlDType {
    let has_experts = layout.entries.iter().any(|e| e.part.is_expert());
    let mut by_type: Vec<(GgmlDType, u64)> = Vec::new();
    for e in &layout.entries {
        let counted = if has_experts {
            e.part.is_expert()
        } else {
            e.part.is_matrix()
        };
        if !counted {
            continue;
        }
        let dtype = match e.kind {
            // Types candle has no name for (IQ4_NL, IQ4_XS, MXFP4) are not calibrated yet.
            TensorKind::Blocks(ty) => match ty.to_candle() {
                Some(dtype) => dtype,
                None => continue,
            },
            TensorKind::Dense(DType::F16) => GgmlDType::F16,
            TensorKind::Dense(DType::BF16) => GgmlDType::BF16,
            TensorKind::Dense(_) => GgmlDType::F32,
        };
        match by_type.iter_mut().find(|(t, _)| *t == dtype) {
            Some((_, bytes)) => *bytes += e.len as u64,
            None => by_type.push((dtype, e.len as u64)),
        }
    }
    by_type
        .into_iter()
        .max_by_key(|&(_, bytes)| bytes)
        .map_or(GgmlDType::F32, |(dtype, _)| dtype)
}

/// One unit kind's decisions.
#[derive(Debug, Clone, PartialEq)]
pub struct TierLine {
    /// The unit kind.
    pub kind: UnitKind,
    /// The tier of one row.
    pub at_one: Tier,
    /// The tier of [`UnitKind::rows_at_max_batch`] rows.
    pub at_max_batch: Tier,
    /// The smallest row count that streams ([`super::cost::CostModel::crossover`]).
    pub crossover: Option<usize>,
}

/// The tier part of a model's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct TierReport {
    /// The rates the decisions use.
    pub calibration: Calibration,
    /// The planned `max_batch`.
    pub max_batch: usize,
    /// One line per offloaded unit kind.
    pub lines: Vec<TierLine>,
    /// Why the units only stream on this device, when they do whatever the rates say (on
    /// CUDA: whole layers, and experts held dense).
    pub stream_only: Option<String>,
}

impl TierReport {
    /// The decisions of `calibration`'s cost model for each of `kinds`.
    pub fn new(calibration: Calibration, max_batch: usize, kinds: Vec<UnitKind>) -> Self {
        let model = &calibration.model;
        let lines = kinds
            .into_iter()
            .map(|kind| TierLine {
                at_one: model.choose(&kind.work, 1),
                at_max_batch: model.choose(&kind.work, kind.rows_at_max_batch),
                crossover: model.crossover(&kind.work),
                kind,
            })
            .collect();
        TierReport {
            calibration,
            max_batch,
            lines,
            stream_only: None,
        }
    }

    /// The report whose units only stream on this device, forced so, for `reason`.
    pub fn stream_only(mut self, reason: impl Into<String>) -> Self {
        self.calibration.model.forced = Some(Tier::Stream);
        self.lines = self
            .lines
            .into_iter()
            .map(|line| TierLine {
                at_one: Tier::Stream,
                at_max_batch: Tier::Stream,
                crossover: Some(1),
                ..line
            })
            .collect();
        self.stream_only = Some(reason.into());
        self
    }

    /// The lines `ferry plan` prints, e.g.
    ///
    /// ```text
    /// tiers   link 8 GB/s (set), host 41.3 GFLOP/s for q4_1 (reads 9.2 GB/s), device 41.3 GFLOP/s (the host's), tier auto
    ///   layer   20 x 45.2 MiB: batch 1 host, max_batch 8 (8 rows) stream; streams from 3 rows
    /// ```
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "tiers   {}", self.calibration.rates());
        if let Some(reason) = &self.stream_only {
            let _ = writeln!(out, "  stream only: {reason}");
        }
        for line in &self.lines {
            let k = &line.kind;
            let rows = if k.rows_at_max_batch == 1 {
                "1 row".to_string()
            } else {
                format!("{} rows", k.rows_at_max_batch)
            };
            let crossover = match line.crossover {
                Some(1) => "streams from 1 row".to_string(),
                Some(n) => format!("streams from {n} rows"),
                None => "never streams".to_string(),
            };
            let _ = writeln!(
                out,
                "  {:<8}{} x {}: batch 1 {}, max_batch {} ({rows}) {}; {crossover}",
                k.name,
                k.count,
                format_bytes(k.work.weight_bytes),
                line.at_one,
                self.max_batch,
                line.at_max_batch,
            );
        }
        out
    }

    /// The report as JSON: `{"link_bytes_per_s", "host_flops_per_s", "host_read_bytes_per_s",
    /// "device_flops_per_s", "activation_bytes_per_s" (the rate a host-computed unit's rows move
    /// at; null when they cost nothing, on the CPU device), "weight_type", "forced": null |
    /// "stream" | "host", "stream_only": null | why the units only stream here, "max_batch",
    /// "units": [{"kind", "count", "weight_bytes", "flops_per_row", "activation_bytes_per_row",
    /// "rows_at_max_batch", "tier_at_1", "tier_at_max_batch", "crossover_rows"}]}`.
    pub fn json(&self) -> Value {
        let m = &self.calibration.model;
        let units: Vec<Value> = self
            .lines
            .iter()
            .map(|line| {
                let k = &line.kind;
                json!({
                    "kind": k.name,
                    "count": k.count,
                    "weight_bytes": k.work.weight_bytes,
                    "flops_per_row": k.work.flops_per_row,
                    "activation_bytes_per_row": k.work.activation_bytes_per_row,
                    "rows_at_max_batch": k.rows_at_max_batch,
                    "tier_at_1": line.at_one.name(),
                    "tier_at_max_batch": line.at_max_batch.name(),
                    "crossover_rows": line.crossover,
                })
            })
            .collect();
        json!({
            "link_bytes_per_s": m.link_bytes_per_s,
            "host_flops_per_s": m.host_flops_per_s,
            "host_read_bytes_per_s": m.host_read_bytes_per_s,
            "device_flops_per_s": m.device_flops_per_s,
            "activation_bytes_per_s": match m.activation_bytes_per_s {
                Some(rate) if rate == f64::INFINITY => None,
                rate => Some(rate.unwrap_or(m.link_bytes_per_s)),
            },
            "weight_type": type_name(self.calibration.weight_type),
            "forced": m.forced.map(Tier::name),
            "stream_only": self.stream_only,
            "max_batch": self.max_batch,
            "units": units,
        })
    }
}

#[cfg(test)]
#[path = "tier_report_tests.rs"]
mod tests;
