//! The placement planner (DESIGN.md 4.1, 4.2): a pure function from layer sizes, a device budget and
//! an offload mode to a [`Plan`] saying where every decoder layer lives, how many device slots the
//! streamed layers rotate through, how many bytes each tier holds, and how fast decoding can be when
//! the link is the bottleneck. No I/O and no devices: the caller measures sizes ([`super::sizing`])
//! and free device memory ([`resolve_budget`]) first.
//!
//! Device bytes of a plan are, for `k` resident layers out of `n`:
//!
//! ```text
//! fixed + sum(layers[..k]) + slots * slot_bytes + kv + workspace + reserve
//! slots      = min(prefetch + 1, n - k)   (0 when nothing streams)
//! slot_bytes = what one slot holds to receive any of layers[k..]
//! ```
//!
//! With the layers' slab layouts ([`PlanInput::layer_layouts`]) a slot is sized as the device
//! holds it ([`SlotLayout`]): on the CPU the largest block region plus the largest dense region;
//! on CUDA the largest dense region plus one padded buffer per (part, type, shape) of quantized
//! matrix across the streamed layers (more than the largest layer for a mixed-type GGUF). The
//! plan carries that [`SlotLayout`] so the slots can allocate exactly it. Without layouts (plain
//! byte tables) a slot is the largest streamed layer.
//!
//! Resident layers are always a prefix (layers `0..k`) and streamed ones the suffix, so the first
//! layers of every forward pass compute while the copy engine fetches the later ones.
//!
//! A mixture-of-experts model with [`PlanInput::experts`] set is placed expert by expert instead
//! ([`super::experts_plan`]) in modes `auto` (when it does not fit whole) and `sequential`: every
//! layer's other parts stay on the device, the slots are a pool of expert slots, and the plan's
//! [`Plan::experts`] says which experts live on the host. The planner degrades before it
//! refuses: a pool without its prefill scratch slots when the budget holds only the pool
//! (a `fitted:` note says so), then whole layers streamed; a refusal names the smaller of the
//! expert plan's and the whole-layer ring's least footprint.

use candle_core::DType;
use serde::Serialize;

use super::error::{PlanError, Result};
use super::experts_plan::{self, ExpertInput, ExpertPlan, PREFILL_SCRATCH_SLOTS};
use super::layout::{LayerLayout, SlotKind, SlotLayout};
use super::units::format_bytes;
use ferry_config::{MemoryBudget, OffloadMode};
use ferry_model::kv_format::KvFormat;

/// Default device reserve on CUDA: the CUDA context, cuBLAS workspace and allocator slack that the
/// budget must leave untouched (256 MiB).
pub const DEFAULT_CUDA_RESERVE_BYTES: u64 = 256 * 1024 * 1024;

/// Default reserve on the CPU device: nothing (host memory is not carved up by a context).
pub const DEFAULT_CPU_RESERVE_BYTES: u64 = 0;

/// Link bandwidth assumed for the decode estimate when none is configured: 16 GB/s, about what a
/// PCIe 4.0 x16 link sustains host-to-device from pinned memory (decimal bytes, as link speeds are
/// quoted).
pub const DEFAULT_LINK_BANDWIDTH: u64 = 16_000_000_000;

/// Where a decoder layer's weights live between uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Home {
    /// Resident on the compute device for the whole run.
    Device,
    /// In pinned host memory, streamed into a device slot for each forward pass.
    Host,
}

impl Home {
    /// `"device"` or `"host"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Home::Device => "device",
            Home::Host => "host",
        }
    }
}

/// One decoder layer's placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerPlacement {
    /// Layer index, 0-based.
    pub index: usize,
    /// Where it lives.
    pub home: Home,
    /// Its weight bytes.
    pub bytes: u64,
}

