//! Where an offloaded layer's tensors sit in its host slab ([`LayerLayout`]) and what a device
//! slot must hold to receive any of the streamed layers ([`SlotLayout`]). Both are computed from
//! the checkpoint's tensor table and the loader's [`Holding`] rules before any weight is read, so
//! the planner sizes slabs and slots exactly as the host store and the slots allocate them.
//!
//! A layer layout has two regions, each a run of tensors starting at multiples of
//! [`TENSOR_ALIGN`] (256 bytes, the alignment cuBLAS wants for the dense views it multiplies):
//! the *block* region (GGUF block-quantized matrices as their raw bytes) and the *dense* region
//! (every other tensor, in the compute dtype).
//!
//! A slot is held differently per device ([`SlotKind`]):
//!
//! - CPU: one block arena and one dense region, each as large as the largest streamed layer's;
//!   every layer is viewed at its own offsets.
//! - CUDA: one dense region as on the CPU, but quantized matrices cannot be views (candle's
//!   quantized CUDA storage owns its buffer), so the slot keeps one buffer per (part, unit, GGML type,
//!   shape) seen across the streamed layers, each with candle's padding of
//!   [`CUDA_ROW_PADDING`] elements. A mixed-type file (Q4_K_M: `attn_v` / `ffn_down` are q6_K in
//!   some layers and q4_K in others) thus needs more than its largest layer: the union.

use candle_core::quantized::GgmlDType;
use candle_core::Device;

use ferry_model::checkpoint::Checkpoint;
use ferry_model::loader::{Holding, Role, TensorKind};
use ferry_model::tensors::Part;

/// Alignment of every tensor inside a slab or slot region.
pub const TENSOR_ALIGN: usize = 256;

/// Elements of zero padding candle's quantized CUDA storage allocates after a matrix
/// (`candle_core::quantized::cuda::MATRIX_ROW_PADDING`: its kernels read whole padded rows).
pub const CUDA_ROW_PADDING: usize = 512;

/// Rounds up to [`TENSOR_ALIGN`].
pub fn align_up(n: usize) -> usize {
    n.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN
}

/// Bytes candle's CUDA storage allocates for a quantized matrix of `elems` elements
/// (`QCudaStorage::zeros` and `load_quantized`: the data plus [`CUDA_ROW_PADDING`] elements).
pub fn cuda_quantized_bytes(dtype: GgmlDType, elems: usize) -> usize {
    (elems + CUDA_ROW_PADDING).div_ceil(dtype.block_size()) * dtype.type_size()
}

/// One tensor of a layer layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// Name in the weight file.
    pub name: String,
    /// The `LayerWeights` part it fills.
    pub part: Part,
    /// Which of the layer's tensors of `part` it is: the expert index for MoE expert parts, 0
    /// for every other part (a layer has one of those).
    pub unit: usize,
    /// Storage kind and type.
    pub kind: TensorKind,
    /// Shape, row-major (`[out, in]` for matrices).
    pub shape: Vec<usize>,
    /// Byte offset inside its region (block or dense), a multiple of [`TENSOR_ALIGN`].
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

impl TensorEntry {
    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One decoder layer's tensors as a host slab holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerLayout {
    /// Decoder layer index.
    pub index: usize,
    /// Tensors, in `Part` order.
    pub entries: Vec<TensorEntry>,
    /// Bytes of the block region (a multiple of [`TENSOR_ALIGN`]).
    pub blocks_len: usize,
    /// Bytes of the dense region (a multiple of [`TENSOR_ALIGN`]).
    pub dense_len: usize,
}

