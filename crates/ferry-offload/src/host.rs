//! The host tier of the offload engine: [`HostStore`] keeps every offloaded decoder layer in one
//! contiguous slab, filled once at start and read by the copy engine for every forward pass.
//!
//! A slab is laid out as its [`LayerLayout`] says ([`super::layout`]): a *block* region of GGUF
//! block-quantized matrices as their raw bytes, copied straight from the memory-mapped file (a
//! Q4 model streams about a quarter of the bytes of bf16), then a *dense* region of every other
//! tensor in the compute dtype, each tensor 256-byte aligned.
//!
//! The device slots ([`super::slot`], the CUDA slot) mirror that layout, so filling a slot is a
//! few memcpys. No tensor of an offloaded layer is ever loaded whole: at most one tensor is
//! converted at a time when a dense dtype is asked for, so host memory for offloaded weights is
//! the slabs and nothing else. On CUDA the slabs are pinned allocations
//! ([`HostMemory::Pinned`]); on the CPU they are heap buffers shaped like a CPU slot (a block
//! arena and a dense tensor, [`SlotBuffers`]), so an offloaded layer can also be computed where
//! it lies ([`HostLayer::views`]: the host tier, no copy) instead of being copied into a slot.
//!
//! A pinned slab is one buffer held as a [`BlockArena`]: the copy stream reads its bytes, and
//! when it has no dense region (an expert whose matrices are all GGUF blocks) ferry's CPU
//! kernels compute from the same bytes in place ([`HostLayer::views`]: the host tier on CUDA).
//! A slab with a dense region (a whole layer's norms; an expert held dense on CUDA, f16/bf16
//! weights or a type candle's CUDA kernels lack) has no CPU view there: a CPU tensor cannot
//! borrow pinned memory, and a second copy would double the host memory, so it only streams.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::buffer::{AlignedBytes, HostMemory};
use super::error::OffloadError;
pub use super::layout::{LayerLayout, TensorEntry, TENSOR_ALIGN};
use super::layout::{SlotKind, SlotLayout};
use super::qview::BlockArena;
use super::slot::SlotBuffers;
use ferry_model::checkpoint::Checkpoint;
use ferry_model::loader::holding::stored_as;
pub use ferry_model::loader::TensorKind;
use ferry_model::loader::{quantize, Holding};
pub use ferry_model::tensors::Part;
use ferry_model::tensors::{StoredType, TensorRecord};
use ferry_model::weights::LayerWeights;

/// Result alias for the running offload engine.
pub type Result<T> = std::result::Result<T, OffloadError>;

/// One offloaded layer: its layout (dereferenced: `layer.entries`, `layer.blocks_len`, ...)
/// and its slab.
#[derive(Debug)]
pub struct HostLayer {
    layout: LayerLayout,
    slab: Slab,
}

/// Where a slab's bytes are.
#[derive(Debug)]
enum Slab {
    /// One buffer, written once: the block region followed by the dense region (`blocks_len`
    /// is where dense starts); pinned memory, which CUDA copies read, held as a block arena
    /// so that the block region can also be viewed by the CPU kernels.
    Bytes(Arc<BlockArena>),
    /// CPU memory laid out as a CPU slot: the block region in a block arena, the dense region
    /// in a tensor of the compute dtype, so the layer's weights can be viewed in place.
    Cpu(SlotBuffers),
}

impl std::ops::Deref for HostLayer {
    type Target = LayerLayout;

    fn deref(&self) -> &LayerLayout {
        &self.layout
    }
}

impl HostLayer {
    /// The slab of expert `expert` of layer `layout` on its own ([`LayerLayout::expert`]),
    /// filled from `checkpoint`: one offloaded MoE expert's gate, up and down.
    pub fn expert(
        checkpoint: &Checkpoint,
        layout: &LayerLayout,
        expert: usize,
        memory: &HostMemory,
    ) -> Result<Self> {
        Self::expert_in(checkpoint, layout, expert, memory, false)
    }

