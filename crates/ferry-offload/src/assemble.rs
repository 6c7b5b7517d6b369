//! Assembling one decoder layer's [`LayerWeights`] from a slot, by the layer's tensor table.
//!
//! A slot (CPU [`super::slot::SlotBuffers`] or CUDA [`super::slot_gpu::GpuSlot`]) only knows how to
//! show one tensor of its region as a device tensor ([`SlotTensors`]); which tensor fills which
//! field, which biases are optional and which matrices stay quantized is decided here, once for
//! every device, so streamed layers round exactly like resident ones.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::Tensor;

use super::error::OffloadError;
use super::host::{LayerLayout, Part, Result, TensorEntry, TensorKind};
use ferry_model::weights::{LayerWeights, Linear};

/// A slot's view of the tensors it holds.
pub trait SlotTensors {
    /// A dense tensor of the slot (no copy).
    fn dense(&self, entry: &TensorEntry) -> Result<Tensor>;
    /// A block-quantized matrix of the slot (no copy of the weight bytes).
    fn blocks(&self, entry: &TensorEntry) -> Result<Arc<QTensor>>;
    /// A block-quantized matrix of the slot as a projection with `bias`: [`Self::blocks`]
    /// through [`Linear::quantized`] unless the slot overrides it (the CPU slot does for the
    /// types candle has no block type for).
    fn quantized(&self, entry: &TensorEntry, bias: Option<Tensor>) -> Result<Linear> {
        Ok(Linear::quantized(self.blocks(entry)?, bias)?)
    }
}

/// The weights of `layer` as the tensors of `slot` (call once the slot holds the layer).
pub fn layer_weights(layer: &LayerLayout, slot: &dyn SlotTensors) -> Result<LayerWeights> {
    let entry = |i: usize| &layer.entries[i];
    let linear = |w: usize, bias: Option<usize>| -> Result<Linear> {
        let bias = match bias.map(entry) {
            Some(entry) => Some(slot.dense(entry)?),
            None => None,
        };
        let entry = entry(w);
        Ok(match entry.kind {
            // The same kernel choice as resident layers, so every mode rounds alike.
            TensorKind::Blocks(_) => slot.quantized(entry, bias)?,
            TensorKind::Dense(_) => Linear::Dense {
                weight: slot.dense(entry)?,
                bias,
            },
        })
    };
    let parts: Vec<Part> = layer.entries.iter().map(|e| e.part).collect();
    // Which part fills what is the model's one definition (`LayerWeights::assemble`); the
    // entries are the layer's tensor table in order (experts once each).
    LayerWeights::assemble(&parts, linear, |i| slot.dense(entry(i)))
}

/// `entry` as a `[shape]` view of a 1-D dense region tensor of `dtype` (narrow + reshape).
pub fn dense_region_view(
    region: &Tensor,
    dtype: candle_core::DType,
    entry: &TensorEntry,
) -> Result<Tensor> {
    if !matches!(entry.kind, TensorKind::Dense(dt) if dt == dtype) {
        return Err(OffloadError::Weights(format!(
            "`{}` is not a dense {dtype:?} tensor",
            entry.name
        )));
    }
    let size = dtype.size_in_bytes();
    Ok(region
        .narrow(0, entry.offset / size, entry.len / size)?
        .reshape(entry.shape.as_slice())?)
}
