//! Qwen3.5's decoder layer (dense `qwen35` and `qwen35moe`): `x + mix(rms(x))`, then
//! `x + ffn(rms(x))`, where the mixer is either
//! - gated full attention (every `full_attention_interval`-th layer): the query projection
//!   gives each head its query and an output gate side by side, queries and keys are
//!   RMS-normed per head, RoPE turns the first `rope_dim` dimensions (NEOX pairs; llama.cpp's
//!   IMRoPE sections give every rotated pair the text position), and the heads' output is
//!   multiplied by `sigmoid(gate)` before the output projection; or
//! - a Gated DeltaNet ([`crate::gated_delta`]): `qkv`, `z`, `b`, `a` projections, the short
//!   causal convolution and SiLU over `qkv`, L2-normed queries and keys (key head
//!   `h % n_k_heads` serves value head `h`), decay `softplus(a + dt_bias) * ssm_a`, strength
//!   `sigmoid(b)`, the delta rule against the sequence's [`crate::recurrent_state`], then an
//!   RMSNorm of each head's output times `silu(z)` and the output projection.
//!
//! The FFN is a SwiGLU (`qwen35`) or routed experts with softmax top-k (renormalised) plus a
//! shared expert scaled by `sigmoid(h . w)` (`qwen35moe`, [`moe`]).
//!
//! Facts (not code) from llama.cpp's `src/models/qwen35.cpp`, `qwen35moe.cpp` and
//! `delta-net-base.cpp`; checked against llama.cpp in `tests/suite/arch_llamacpp.rs`.

use candle_core::{DType, Tensor};

use super::decoder::attention;
use super::decoder::block::{head_norm, projections, rms_norm, BatchRows, Block, LayerDims};
use super::error::{ModelError, Result};
use super::gated_delta::{delta_rule, l2_norm, short_conv, softplus};
use super::llama::{add_mlp, pregate_experts};
use super::spec::{DeltaNetSpec, ModelSpec, MoeSpec};
use super::tensors::Part;
use super::weights::LayerWeights;

/// One Qwen3.5 decoder layer: gated attention or a Gated DeltaNet, by its index.
#[derive(Debug, Clone)]
pub struct Qwen35Block {
    layer: LayerDims,
    moe: Option<MoeSpec>,
    /// The DeltaNet's shape when this layer is one.
    delta: Option<DeltaNetSpec>,
}