    /// [`HostLayer::expert`]; `one_buffer` writes a heap slab as one buffer, the shape of a
    /// pinned one (tests on the CPU of what a CUDA device's slabs do).
    fn expert_in(
        checkpoint: &Checkpoint,
        layout: &LayerLayout,
        expert: usize,
        memory: &HostMemory,
        one_buffer: bool,
    ) -> Result<Self> {
        let tensors = checkpoint.tensors().layer(layout.index)?;
        let records: Vec<&TensorRecord> = layout
            .entries
            .iter()
            .zip(&tensors.tensors)
            .filter(|(e, _)| e.part.is_expert() && e.unit == expert)
            .map(|(_, (_, r))| r)
            .collect();
        Self::write(
            checkpoint,
            layout.expert(expert),
            &records,
            memory,
            one_buffer,
        )
    }

    /// [`HostLayer::expert`] in one heap buffer laid out as a pinned slab is.
    #[cfg(test)]
    pub(crate) fn expert_in_one_buffer(
        checkpoint: &Checkpoint,
        layout: &LayerLayout,
        expert: usize,
    ) -> Result<Self> {
        Self::expert_in(checkpoint, layout, expert, &HostMemory::Heap, true)
    }

    /// Writes the slab of `layout`, whose entries are `records` in order, front to back (so
    /// the slab is written once; only alignment gaps are zeroed): shaped as a CPU slot on the
    /// heap unless `one_buffer`, one buffer in pinned memory.
    fn write(
        checkpoint: &Checkpoint,
        layout: LayerLayout,
        records: &[&TensorRecord],
        memory: &HostMemory,
        one_buffer: bool,
    ) -> Result<Self> {
        if records.len() != layout.entries.len() {
            return Err(OffloadError::Weights(format!(
                "layer {}: {} tensors for {} slab entries",
                layout.index,
                records.len(),
                layout.entries.len()
            )));
        }
        let mut placed: Vec<(usize, &TensorEntry, &TensorRecord)> = layout
            .entries
            .iter()
            .zip(records)
            .map(|(entry, record)| match entry.kind {
                TensorKind::Blocks(_) => (entry.offset, entry, *record),
                TensorKind::Dense(_) => (layout.blocks_len + entry.offset, entry, *record),
            })
            .collect();
        placed.sort_by_key(|(start, _, _)| *start);
        if matches!(memory, HostMemory::Heap) && !one_buffer {
            // The dense region's dtype: its tensors' (the compute dtype), any without one.
            let buffers = SlotBuffers::new(
                layout.blocks_len,
                layout.dense_len,
                dense_dtype(&layout),
                &Device::Cpu,
            )?;
            for (start, entry, record) in placed {
                let bytes = entry_bytes(checkpoint, record, entry)?;
                match entry.kind {
                    TensorKind::Blocks(_) => buffers.put_blocks(start, &bytes)?,
                    TensorKind::Dense(_) => buffers.put_dense(entry.offset, &bytes)?,
                }
            }
            return Ok(HostLayer {
                layout,
                slab: Slab::Cpu(buffers),
            });
        }
        let len = layout.blocks_len + layout.dense_len;
        let slab = AlignedBytes::write_once(len, memory, |slab| -> Result<()> {
            for (start, entry, record) in placed {
                let bytes = entry_bytes(checkpoint, record, entry)?;
                slab.put(start, &bytes)?;
            }
            Ok(())
        })?;
        Ok(HostLayer {
            layout,
            slab: Slab::Bytes(BlockArena::from_bytes(slab)),
        })
    }

    /// The layer's layout.
    pub fn layout(&self) -> &LayerLayout {
        &self.layout
    }

    /// The block region's bytes, of a slab in one buffer (pinned memory; a CPU slab is read
    /// through [`HostLayer::cpu_slab`]).
    pub fn blocks(&self) -> Result<&[u8]> {
        Ok(&self.bytes()?[..self.blocks_len])
    }

    /// The dense region's bytes, of a slab in one buffer (see [`HostLayer::blocks`]).
    pub fn dense(&self) -> Result<&[u8]> {
        Ok(&self.bytes()?[self.blocks_len..self.blocks_len + self.dense_len])
    }

