//! The decoder every architecture shares, written one layer at a time.
//!
//! [`Model`] owns only what every step needs whatever the placement: the spec, the fixed
//! weights (embedding, final norm, head), the RoPE tables and one [`Block`] per layer (what
//! the layer computes, chosen by family in [`block::for_layer`]). Decoder weights come from a
//! [`LayerSource`] one layer at a time, so resident layers ([`ResidentLayers`]) and layers
//! streamed or swapped by the offload engine go through the same loop and the model never
//! knows where its weights live.
//!
//! There is one forward path, [`Model::forward_batch`]: a step runs the new tokens of several
//! sequences ([`SeqInput`]), each against its own cache; [`Model::forward`] is a batch of one.
//! [`Model::forward_hidden`] runs the same layers and stops before the output head, returning
//! every new position's final normed hidden state (what embeddings pool, [`crate::pooling`]).

pub mod attention;
pub mod block;
pub mod flash_cpu;
pub mod layers;
pub mod rope;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

pub use self::block::Block;
pub use self::layers::{LayerSource, ResidentLayers, StepRows};

use self::attention::Step;
use self::block::{rms_norm_plus, BatchRows};
use self::rope::Rope;
use super::error::{ModelError, Result};
use super::kv_cache::{HostKvRates, KvCache, KvShape};
use super::kv_format::KvFormat;
use super::recurrent_state::RecurrentShape;
use super::spec::ModelSpec;
use super::weights::FixedWeights;

/// One sequence of a step ([`Model::forward_batch`]): its new tokens and its cache.
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

/// A decoder model without its decoder layers' weights.
#[derive(Debug, Clone)]
pub struct Model {
    spec: ModelSpec,
    fixed: FixedWeights,
    blocks: Vec<Arc<dyn Block>>,
    rope: Rope,
    local_rope: Option<Rope>,
    device: Device,
    dtype: DType,
    kv_dtype: KvFormat,
    kv_host: bool,
    host_kv_rates: Option<HostKvRates>,
}