/// Where a plan's KV-cache shape came from (`ferry plan` shows it; [`super::fit`] decides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Unset, and the default fit: the model's window, batch 8, the device's KV dtype.
    Default,
    /// Set in the configuration (a flag, variable or file).
    Set,
    /// Unset, and lowered from the default to fit the budget.
    Fitted,
}

impl Origin {
    /// `"default"`, `"set"` or `"fitted"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::Set => "set",
            Origin::Fitted => "fitted",
        }
    }
}

/// The origins of a plan's `max_context`, `max_batch` and `kv_dtype`, and the model's own window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOrigins {
    /// Where `max_context` came from.
    pub max_context: Origin,
    /// Where `max_batch` came from.
    pub max_batch: Origin,
    /// Where `kv_dtype` came from.
    pub kv_dtype: Origin,
    /// The model's own context window (0 = unknown).
    pub model_context: usize,
}

impl Default for CacheOrigins {
    fn default() -> Self {
        Self {
            max_context: Origin::Set,
            max_batch: Origin::Set,
            kv_dtype: Origin::Set,
            model_context: 0,
        }
    }
}

/// The same model sized for another dtype (e.g. `--dtype bf16` for an f32 checkpoint), so that an
/// error can say whether that dtype would fit with mode `none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DtypeAlternative {
    /// What the user would type, e.g. `--dtype bf16`.
    pub label: String,
    /// Bytes per decoder layer with that dtype.
    pub layer_bytes: Vec<u64>,
    /// Fixed parts with that dtype.
    pub fixed_bytes: u64,
}

/// Everything the planner needs. Build it with struct syntax; [`PlanInput::new`] fills the
/// optional parts with their defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInput {
    /// Placement mode.
    pub mode: OffloadMode,
    /// Weight bytes of each decoder layer, in forward order; its length is the layer count.
    pub layer_bytes: Vec<u64>,
    /// Embeddings, final norm and output head (tied embeddings counted once).
    pub fixed_bytes: u64,
    /// Device budget in bytes (see [`resolve_budget`] for percentages of free memory).
    pub budget_bytes: u64,
    /// Sequences decoded together; sizes the KV cache.
    pub max_batch: usize,
    /// Tokens per sequence (prompt + completion); sizes the KV cache.
    pub max_context: usize,
    /// KV-cache bytes for one token in one layer (see
    /// [`super::sizing::kv_bytes_per_token_per_layer`]), in [`PlanInput::kv_dtype`].
    pub kv_bytes_per_token_per_layer: u64,
    /// The KV cache's dtype (what `kv_bytes_per_token_per_layer` was computed with).
    pub kv_dtype: KvFormat,
    /// Which layers keep only a window, and what a token costs in each format.
    pub kv_layout: KvLayout,
    /// Whether the KV cache lives in host memory (`kv_offload`): its bytes then count there,
    /// not against the device budget.
    pub kv_host: bool,
    /// Where `max_context`, `max_batch` and `kv_dtype` came from (set by [`super::fit`]).
    pub origins: CacheOrigins,
    /// Layers in flight ahead of compute; the ring has `prefetch + 1` slots.
    pub prefetch: usize,
    /// Activation workspace (see [`super::sizing::workspace_bytes`]).
    pub workspace_bytes: u64,
    /// The most tokens one engine step computes, which sized `workspace_bytes` (0: not told).
    pub max_step_tokens: usize,
    /// Bytes the budget leaves to the runtime ([`DEFAULT_CUDA_RESERVE_BYTES`],
    /// [`DEFAULT_CPU_RESERVE_BYTES`]).
    pub reserve_bytes: u64,
    /// Host-to-device bandwidth in bytes/s for the decode estimate; `None`: no estimate.
    pub link_bandwidth: Option<u64>,
    /// Other dtypes worth suggesting when mode `none` or `model` does not fit; default none.
    pub dtype_alternatives: Vec<DtypeAlternative>,
    /// Each layer's slab layout, in layer order (see [`super::sizing::ModelSizes::layouts`]);
    /// empty: unknown, and a slot is sized as the largest streamed layer.
    pub layer_layouts: Vec<LayerLayout>,
    /// How the compute device holds a slot (sizes slots from `layer_layouts`).
    pub slot_kind: SlotKind,
    /// A MoE model's routing, to place its experts one by one (with `layer_layouts`, in modes
    /// `auto` and `sequential`); `None`: whole layers are the placement units.
    pub experts: Option<ExpertInput>,
}