    fn bytes(&self) -> Result<&[u8]> {
        match &self.slab {
            Slab::Bytes(arena) => {
                let guard = arena.read();
                let bytes = guard.as_bytes();
                // SAFETY: the arena's buffer is allocated once and never resized or freed while
                // `self` holds the arena, and it is never written after `write` filled it: no
                // write handle is ever taken on it (the CPU views over it, `SlotBlocks`, only
                // read; their `from_float` is for storage candle quantizes into, never a view).
                // So the bytes stay valid and unchanged for `&self`'s lifetime.
                Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) })
            }
            Slab::Cpu(_) => Err(OffloadError::Weights(format!(
                "layer {}: its slab is CPU memory, which CUDA copies do not read",
                self.index
            ))),
        }
    }

    /// The slab as CPU buffers, when it is in ordinary CPU memory (the CPU device).
    pub fn cpu_slab(&self) -> Option<&SlotBuffers> {
        match &self.slab {
            Slab::Cpu(buffers) => Some(buffers),
            Slab::Bytes(_) => None,
        }
    }

    /// The layer's weights as views into its slab, where it lies (the host tier: no weight
    /// byte is copied): a slab shaped as a CPU slot, or a slab in one buffer (pinned) without a
    /// dense region, whose block region the CPU kernels read in place.
    pub fn views(&self) -> Result<LayerWeights> {
        match &self.slab {
            Slab::Cpu(buffers) => buffers.views(&self.layout),
            Slab::Bytes(arena) if self.can_view_in_one_buffer() => {
                SlotBuffers::over_blocks(arena.clone(), dense_dtype(&self.layout))?
                    .views(&self.layout)
            }
            Slab::Bytes(_) => Err(OffloadError::Weights(format!(
                "layer {}: its pinned slab has {} bytes of dense tensors, which ferry's CPU \
                 kernels cannot read in place (on CUDA it only streams)",
                self.index, self.dense_len
            ))),
        }
    }

    /// Whether the layer can be computed where its slab lies ([`HostLayer::views`]).
    pub fn can_view(&self) -> bool {
        match &self.slab {
            Slab::Cpu(_) => true,
            Slab::Bytes(_) => self.can_view_in_one_buffer(),
        }
    }

    /// A one-buffer slab is viewed by its block region alone: it must have no dense tensor.
    fn can_view_in_one_buffer(&self) -> bool {
        self.dense_len == 0
            && self
                .entries
                .iter()
                .all(|e| matches!(e.kind, TensorKind::Blocks(_)))
    }

    /// Bytes the slab occupies in host memory.
    pub fn allocated_bytes(&self) -> u64 {
        match &self.slab {
            Slab::Bytes(arena) => arena.read().capacity_bytes() as u64,
            Slab::Cpu(buffers) => buffers.allocated_bytes(),
        }
    }

    /// Whether the slab is page-locked (CUDA devices).
    pub fn is_pinned(&self) -> bool {
        match &self.slab {
            Slab::Bytes(arena) => arena.read().is_pinned(),
            Slab::Cpu(_) => false,
        }
    }
}

/// Every offloaded layer's slab, keyed by layer index.
#[derive(Debug)]
pub struct HostStore {
    layers: Vec<HostLayer>,
    dense_dtype: DType,
}

