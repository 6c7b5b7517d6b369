//! The Llama-family decoder (Llama, Qwen2, Mistral), written one layer at a time.
//!
//! Reference: HF transformers' `modeling_llama.py` / `modeling_qwen2.py` / `modeling_mistral.py`,
//! cross-checked in `tests/arch_crosscheck.rs` against candle-transformers' `llama`, `qwen2`,
//! `mistral` and `quantized_llama` on the same random weights.
//!
//! [`Model`] owns only what every step needs whatever the placement: the spec, the fixed weights
//! (embedding, final norm, head) and the RoPE tables. Decoder layers come from a
//! [`LayerSource`] one at a time, so resident layers ([`ResidentLayers`]) and layers streamed
//! by the offload engine go through the same loop.

pub mod attention;
pub mod block;
pub mod rope;

use candle_core::{DType, Device, Tensor};

use self::attention::Step;
use self::block::{rms_norm, BatchRows, Block};
use self::rope::Rope;
use super::error::{ModelError, Result};
use super::kv_cache::{KvCache, KvShape};
use super::spec::ModelSpec;
use super::weights::{FixedWeights, LayerWeights};

/// Hands out the weights of decoder layer `index` for one forward pass.
pub trait LayerSource {
    /// The weights of layer `index` (called once per layer per step, in order).
    fn layer(&mut self, index: usize) -> Result<LayerWeights>;
    /// Called when layer `index` has been computed and its weights may be reused.
    fn release(&mut self, index: usize) -> Result<()> {
        let _ = index;
        Ok(())
    }
}

/// Every layer resident on the compute device.
#[derive(Debug, Clone)]
pub struct ResidentLayers(pub Vec<LayerWeights>);

impl LayerSource for ResidentLayers {
    fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        self.0.get(index).cloned().ok_or_else(|| {
            ModelError::MissingTensor(format!("layer {index} (of {})", self.0.len()))
        })
    }
}

/// One sequence of a batched step ([`Model::forward_batch`]): its new tokens and its cache.
pub struct SeqInput<'a> {
    /// Tokens to run at positions `cache.len()..` (a prompt chunk or one decode token).
    pub tokens: &'a [u32],
    /// The sequence's key/value cache.
    pub cache: &'a mut KvCache,
}

/// Everything [`Model::new`] needs.
#[derive(Debug, Clone)]
pub struct ModelParts {
    /// Shape and hyper-parameters.
    pub spec: ModelSpec,
    /// Embedding, final norm and output head.
    pub fixed: FixedWeights,
    /// Per-frequency RoPE divisors (GGUF `rope_freqs.weight`), if the checkpoint has them.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// The compute device.
    pub device: Device,
    /// Activation dtype (f32 for quantized weights).
    pub dtype: DType,
}

/// A Llama-family model without its decoder layers.
#[derive(Debug, Clone)]
pub struct Model {
    spec: ModelSpec,
    fixed: FixedWeights,
    block: Block,
    rope: Rope,
    device: Device,
    dtype: DType,
}

impl Model {
    /// Builds the model and its RoPE tables.
    pub fn new(parts: ModelParts) -> Result<Self> {
        let rope = Rope::new(
            &parts.spec,
            parts.rope_freq_factors.as_deref(),
            parts.dtype,
            &parts.device,
        )?;
        Ok(Self {
            block: Block::new(&parts.spec),
            spec: parts.spec,
            fixed: parts.fixed,
            rope,
            device: parts.device,
            dtype: parts.dtype,
        })
    }

    /// The model's spec.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Embedding, final norm and head.
    pub fn fixed(&self) -> &FixedWeights {
        &self.fixed
    }

    /// The compute device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The activation dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// An empty key/value cache that can hold the model's whole context.
    pub fn new_cache(&self) -> KvCache {
        self.new_cache_with_limit(self.spec.max_context)
    }

