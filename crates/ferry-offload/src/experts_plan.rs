//! Experts as placement units (issue 13, item 1): the pure side of expert-level offload.
//!
//! For a mixture-of-experts model the planner places, in order: the fixed parts, the KV cache,
//! workspace and reserve, then the non-expert parts of every layer (attention, norms, router),
//! then a pool of expert slots (at least one token's routed experts), then experts, spread
//! evenly over the layers (each layer's first expert, then its second, ...), until the budget
//! (except in the MoE layers of [`ExpertInput::host_layers`], which keep them all on the host
//! by setting, as llama.cpp's `--n-cpu-moe` does). A layer's experts go in its residency
//! order ([`LayerExperts::order`]): the most routed first where [`ExpertInput::route_counts`]
//! says which (counted while serving, [`super::expert_routes`]), ties and unknown ones by
//! index, so without counts experts `0..k` of each layer are resident. The
//! remaining experts live in host slabs, one per expert (its gate, up and down together), and
//! are either copied into a slot of the pool when the router picks them or computed where they
//! are ([`super::experts`] runs both).
//!
//! Beside the pool, [`PREFILL_SCRATCH_SLOTS`] scratch slots: a prefill's streamed experts pass
//! through them one after another (the next copied while the current computes), never entering
//! the pool's cache, so a prompt does not evict the experts decoding keeps hot. When the budget
//! holds the pool but not the scratch slots beside it, the plan has none (the planner degrades
//! before it refuses, [`super::plan`]): a prefill then streams through the pool.
//!
//! The bytes moved per decode token follow the routed-expert arithmetic: a token routes to
//! `n_used` of a layer's `n_experts` experts, so with uniform routing and no cache hits a layer
//! with `h` of its experts on the host moves `n_used * h / n_experts` experts, where whole-layer
//! streaming moves the whole layer.

use serde::Serialize;

use super::layout::{expert_units, LayerLayout, SlotKind, SlotLayout};
use ferry_config::HostExpertLayers;

/// Scratch slots beside the expert pool for a prefill's streamed experts: one computing, one
/// receiving the next copy.
pub const PREFILL_SCRATCH_SLOTS: usize = 2;

/// What the planner needs to place experts one by one (set for MoE models).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertInput {
    /// Experts each token is routed to (top-k).
    pub n_used: usize,
    /// Expert slots of the device pool (the cache of hot experts); `None`: `n_used` (one
    /// token's experts of one layer).
    pub pool_slots: Option<usize>,
    /// The MoE layers that keep every expert on the host, whatever the budget
    /// (`offload.host_expert_layers`, llama.cpp's `--n-cpu-moe`: the first N, or a list);
    /// `First(0)`: the budget decides.
    pub host_layers: HostExpertLayers,
    /// Per decoder layer, how often each expert was routed to (from earlier serving,
    /// [`super::expert_routes`]); a missing layer or expert counts 0. Empty: no counts, every
    /// layer's experts resident in index order.
    pub route_counts: Vec<Vec<u64>>,
}

/// The residency order of `n` experts: the most routed first by `counts` (a missing expert
/// counts 0), ties in index order.
pub fn residency_order(n: usize, counts: Option<&[u64]>) -> Vec<usize> {
    let count = |e: usize| counts.and_then(|c| c.get(e)).copied().unwrap_or(0);
    let mut order: Vec<usize> = (0..n).collect();
    // A stable sort: equal counts keep index order.
    order.sort_by_key(|&e| std::cmp::Reverse(count(e)));
    order
}

/// One MoE layer's experts in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerExperts {
    /// Decoder layer index.
    pub index: usize,
    /// Device bytes of the layer's other parts (attention, norms, router): always resident.
    pub base_bytes: u64,
    /// Device bytes of each expert (gate, up and down), in expert order.
    pub expert_bytes: Vec<u64>,
    /// The residency order of the experts (every expert once): the first `device_experts`
    /// are resident, the rest live in host slabs ([`residency_order`]).
    pub order: Vec<usize>,
    /// How many experts are resident: `order[..device_experts]`.
    pub device_experts: usize,
}

impl LayerExperts {
    /// Number of experts of the layer.
    pub fn n_experts(&self) -> usize {
        self.expert_bytes.len()
    }

    /// Experts in host slabs.
    pub fn host_experts(&self) -> usize {
        self.n_experts() - self.device_experts
    }