impl Model {
    /// Builds the model, its layers' blocks and its RoPE tables.
    pub fn new(parts: ModelParts) -> Result<Self> {
        let rope = Rope::new(
            &parts.spec,
            parts.rope_freq_factors.as_deref(),
            parts.dtype,
            &parts.device,
        )?;
        let local_rope = Rope::local(&parts.spec, parts.dtype, &parts.device)?;
        let blocks = (0..parts.spec.n_layers)
            .map(|i| block::for_layer(&parts.spec, i))
            .collect();
        Ok(Self {
            blocks,
            local_rope,
            spec: parts.spec,
            fixed: parts.fixed,
            rope,
            device: parts.device,
            dtype: parts.dtype,
            kv_dtype: KvFormat::Dense(parts.dtype),
            kv_host: false,
            host_kv_rates: None,
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

    /// The format new key/value caches hold (the activation dtype unless set).
    pub fn kv_dtype(&self) -> KvFormat {
        self.kv_dtype
    }

    /// Makes new key/value caches hold `format` (see [`super::kv_cache::kv_dtype_for`]; a
    /// block format was checked against the heads and the device by [`KvFormat::check`]).
    pub fn set_kv_dtype(&mut self, format: KvFormat) {
        self.kv_dtype = format;
    }

    /// Whether new key/value caches live in host memory (`kv_offload`: attention for every
    /// layer then runs on the host, [`KvCache::on_host`]).
    pub fn kv_host(&self) -> bool {
        self.kv_host
    }

    /// Makes new key/value caches live in host memory (`true`) or on the compute device.
    pub fn set_kv_host(&mut self, host: bool) {
        self.kv_host = host;
    }

    /// The rates by which a host cache's attention runs on the host or on the device, per layer
    /// and step ([`HostKvRates`]); `None` (the default): always on the host.
    pub fn set_host_kv_rates(&mut self, rates: Option<HostKvRates>) {
        self.host_kv_rates = rates;
    }

    /// An empty key/value cache that can hold the model's whole context.
    pub fn new_cache(&self) -> KvCache {
        self.new_cache_with_limit(self.spec.max_context)
    }

    /// An empty key/value cache limited to `max_len` positions (capped at the model's context),
    /// its sliding-window layers keeping only their window ([`KvCache::with_windows`]) and its
    /// recurrent layers a state on the compute device ([`KvCache::with_recurrent`]).
    pub fn new_cache_with_limit(&self, max_len: usize) -> KvCache {
        let shape = KvShape::of(&self.spec);
        let max_len = max_len.min(self.spec.max_context);
        let windows: Vec<Option<usize>> = (0..self.spec.n_layers)
            .map(|i| self.spec.layer_window(i))
            .collect();
        KvCache::new(
            self.spec.n_layers,
            shape,
            max_len,
            self.kv_dtype,
            &self.device,
        )
        .with_windows(&windows)
        .on_host(self.kv_host, self.host_kv_rates)
        .with_recurrent(&self.recurrent_shapes(), &self.device)
    }

    /// Per layer, the shape of its recurrent state (`None`: an attention layer).
    pub fn recurrent_shapes(&self) -> Vec<Option<RecurrentShape>> {
        (0..self.spec.n_layers)
            .map(|i| {
                let delta = self.spec.delta_net.as_ref()?;
                self.spec
                    .is_recurrent_layer(i)
                    .then(|| RecurrentShape::of(delta))
            })
            .collect()
    }

    /// One sequence's step: runs `tokens` at positions `cache.len()..` and returns the last
    /// position's logits as f32 `[vocab]`. The same path as [`Model::forward_batch`], for a
    /// batch of one. On error the cache keeps its previous length.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        let logits = self.forward_batch(&mut [SeqInput { tokens, cache }], layers)?;
        Ok(logits.squeeze(0)?)
    }

    /// Runs one step for several sequences and returns each one's last-position logits as f32
    /// `[n_seqs, vocab]`, in input order. Every decoder layer is fetched from `layers` once and
    /// serves the whole batch: its block sees every row together (rows concatenated) and runs
    /// attention per sequence against its own cache, so each sequence gets the logits it would
    /// get alone. On error no cache is advanced. [`Model::forward_rows`] with one row each.
    pub fn forward_batch(
        &self,
        batch: &mut [SeqInput<'_>],
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        let ones = vec![1; batch.len()];
        self.forward_rows(batch, &ones, layers)
    }

    /// [`Model::forward_batch`] returning the logits of each sequence's last `outputs[i]`
    /// positions (at least 1, at most its new tokens) as f32 `[sum of outputs, vocab]`, the
    /// sequences in input order and each one's positions in order: what a speculative step's
    /// verification reads (the logits after every proposed token), from the same pass.
    pub fn forward_rows(
        &self,
        batch: &mut [SeqInput<'_>],
        outputs: &[usize],
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        if outputs.len() != batch.len()
            || batch
                .iter()
                .zip(outputs)
                .any(|(s, &n)| !s.tokens.is_empty() && (n == 0 || n > s.tokens.len()))
        {
            return Err(ModelError::Config(format!(
                "forward_rows: {} output counts for {} sequences, each 1 to its token count",
                outputs.len(),
                batch.len()
            )));
        }
        self.on_step_pool(layers.never_waits(), || {
            self.rows_logits(batch, outputs, layers)
        })
    }

    /// [`Model::forward_rows`] past its checks: the layers, then the output head over the rows
    /// `outputs` asks for.
    fn rows_logits(
        &self,
        batch: &mut [SeqInput<'_>],
        outputs: &[usize],
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        let (x, offsets) = self.run_layers(batch, layers)?;
        let rows: Vec<u32> = batch
            .iter()
            .zip(&offsets)
            .zip(outputs)
            .flat_map(|((s, &offset), &n)| {
                let end = offset + s.tokens.len();
                (end - n..end).map(|row| row as u32)
            })
            .collect();
        let count = rows.len();
        let rows = Tensor::from_vec(rows, count, &self.device)?;
        let rows = x.squeeze(0)?.index_select(&rows, 0)?.unsqueeze(0)?;
        let rows = self.final_norm(&rows)?;
        let logits = self.fixed.lm_head.forward(&rows)?.to_dtype(DType::F32)?;
        let logits = match self.spec.final_softcap {
            None => logits,
            Some(cap) => ((logits / cap as f64)?.tanh()? * cap as f64)?,
        };
        Ok(logits.squeeze(0)?)
    }

    /// The same step as [`Model::forward`] for one sequence, returning instead of the last
    /// position's logits every new position's final hidden state (after the final norm, before
    /// the output head) as f32 `[tokens.len(), hidden]`: what an embedding pools. On error the
    /// cache keeps its previous length.
    pub fn forward_hidden(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        layers: &mut dyn LayerSource,
    ) -> Result<Tensor> {
        self.on_step_pool(layers.never_waits(), || {
            let (x, _) = self.run_layers(&mut [SeqInput { tokens, cache }], layers)?;
            Ok(self.final_norm(&x.squeeze(0)?)?.to_dtype(DType::F32)?)
        })
    }

    /// The final RMSNorm (with the family's weight offset) over rows of the residual stream.
    fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm_plus(
            x,
            &self.fixed.final_norm,
            self.spec.rms_norm_eps as f32,
            self.spec.norm_offset,
        )
    }

    /// The decoder proper, shared by every output: embeds the batch's new tokens as one row
    /// block `[1, total, hidden]`, runs every layer over it (each fetched from `layers` once)
    /// and commits the caches. Returns the residual stream after the last layer and each
    /// sequence's first row in it. On error no cache is advanced.
    fn run_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        layers: &mut dyn LayerSource,
    ) -> Result<(Tensor, Vec<usize>)> {
        if batch.is_empty() || batch.iter().any(|s| s.tokens.is_empty()) {
            return Err(ModelError::EmptyInput);
        }
        // Families whose layers alternate (a pattern) keep the window for the local mask;
        // otherwise it applies to every layer (Mistral).
        let (global_window, local_window) = match self.spec.sliding_window_pattern {
            None => (self.spec.sliding_window, None),
            Some(_) => (None, self.spec.sliding_window),
        };
        let mut ids = Vec::new();
        let mut steps = Vec::with_capacity(batch.len());
        let mut offsets = Vec::with_capacity(batch.len());
        for s in batch.iter() {
            self.check(s)?;
            let pos = s.cache.len();
            let seq = s.tokens.len();
            offsets.push(ids.len());
            ids.extend_from_slice(s.tokens);
            steps.push(Step::new(
                seq,
                pos,
                &self.rope,
                self.local_rope.as_ref(),
                global_window,
                local_window,
                &self.device,
            )?);
        }
        let total = ids.len();
        let ids = Tensor::from_vec(ids, (1, total), &self.device)?;
        let mut x = self.fixed.embedding.forward(&ids)?.to_dtype(self.dtype)?;
        if let Some(scale) = self.spec.embed_scale {
            // Gemma rounds the scale to the activation dtype first, as transformers does.
            let scale = Tensor::new(scale, &self.device)?.to_dtype(self.dtype)?;
            x = x.broadcast_mul(&scale)?;
        }
        let longest = batch.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        layers.begin_step(StepRows {
            rows: total,
            longest,
        })?;
        for (i, block) in self.blocks.iter().enumerate() {
            let w = layers.layer(i)?;
            let mut rows = Vec::with_capacity(batch.len());
            for ((s, step), &offset) in batch.iter_mut().zip(&steps).zip(&offsets) {
                let len = s.tokens.len();
                let n_cached = s.cache.n_layers();
                let state = s.cache.state_mut(i).ok_or(ModelError::CacheMismatch {
                    cache: n_cached,
                    model: self.spec.n_layers,
                })?;
                rows.push(BatchRows {
                    offset,
                    len,
                    state,
                    step,
                });
            }
            x = self.on_pool(|| block.forward(&x, &w, &mut rows))?;
            drop(w);
            layers.release(i)?;
        }
        for s in batch.iter_mut() {
            s.cache.commit(s.tokens.len())?;
        }
        Ok((x, offsets))
    }

    /// Refuses a sequence this model cannot run: a cache of another model, a token past the
    /// vocabulary, or more tokens than the cache has room for.
    fn check(&self, s: &SeqInput<'_>) -> Result<()> {
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
        s.cache.check_room(s.tokens.len())
    }

    /// Runs `f` (one decoder layer) on a thread of rayon's pool when computing on the CPU.
    ///
    /// The CPU matmuls split their rows over the pool; called from a thread outside it, each
    /// of them would hand its work over and sleep until woken (two thread switches per matmul).
    /// Moving the whole layer onto a pool thread pays that once per layer instead. Inside
    /// [`Model::on_step_pool`] the caller is already a pool thread and `f` runs in place.
    fn on_pool<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.device.is_cpu() {
            rayon::scope(|_| f())
        } else {
            f()
        }
    }

    /// Runs `f` (a whole step: every layer and the output head) on a thread of rayon's pool
    /// when computing on the CPU and `whole` (the layer source never waits,
    /// [`LayerSource::never_waits`]); otherwise on the calling thread, each layer then moving
    /// to the pool on its own ([`Model::on_pool`]). One hand-over per step instead of one per
    /// layer: each cost the pool's thread a wake-up of tens of microseconds on a VM (measured:
    /// the 30-layer default model's busiest pool thread switched 29 times a token before,
    /// about 2 after, and decoded 1.12-1.2x as fast; 4-layer models within the noise).
    fn on_step_pool<R: Send>(&self, whole: bool, f: impl FnOnce() -> R + Send) -> R {
        if whole {
            self.on_pool(f)
        } else {
            f()
        }
    }
}

#[cfg(test)]
#[path = "hidden_tests.rs"]
mod hidden_tests;
