//! DeepSeek-V2 / V2-Lite / V3's decoder layer (`deepseek2`): pre-norm, multi-head latent
//! attention, then a SwiGLU MLP (the leading dense layers) or DeepSeek's mixture of experts
//! ([`moe`]: softmax or sigmoid routing, the selection-only correction bias, expert groups, the
//! routed weights' scale, ungated shared experts).
//!
//! The latent attention, in the absorbed form llama.cpp runs for every step (prefill too):
//! - queries from `attn_q`, or through their compression (`attn_q_a`, its RMSNorm, `attn_q_b`),
//!   each head a no-RoPE part and a RoPE part;
//! - `attn_kv_a_mqa` gives per token the latent (`kv_lora_rank` wide, through `attn_kv_a_norm`)
//!   and one RoPE key part every head shares;
//! - each head's no-RoPE query goes into the latent space through its `attn_k_b` (which would
//!   have expanded the latent to that head's no-RoPE key), so the scores are
//!   `q_latent . latent + q_rope . k_rope`: an attention with one key/value head whose key row
//!   is `[latent | rotated k_rope]` and whose value is the latent;
//! - the cache holds only that row per token ([`crate::kv_cache::KvShape::values_in_keys`]: no
//!   expanded per-head keys or values, and no second copy for the values);
//! - each head's output (in the latent space) leaves it through its `attn_v_b`, then
//!   `attn_output`.
//!
//! RoPE is llama.cpp's "normal" one for this family (adjacent pairs) on the RoPE parts only,
//! with YaRN's frequencies; the score scale ([`MlaSpec::score_scale`]) carries YaRN's
//! `mscale` squared. Reference: llama.cpp's `src/models/deepseek2.cpp` (the version vendored in
//! llama-cpp-python 0.3.36), checked against it in `tests/suite/arch_llamacpp.rs`.

use std::sync::OnceLock;

use candle_core::Tensor;

use super::decoder::attention::{self, AttentionDims};
use super::decoder::block::{projections, rms_norm, BatchRows, Block, LayerDims};
use super::error::{ModelError, Result};
use super::llama::{add_mlp, pregate_experts, HostVectors};
use super::spec::{MlaSpec, ModelSpec, MoeSpec};
use super::tensors::Part;
use super::weights::{LayerWeights, Linear};

/// The decoder layer of `deepseek2` models.
#[derive(Debug)]
pub struct Deepseek2Block {
    layer: LayerDims,
    mla: MlaSpec,
    rope_dim: usize,
    moe: Option<MoeSpec>,
    /// The layer's selection bias on the host, from its first call's weights.
    host: OnceLock<HostVectors>,
}