    /// Whether expert `e` is resident: the one definition every consumer uses.
    pub fn is_resident(&self, e: usize) -> bool {
        self.order[..self.device_experts].contains(&e)
    }

    /// The resident experts, in index order.
    pub fn resident_experts(&self) -> Vec<usize> {
        let mut resident = self.order[..self.device_experts].to_vec();
        resident.sort_unstable();
        resident
    }

    /// The experts in host slabs, in index order.
    pub fn offloaded_experts(&self) -> Vec<usize> {
        let mut host = self.order[self.device_experts..].to_vec();
        host.sort_unstable();
        host
    }

    /// Device bytes: the other parts and the resident experts.
    pub fn device_bytes(&self) -> u64 {
        self.base_bytes
            + self.order[..self.device_experts]
                .iter()
                .map(|&e| self.expert_bytes[e])
                .sum::<u64>()
    }

    /// Bytes of the experts in host slabs.
    pub fn host_bytes(&self) -> u64 {
        self.order[self.device_experts..]
            .iter()
            .map(|&e| self.expert_bytes[e])
            .sum()
    }

    /// Bytes of the whole layer.
    pub fn layer_bytes(&self) -> u64 {
        self.base_bytes + self.expert_bytes.iter().sum::<u64>()
    }

    /// Expected bytes moved for one token: `n_used` routed experts, each on the host with
    /// probability `host / n` (uniform routing, no cache hits), at the host experts' mean size.
    pub fn routed_bytes_per_token(&self, n_used: usize) -> f64 {
        let n = self.n_experts();
        let host = self.host_experts();
        if n == 0 || host == 0 {
            return 0.0;
        }
        let mean = self.host_bytes() as f64 / host as f64;
        n_used.min(n) as f64 * (host as f64 / n as f64) * mean
    }
}

/// Where every expert goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertPlan {
    /// Every decoder layer's experts (a dense layer has none).
    pub layers: Vec<LayerExperts>,
    /// Experts each token is routed to.
    pub n_used: usize,
    /// Expert slots of the device pool, the cache of hot experts (0 when every expert is
    /// resident).
    pub pool_slots: usize,
    /// Scratch slots beside the pool for a prefill's streamed experts
    /// ([`PREFILL_SCRATCH_SLOTS`]); never part of the cache.
    pub scratch_slots: usize,
    /// What one expert slot holds: enough for any offloaded expert.
    pub slot: SlotLayout,
    /// Estimated bytes moved host-to-device per decode token ([`LayerExperts::routed_bytes_per_token`]
    /// summed over the layers, rounded).
    pub bytes_per_token: u64,
    /// What streaming the same layers whole moves per token: every layer with an expert on
    /// the host.
    pub whole_layer_bytes_per_token: u64,
}

impl ExpertPlan {
    /// Device bytes of the resident parts of every layer.
    pub fn resident_bytes(&self) -> u64 {
        self.layers.iter().map(LayerExperts::device_bytes).sum()
    }

    /// Bytes of every expert in host slabs.
    pub fn host_bytes(&self) -> u64 {
        self.layers.iter().map(LayerExperts::host_bytes).sum()
    }

    /// Device bytes of the pool and its scratch slots.
    pub fn pool_bytes(&self) -> u64 {
        (self.slot_count() as u64).saturating_mul(self.slot.total_bytes())
    }

    /// Expert slots on the device: the pool's and the scratch ones.
    pub fn slot_count(&self) -> usize {
        self.pool_slots + self.scratch_slots
    }

    /// Experts in host slabs, over all layers.
    pub fn host_experts(&self) -> usize {
        self.layers.iter().map(LayerExperts::host_experts).sum()
    }
}

/// Splits each layer layout into its other parts and its experts, sized as a device of `kind`
/// holds them; `None` when no layer has experts.
pub fn layer_experts(layouts: &[LayerLayout], kind: SlotKind) -> Option<Vec<LayerExperts>> {
    let layers: Vec<LayerExperts> = layouts
        .iter()
        .map(|l| LayerExperts {
            index: l.index,
            base_bytes: l.without_experts().resident_bytes(kind),
            expert_bytes: (0..expert_units(l))
                .map(|e| l.expert(e).resident_bytes(kind))
                .collect(),
            order: (0..expert_units(l)).collect(),
            device_experts: 0,
        })
        .collect();
    layers.iter().any(|l| l.n_experts() > 0).then_some(layers)
}