impl PlanInput {
    /// An input with no KV cache, workspace, reserve, bandwidth or alternatives, and prefetch 2;
    /// set the remaining public fields directly.
    pub fn new(mode: OffloadMode, layer_bytes: Vec<u64>, fixed_bytes: u64, budget: u64) -> Self {
        PlanInput {
            mode,
            layer_bytes,
            fixed_bytes,
            budget_bytes: budget,
            max_batch: 1,
            max_context: 0,
            kv_bytes_per_token_per_layer: 0,
            kv_dtype: KvFormat::Dense(DType::F32),
            kv_layout: KvLayout::default(),
            kv_host: false,
            origins: CacheOrigins::default(),
            prefetch: 2,
            workspace_bytes: 0,
            max_step_tokens: 0,
            reserve_bytes: 0,
            link_bandwidth: None,
            dtype_alternatives: Vec::new(),
            layer_layouts: Vec::new(),
            slot_kind: SlotKind::Cpu,
            experts: None,
        }
    }

    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.layer_bytes.len()
    }

    /// KV-cache bytes: `max_batch * positions * kv_bytes_per_token_per_layer`, where each
    /// layer holds `max_context` positions, a window layer at most
    /// [`KvLayout::window_positions`]. The cache of every layer stays on the device, streamed
    /// or not, unless [`PlanInput::kv_host`] puts all of it in host memory.
    /// Recurrent layers ([`KvLayout::recurrent_layers`]) add their fixed state per sequence
    /// instead, whatever the context.
    pub fn kv_bytes(&self) -> u64 {
        let windowed = self.kv_layout.window_layers.min(self.n_layers()) as u64;
        let recurrent =
            (self.kv_layout.recurrent_layers as u64).min(self.n_layers() as u64 - windowed);
        let full = self.n_layers() as u64 - windowed - recurrent;
        let window = self.kv_layout.window_positions.min(self.max_context) as u64;
        let positions = full
            .saturating_mul(self.max_context as u64)
            .saturating_add(windowed.saturating_mul(window));
        (self.max_batch as u64)
            .saturating_mul(positions)
            .saturating_mul(self.kv_bytes_per_token_per_layer)
            .saturating_add(self.recurrent_bytes())
    }

    /// The recurrent layers' states of `max_batch` sequences (always on the device).
    fn recurrent_bytes(&self) -> u64 {
        (self.max_batch as u64).saturating_mul(self.kv_layout.recurrent_bytes_per_seq)
    }

    /// KV-cache bytes on the device: [`PlanInput::kv_bytes`], or only the recurrent states
    /// when the keys and values are on the host.
    pub fn device_kv_bytes(&self) -> u64 {
        if self.kv_host {
            self.recurrent_bytes()
        } else {
            self.kv_bytes()
        }
    }

    /// Device bytes that do not depend on placement: fixed parts, KV, workspace and reserve.
    pub(super) fn base_bytes(&self) -> u64 {
        self.fixed_bytes
            .saturating_add(self.device_kv_bytes())
            .saturating_add(self.workspace_bytes)
            .saturating_add(self.reserve_bytes)
    }
}

