//! The host tier of the offload engine: [`HostStore`] keeps every offloaded decoder layer in one
//! contiguous slab, filled once at start and read by the copy engine for every forward pass.
//!
//! A slab holds two regions, each a run of 8-byte-aligned tensors:
//!
//! - the *block* region: GGUF block-quantized matrices as their raw bytes, copied straight from
//!   the memory-mapped file (a Q4 model streams about a quarter of the bytes of bf16);
//! - the *dense* region: every other tensor (norms, biases, and all matrices when the model runs
//!   dense) in the compute dtype.
//!
//! The device slots ([`super::slot`]) mirror that layout, so filling a slot is two memcpys. No
//! tensor of an offloaded layer is ever loaded whole: at most one tensor is converted at a time
//! when a dense dtype is asked for, so host memory for offloaded weights is the slabs and nothing
//! else. On CUDA the slabs are pinned allocations ([`HostMemory::Pinned`]); on the CPU they are
//! plain heap buffers.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::buffer::{AlignedBytes, HostMemory};
use super::error::OffloadError;
use crate::model::spec::ModelSpec;

/// Result alias for the running offload engine.
pub type Result<T> = std::result::Result<T, OffloadError>;

/// Alignment of every tensor inside a slab or slot region (covers f16/f32 and all GGML blocks).
pub const TENSOR_ALIGN: usize = 8;

/// Which field of [`crate::model::weights::LayerWeights`] a tensor fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// RMSNorm before attention.
    AttnNorm,
    /// Query projection weight / bias.
    Q,
    /// Query bias.
    QBias,
    /// Key projection weight.
    K,
    /// Key bias.
    KBias,
    /// Value projection weight.
    V,
    /// Value bias.
    VBias,
    /// Attention output projection.
    O,
    /// RMSNorm before the MLP.
    FfnNorm,
    /// SwiGLU gate.
    Gate,
    /// SwiGLU up projection.
    Up,
    /// SwiGLU down projection.
    Down,
}

impl Part {
    /// Every part with its GGUF name suffix and HF name suffix (after the layer prefix), and
    /// whether it is optional (biases).
    const ALL: [(Part, &'static str, &'static str, bool); 12] = [
        (
            Part::AttnNorm,
            "attn_norm.weight",
            "input_layernorm.weight",
            false,
        ),
        (Part::Q, "attn_q.weight", "self_attn.q_proj.weight", false),
        (Part::QBias, "attn_q.bias", "self_attn.q_proj.bias", true),
        (Part::K, "attn_k.weight", "self_attn.k_proj.weight", false),
        (Part::KBias, "attn_k.bias", "self_attn.k_proj.bias", true),
        (Part::V, "attn_v.weight", "self_attn.v_proj.weight", false),
        (Part::VBias, "attn_v.bias", "self_attn.v_proj.bias", true),
        (
            Part::O,
            "attn_output.weight",
            "self_attn.o_proj.weight",
            false,
        ),
        (
            Part::FfnNorm,
            "ffn_norm.weight",
            "post_attention_layernorm.weight",
            false,
        ),
        (Part::Gate, "ffn_gate.weight", "mlp.gate_proj.weight", false),
        (Part::Up, "ffn_up.weight", "mlp.up_proj.weight", false),
        (Part::Down, "ffn_down.weight", "mlp.down_proj.weight", false),
    ];

    /// Whether this part is a projection matrix (may stay block-quantized).
    fn is_matrix(self) -> bool {
        matches!(
            self,
            Part::Q | Part::K | Part::V | Part::O | Part::Gate | Part::Up | Part::Down
        )
    }
}

/// How a tensor is stored in a slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// GGUF block-quantized bytes, in the block region.
    Blocks(GgmlDType),
    /// Dense elements of the compute dtype, in the dense region.
    Dense(DType),
}

/// One tensor of an offloaded layer.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// Name in the weight file.
    pub name: String,
    /// The `LayerWeights` field it fills.
    pub part: Part,
    /// Storage kind and type.
    pub kind: TensorKind,
    /// Shape, row-major (`[out, in]` for matrices).
    pub shape: Vec<usize>,
    /// Byte offset inside its region (block or dense).
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// One offloaded layer: its slab and the table of its tensors.
#[derive(Debug)]
pub struct HostLayer {
    /// Decoder layer index.
    pub index: usize,
    /// Block region followed by the dense region (`blocks_len` is where dense starts).
    slab: AlignedBytes,
    /// Tensors, in `Part` order.
    pub entries: Vec<TensorEntry>,
    /// Bytes of the block region (padded to [`TENSOR_ALIGN`]).
    pub blocks_len: usize,
    /// Bytes of the dense region (padded to [`TENSOR_ALIGN`]).
    pub dense_len: usize,
}

impl HostLayer {
    /// The block region's bytes.
    pub fn blocks(&self) -> &[u8] {
        &self.slab.as_bytes()[..self.blocks_len]
    }