impl LayerLayout {
    /// Lays out layer `index` of `checkpoint`, held as `holding` says (blocks first, then
    /// dense, each tensor aligned).
    pub fn of(
        checkpoint: &Checkpoint,
        holding: &Holding,
        index: usize,
    ) -> ferry_model::Result<Self> {
        let layer = checkpoint.tensors().layer(index)?;
        let (mut blocks_len, mut dense_len) = (0, 0);
        let mut entries = Vec::with_capacity(layer.tensors.len());
        for (part, record) in &layer.tensors {
            let role = if part.is_matrix() {
                Role::Matrix
            } else {
                Role::Vector
            };
            let kind = holding.kind(role, record)?;
            let len = Holding::bytes(kind, record);
            let cursor = match kind {
                TensorKind::Blocks(_) => &mut blocks_len,
                TensorKind::Dense(_) => &mut dense_len,
            };
            let unit = entries
                .iter()
                .filter(|e: &&TensorEntry| e.part == *part)
                .count();
            entries.push(TensorEntry {
                name: record.name.clone(),
                part: *part,
                unit,
                kind,
                shape: record.shape.clone(),
                offset: *cursor,
                len,
            });
            *cursor = align_up(*cursor + len);
        }
        Ok(Self {
            index,
            entries,
            blocks_len,
            dense_len,
        })
    }

    /// Weight bytes of the layer's tensors (no padding).
    pub fn weight_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.len as u64).sum()
    }

    /// Bytes of the slab: both regions, with their padding.
    pub fn slab_bytes(&self) -> u64 {
        (self.blocks_len + self.dense_len) as u64
    }

    /// Bytes a device of `kind` holds for this layer when it is resident (loaded tensor by
    /// tensor): the weight bytes, plus candle's padding of each quantized matrix on CUDA.
    pub fn resident_bytes(&self, kind: SlotKind) -> u64 {
        self.entries
            .iter()
            .map(|e| held_bytes(e.kind, e.len, e.elem_count(), kind))
            .sum()
    }
}

/// The experts of a MoE layer: which units of `layer` are experts (each expert's gate, up and
/// down), in expert order.
pub fn expert_units(layer: &LayerLayout) -> usize {
    layer
        .entries
        .iter()
        .filter(|e| e.part.is_expert())
        .map(|e| e.unit + 1)
        .max()
        .unwrap_or(0)
}

impl LayerLayout {
    /// The layout of expert `expert` of this layer on its own (its gate, up and down, unit 0,
    /// each region starting at 0): the host slab of one offloaded expert, and what an expert
    /// slot must hold to receive it.
    pub fn expert(&self, expert: usize) -> LayerLayout {
        let (mut blocks_len, mut dense_len) = (0, 0);
        let mut entries = Vec::with_capacity(3);
        for entry in &self.entries {
            if !entry.part.is_expert() || entry.unit != expert {
                continue;
            }
            let cursor = match entry.kind {
                TensorKind::Blocks(_) => &mut blocks_len,
                TensorKind::Dense(_) => &mut dense_len,
            };
            entries.push(TensorEntry {
                unit: 0,
                offset: *cursor,
                ..entry.clone()
            });
            *cursor = align_up(*cursor + entry.len);
        }
        LayerLayout {
            index: self.index,
            entries,
            blocks_len,
            dense_len,
        }
    }

    /// The layout of everything but the experts (attention, norms, router): what stays on
    /// the device when the experts are placed one by one. Offsets are the layer's.
    pub fn without_experts(&self) -> LayerLayout {
        LayerLayout {
            entries: self
                .entries
                .iter()
                .filter(|e| !e.part.is_expert())
                .cloned()
                .collect(),
            ..self.clone()
        }
    }
}

/// Bytes a device of `slot_kind` holds for one tensor of `len` bytes and `elems` elements held
/// as `kind`.
pub fn held_bytes(kind: TensorKind, len: usize, elems: usize, slot_kind: SlotKind) -> u64 {
    match (kind, slot_kind) {
        (TensorKind::Blocks(ty), SlotKind::Cuda) => match ty.to_candle() {
            Some(dtype) => cuda_quantized_bytes(dtype, elems) as u64,
            None => len as u64,
        },
        _ => len as u64,
    }
}

/// How the compute device holds a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotKind {
    /// The CPU device: a block arena viewed at each layer's offsets, and a dense region.
    #[default]
    Cpu,
    /// A CUDA device: one padded buffer per (part, unit, type, shape) of quantized matrix, and
    /// a dense region.
    Cuda,
}

impl SlotKind {
    /// The slot kind of `device`.
    pub fn for_device(device: &Device) -> Self {
        if device.is_cuda() {
            SlotKind::Cuda
        } else {
            SlotKind::Cpu
        }
    }