/// The decoder layers whose experts stay on the host by setting (`input.host_layers` resolved
/// against the layers that have experts); an error names a listed layer out of range or
/// without experts.
pub fn pinned_layers(layouts: &[LayerLayout], input: &ExpertInput) -> Result<Vec<usize>, String> {
    let moe: Vec<usize> = layouts
        .iter()
        .filter(|l| expert_units(l) > 0)
        .map(|l| l.index)
        .collect();
    input.host_layers.resolve(&moe, layouts.len())
}

/// What the smallest expert plan of `layouts` holds on the device besides the fixed parts, KV
/// cache, workspace and reserve: `(every layer's other parts, one pool slot)`, the pool having
/// no scratch slots and every expert on the host; `None` without experts.
pub fn least_parts(layouts: &[LayerLayout], kind: SlotKind) -> Option<(u64, u64)> {
    let layers = layer_experts(layouts, kind)?;
    let base: u64 = layers.iter().map(|l| l.base_bytes).sum();
    let mut slot = SlotLayout::new(kind);
    for layout in layouts {
        for e in 0..expert_units(layout) {
            slot.add(&layout.expert(e));
        }
    }
    Some((base, slot.total_bytes()))
}

/// Places experts in `available` device bytes (the budget less the fixed parts, KV cache,
/// workspace and reserve), with `scratch_slots` prefill scratch slots beside the pool. With
/// `spread` experts fill the room left after the other parts and the pool, evenly over the
/// layers; without it (mode `sequential`) every expert stays on the host. `None` when the
/// other parts and the pool do not fit, or nothing is left to offload.
pub fn place(
    layouts: &[LayerLayout],
    kind: SlotKind,
    input: &ExpertInput,
    available: u64,
    spread: bool,
    scratch_slots: usize,
) -> Option<ExpertPlan> {
    let mut layers = layer_experts(layouts, kind)?;
    for l in &mut layers {
        let counts = input.route_counts.get(l.index).map(Vec::as_slice);
        l.order = residency_order(l.n_experts(), counts);
    }
    let base: u64 = layers.iter().map(|l| l.base_bytes).sum();
    let mut left = available.checked_sub(base)?;
    let pool_slots = input.pool_slots.unwrap_or(input.n_used).max(1);
    let host_layouts = |layers: &[LayerExperts]| {
        let mut slot = SlotLayout::new(kind);
        for (l, layout) in layers.iter().zip(layouts) {
            for e in l.offloaded_experts() {
                slot.add(&layout.expert(e));
            }
        }
        slot
    };
    // The pool is sized for the largest expert of any layer (experts are placed evenly, so
    // every layer keeps some on the host unless all fit).
    let pool_bytes =
        ((pool_slots + scratch_slots) as u64).saturating_mul(host_layouts(&layers).total_bytes());
    left = left.checked_sub(pool_bytes)?;
    if spread {
        let most = layers
            .iter()
            .map(LayerExperts::n_experts)
            .max()
            .unwrap_or(0);
        // The layers whose experts stay on the host by setting (checked by the planner).
        let pinned = pinned_layers(layouts, input).unwrap_or_default();
        // Each layer's first expert by residency order, then its second, ...
        'fill: for rank in 0..most {
            for l in layers
                .iter_mut()
                .filter(|l| rank < l.n_experts() && !pinned.contains(&l.index))
            {
                let bytes = l.expert_bytes[l.order[rank]];
                if bytes > left {
                    break 'fill;
                }
                left -= bytes;
                l.device_experts = rank + 1;
            }
        }
    }
    if layers.iter().all(|l| l.host_experts() == 0) {
        return None;
    }
    let slot = host_layouts(&layers);
    let n_used = input.n_used;
    let bytes_per_token = layers
        .iter()
        .map(|l| l.routed_bytes_per_token(n_used))
        .sum::<f64>()
        .round() as u64;
    let whole_layer_bytes_per_token = layers
        .iter()
        .filter(|l| l.host_experts() > 0)
        .map(LayerExperts::layer_bytes)
        .sum();
    Some(ExpertPlan {
        layers,
        n_used,
        pool_slots,
        scratch_slots,
        slot,
        bytes_per_token,
        whole_layer_bytes_per_token,
    })
}

#[cfg(test)]
#[path = "experts_plan_tests.rs"]
mod tests;