    /// The dense region's bytes.
    pub fn dense(&self) -> &[u8] {
        &self.slab.as_bytes()[self.blocks_len..self.blocks_len + self.dense_len]
    }

    /// Weight bytes of the layer's tensors (no padding).
    pub fn weight_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.len as u64).sum()
    }

    /// Bytes the slab occupies in host memory.
    pub fn allocated_bytes(&self) -> u64 {
        self.slab.capacity_bytes() as u64
    }

    /// Whether the slab is page-locked (CUDA devices).
    pub fn is_pinned(&self) -> bool {
        self.slab.is_pinned()
    }
}

/// Every offloaded layer's slab, keyed by layer index.
#[derive(Debug)]
pub struct HostStore {
    layers: Vec<HostLayer>,
    dense_dtype: DType,
}

/// A tensor waiting to be placed: where it comes from and how it will be stored.
struct Pending<'a> {
    entry: TensorEntry,
    source: Source<'a>,
}

impl<'a> Pending<'a> {
    /// A tensor not yet placed (`place` sets its offset and length).
    fn new(
        name: String,
        part: Part,
        kind: TensorKind,
        shape: Vec<usize>,
        source: Source<'a>,
    ) -> Self {
        let entry = TensorEntry {
            name,
            part,
            kind,
            shape,
            offset: 0,
            len: 0,
        };
        Self { entry, source }
    }
}

/// The bytes a pending tensor is made of.
enum Source<'a> {
    /// Copied as is (raw GGUF blocks, or dense bytes already in the compute dtype).
    Raw(&'a [u8]),
    /// Converted: a dense tensor in the compute dtype.
    Converted(Tensor),
}

impl HostStore {
    /// Fills slabs for `layers` of a GGUF file. `dense`: `None` keeps block-quantized matrices as
    /// their raw bytes (activations f32); `Some(dtype)` dequantizes everything to `dtype`, like the
    /// loader does. Slabs are allocated in `memory`.
    pub fn from_gguf(
        path: &Path,
        content: &Content,
        layers: &[usize],
        dense: Option<DType>,
        memory: &HostMemory,
    ) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|source| io(path, source))?;
        // SAFETY: the file is mapped read-only and only read while this function runs; like every
        // mmap-based loader we rely on it not being truncated meanwhile.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| io(path, source))?;
        let compute = dense.unwrap_or(DType::F32);
        let base = content.tensor_data_offset as usize;
        let mut out = Vec::with_capacity(layers.len());
        for &index in layers {
            let mut pending = Vec::new();
            for (part, suffix, _, optional) in Part::ALL {
                let name = format!("blk.{index}.{suffix}");
                let Some(info) = content.tensor_infos.get(&name) else {
                    if optional {
                        continue;
                    }
                    return Err(OffloadError::Weights(format!("missing tensor `{name}`")));
                };
                let shape = info.shape.dims().to_vec();
                let elems = info.shape.elem_count();
                let dtype = info.ggml_dtype;
                let len = elems / dtype.block_size() * dtype.type_size();
                let start = base + info.offset as usize;
                let bytes = map.get(start..start + len).ok_or_else(|| {
                    OffloadError::Weights(format!("`{name}` lies past the end of the file"))
                })?;
                let keep_blocks = dense.is_none() && part.is_matrix() && is_block(dtype);
                let (kind, source) = if keep_blocks {
                    (TensorKind::Blocks(dtype), Source::Raw(bytes))
                } else {
                    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype)?;
                    let t = QTensor::new(storage, shape.clone())?
                        .dequantize(&Device::Cpu)?
                        .to_dtype(compute)?;
                    (TensorKind::Dense(compute), Source::Converted(t))
                };
                pending.push(Pending::new(name, part, kind, shape, source));
            }
            out.push(place(index, pending, memory)?);
        }
        Ok(Self {
            layers: out,
            dense_dtype: compute,
        })
    }

    /// Fills slabs for `layers` of a Hugging Face checkpoint, every tensor dense in `dtype`
    /// (tensors already in `dtype` are copied straight from the mapped shard). Slabs are
    /// allocated in `memory`.
    pub fn from_safetensors(
        shards: &[PathBuf],
        spec: &ModelSpec,
        layers: &[usize],
        dtype: DType,
        memory: &HostMemory,
    ) -> Result<Self> {
        let _ = spec;
        // SAFETY: read-only maps, read only while this function runs (see `from_gguf`).
        let files = unsafe { MmapedSafetensors::multi(shards) }?;
        let mut out = Vec::with_capacity(layers.len());
        for &index in layers {
            let mut pending = Vec::new();
            for (part, _, suffix, optional) in Part::ALL {
                let name = format!("model.layers.{index}.{suffix}");
                let view = match files.get(&name) {
                    Ok(view) => view,
                    Err(_) if optional => continue,
                    Err(_) => {
                        return Err(OffloadError::Weights(format!("missing tensor `{name}`")))
                    }
                };
                let shape = view.shape().to_vec();
                let same_dtype = DType::try_from(view.dtype()).ok() == Some(dtype);
                let source = if same_dtype {
                    Source::Raw(view.data())
                } else {
                    Source::Converted(files.load(&name, &Device::Cpu)?.to_dtype(dtype)?)
                };
                pending.push(Pending::new(
                    name,
                    part,
                    TensorKind::Dense(dtype),
                    shape,
                    source,
                ));
            }
            out.push(place(index, pending, memory)?);
        }
        Ok(Self {
            layers: out,
            dense_dtype: dtype,
        })
    }

    /// The slab of layer `index`, if it is offloaded.
    pub fn layer(&self, index: usize) -> Option<&HostLayer> {
        self.layers.iter().find(|l| l.index == index)
    }

    /// Offloaded layers in index order.
    pub fn layers(&self) -> &[HostLayer] {
        &self.layers
    }

    /// The dtype of every dense tensor.
    pub fn dense_dtype(&self) -> DType {
        self.dense_dtype
    }

    /// Weight bytes held (sum of tensor sizes, no padding).
    pub fn weight_bytes(&self) -> u64 {
        self.layers.iter().map(HostLayer::weight_bytes).sum()
    }

    /// Host bytes the slabs occupy (what ferry allocated for offloaded weights).
    pub fn allocated_bytes(&self) -> u64 {
        self.layers.iter().map(HostLayer::allocated_bytes).sum()
    }

    /// The largest block and dense regions over all layers: the size of one device slot.
    pub fn slot_regions(&self) -> (usize, usize) {
        self.layers.iter().fold((0, 0), |(b, d), l| {
            (b.max(l.blocks_len), d.max(l.dense_len))
        })
    }
}