/// How the KV cache's bytes depend on the layers: how many keep only a window of positions
/// (sliding-window layers: Gemma 2/3's local layers, Mistral's), and what one token takes in
/// one layer in each format the cache can hold (what `ferry plan` shows each choice saves).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KvLayout {
    /// Layers that keep only a window of positions.
    pub window_layers: usize,
    /// The most positions such a layer holds ([`ferry_model::kv_cache::window_positions`]).
    pub window_positions: usize,
    /// `(format, bytes of one token in one layer)` for each format, e.g. `("q8_0", 408)`.
    pub per_token_by_format: Vec<(&'static str, u64)>,
    /// Layers that keep a fixed-size recurrent state instead of keys and values (Qwen3.5's
    /// Gated DeltaNet layers): no bytes per token.
    pub recurrent_layers: usize,
    /// Bytes of one sequence's recurrent states, all those layers together (f32, on the
    /// device even with `kv_offload`): the same at any context.
    pub recurrent_bytes_per_seq: u64,
    /// With latent attention (DeepSeek's MLA), the values one token's keys and values would
    /// take in one layer expanded per head (`heads * (qk_nope + rope + v_head_dim)`), which
    /// the cache does not hold: what `ferry plan` compares the latent's bytes with. `None`:
    /// the cache holds the heads' keys and values themselves.
    pub expanded_values_per_token: Option<usize>,
}

/// Where everything goes, and what it costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The mode this plan was made for.
    pub mode: OffloadMode,
    /// The device budget it was made against.
    pub budget_bytes: u64,
    /// Every decoder layer in order: a device prefix, then a host suffix.
    pub layers: Vec<LayerPlacement>,
    /// Fixed parts (always on the device).
    pub fixed_bytes: u64,
    /// Sum of the resident layers' bytes.
    pub resident_layer_bytes: u64,
    /// KV cache, on the device (or on the host when `kv_host`).
    pub kv_bytes: u64,
    /// Whether the KV cache lives in host memory, attention computed there (`kv_offload`).
    pub kv_host: bool,
    /// Tokens per sequence the KV cache is sized for.
    pub max_context: usize,
    /// Sequences the KV cache is sized for.
    pub max_batch: usize,
    /// The KV cache's dtype.
    pub kv_dtype: KvFormat,
    /// KV bytes of one token in one layer, in `kv_dtype`.
    pub kv_bytes_per_token_per_layer: u64,
    /// Which layers keep only a window, and what a token costs in each format.
    pub kv_layout: KvLayout,
    /// Where `max_context`, `max_batch` and `kv_dtype` came from.
    pub origins: CacheOrigins,
    /// Activation workspace on the device.
    pub workspace_bytes: u64,
    /// The most tokens one engine step computes, which sized the workspace (0: not told).
    pub max_step_tokens: usize,
    /// Reserve left to the runtime.
    pub reserve_bytes: u64,
    /// Device slots streamed layers rotate through: `min(prefetch + 1, streamed layers)`, 0 when
    /// nothing streams.
    pub slots: usize,
    /// Bytes per slot: what one slot holds to receive any streamed layer (0 when nothing
    /// streams).
    pub slot_bytes: u64,
    /// What each slot holds, when the input had layer layouts and something streams: the CUDA
    /// slot allocates exactly this, the CPU slot its two regions.
    pub slot_layout: Option<SlotLayout>,
    /// Device total: fixed + resident layers + slots + KV + workspace + reserve; never above
    /// `budget_bytes`.
    pub device_bytes: u64,
    /// Host total: the offloaded layers (pinned); in mode `model`, the whole model (its parked
    /// copy); and the KV cache when `kv_host`.
    pub host_bytes: u64,
    /// Bytes copied host-to-device per forward pass (the streamed layers).
    pub streamed_bytes_per_step: u64,
    /// The link bandwidth the estimate assumes.
    pub link_bandwidth: Option<u64>,
    /// Upper bound on decode tokens/s per sequence when copies are the bottleneck:
    /// `link_bandwidth / streamed_bytes_per_step`; `None` when nothing streams or no bandwidth.
    pub estimated_decode_tokens_per_s: Option<f64>,
    /// Where each expert of a MoE model lives, when experts are the placement units: every
    /// layer's other parts are then resident (`layers` all say device), `slots` / `slot_bytes`
    /// are the expert pool, `host_bytes` the offloaded experts and `streamed_bytes_per_step`
    /// the routed-expert estimate for one decode token.
    pub experts: Option<ExpertPlan>,
    /// Lines `ferry plan` adds below the table: what the planner and the fit degraded and why
    /// (`fitted: ...`), and what its caller adds (e.g. tensors dequantized at load).
    pub notes: Vec<String>,
}

