//! Model sizes for the planner, from an open [`Checkpoint`] alone (no weights are read): the bytes
//! every decoder layer and the fixed parts (embedding, final norm, head) take on the compute
//! device, held exactly as the loader holds them ([`Holding`]), and each layer's slab layout (for
//! the slot ring); plus the KV-cache and activation-workspace estimates.
//!
//! The dimensions come from the checkpoint's [`ferry_model::spec::ModelSpec`], the tensors from
//! its table: `ferry plan` and `ferry serve` read the same header through the same code, so a
//! model one of them refuses the other refuses too. A model with tied embeddings has no separate
//! head tensor, so the shared matrix is counted once.

use super::layout::{held_bytes, LayerLayout, SlotKind};
use ferry_model::checkpoint::Checkpoint;
use ferry_model::kv_cache::KvShape;
use ferry_model::kv_format::KvFormat;
use ferry_model::loader::{Holding, Role};
use ferry_model::tensors::TensorRecord;

/// Weight bytes of a model, split the way the planner places them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSizes {
    /// Device bytes of each decoder layer when resident, by index.
    pub layers: Vec<u64>,
    /// Device bytes of the embedding, final norm and head (a tied head counted once).
    pub fixed: u64,
    /// No separate output head: the head reuses the embedding matrix (counted once).
    pub tied_embeddings: bool,
    /// Number of tensors the model uses.
    pub tensor_count: usize,
    /// Each decoder layer's slab layout (what a slot must hold to stream it).
    pub layouts: Vec<LayerLayout>,
}

impl ModelSizes {
    /// Sizes `checkpoint` as loaded with `holding` on a device of kind `device`.
    pub fn of(
        checkpoint: &Checkpoint,
        holding: &Holding,
        device: SlotKind,
    ) -> ferry_model::Result<Self> {
        let table = checkpoint.tensors();
        let held = |role: Role, record: &TensorRecord| -> ferry_model::Result<u64> {
            let kind = holding.kind(role, record)?;
            let len = Holding::bytes(kind, record);
            Ok(held_bytes(kind, len, record.elem_count(), device))
        };
        let mut fixed = held(Role::Embedding, &table.embedding)?;
        fixed += held(Role::Vector, &table.final_norm)?;
        if let Some(head) = &table.head {
            fixed += held(Role::Matrix, head)?;
        }
        let layouts = (0..table.layers.len())
            .map(|i| LayerLayout::of(checkpoint, holding, i))
            .collect::<ferry_model::Result<Vec<_>>>()?;
        Ok(Self {
            layers: layouts.iter().map(|l| l.resident_bytes(device)).collect(),
            fixed,
            tied_embeddings: table.head.is_none(),
            tensor_count: table.records().count(),
            layouts,
        })
    }

    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Sum of the decoder layers' bytes.
    pub fn layer_total(&self) -> u64 {
        self.layers
            .iter()
            .fold(0u64, |sum, &b| sum.saturating_add(b))
    }

    /// All weight bytes: layers + fixed parts.
    pub fn total(&self) -> u64 {
        self.layer_total().saturating_add(self.fixed)
    }
}

/// KV-cache bytes one token takes in one layer of a cache of `shape`: keys and values,
/// `2 * n_kv_heads` rows of `head_dim` values in `format` ([`KvFormat::row_bytes`]:
/// `head_dim * dtype bytes` dense, 34 or 18 bytes per 32 values in q8_0 / q4_0 blocks), or one
/// row per head when the values are in the keys (latent attention,
/// [`KvShape::bytes_per_position`]).
pub fn kv_bytes_per_token_per_layer(shape: KvShape, format: KvFormat) -> u64 {
    shape.bytes_per_position(format) as u64
}

/// What the activation workspace estimate depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceInput {
    /// Hidden size.
    pub hidden_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Sequences decoded together.
    pub max_batch: usize,
    /// Prompt tokens prefilled in one step.
    pub prefill_chunk: usize,
    /// Keys a query is scored against at once: the device's attention block for the longest
    /// sequence ([`ferry_model::decoder::attention::score_block`]), never the whole context.
    pub score_block: usize,
}

/// Activation workspace estimate in bytes, with f32 activations (4 bytes) and one step at a time
/// (either a prefill chunk or a decode batch, so `tokens = max(max_batch, prefill_chunk)`):
///
/// ```text
/// activations = tokens * hidden_size * 16 * 4           residual, norm, q/k/v, attention output
///                                                       and the MLP's gate/up/activation (~8x hidden)
/// scores      = 3 * n_heads * tokens * score_block * 4  one block's scores, masked, and weights
/// logits      = 2 * max_batch * vocab_size * 4          last-position logits and sampling copy
/// workspace   = activations + scores + logits
/// ```
///
/// The attention scores a query against one block of keys at a time (a tile on the CPU, up to
/// 2048 keys on CUDA), so the workspace does not grow with the context. It is deliberately
/// generous otherwise: an underestimate would be a device out-of-memory error at run time, an
/// overestimate only a layer more on the host.
pub fn workspace_bytes(input: &WorkspaceInput) -> u64 {
    let product = |factors: &[u64]| factors.iter().fold(1u64, |p, &f| p.saturating_mul(f));
    let tokens = input.max_batch.max(input.prefill_chunk) as u64;
    let activations = product(&[tokens, input.hidden_size as u64, 16, 4]);
    let scores = product(&[3, input.n_heads as u64, tokens, input.score_block as u64, 4]);
    let logits = product(&[2, input.max_batch as u64, input.vocab_size as u64, 4]);
    activations.saturating_add(scores).saturating_add(logits)
}

#[cfg(test)]
#[path = "sizing_tests.rs"]
mod tests;