impl HostStore {
    /// Fills slabs for `layers` of `checkpoint`, each tensor held as `holding` says (the
    /// loader's rules: raw GGUF blocks, or dense in the compute dtype). Slabs are allocated in
    /// `memory`.
    pub fn fill(
        checkpoint: &Checkpoint,
        holding: &Holding,
        layers: &[usize],
        memory: &HostMemory,
    ) -> Result<Self> {
        let mut out = Vec::with_capacity(layers.len());
        for &index in layers {
            let layout = LayerLayout::of(checkpoint, holding, index)?;
            let tensors = checkpoint.tensors().layer(index)?;
            // The layout's entries are the table's tensors in order (experts once each).
            let records: Vec<&TensorRecord> = tensors.tensors.iter().map(|(_, r)| r).collect();
            out.push(HostLayer::write(
                checkpoint, layout, &records, memory, false,
            )?);
        }
        Ok(Self {
            layers: out,
            dense_dtype: holding.compute(),
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
        self.layers.iter().map(|l| l.weight_bytes()).sum()
    }

    /// Host bytes the slabs occupy (what ferry allocated for offloaded weights).
    pub fn allocated_bytes(&self) -> u64 {
        self.layers.iter().map(HostLayer::allocated_bytes).sum()
    }

    /// The slot of `kind` that can hold any of the layers (what the plan's
    /// [`super::Plan::slot_layout`] says for the same streamed layers).
    pub fn slot_layout(&self, kind: SlotKind) -> SlotLayout {
        SlotLayout::of(kind, self.layers.iter().map(HostLayer::layout))
    }

    /// The largest block and dense regions over all layers: the regions of one CPU slot.
    pub fn slot_regions(&self) -> (usize, usize) {
        let slot = self.slot_layout(SlotKind::Cpu);
        (slot.blocks_bytes, slot.dense_bytes)
    }
}

/// The dtype of `layout`'s dense region: its tensors' (the compute dtype), f32 without one.
fn dense_dtype(layout: &LayerLayout) -> DType {
    layout
        .entries
        .iter()
        .find_map(|e| match e.kind {
            TensorKind::Dense(dtype) => Some(dtype),
            TensorKind::Blocks(_) => None,
        })
        .unwrap_or(DType::F32)
}

/// `record`'s bytes as `entry` holds them: raw (borrowed from the mapped file) when the stored
/// type is the held one, else converted (one tensor at a time, on the CPU).
fn entry_bytes<'a>(
    checkpoint: &'a Checkpoint,
    record: &TensorRecord,
    entry: &TensorEntry,
) -> Result<Cow<'a, [u8]>> {
    let bytes: Cow<'a, [u8]> = match entry.kind {
        TensorKind::Dense(dtype) if stored_dtype(record) != Some(dtype) => {
            let t = checkpoint.read_dense(record, dtype, &Device::Cpu)?;
            Cow::Owned(tensor_bytes(&t)?)
        }
        // Quantized at load (dtype `q8_0`, ...): the blocks the loader would make.
        TensorKind::Blocks(ty) if !stored_as(record, ty) => {
            let target = ty.to_candle().ok_or_else(|| {
                OffloadError::Weights(format!("`{}`: ferry cannot quantize to {ty}", record.name))
            })?;
            Cow::Owned(quantize::quantized_bytes(checkpoint, record, target)?)
        }
        _ => Cow::Borrowed(checkpoint.bytes(record)?),
    };
    if bytes.len() != entry.len {
        return Err(OffloadError::Weights(format!(
            "`{}` has {} bytes, its slab entry {}",
            record.name,
            bytes.len(),
            entry.len
        )));
    }
    Ok(bytes)
}

/// The dense dtype a tensor is stored in, if it is stored densely.
fn stored_dtype(record: &TensorRecord) -> Option<DType> {
    match record.stored {
        StoredType::Gguf(ty) => match ty.to_candle()? {
            candle_core::quantized::GgmlDType::F32 => Some(DType::F32),
            candle_core::quantized::GgmlDType::F16 => Some(DType::F16),
            candle_core::quantized::GgmlDType::BF16 => Some(DType::BF16),
            _ => None,
        },
        StoredType::Safetensors(st) => DType::try_from(st).ok(),
    }
}

/// A dense tensor's elements as bytes (native endianness).
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F32 => elem_bytes(&flat.to_vec1::<f32>()?),
        DType::F16 => elem_bytes(&flat.to_vec1::<half::f16>()?),
        DType::BF16 => elem_bytes(&flat.to_vec1::<half::bf16>()?),
        other => {
            return Err(OffloadError::Weights(format!(
                "unsupported dense dtype {other:?}"
            )))
        }
    })
}

fn elem_bytes<T: Copy>(src: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(src);
    // SAFETY: `src` is a slice of plain floats; viewing its memory as bytes is always valid.
    unsafe { std::slice::from_raw_parts(src.as_ptr() as *const u8, n) }.to_vec()
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