impl Plan {
    /// Number of layers resident on the device.
    pub fn device_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.home == Home::Device)
            .count()
    }

    /// Number of layers streamed from the host.
    pub fn host_layers(&self) -> usize {
        self.layers.len() - self.device_layers()
    }

    /// KV-cache bytes on the device: `kv_bytes`, or only the recurrent states when the keys
    /// and values live on the host.
    pub fn device_kv_bytes(&self) -> u64 {
        if self.kv_host {
            self.recurrent_kv_bytes()
        } else {
            self.kv_bytes
        }
    }

    /// The part of `kv_bytes` that is recurrent state: `max_batch` sequences' fixed states.
    pub fn recurrent_kv_bytes(&self) -> u64 {
        (self.max_batch as u64).saturating_mul(self.kv_layout.recurrent_bytes_per_seq)
    }

    /// Bytes of the whole slot ring.
    pub fn slot_ring_bytes(&self) -> u64 {
        (self.slots as u64).saturating_mul(self.slot_bytes)
    }
}

/// The config spelling of a mode: `none`, `auto`, `sequential` or `model`.
pub fn mode_name(mode: OffloadMode) -> &'static str {
    match mode {
        OffloadMode::None => "none",
        OffloadMode::Auto => "auto",
        OffloadMode::Sequential => "sequential",
        OffloadMode::Model => "model",
    }
}

/// Resolves a configured budget against the device's free memory: a fixed size stays as is, a
/// fraction takes that share of `free_bytes` (rounded down). Fractions outside (0, 1] are an error.
pub fn resolve_budget(budget: MemoryBudget, free_bytes: u64) -> Result<u64> {
    match budget {
        MemoryBudget::Bytes(bytes) => Ok(bytes),
        MemoryBudget::FractionOfFree(fraction) => {
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(PlanError::InvalidInput(format!(
                    "budget fraction {fraction} is not in (0, 1]"
                )));
            }
            // f64 has 53 bits of mantissa: exact for any memory size below 8 PiB.
            Ok(((free_bytes as f64) * fraction).floor() as u64)
        }
    }
}

/// Device costs of every possible split point `k` (layers `0..k` resident, `k..n` streamed).
struct Costs<'a> {
    input: &'a PlanInput,
    /// `prefix[k]` = sum of `layers[..k]`.
    prefix: Vec<u64>,
    /// `slot_from[k]` = bytes of one slot that holds any of layers `k..` (0 for the empty
    /// suffix): their slot layout, or the largest of them without layouts.
    slot_from: Vec<u64>,
}

impl<'a> Costs<'a> {
    fn new(input: &'a PlanInput) -> Self {
        let layers = &input.layer_bytes;
        let mut prefix = Vec::with_capacity(layers.len() + 1);
        prefix.push(0u64);
        for &bytes in layers {
            let last = prefix.last().copied().unwrap_or(0);
            prefix.push(last.saturating_add(bytes));
        }
        let mut slot_from = vec![0u64; layers.len() + 1];
        if input.layer_layouts.is_empty() {
            for k in (0..layers.len()).rev() {
                slot_from[k] = slot_from[k + 1].max(layers[k]);
            }
        } else {
            let mut slot = SlotLayout::new(input.slot_kind);
            for (k, layout) in input.layer_layouts.iter().enumerate().rev() {
                slot.add(layout);
                slot_from[k] = slot.total_bytes();
            }
        }
        Costs {
            input,
            prefix,
            slot_from,
        }
    }

