//! The offload layer's error types: placing a model ([`PlanError`]) and running the offload
//! engine ([`OffloadError`]). Sizing failures are model errors (the checkpoint's header, spec or
//! tensor table), reported as [`ferry_model::ModelError`] exactly as the loader reports them.

use std::path::PathBuf;

use thiserror::Error;

/// Result alias for the offload layer.
pub type Result<T> = std::result::Result<T, PlanError>;

/// Failures while placing a model on the device and host tiers.
#[derive(Debug, Error)]
pub enum PlanError {
    /// Mode `none`: the whole model does not fit in the budget.
    #[error("the model needs {needed} on the device, budget {budget}: {advice}", needed = crate::units::format_bytes(*.needed), budget = crate::units::format_bytes(*.budget))]
    DoesNotFit {
        /// Device bytes a fully resident model needs.
        needed: u64,
        /// The device budget in bytes.
        budget: u64,
        /// Which other mode or dtype would fit (or that none does).
        advice: String,
    },
    /// Mode `model`: the model cannot be made resident while active.
    #[error("offload mode `model` cannot make the model resident: it needs {needed} on the device, budget {budget}: {advice}", needed = crate::units::format_bytes(*.needed), budget = crate::units::format_bytes(*.budget))]
    CannotBeResident {
        /// Device bytes the resident model needs.
        needed: u64,
        /// The device budget in bytes.
        budget: u64,
        /// Which other mode or dtype would fit (or that none does).
        advice: String,
    },
    /// Modes `auto` and `sequential`: not even the fixed parts, KV cache, workspace, reserve and a
    /// slot ring for the streamed layers fit.
    #[error("offload mode `{mode}` needs at least {needed} on the device (fixed parts, KV cache, workspace, reserve and {slots} slot(s) of {slot}), budget {budget}", needed = crate::units::format_bytes(*.needed), budget = crate::units::format_bytes(*.budget), slot = crate::units::format_bytes(*.slot_bytes))]
    RingDoesNotFit {
        /// `auto` or `sequential`.
        mode: &'static str,
        /// The smallest device footprint the mode can have.
        needed: u64,
        /// The device budget in bytes.
        budget: u64,
        /// Slots in that smallest footprint.
        slots: usize,
        /// Bytes per slot (the largest streamed layer).
        slot_bytes: u64,
    },
    /// A mixture of experts placed expert by expert does not fit even with every routed expert
    /// on the host, and streaming whole layers needs more still.
    #[error("offload mode `{mode}` needs at least {needed} on the device with every routed expert on the host (fixed parts, KV cache, workspace, reserve, every layer's attention, norms and router, and an expert pool of {slots} slot(s) of {slot}), budget {budget}", needed = crate::units::format_bytes(*.needed), budget = crate::units::format_bytes(*.budget), slot = crate::units::format_bytes(*.slot_bytes))]
    ExpertsDoNotFit {
        /// `auto` or `sequential`.
        mode: &'static str,
        /// The smallest device footprint of an expert plan.
        needed: u64,
        /// The device budget in bytes.
        budget: u64,
        /// Slots of the smallest expert pool (one token's experts of one layer).
        slots: usize,
        /// Bytes per slot (the largest expert).
        slot_bytes: u64,
    },
    /// What the plan keeps in host memory (offloaded weights, pinned or registered, and a KV
    /// cache there) exceeds what the host has free.
    #[error("the plan keeps {needed} in host memory (offloaded weights pinned or registered for the copies, and any KV cache there{device}), but the host has {free} available (MemAvailable, a tenth kept back): give the device a larger budget (`offload.gpu_memory`), a shorter `max_context`, or free host memory", needed = crate::units::format_bytes(*.needed), free = crate::units::format_bytes(*.free), device = device_share(*.device))]
    HostMemory {
        /// Host bytes of the plan (with its device bytes where the device is the host).
        needed: u64,
        /// Host bytes available to it.
        free: u64,
        /// The plan's device bytes counted in `needed` (the CPU device, whose memory is the
        /// host's); 0 elsewhere.
        device: u64,
    },
    /// The KV cache and workspace that `max_context` and `max_batch` ask for do not fit the
    /// budget, while smaller values would ([`super::fit`]).
    #[error("{0}")]
    CacheDoesNotFit(Box<CacheOverflow>),
    /// An input to the planner is out of range (e.g. a budget fraction outside (0, 1]).
    #[error("invalid plan input: {0}")]
    InvalidInput(String),
}

/// What [`PlanError::CacheDoesNotFit`] says: the values planned, their cost, the planner's
/// refusal, and what would fit instead.
#[derive(Debug, Error)]
#[error("{asked} need {kv} of KV cache ({kv_dtype}) and {workspace} of workspace, and {cause}; {instead}", kv = crate::units::format_bytes(*.kv_bytes), workspace = crate::units::format_bytes(*.workspace_bytes))]
pub struct CacheOverflow {
    /// The values planned and where they came from, e.g. "`max_context` 1048576 (set) with
    /// `max_batch` 8 (the default)".
    pub asked: String,
    /// Their KV-cache bytes.
    pub kv_bytes: u64,
    /// The KV cache's dtype.
    pub kv_dtype: &'static str,
    /// Their workspace bytes.
    pub workspace_bytes: u64,
    /// The planner's refusal with those values.
    pub cause: PlanError,
    /// What would fit instead: the largest values at this budget ("the largest that fit:
    /// `max_context` 2048 with `max_batch` 8") and the smallest budget for these values.
    pub instead: String,
}

/// Failures of the running offload engine: filling the host store, the slot ring and the copy
/// thread, and handing layers to the forward loop.
#[derive(Debug, Error)]
pub enum OffloadError {
    /// Placement failed (including "does not fit" with advice).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A weight file could not be opened, mapped or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A tensor of an offloaded layer is missing, malformed or of an unsupported type.
    #[error("offloaded weights: {0}")]
    Weights(String),
    /// A tensor operation failed while filling a slab or a slot.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// Loading the resident parts of the model failed.
    #[error(transparent)]
    Model(#[from] ferry_model::ModelError),
    /// The CUDA layer failed (or this build has none).
    #[error(transparent)]
    Gpu(#[from] ferry_gpu::GpuError),
    /// The copy thread stopped or could not be started.
    #[error("copy thread: {0}")]
    CopyThread(String),
    /// Mode `model`: the device room a model needs stayed held by other models' running requests
    /// for longer than the wait timeout.
    #[error("busy: {0}")]
    Busy(String),
    /// The forward loop asked for a layer the store does not have.
    #[error("layer {index} is not in the weight store (it has {n_layers} layers)")]
    NoSuchLayer {
        /// The requested layer.
        index: usize,
        /// Layers in the model.
        n_layers: usize,
    },
}

impl From<super::buffer::WriteError> for OffloadError {
    fn from(err: super::buffer::WriteError) -> Self {
        OffloadError::Weights(err.to_string())
    }
}

impl From<OffloadError> for ferry_model::ModelError {
    fn from(err: OffloadError) -> Self {
        match err {
            OffloadError::Model(inner) => inner,
            OffloadError::Candle(inner) => ferry_model::ModelError::Candle(inner),
            other => ferry_model::ModelError::Source(other.to_string()),
        }
    }
}

/// The part of a [`PlanError::HostMemory`] message naming the CPU device's own bytes.
fn device_share(device: u64) -> String {
    match device {
        0 => String::new(),
        bytes => format!(
            ", and the CPU device's {} of weights, KV cache and workspace, also host memory",
            crate::units::format_bytes(bytes)
        ),
    }
}