/// Lays `pending` out (blocks first, then dense, each 8-byte aligned) and copies it into a new
/// slab of exactly that size in `memory`.
fn place(index: usize, mut pending: Vec<Pending<'_>>, memory: &HostMemory) -> Result<HostLayer> {
    let mut blocks_len = 0usize;
    let mut dense_len = 0usize;
    for p in &mut pending {
        let len = match &p.source {
            Source::Raw(bytes) => bytes.len(),
            Source::Converted(t) => t.elem_count() * t.dtype().size_in_bytes(),
        };
        let cursor = match p.entry.kind {
            TensorKind::Blocks(_) => &mut blocks_len,
            TensorKind::Dense(_) => &mut dense_len,
        };
        p.entry.offset = *cursor;
        p.entry.len = len;
        *cursor = align_up(*cursor + len);
    }
    let mut slab = AlignedBytes::zeroed_in(blocks_len + dense_len, memory)?;
    let bytes = slab.as_bytes_mut();
    for p in &pending {
        let start = match p.entry.kind {
            TensorKind::Blocks(_) => p.entry.offset,
            TensorKind::Dense(_) => blocks_len + p.entry.offset,
        };
        let dst = &mut bytes[start..start + p.entry.len];
        match &p.source {
            Source::Raw(src) => dst.copy_from_slice(src),
            Source::Converted(t) => write_tensor_bytes(t, dst)?,
        }
    }
    Ok(HostLayer {
        index,
        slab,
        entries: pending.into_iter().map(|p| p.entry).collect(),
        blocks_len,
        dense_len,
    })
}

/// Writes a dense tensor's elements (native endianness) into `dst`.
fn write_tensor_bytes(t: &Tensor, dst: &mut [u8]) -> Result<()> {
    let flat = t.flatten_all()?;
    match t.dtype() {
        DType::F32 => copy_elems(&flat.to_vec1::<f32>()?, dst),
        DType::F16 => copy_elems(&flat.to_vec1::<half::f16>()?, dst),
        DType::BF16 => copy_elems(&flat.to_vec1::<half::bf16>()?, dst),
        other => {
            return Err(OffloadError::Weights(format!(
                "unsupported dense dtype {other:?}"
            )))
        }
    }
    Ok(())
}

fn copy_elems<T: Copy>(src: &[T], dst: &mut [u8]) {
    let n = std::mem::size_of_val(src).min(dst.len());
    // SAFETY: `src` is a slice of plain floats; viewing its memory as bytes is always valid.
    let src_bytes = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, n) };
    dst[..n].copy_from_slice(src_bytes);
}

/// Rounds up to [`TENSOR_ALIGN`].
pub fn align_up(n: usize) -> usize {
    n.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN
}

/// Whether `dtype` is a GGML block format (kept quantized) rather than plain floats.
pub fn is_block(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

fn io(path: &Path, source: std::io::Error) -> OffloadError {
    OffloadError::Io {
        path: path.to_path_buf(),
        source,
    }
}