    fn n(&self) -> usize {
        self.input.n_layers()
    }

    /// `(slots, slot_bytes)` when layers `k..n` stream.
    fn ring(&self, k: usize) -> (usize, u64) {
        let streamed = self.n() - k;
        if streamed == 0 {
            (0, 0)
        } else {
            (
                (self.input.prefetch.saturating_add(1)).min(streamed),
                self.slot_from[k],
            )
        }
    }

    /// Device bytes with layers `0..k` resident.
    fn device(&self, k: usize) -> u64 {
        let (slots, slot_bytes) = self.ring(k);
        self.input
            .base_bytes()
            .saturating_add(self.prefix[k])
            .saturating_add((slots as u64).saturating_mul(slot_bytes))
    }

    fn fits(&self, k: usize) -> bool {
        self.device(k) <= self.input.budget_bytes
    }

    /// The largest resident prefix that fits, if any does.
    fn best_split(&self) -> Option<usize> {
        (0..=self.n()).rev().find(|&k| self.fits(k))
    }

    /// The split with the smallest device footprint (for error messages).
    fn cheapest_split(&self) -> usize {
        (0..=self.n()).min_by_key(|&k| self.device(k)).unwrap_or(0)
    }

    /// Builds the plan with layers `0..k` resident.
    fn build(&self, k: usize) -> Plan {
        let input = self.input;
        let n = self.n();
        let (slots, slot_bytes) = self.ring(k);
        let layers: Vec<LayerPlacement> = input
            .layer_bytes
            .iter()
            .enumerate()
            .map(|(index, &bytes)| LayerPlacement {
                index,
                home: if index < k { Home::Device } else { Home::Host },
                bytes,
            })
            .collect();
        let streamed = self.prefix[n].saturating_sub(self.prefix[k]);
        let host_weights = if input.mode == OffloadMode::Model {
            input.fixed_bytes.saturating_add(self.prefix[n])
        } else {
            streamed
        };
        let host_bytes = host_weights.saturating_add(input.kv_bytes() - input.device_kv_bytes());
        let slot_layout = (slots > 0 && !input.layer_layouts.is_empty())
            .then(|| SlotLayout::of(input.slot_kind, &input.layer_layouts[k..]));
        let estimate = match (input.link_bandwidth, streamed) {
            (Some(bandwidth), s) if s > 0 => Some(bandwidth as f64 / s as f64),
            _ => None,
        };
        Plan {
            mode: input.mode,
            budget_bytes: input.budget_bytes,
            layers,
            fixed_bytes: input.fixed_bytes,
            resident_layer_bytes: self.prefix[k],
            kv_bytes: input.kv_bytes(),
            kv_host: input.kv_host,
            max_context: input.max_context,
            max_batch: input.max_batch,
            kv_dtype: input.kv_dtype,
            kv_bytes_per_token_per_layer: input.kv_bytes_per_token_per_layer,
            kv_layout: input.kv_layout.clone(),
            origins: input.origins,
            workspace_bytes: input.workspace_bytes,
            max_step_tokens: input.max_step_tokens,
            reserve_bytes: input.reserve_bytes,
            slots,
            slot_bytes,
            slot_layout,
            device_bytes: self.device(k),
            host_bytes,
            streamed_bytes_per_step: streamed,
            link_bandwidth: input.link_bandwidth,
            estimated_decode_tokens_per_s: estimate,
            experts: None,
            notes: Vec::new(),
        }
    }