impl Deepseek2Block {
    /// Layer `index` of a model with `spec` (its latent attention from [`ModelSpec::mla`]).
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        Self {
            layer: LayerDims::of(spec, index),
            mla: spec.mla.unwrap_or_default(),
            rope_dim: spec.rope_dim,
            moe: spec.moe_at(index),
            host: OnceLock::new(),
        }
    }

    fn host_vectors(&self, w: &LayerWeights) -> Result<&HostVectors> {
        HostVectors::once(&self.host, w, self.moe)
    }

    /// The queries of rows `h` (`[1, rows, heads * (qk_nope + rope)]`) and the latent with
    /// its RoPE key part (`[1, rows, kv_lora_rank + rope]`, the latent not yet normed).
    fn project(&self, h: &Tensor, w: &LayerWeights) -> Result<(Tensor, Tensor)> {
        let latent = w.linear(Part::KvAMqa)?;
        if self.mla.q_lora_rank == 0 {
            let [q, kv] = projections(&[w.linear(Part::Q)?, latent], h)?;
            return Ok((q, kv));
        }
        let [q_a, kv] = projections(&[w.linear(Part::QA)?, latent], h)?;
        let q_a = rms_norm(&q_a, w.vector(Part::QANorm)?, self.layer.eps)?;
        Ok((w.linear(Part::QB)?.forward(&q_a)?, kv))
    }

    /// The attention output (before `attn_output`) of every sequence's rows, `[1, rows,
    /// heads * v_head_dim]`, writing each sequence's latent rows to its cache.
    fn attention(
        &self,
        h: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let dims: AttentionDims = self.layer.attn;
        let (heads, nope, rope, rank) = (
            dims.n_heads,
            self.mla.qk_nope_dim,
            self.rope_dim,
            self.mla.kv_lora_rank,
        );
        let (q, kv) = self.project(h, w)?;
        let rows = q.dim(1)?;
        let q = q.reshape((1, rows, heads, nope + rope))?;
        // Each head's no-RoPE query into the latent space: `[1, rows, heads, rank]`.
        let q_latent = per_head(
            &w.linears(Part::KB),
            &q.narrow(3, 0, nope)?,
            heads,
            "attn_k_b",
        )?;
        let q_rope = q.narrow(3, nope, rope)?;
        let latent = rms_norm(
            &kv.narrow(2, 0, rank)?,
            w.vector(Part::KvANorm)?,
            self.layer.eps,
        )?;
        let k_rope = kv.narrow(2, rank, rope)?;
        let mut outputs = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let table = s.step.rope_of(dims);
            let of_seq = |t: &Tensor| s.rows(t);
            // Queries `[1, heads, seq, rank + rope]`: the absorbed no-RoPE part, then the
            // rotated RoPE part.
            let q_rope = table.apply(&of_seq(&q_rope)?.transpose(1, 2)?, s.step.pos)?;
            let q_latent = of_seq(&q_latent)?.transpose(1, 2)?;
            let queries = Tensor::cat(&[&q_latent, &q_rope], 3)?.contiguous()?;
            // The one key row per token `[1, 1, seq, rank + rope]`: the latent, then the
            // rotated RoPE part (rotated once, shared by every head). Its values are its latent.
            let k_rope = table.apply(&of_seq(&k_rope)?.unsqueeze(1)?, s.step.pos)?;
            let values = of_seq(&latent)?.unsqueeze(1)?.contiguous()?;
            let keys = Tensor::cat(&[&values, &k_rope], 3)?.contiguous()?;
            let step = s.step;
            outputs.push(attention::attend_heads(
                &queries,
                &keys,
                &values,
                s.kv()?,
                step,
                dims,
                None,
            )?);
        }
        let out = Tensor::cat(&outputs, 1)?.reshape((1, rows, heads, rank))?;
        // Each head's output out of the latent space: `[1, rows, heads, v_head_dim]`.
        let y = per_head(&w.linears(Part::VB), &out, heads, "attn_v_b")?;
        Ok(y.reshape((1, rows, heads * self.mla.v_head_dim))?)
    }
}

/// Head `i` of `x` (`[1, rows, heads, in]`) through `linears[i]`, stacked back:
/// `[1, rows, heads, out]`.
fn per_head(linears: &[&Linear], x: &Tensor, heads: usize, name: &str) -> Result<Tensor> {
    if linears.len() != heads {
        return Err(ModelError::MissingTensor(format!(
            "{name}: {} of {heads} heads",
            linears.len()
        )));
    }
    let each = linears
        .iter()
        .enumerate()
        .map(|(i, l)| l.forward(&x.narrow(2, i, 1)?.squeeze(2)?.contiguous()?))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::stack(&each, 2)?)
}

impl Block for Deepseek2Block {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let selection_bias = self.host_vectors(w)?.selection_bias.as_deref();
        pregate_experts(x, w, self.moe, self.layer.eps, selection_bias)?;
        let h = rms_norm(x, w.vector(Part::AttnNorm)?, self.layer.eps)?;
        let y = self.attention(&h, w, seqs)?;
        let x = (x + w.linear(Part::O)?.forward(&y)?)?;
        add_mlp(&x, w, self.moe, self.layer.eps, selection_bias)
    }
}