impl Qwen35Block {
    /// Layer `index` of a model with `spec`.
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        Self {
            layer: LayerDims::of(spec, index),
            moe: spec.moe_at(index),
            delta: spec
                .delta_net
                .clone()
                .filter(|_| spec.is_recurrent_layer(index)),
        }
    }

    /// The gated full attention of the normed rows `h`.
    fn gated_attention(
        &self,
        h: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let dims = self.layer.attn;
        let [q_gate, k, v] = projections(
            &[w.linear(Part::Q)?, w.linear(Part::K)?, w.linear(Part::V)?],
            h,
        )?;
        let (batch, rows, _) = q_gate.dims3()?;
        let width = dims.n_heads * dims.head_dim;
        let halves = q_gate.reshape((batch, rows, dims.n_heads, 2, dims.head_dim))?;
        let half = |i: usize| -> Result<Tensor> {
            Ok(halves
                .narrow(3, i, 1)?
                .contiguous()?
                .reshape((batch, rows, width))?)
        };
        let (q, gate) = (half(0)?, half(1)?);
        let q = head_norm(&q, w.vector(Part::QNorm)?, self.layer.eps, 0.0)?;
        let k = head_norm(&k, w.vector(Part::KNorm)?, self.layer.eps, 0.0)?;
        let y = attention::attend_each(&q, &k, &v, seqs, dims, None)?;
        let y = (y * candle_nn::ops::sigmoid(&gate)?)?;
        w.linear(Part::O)?.forward(&y)
    }

    /// The Gated DeltaNet of the normed rows `h`, each sequence against its own state.
    fn delta_net(
        &self,
        delta: &DeltaNetSpec,
        h: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let dtype = h.dtype();
        let [qkv, z, b, a] = projections(
            &[
                w.linear(Part::Qkv)?,
                w.linear(Part::AttnGate)?,
                w.linear(Part::SsmBeta)?,
                w.linear(Part::SsmAlpha)?,
            ],
            h,
        )?;
        let f32 = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?) };
        let beta = candle_nn::ops::sigmoid(&f32(&b)?)?;
        let dt_bias = f32(w.vector(Part::SsmDt)?)?;
        let rate = f32(w.vector(Part::SsmA)?)?;
        let g = softplus(&f32(&a)?.broadcast_add(&dt_bias)?)?.broadcast_mul(&rate)?;
        let conv_weight = f32(w.vector(Part::SsmConv)?)?;
        let qkv = f32(&qkv)?;
        let (hk, hv) = (delta.n_k_heads, delta.n_v_heads);
        let (dk, dv) = (delta.head_k_dim, delta.head_v_dim);
        let key_dim = hk * dk;
        let eps = self.layer.eps as f64;
        let mut outputs = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let (offset, rows) = (s.offset, s.len);
            let seq_rows =
                |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(1, offset, rows)?.squeeze(0)?) };
            let x = seq_rows(&qkv)?;
            let state = s.recurrent()?;
            let (window, matrices) = state.current()?;
            let (mixed, window) = short_conv(&x, &window, &conv_weight)?;
            let mixed = candle_nn::ops::silu(&mixed)?;
            let heads = |start: usize, n: usize, d: usize| -> Result<Tensor> {
                Ok(mixed
                    .narrow(1, start, n * d)?
                    .contiguous()?
                    .reshape((rows, n, d))?)
            };
            let mut q = l2_norm(&heads(0, hk, dk)?, eps)?;
            let mut k = l2_norm(&heads(key_dim, hk, dk)?, eps)?;
            let v = heads(2 * key_dim, hv, dv)?;
            if hv != hk {
                // Value head `h` reads key head `h % hk` (llama.cpp repeats the key heads).
                q = q.repeat((1, hv / hk, 1))?;
                k = k.repeat((1, hv / hk, 1))?;
            }
            let (out, matrices) = delta_rule(
                &q,
                &k,
                &v,
                &seq_rows(&g)?,
                &seq_rows(&beta)?,
                &matrices,
                1.0 / (dk as f64).sqrt(),
            )?;
            s.recurrent()?.stage(window, matrices)?;
            outputs.push(out);
        }
        let out = Tensor::cat(&outputs, 0)?;
        let total = out.dim(0)?;
        let gate = f32(&z)?.reshape((total, hv, dv))?;
        let normed = rms_norm(&out, &f32(w.vector(Part::SsmNorm)?)?, self.layer.eps)?;
        let y = (normed * candle_nn::ops::silu(&gate)?)?
            .reshape((1, total, hv * dv))?
            .to_dtype(dtype)?;
        w.linear(Part::SsmOut)?.forward(&y)
    }
}

impl Block for Qwen35Block {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        pregate_experts(x, w, self.moe, self.layer.eps, None)?;
        let h = rms_norm(x, w.vector(Part::AttnNorm)?, self.layer.eps)?;
        let mixed = match &self.delta {
            None => self.gated_attention(&h, w, seqs)?,
            Some(delta) => self.delta_net(delta, &h, w, seqs)?,
        };
        if mixed.dims() != x.dims() {
            return Err(ModelError::Config(format!(
                "Qwen3.5 mixer output {:?} for input {:?}",
                mixed.dims(),
                x.dims()
            )));
        }
        let x = (x + mixed)?;
        add_mlp(&x, w, self.moe, self.layer.eps, None)
    }
}