    /// The plan with experts as placement units, if the input asks for it and it fits
    /// ([`experts_plan::place`]).
    fn experts(&self, spread: bool) -> Option<Plan> {
        let input = self.input;
        let routing = input.experts.as_ref()?;
        if input.layer_layouts.is_empty() {
            return None;
        }
        let available = input.budget_bytes.checked_sub(input.base_bytes())?;
        let place = |scratch| {
            experts_plan::place(
                &input.layer_layouts,
                input.slot_kind,
                routing,
                available,
                spread,
                scratch,
            )
        };
        // The prefill scratch slots when the budget holds them beside the pool; else none,
        // and the plan says so (a degrade, not a refusal).
        let (placed, dropped_scratch) = match place(PREFILL_SCRATCH_SLOTS) {
            Some(placed) => (placed, false),
            None => (place(0)?, true),
        };
        let mut plan = self.build(self.n());
        plan.resident_layer_bytes = placed.resident_bytes();
        plan.slots = placed.slot_count();
        plan.slot_bytes = placed.slot.total_bytes();
        plan.slot_layout = Some(placed.slot.clone());
        plan.device_bytes = input
            .base_bytes()
            .saturating_add(placed.resident_bytes())
            .saturating_add(placed.pool_bytes());
        plan.host_bytes = placed
            .host_bytes()
            .saturating_add(input.kv_bytes() - input.device_kv_bytes());
        plan.streamed_bytes_per_step = placed.bytes_per_token;
        plan.estimated_decode_tokens_per_s = match (input.link_bandwidth, placed.bytes_per_token) {
            (Some(bandwidth), s) if s > 0 => Some(bandwidth as f64 / s as f64),
            _ => None,
        };
        if dropped_scratch {
            let scratch = (PREFILL_SCRATCH_SLOTS as u64).saturating_mul(plan.slot_bytes);
            plan.notes.push(format!(
                "fitted: no prefill scratch slots beside the expert pool, because the budget {} does not hold their {} with the pool (a prefill streams its experts through the pool, where it may evict the experts decoding keeps hot); a budget of {} keeps them",
                format_bytes(input.budget_bytes),
                format_bytes(scratch),
                format_bytes(plan.device_bytes.saturating_add(scratch)),
            ));
        }
        plan.experts = Some(placed);
        (plan.device_bytes <= input.budget_bytes).then_some(plan)
    }

    /// The refusal of an expert plan that does not fit even with every routed expert on the
    /// host and no scratch slots, when that is cheaper than streaming whole layers (`None`
    /// otherwise: the ring's refusal names the smaller footprint).
    fn experts_error(&self, mode: &'static str, ring_needed: u64) -> Option<PlanError> {
        let input = self.input;
        let routing = input.experts.as_ref()?;
        let (parts, slot_bytes) = experts_plan::least_parts(&input.layer_layouts, input.slot_kind)?;
        let slots = routing.pool_slots.unwrap_or(routing.n_used).max(1);
        let needed = input
            .base_bytes()
            .saturating_add(parts)
            .saturating_add((slots as u64).saturating_mul(slot_bytes));
        (needed < ring_needed).then_some(PlanError::ExpertsDoNotFit {
            mode,
            needed,
            budget: input.budget_bytes,
            slots,
            slot_bytes,
        })
    }
}