    /// An empty key/value cache limited to `max_len` positions (capped at the model's context).
    pub fn new_cache_with_limit(&self, max_len: usize) -> KvCache {
        let shape = KvShape {
            n_kv_heads: self.spec.n_kv_heads,
            head_dim: self.spec.head_dim,
        };
        let max_len = max_len.min(self.spec.max_context);
        KvCache::new(self.spec.n_layers, shape, max_len, self.dtype, &self.device)
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the last position's logits as
    /// f32 `[vocab]`. On error the cache keeps its previous length.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        let seq = tokens.len();
        if seq == 0 {
            return Err(ModelError::EmptyInput);
        }
        if cache.n_layers() != self.spec.n_layers {
            return Err(ModelError::CacheMismatch {
                cache: cache.n_layers(),
                model: self.spec.n_layers,
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.spec.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                token,
                vocab_size: self.spec.vocab_size,
            });
        }
        cache.check_room(seq)?;
        let pos = cache.len();

        let ids = Tensor::from_slice(tokens, (1, seq), &self.device)?;
        let mut x = self.fixed.embedding.forward(&ids)?.to_dtype(self.dtype)?;
        let step = Step {
            pos,
            rope: &self.rope,
            mask: attention::causal_mask(seq, pos, self.spec.sliding_window, &self.device)?,
        };
        for i in 0..self.spec.n_layers {
            let w = layers.layer(i)?;
            let n_cached = cache.n_layers();
            let kv = cache.layer_mut(i).ok_or(ModelError::CacheMismatch {
                cache: n_cached,
                model: self.spec.n_layers,
            })?;
            x = self.on_pool(|| self.block.forward(&x, &w, kv, &step))?;
            drop(w);
            layers.release(i)?;
        }
        cache.commit(seq)?;

        let last = x.narrow(1, seq - 1, 1)?;
        let last = rms_norm(&last, &self.fixed.final_norm, self.spec.rms_norm_eps as f32)?;
        let logits = self.fixed.lm_head.forward(&last)?;
        Ok(logits.flatten_all()?.to_dtype(DType::F32)?)
    }

    /// Runs `f` (one decoder layer) on a thread of rayon's pool when computing on the CPU.
    ///
    /// The CPU matmuls split their rows over the pool; called from a thread outside it, each
    /// of them would hand its work over and sleep until woken (two thread switches per matmul).
    /// Moving the whole layer onto a pool thread pays that once per layer instead.
    fn on_pool<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.device.is_cpu() {
            rayon::scope(|_| f())
        } else {
            f()
        }
    }

    /// Runs several sequences in one step and returns each one's last-position logits as f32
    /// `[n_seqs, vocab]`, in input order. Every decoder layer is fetched from `layers` once and
    /// serves the whole batch: norms, projections and MLP run on all rows together (rows
    /// concatenated), attention per sequence against its own cache. Each sequence gives the
    /// same logits as [`Model::forward`] on it alone. On error no cache is advanced.
    pub fn forward_batch(
        &self,
        batch: &mut [SeqInput<'_>],
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        if batch.is_empty() || batch.iter().any(|s| s.tokens.is_empty()) {
            return Err(ModelError::EmptyInput);
        }
        let mut ids = Vec::new();
        let mut steps = Vec::with_capacity(batch.len());
        let mut offsets = Vec::with_capacity(batch.len());
        for s in batch.iter() {
            if s.cache.n_layers() != self.spec.n_layers {
                return Err(ModelError::CacheMismatch {
                    cache: s.cache.n_layers(),
                    model: self.spec.n_layers,
                });
            }
            if let Some(&token) = s
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.spec.vocab_size)
            {
                return Err(ModelError::TokenOutOfRange {
                    token,
                    vocab_size: self.spec.vocab_size,
                });
            }
            s.cache.check_room(s.tokens.len())?;
            let pos = s.cache.len();
            let seq = s.tokens.len();
            offsets.push(ids.len());
            ids.extend_from_slice(s.tokens);
            steps.push(Step {
                pos,
                rope: &self.rope,
                mask: attention::causal_mask(seq, pos, self.spec.sliding_window, &self.device)?,
            });
        }
        let total = ids.len();
        let ids = Tensor::from_vec(ids, (1, total), &self.device)?;
        let mut x = self.fixed.embedding.forward(&ids)?.to_dtype(self.dtype)?;
        for i in 0..self.spec.n_layers {
            let w = layers.layer(i)?;
            let mut rows = Vec::with_capacity(batch.len());
            for ((s, step), &offset) in batch.iter_mut().zip(&steps).zip(&offsets) {
                let len = s.tokens.len();
                let n_cached = s.cache.n_layers();
                let kv = s.cache.layer_mut(i).ok_or(ModelError::CacheMismatch {
                    cache: n_cached,
                    model: self.spec.n_layers,
                })?;
                rows.push(BatchRows {
                    offset,
                    len,
                    kv,
                    step,
                });
            }
            x = self.on_pool(|| self.block.forward_batch(&x, &w, &mut rows))?;
            drop(w);
            layers.release(i)?;
        }
        for s in batch.iter_mut() {
            s.cache.commit(s.tokens.len())?;
        }

        let last: Vec<u32> = batch
            .iter()
            .zip(&offsets)
            .map(|(s, &offset)| (offset + s.tokens.len() - 1) as u32)
            .collect();
        let last = Tensor::from_vec(last, batch.len(), &self.device)?;
        let last = x.squeeze(0)?.index_select(&last, 0)?.unsqueeze(0)?;
        let last = rms_norm(&last, &self.fixed.final_norm, self.spec.rms_norm_eps as f32)?;
        let logits = self.fixed.lm_head.forward(&last)?;
        Ok(logits.squeeze(0)?.to_dtype(DType::F32)?)
    }
}
