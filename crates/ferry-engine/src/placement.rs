//! Where a served model's parts live, as the runtime planned them at load: plain serializable
//! facts ([`ModelPlacement`]) the runtime hands the engine ([`crate::EngineHandle::set_placement`])
//! and the HTTP layer reads back through [`crate::Backend::placement`] for
//! `GET /v1/ferry/status`. The engine neither computes nor checks them; it only keeps them.

use serde::Serialize;

/// Where one decoder layer's weights are used from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerLocation {
    /// Resident on the compute device.
    Device,
    /// In host memory, copied into a device slot for each forward pass.
    Streamed,
    /// In host memory, computed there by the host kernels (the tier cost model's choice).
    HostComputed,
    /// Offload mode `model`: the whole model is parked in host memory.
    SwappedOut,
}

/// Where one MoE expert lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertLocation {
    /// Resident on the device for the whole run.
    Resident,
    /// In host memory, copied into the device's expert cache (its pool) when routed.
    Cached,
    /// In host memory, computed there when routed.
    Host,
}

/// One decoder layer's place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerSite {
    /// Layer index, 0-based.
    pub index: usize,
    /// Where it is used from.
    pub location: LayerLocation,
    /// Its weight bytes.
    pub bytes: u64,
}

/// One MoE layer's experts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerExperts {
    /// Decoder layer index.
    pub layer: usize,
    /// Each expert's place, in expert order.
    pub experts: Vec<ExpertLocation>,
}

/// What a model takes of the device budget, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BudgetUse {
    /// The device budget the plan was made against.
    pub budget: u64,
    /// Resident weights: the fixed parts (embeddings, norm, head) and the resident layers.
    pub weights: u64,
    /// The slot ring streamed layers (or the expert pool) are copied into.
    pub slots: u64,
    /// The KV cache.
    pub kv_cache: u64,
    /// Activations and scratch buffers.
    pub workspace: u64,
    /// What the budget leaves to the runtime (CUDA context, allocator slack).
    pub reserve: u64,
    /// The planned device total (never above `budget`).
    pub device_total: u64,
    /// Host memory holding the offloaded weights.
    pub host: u64,
}

/// A served model's placement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelPlacement {
    /// The offload mode: `none`, `auto`, `sequential` or `model`.
    pub offload_mode: String,
    /// The budget and what takes it.
    pub budget: BudgetUse,
    /// Every decoder layer, in forward order.
    pub layers: Vec<LayerSite>,
    /// A MoE model's experts per MoE layer (empty for a dense model or when whole layers are
    /// the placement units).
    pub experts: Vec<LayerExperts>,
    /// Expert slots of the device's expert cache (0: none).
    pub expert_cache_slots: usize,
    /// Tokens per sequence the KV cache is sized for.
    pub max_context: usize,
    /// Sequences the KV cache is sized for.
    pub max_batch: usize,
    /// The host-to-device link rate the tier cost model measured or was given, bytes/s.
    pub link_bytes_per_s: Option<f64>,
}