    /// `"cpu"` or `"cuda"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotKind::Cpu => "cpu",
            SlotKind::Cuda => "cuda",
        }
    }
}

/// One quantized matrix buffer of a CUDA slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMatrix {
    /// The part it receives.
    pub part: Part,
    /// Which of the layer's tensors of that part ([`TensorEntry::unit`]: each MoE expert has
    /// its own buffer).
    pub unit: usize,
    /// Its GGML type.
    pub dtype: GgmlDType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Bytes of the matrix data (what a fill copies).
    pub bytes: usize,
    /// Bytes to allocate: the data plus candle's row padding ([`cuda_quantized_bytes`]).
    pub allocated: usize,
}

/// What one slot of the ring holds: enough for any of the streamed layers it was made for.
///
/// CPU: `blocks_bytes` + `dense_bytes`, `matrices` empty. CUDA: `dense_bytes` + one allocation
/// per entry of `matrices`, `blocks_bytes` 0. A CUDA slot allocates exactly this: a dense tensor
/// of `dense_bytes` and, per [`SlotMatrix`], `QCudaStorage::zeros(elems, dtype)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLayout {
    /// How the device holds it.
    pub kind: SlotKind,
    /// Bytes of the dense region: the largest dense region of the layers.
    pub dense_bytes: usize,
    /// CPU: bytes of the block arena, the largest block region of the layers; CUDA: 0.
    pub blocks_bytes: usize,
    /// CUDA: one buffer per (part, unit, type, shape) over the layers, in first-seen order;
    /// CPU: none.
    pub matrices: Vec<SlotMatrix>,
}

impl SlotLayout {
    /// An empty slot of `kind`.
    pub fn new(kind: SlotKind) -> Self {
        Self {
            kind,
            dense_bytes: 0,
            blocks_bytes: 0,
            matrices: Vec::new(),
        }
    }

    /// The slot that can hold any of `layers`.
    pub fn of<'a>(kind: SlotKind, layers: impl IntoIterator<Item = &'a LayerLayout>) -> Self {
        let mut slot = Self::new(kind);
        for layer in layers {
            slot.add(layer);
        }
        slot
    }

    /// Grows the slot so that it can also hold `layer`.
    pub fn add(&mut self, layer: &LayerLayout) {
        self.dense_bytes = self.dense_bytes.max(layer.dense_len);
        match self.kind {
            SlotKind::Cpu => self.blocks_bytes = self.blocks_bytes.max(layer.blocks_len),
            SlotKind::Cuda => {
                for entry in &layer.entries {
                    let Some(dtype) = candle_blocks(entry) else {
                        continue;
                    };
                    if self.matrix(entry).is_none() {
                        self.matrices.push(SlotMatrix {
                            part: entry.part,
                            unit: entry.unit,
                            dtype,
                            shape: entry.shape.clone(),
                            bytes: entry.len,
                            allocated: cuda_quantized_bytes(dtype, entry.elem_count()),
                        });
                    }
                }
            }
        }
    }

    /// The buffer of a CUDA slot that receives `entry`, if it has one.
    pub fn matrix(&self, entry: &TensorEntry) -> Option<&SlotMatrix> {
        let dtype = candle_blocks(entry)?;
        self.matrices.iter().find(|m| {
            m.part == entry.part
                && m.unit == entry.unit
                && m.dtype == dtype
                && m.shape == entry.shape
        })
    }

    /// Device bytes of the slot.
    pub fn total_bytes(&self) -> u64 {
        let matrices: usize = self.matrices.iter().map(|m| m.allocated).sum();
        (self.dense_bytes + self.blocks_bytes + matrices) as u64
    }
}

/// candle's type of `entry`'s blocks, if it is held as blocks of a type candle has (on CUDA,
/// every quantized matrix: the others are held dense).
pub fn candle_blocks(entry: &TensorEntry) -> Option<GgmlDType> {
    match entry.kind {
        TensorKind::Blocks(ty) => ty.to_candle(),
        TensorKind::Dense(_) => None,
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
pub(super) mod tests;