/// Places every decoder layer according to `input.mode` (DESIGN.md 4.2):
///
/// - `none`: everything on the device; if it does not fit, [`PlanError::DoesNotFit`] with the bytes
///   needed and available and which mode or dtype would fit.
/// - `auto`: fixed parts, KV, workspace, reserve and the slot ring first, then layers in order while
///   they fit, the rest on the host. With room for every layer it equals `none` (no slots).
///   [`PlanError::RingDoesNotFit`] when no split fits at all.
/// - `sequential`: every layer on the host, only the ring on the device.
/// - `model`: sized like `none` (the whole model is resident while active); its error,
///   [`PlanError::CannotBeResident`], says the model cannot be made resident with this budget.
///
/// Every successful plan has `device_bytes <= budget_bytes`.
pub fn plan(input: &PlanInput) -> Result<Plan> {
    if !input.layer_layouts.is_empty() && input.layer_layouts.len() != input.n_layers() {
        return Err(PlanError::InvalidInput(format!(
            "{} layer layouts for {} layers",
            input.layer_layouts.len(),
            input.n_layers()
        )));
    }
    if let (Some(routing), false) = (&input.experts, input.layer_layouts.is_empty()) {
        experts_plan::pinned_layers(&input.layer_layouts, routing)
            .map_err(PlanError::InvalidInput)?;
    }
    let costs = Costs::new(input);
    let n = costs.n();
    match input.mode {
        OffloadMode::None | OffloadMode::Model => {
            if costs.fits(n) {
                return Ok(costs.build(n));
            }
            let needed = costs.device(n);
            let budget = input.budget_bytes;
            let advice = advice(input);
            Err(if input.mode == OffloadMode::None {
                PlanError::DoesNotFit {
                    needed,
                    budget,
                    advice,
                }
            } else {
                PlanError::CannotBeResident {
                    needed,
                    budget,
                    advice,
                }
            })
        }
        OffloadMode::Auto => {
            let pinned = input
                .experts
                .as_ref()
                .is_some_and(|e| !e.host_layers.is_none());
            if !costs.fits(n) || pinned {
                if let Some(plan) = costs.experts(true) {
                    return Ok(plan);
                }
            }
            match costs.best_split() {
                Some(k) => Ok(costs.build(k)),
                None => Err(ring_error("auto", &costs, costs.cheapest_split())),
            }
        }
        OffloadMode::Sequential => {
            if let Some(plan) = costs.experts(false) {
                return Ok(plan);
            }
            if costs.fits(0) {
                Ok(costs.build(0))
            } else {
                Err(ring_error("sequential", &costs, 0))
            }
        }
    }
}

/// The refusal of mode `auto` or `sequential`: the smaller of the whole-layer ring's least
/// footprint (layers `0..k` resident) and an expert plan's.
fn ring_error(mode: &'static str, costs: &Costs<'_>, k: usize) -> PlanError {
    let (slots, slot_bytes) = costs.ring(k);
    if let Some(experts) = costs.experts_error(mode, costs.device(k)) {
        return experts;
    }
    PlanError::RingDoesNotFit {
        mode,
        needed: costs.device(k),
        budget: costs.input.budget_bytes,
        slots,
        slot_bytes,
    }
}

/// Which other modes or dtypes would fit, for the `none` / `model` errors.
fn advice(input: &PlanInput) -> String {
    let mut options = Vec::new();
    let n = input.n_layers();
    let with_mode = |mode| PlanInput {
        mode,
        ..input.clone()
    };
    if let Ok(auto) = plan(&with_mode(OffloadMode::Auto)) {
        options.push(format!(
            "--offload auto (fits with {} of {n} layers on the device)",
            auto.device_layers()
        ));
    }
    let sequential = Costs::new(input).device(0);
    let sequential_fits = sequential <= input.budget_bytes;
    if sequential_fits {
        options.push(format!(
            "--offload sequential (needs {})",
            format_bytes(sequential)
        ));
    }
    for alternative in &input.dtype_alternatives {
        let resident = PlanInput {
            mode: OffloadMode::None,
            layer_bytes: alternative.layer_bytes.clone(),
            fixed_bytes: alternative.fixed_bytes,
            dtype_alternatives: Vec::new(),
            layer_layouts: Vec::new(),
            ..input.clone()
        };
        let needed = Costs::new(&resident).device(resident.n_layers());
        if needed <= input.budget_bytes {
            options.push(format!(
                "{} (needs {})",
                alternative.label,
                format_bytes(needed)
            ));
        }
    }
    if options.is_empty() {
        let costs = Costs::new(input);
        format!(
            "no offload mode fits: streaming every layer it can still needs {} (fixed parts, KV cache, workspace, reserve and slots)",
            format_bytes(costs.device(costs.cheapest_split()))
        )
    } else {
        format!("use {}", options.join(" or "))
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
