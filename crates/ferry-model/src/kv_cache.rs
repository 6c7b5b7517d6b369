//! The per-sequence key/value cache: one buffer pair per layer, written in place.
//!
//! Each layer keeps `[1, n_kv_heads, capacity, head_dim]` buffers for keys and values. New
//! positions are written with `slice_set` and attention reads a narrowed view, so a decode step
//! copies only the new token's keys and values, never the whole history. Buffers start small
//! and double (up to the limit) when a step does not fit, so a short chat does not reserve the
//! model's full context. The cache never grows past its limit: a step that would is refused
//! with [`ModelError::ContextOverflow`] before any layer runs.
//!
//! Positions are committed only after every layer has written them ([`KvCache::commit`]), so a
//! forward pass that fails half-way leaves the cache as it was.
//!
//! A layer that attends within a sliding window ([`KvCache::with_windows`]: Gemma 2/3's local
//! layers, Mistral's) keeps only what its queries can still see: when its buffer is full it
//! moves the last `window` positions (and [`ROLLBACK_SLACK`] more) to the front and forgets the
//! older ones, so its bytes stop growing at about [`window_positions`] while the global layers
//! grow with the context. Its reads are views of the positions it holds, from
//! [`LayerKv::first_position`] on (attention is the same relative to any first position). The
//! positions a window layer has forgotten cannot be copied out ([`KvCache::copy_span`] refuses
//! them), so the prefix cache keeps such a model's prompts only while they are held.
//!
//! The prefix cache keeps copies of some positions ([`KvSpan`], [`KvCache::copy_span`]) and a new
//! sequence starts from them ([`KvCache::extend_from_spans`]) instead of computing them again.
//!
//! A recurrent layer (Qwen3.5's Gated DeltaNet) keeps a fixed-size state instead
//! ([`LayerState::Recurrent`], [`RecurrentState`]): its bytes do not grow with the context, it
//! is copied by [`KvCache::fork`], and since it keeps no history a cache with such layers
//! cannot be cut back ([`KvCache::truncate`] refuses, except to empty) nor copied out by
//! position ([`KvCache::copy_span`] refuses).
//!
//! A latent attention layer (DeepSeek's MLA) caches one row per position, the latent and its
//! RoPE key part, whose first `kv_lora_rank` values are its values ([`KvShape::values_in_keys`]):
//! no value buffer, the values a view of the keys.
//!
//! The buffers hold the cache's own format (`kv_dtype`, [`kv_dtype_for`], [`KvFormat`]): new keys
//! and values are converted on write, so an f16 or bf16 cache takes half the bytes of an f32 one
//! and a q8_0 / q4_0 one about 0.53x / 0.28x those of f16.

use candle_core::{DType, Device, Tensor};

use super::error::{ModelError, Result};
use super::kv_format::KvFormat;
use super::recurrent_state::{RecurrentShape, RecurrentState};
use super::spec::ModelSpec;
use ferry_config::{DtypeChoice, QuantType};

/// The KV cache's dtype for the setting `choice` with activations in `compute`: a set dtype as
/// it is; `auto` f16 (half the bytes of f32, and llama.cpp's default), or bf16 when the
/// activations are bf16, whose range f16 lacks. The same on every device: CUDA multiplies in
/// the cache's dtype, and the CPU's attention (`decoder::flash_cpu`) widens f16 / bf16 keys and
/// values in registers, so long-context decode, bound by reading the cache, gains about 1.5x
/// over an f32 cache (docs/BENCHMARKS.md, "KV cache dtype on the CPU").
/// `q8_0` and `q4_0` are llama.cpp's blocks ([`KvFormat`]).
pub fn kv_dtype_for(choice: DtypeChoice, compute: DType) -> KvFormat {
    match choice {
        DtypeChoice::F32 => KvFormat::Dense(DType::F32),
        DtypeChoice::F16 => KvFormat::Dense(DType::F16),
        DtypeChoice::BF16 => KvFormat::Dense(DType::BF16),
        DtypeChoice::Auto if compute == DType::BF16 => KvFormat::Dense(DType::BF16),
        DtypeChoice::Auto => KvFormat::Dense(DType::F16),
        DtypeChoice::Quantize(QuantType::Q8_0) => KvFormat::Q8_0,
        DtypeChoice::Quantize(QuantType::Q4_0) => KvFormat::Q4_0,
        // Another weight quantization type says nothing of the cache (the kv_dtype setting
        // refuses one).
        DtypeChoice::Quantize(_) => kv_dtype_for(DtypeChoice::Auto, compute),
    }
}

/// Smallest number of positions a layer buffer is allocated for.
const MIN_CHUNK: usize = 256;

/// Positions a sliding-window layer keeps beyond its window, so that a sequence cut back by this
/// many positions (a rejected speculation) still has every key its next query sees.
pub const ROLLBACK_SLACK: usize = 64;

/// The most positions a layer with a sliding `window` holds when no step writes more than
/// `max_step` positions (what the plan counts for such a layer): its window, the slack and one
/// step, in whole chunks.
pub fn window_positions(window: usize, max_step: usize) -> usize {
    (window + ROLLBACK_SLACK + max_step).next_multiple_of(MIN_CHUNK)
}

/// The rates that decide, per layer and step, where attention against a cache in host memory
/// runs ([`KvCache::on_host`]): on the host, which reads the cache and computes there, or on the
/// device, the positions the step attends to crossing the link first. What crosses in the first
/// case is a step's queries, keys and values and the output: nothing next to the cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostKvRates {
    /// Host-to-device bytes/s.
    pub link_bytes_per_s: f64,
    /// Bytes/s the host reads the cache at.
    pub host_read_bytes_per_s: f64,
    /// Flop/s of the host's attention.
    pub host_flops_per_s: f64,
}

impl HostKvRates {
    /// Whether `bytes` of cache are sooner over the link than read and used for `flops` on the
    /// host (a rate that is not a positive number counts as infinitely slow).
    pub fn streams(&self, bytes: f64, flops: f64) -> bool {
        let time = |amount: f64, rate: f64| {
            if rate.is_finite() && rate > 0.0 {
                amount / rate
            } else if rate.is_infinite() && rate > 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        };
        let host = time(bytes, self.host_read_bytes_per_s).max(time(flops, self.host_flops_per_s));
        time(bytes, self.link_bytes_per_s) < host
    }
}

/// Shape of the cached tensors, shared by every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of one head (of its keys).
    pub head_dim: usize,
    /// The values are the first this many of each key row rather than rows of their own (the
    /// latent attention's cache: a key row is the latent and its RoPE part, the value the
    /// latent): one buffer, the values a view of it. `None`: values of `head_dim` apart.
    pub values_in_keys: Option<usize>,
}

impl KvShape {
    /// Grouped-query attention's cache: `n_kv_heads` heads of `head_dim` keys and as many values.
    pub fn gqa(n_kv_heads: usize, head_dim: usize) -> Self {
        Self {
            n_kv_heads,
            head_dim,
            values_in_keys: None,
        }
    }

    /// The cache of a model with `spec`: its key/value heads, or with latent attention one row
    /// of the latent and the RoPE part per position, the values its first `kv_lora_rank`.
    pub fn of(spec: &ModelSpec) -> Self {
        Self {
            n_kv_heads: spec.n_kv_heads,
            head_dim: spec.head_dim,
            values_in_keys: spec.mla.map(|m| m.kv_lora_rank),
        }
    }

    /// Width of one value row.
    pub fn value_dim(&self) -> usize {
        self.values_in_keys.unwrap_or(self.head_dim)
    }

    /// Bytes one position takes in one layer stored in `format`: a key row per head and, unless
    /// the values are in the keys, a value row ([`KvFormat::row_bytes`]).
    pub fn bytes_per_position(&self, format: KvFormat) -> usize {
        let rows = match self.values_in_keys {
            Some(_) => 1,
            None => 2,
        };
        rows * self.n_kv_heads * format.row_bytes(self.head_dim)
    }
}

/// What one layer of a sequence keeps: keys and values, or a recurrent state.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// An attention layer's key/value buffers.
    Attention(LayerKv),
    /// A recurrent layer's fixed-size state.
    Recurrent(RecurrentState),
}

impl LayerState {
    /// The key/value buffers of an attention layer; an error for a recurrent layer.
    pub fn kv_mut(&mut self) -> Result<&mut LayerKv> {
        match self {
            LayerState::Attention(kv) => Ok(kv),
            LayerState::Recurrent(_) => Err(ModelError::Config(
                "an attention block was given a recurrent layer's state".into(),
            )),
        }
    }

    /// The state of a recurrent layer; an error for an attention layer.
    pub fn recurrent_mut(&mut self) -> Result<&mut RecurrentState> {
        match self {
            LayerState::Recurrent(state) => Ok(state),
            LayerState::Attention(_) => Err(ModelError::Config(
                "a recurrent block was given an attention layer's key/value cache".into(),
            )),
        }
    }

    fn attention(&self) -> Option<&LayerKv> {
        match self {
            LayerState::Attention(kv) => Some(kv),
            LayerState::Recurrent(_) => None,
        }
    }

    fn allocated_bytes(&self) -> usize {
        match self {
            LayerState::Attention(kv) => kv.allocated_bytes(),
            LayerState::Recurrent(state) => state.allocated_bytes(),
        }
    }

    /// Whether the layer's bytes are in host memory (a recurrent state never is).
    fn on_host(&self) -> bool {
        self.attention().is_some_and(LayerKv::on_host)
    }

    fn fork(&self, len: usize) -> Result<Self> {
        Ok(match self {
            LayerState::Attention(kv) => LayerState::Attention(kv.fork(len)?),
            LayerState::Recurrent(state) => LayerState::Recurrent(state.fork()?),
        })
    }
}

/// The key/value cache of one sequence across all layers.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerState>,
    len: usize,
    max_len: usize,
}

impl KvCache {
    /// An empty cache for `n_layers` layers that holds at most `max_len` positions.
    pub fn new(
        n_layers: usize,
        shape: KvShape,
        max_len: usize,
        format: KvFormat,
        device: &Device,
    ) -> Self {
        let layer = LayerKv {
            k: None,
            v: None,
            shape,
            format,
            device: device.clone(),
            max_len,
            window: None,
            first: 0,
            host: false,
            rates: None,
        };
        Self {
            layers: vec![LayerState::Attention(layer); n_layers],
            len: 0,
            max_len,
        }
    }

    /// The cache with layer `i` keeping a recurrent state of `shapes[i]` (`None`: keys and
    /// values) on `device`, for an empty cache.
    pub fn with_recurrent(mut self, shapes: &[Option<RecurrentShape>], device: &Device) -> Self {
        for (layer, shape) in self.layers.iter_mut().zip(shapes) {
            if let Some(shape) = shape {
                *layer = LayerState::Recurrent(RecurrentState::new(*shape, device));
            }
        }
        self
    }

    /// Whether some layer keeps a recurrent state.
    pub fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Recurrent(_)))
    }

    fn attention_layers_mut(&mut self) -> impl Iterator<Item = &mut LayerKv> {
        self.layers.iter_mut().filter_map(|l| match l {
            LayerState::Attention(kv) => Some(kv),
            LayerState::Recurrent(_) => None,
        })
    }

    /// The cache with layer `i` attending within `windows[i]` positions (`None`: every
    /// position), for an empty cache: such a layer keeps only its window ([`window_positions`]).
    pub fn with_windows(mut self, windows: &[Option<usize>]) -> Self {
        for (layer, window) in self.layers.iter_mut().zip(windows) {
            if let LayerState::Attention(layer) = layer {
                layer.window = window.filter(|&w| w > 0);
            }
        }
        self
    }

    /// The cache with every layer's buffers in host memory (`kv_offload`), for an empty cache:
    /// attention against them runs on the host, or, where `rates` say the link is quicker for a
    /// step, on the device after the positions cross ([`LayerKv::streams`]).
    pub fn on_host(mut self, host: bool, rates: Option<HostKvRates>) -> Self {
        if host {
            for layer in self.attention_layers_mut() {
                layer.host = true;
                layer.rates = rates;
                layer.device = Device::Cpu;
            }
        }
        self
    }

    /// Positions stored (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is stored yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Positions currently allocated in each attention layer's buffers.
    pub fn capacity(&self) -> usize {
        self.layers
            .iter()
            .find_map(LayerState::attention)
            .map_or(0, LayerKv::capacity)
    }

    /// Bytes currently allocated across all layers (keys and values, recurrent states).
    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(LayerState::allocated_bytes).sum()
    }

    /// The part of [`Self::allocated_bytes`] on the compute device (none of a host cache's
    /// keys and values; recurrent states always).
    pub fn device_allocated_bytes(&self) -> usize {
        self.layers
            .iter()
            .filter(|layer| !layer.on_host())
            .map(LayerState::allocated_bytes)
            .sum()
    }

    /// Bytes of the positions stored across all layers (keys and values): on the CPU the part of
    /// [`Self::allocated_bytes`] that is resident ([`super::kv_buffer`]), give or take a page per
    /// head.
    pub fn stored_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|layer| match layer {
                LayerState::Attention(kv) => kv.bytes_for(self.len.saturating_sub(kv.first)),
                LayerState::Recurrent(state) => state.stored_bytes(),
            })
            .sum()
    }

    /// Fails with [`ModelError::ContextOverflow`] when `extra` more positions do not fit.
    pub fn check_room(&self, extra: usize) -> Result<()> {
        let needed = self.len + extra;
        if needed > self.max_len {
            return Err(ModelError::ContextOverflow {
                needed,
                max: self.max_len,
            });
        }
        Ok(())
    }

    /// The key/value cache of attention layer `index` (`None` past the last layer or for a
    /// recurrent layer).
    pub fn layer_mut(&mut self, index: usize) -> Option<&mut LayerKv> {
        self.layers.get_mut(index).and_then(|l| l.kv_mut().ok())
    }

    /// What layer `index` keeps, for its block to read and write.
    pub fn state_mut(&mut self, index: usize) -> Option<&mut LayerState> {
        self.layers.get_mut(index)
    }

    /// Marks `n` new positions as written by every layer (recurrent layers' staged states
    /// become their states).
    pub fn commit(&mut self, n: usize) -> Result<()> {
        self.check_room(n)?;
        for layer in &mut self.layers {
            if let LayerState::Recurrent(state) = layer {
                state.commit();
            }
        }
        self.len += n;
        Ok(())
    }

    /// An independent copy holding the same positions (its own buffers, so writes to either
    /// never show in the other): how a request's other choices start after its prompt. (The
    /// derived `Clone` shares the buffers.)
    pub fn fork(&self) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|layer| layer.fork(self.len))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            len: self.len,
            max_len: self.max_len,
        })
    }

    /// Forgets every position at or after `len` (keeps the buffers for reuse). A cache with
    /// recurrent layers can only be emptied (`len` 0) or left as it is (`len` at least the
    /// positions held): its states keep no history to go back to, and a shorter `len` is an
    /// error that changes nothing.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len < self.len && len > 0 && self.has_recurrent() {
            return Err(ModelError::Config(format!(
                "cannot cut a cache with recurrent layers back from {} to {len} positions \
                 (a recurrent state keeps no history)",
                self.len
            )));
        }
        if len == 0 {
            for layer in &mut self.layers {
                if let LayerState::Recurrent(state) = layer {
                    state.clear();
                }
            }
        }
        self.len = self.len.min(len);
        Ok(())
    }

    /// A copy of positions `start..start + len` of every layer (all of them stored), with its
    /// own buffers: what the prefix cache keeps of a prompt. Refused for a cache with
    /// recurrent layers (a state is not a sum of positions).
    pub fn copy_span(&self, start: usize, len: usize) -> Result<KvSpan> {
        if self.has_recurrent() {
            return Err(ModelError::Config(
                "a cache with recurrent layers has no positions to copy out".into(),
            ));
        }
        if len == 0 || start + len > self.len {
            return Err(candle_core::Error::Msg(format!(
                "kv span {start}..{} is outside the {} positions stored",
                start + len,
                self.len
            ))
            .into());
        }
        let layers = self
            .layers
            .iter()
            .filter_map(LayerState::attention)
            .map(|layer| layer.copy_span(start, len))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvSpan { layers, len })
    }

    /// Appends `spans` (consecutive positions, in order) after the positions stored, in every
    /// layer, and commits them. On error nothing is committed.
    pub fn extend_from_spans(&mut self, spans: &[&KvSpan]) -> Result<()> {
        let added: usize = spans.iter().map(|s| s.len).sum();
        if added == 0 {
            return Ok(());
        }
        self.check_room(added)?;
        if self.has_recurrent() || spans.iter().any(|s| s.layers.len() != self.layers.len()) {
            return Err(candle_core::Error::Msg("kv span of another model".into()).into());
        }
        let pos = self.len;
        for (index, layer) in self.attention_layers_mut().enumerate() {
            let keys: Vec<&Tensor> = spans.iter().map(|s| &s.layers[index].0).collect();
            let values: Vec<&Tensor> = spans.iter().map(|s| &s.layers[index].1).collect();
            layer.append_stored(pos, &Tensor::cat(&keys, 2)?, &Tensor::cat(&values, 2)?)?;
        }
        self.commit(added)
    }

    /// [`capacity_bound`] for this cache's limit.
    pub fn capacity_bound(&self, len: usize) -> usize {
        capacity_bound(len, self.max_len)
    }
}

/// The most positions the buffers of a cache limited to `max_len` positions may be allocated
/// for once it holds `len` positions, whatever steps it grew by: every growth takes the larger
/// of twice the old capacity (below `len`, a multiple of [`MIN_CHUNK`]) and the new length
/// rounded up to [`MIN_CHUNK`], capped at the limit. What a running sequence may come to hold,
/// for budgets that must leave it room.
pub fn capacity_bound(len: usize, max_len: usize) -> usize {
    let rounded = len.max(1).div_ceil(MIN_CHUNK) * MIN_CHUNK;
    let doubled = 2 * rounded.saturating_sub(MIN_CHUNK);
    rounded.max(doubled).min(max_len)
}

/// Copies of some consecutive positions of every layer's keys and values, taken from one
/// sequence's cache ([`KvCache::copy_span`]) to start others from ([`KvCache::extend_from_spans`]).
#[derive(Debug)]
pub struct KvSpan {
    /// Per layer, keys and values `[1, n_kv_heads, len, head_dim]`.
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
}

impl KvSpan {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no position (never, for a span made by [`KvCache::copy_span`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held across all layers (keys and values; a block-format cache's are bytes).
    pub fn allocated_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum()
    }
}

/// One layer's key and value buffers.
#[derive(Debug, Clone)]
pub struct LayerKv {
    k: Option<Tensor>,
    v: Option<Tensor>,
    shape: KvShape,
    format: KvFormat,
    device: Device,
    max_len: usize,
    /// The layer's sliding window, when it keeps only that.
    window: Option<usize>,
    /// The position buffer row 0 holds (0 unless a window layer forgot older positions).
    first: usize,
    /// Whether the buffers live in host memory while the model computes elsewhere.
    host: bool,
    /// What decides where attention against them runs when `host` (`None`: on the host).
    rates: Option<HostKvRates>,
}

impl LayerKv {
    /// Whether the buffers live in host memory (`kv_offload`), so attention against them runs
    /// on the host whatever the compute device ([`crate::decoder::attention::attend`]).
    pub fn on_host(&self) -> bool {
        self.host
    }

    /// Whether a step of `rows` queries (of `heads` heads) attends on the device, this layer's
    /// positions up to `end` crossing the link, rather than on the host: the rates' choice for
    /// the bytes the host would read and the work it would do.
    pub fn streams(&self, rows: usize, heads: usize, end: usize) -> bool {
        let Some(rates) = self.rates.filter(|_| self.host) else {
            return false;
        };
        let positions = end.saturating_sub(self.first);
        let bytes = self.bytes_for(positions) as f64;
        let flops = 4.0 * (rows * heads * positions * self.shape.head_dim) as f64;
        rates.streams(bytes, flops)
    }

    /// How the buffers store keys and values.
    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// The first position the buffers hold: row 0 of the views [`Self::write`] returns.
    pub fn first_position(&self) -> usize {
        self.first
    }

    /// Writes `k` and `v` (`[1, n_kv_heads, seq, head_dim]`, contiguous) at positions
    /// `pos..pos + seq` and returns views of positions `first..pos + seq`
    /// ([`Self::first_position`], after the write), as the buffers store them
    /// (`[1, n_kv_heads, pos + seq - first, row_len]` of [`KvFormat::storage_dtype`]).
    pub fn write(&mut self, pos: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.write_stored(pos, &self.format.encode(k)?, &self.format.encode(v)?)
    }

    /// [`Self::write`] of keys and values already in the buffers' format (a span's copies).
    fn write_stored(&mut self, pos: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let seq = k.dim(2)?;
        let end = pos + seq;
        if end > self.max_len {
            return Err(ModelError::ContextOverflow {
                needed: end,
                max: self.max_len,
            });
        }
        if let Some(window) = self.window {
            // The first query of this write sees positions from `pos + 1 - window` on.
            let needed_from = (pos + 1).saturating_sub(window);
            if pos < self.first || needed_from < self.first {
                return Err(candle_core::Error::Msg(format!(
                    "kv cache: a sliding-window layer no longer holds position {} (it holds {}..)",
                    needed_from.min(pos),
                    self.first
                ))
                .into());
            }
            if end - self.first > self.capacity() {
                self.forget_before(needed_from.saturating_sub(ROLLBACK_SLACK), pos)?;
            }
        }
        let rows = end - self.first;
        if rows > self.capacity() {
            self.grow(pos - self.first, rows, seq)?;
        }
        self.set_rows(pos - self.first, k, v)?;
        let keys = self.keys()?.narrow(2, 0, rows)?;
        let values = match (&self.v, self.shape.values_in_keys) {
            (Some(vb), _) => vb.narrow(2, 0, rows)?,
            (None, Some(n)) => keys.narrow(3, 0, self.format.row_len(n))?,
            (None, None) => return Err(buffers_missing()),
        };
        Ok((keys, values))
    }

    /// The key buffer.
    fn keys(&self) -> Result<&Tensor> {
        self.k.as_ref().ok_or_else(buffers_missing)
    }

    /// Writes `k` and `v` (stored format) at buffer row `row`: the values only where they have
    /// a buffer of their own.
    fn set_rows(&self, row: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.keys()?.slice_set(&k.contiguous()?, 2, row)?;
        match (&self.v, self.shape.values_in_keys) {
            (Some(vb), _) => Ok(vb.slice_set(&v.contiguous()?, 2, row)?),
            (None, Some(_)) => Ok(()),
            (None, None) => Err(buffers_missing()),
        }
    }

    /// [`Self::write_stored`] of positions no query of this write reads (a restored prefix): a
    /// window layer keeps only the last of them its next queries can see.
    fn append_stored(&mut self, pos: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let seq = k.dim(2)?;
        let end = pos + seq;
        let keep_from = match self.window {
            Some(window) => end.saturating_sub(window + ROLLBACK_SLACK),
            None => 0,
        };
        if keep_from <= pos {
            self.write_stored(pos, k, v)?;
            return Ok(());
        }
        // Everything held and the span's first positions are older than the next queries see.
        let (skip, rows) = (keep_from - pos, end - keep_from);
        self.first = keep_from;
        if rows > self.capacity() {
            self.grow(0, rows, rows)?;
        }
        let values = match self.v {
            Some(_) => v.narrow(2, skip, rows)?,
            None => v.clone(),
        };
        self.set_rows(0, &k.narrow(2, skip, rows)?, &values)
    }

    /// Moves positions `keep_from..pos` to the front of the buffers and forgets the older ones
    /// (nothing when none is older).
    fn forget_before(&mut self, keep_from: usize, pos: usize) -> Result<()> {
        if keep_from <= self.first {
            return Ok(());
        }
        let (from, rows) = (
            keep_from.saturating_sub(self.first),
            pos.saturating_sub(keep_from),
        );
        if rows > 0 {
            // Own copies first: the rows move within the same buffers.
            for buffer in [&self.k, &self.v].into_iter().flatten() {
                let moved = buffer.narrow(2, from, rows)?.force_contiguous()?;
                buffer.slice_set(&moved, 2, 0)?;
            }
        }
        self.first = keep_from;
        Ok(())
    }

    /// A copy with its own buffers of the same capacity, holding positions `first..len`.
    fn fork(&self, len: usize) -> Result<Self> {
        let (k, v) = match &self.k {
            Some(_) => {
                let (k, v) = self.copied_into(self.capacity(), len.saturating_sub(self.first))?;
                (Some(k), v)
            }
            None => (None, None),
        };
        Ok(Self {
            k,
            v,
            shape: self.shape,
            format: self.format,
            device: self.device.clone(),
            max_len: self.max_len,
            window: self.window,
            first: self.first,
            host: self.host,
            rates: self.rates,
        })
    }

    fn capacity(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// Copies of positions `start..start + len` of the keys and values, each in a buffer of
    /// its own that holds just those positions. (`force_contiguous`, not candle's `copy`:
    /// `copy` clones the whole storage under a view, so every span kept the layer's full
    /// buffers alive; nor `contiguous`, which returns the view itself when the narrowed
    /// positions happen to be contiguous, as they are with one key/value head.)
    /// Values in the keys ([`KvShape::values_in_keys`]) are in the keys' copy: the values'
    /// copy is then empty (no positions' bytes, `[1, heads, len, 0]`).
    fn copy_span(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let k = self.keys()?;
        if start < self.first {
            return Err(candle_core::Error::Msg(format!(
                "kv span from position {start}: a sliding-window layer holds {}.. only",
                self.first
            ))
            .into());
        }
        let row = start - self.first;
        let keys = k.narrow(2, row, len)?.force_contiguous()?;
        let values = match &self.v {
            Some(v) => v.narrow(2, row, len)?.force_contiguous()?,
            None => Tensor::zeros((1, self.shape.n_kv_heads, len, 0), k.dtype(), k.device())?,
        };
        Ok((keys, values))
    }

    fn allocated_bytes(&self) -> usize {
        self.bytes_for(self.capacity())
    }

    /// Bytes of keys and values for `positions` positions.
    fn bytes_for(&self, positions: usize) -> usize {
        positions * self.shape.bytes_per_position(self.format)
    }

    /// Reallocates to hold at least `needed` rows, keeping rows `0..keep`; a window layer no
    /// more than its window, the slack and this `step` need ([`window_positions`]).
    fn grow(&mut self, keep: usize, needed: usize, step: usize) -> Result<()> {
        let doubled = (self.capacity() * 2).max(MIN_CHUNK);
        let rounded = needed.div_ceil(MIN_CHUNK) * MIN_CHUNK;
        let limit = match self.window {
            Some(window) => window_positions(window, step).max(rounded),
            None => usize::MAX,
        };
        let capacity = doubled.min(limit).max(rounded).min(self.max_len);
        let (k, v) = self.copied_into(capacity, keep)?;
        self.k = Some(k);
        self.v = v;
        Ok(())
    }

    /// New key and value buffers of `capacity` positions ([`super::kv_buffer::zeroed`]: only
    /// the pages written become resident) holding this layer's positions `0..keep`; no value
    /// buffer when the values are in the keys.
    fn copied_into(&self, capacity: usize, keep: usize) -> Result<(Tensor, Option<Tensor>)> {
        let row = self.format.row_len(self.shape.head_dim);
        let shape = (1, self.shape.n_kv_heads, capacity, row);
        let dtype = self.format.storage_dtype();
        let fresh = |old: &Option<Tensor>| -> Result<Tensor> {
            let new = super::kv_buffer::zeroed(shape, dtype, &self.device)?;
            if let (Some(old), true) = (old, keep > 0) {
                new.slice_set(&old.narrow(2, 0, keep)?.contiguous()?, 2, 0)?;
            }
            Ok(new)
        };
        let new_k = fresh(&self.k)?;
        let new_v = match self.shape.values_in_keys {
            Some(_) => None,
            None => Some(fresh(&self.v)?),
        };
        Ok((new_k, new_v))
    }
}

fn buffers_missing() -> ModelError {
    candle_core::Error::Msg("kv cache buffers missing".into()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(cache: &mut KvCache, seq: usize, value: f32) -> Result<(Tensor, Tensor)> {
        cache.check_room(seq)?;
        let pos = cache.len();
        let t = Tensor::full(value, (1, 2, seq, 4), &Device::Cpu)?;
        let mut out = None;
        for i in 0..cache.n_layers() {
            let layer = cache.layer_mut(i).unwrap();
            out = Some(layer.write(pos, &t, &(&t * 2.0)?)?);
        }
        cache.commit(seq)?;
        Ok(out.unwrap())
    }

    #[test]
    fn writes_in_place_and_grows_in_chunks() {
        let shape = KvShape::gqa(2, 4);
        let mut cache = KvCache::new(3, shape, 1000, KvFormat::Dense(DType::F32), &Device::Cpu);
        let (k, v) = step(&mut cache, 5, 1.0).unwrap();
        assert_eq!(k.dims(), &[1, 2, 5, 4]);
        assert_eq!(cache.capacity(), 256);
        let (k, v2) = step(&mut cache, 1, 3.0).unwrap();
        assert_eq!(k.dims(), &[1, 2, 6, 4]);
        let col: Vec<f32> = k
            .narrow(2, 4, 2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(&col[..8], &[1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]);
        assert_eq!(v.dims(), &[1, 2, 5, 4]);
        let first: f32 = v2
            .narrow(2, 0, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0];
        assert_eq!(first, 2.0);
        // Growing past the first chunk keeps the history.
        let (k, _) = step(&mut cache, 300, 7.0).unwrap();
        assert_eq!(cache.capacity(), 512);
        let old: Vec<f32> = k
            .narrow(2, 5, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(old[0], 3.0);
        assert_eq!(cache.len(), 306);
        // 3 layers x keys and values x 2 heads x 4 wide x 4 bytes per position.
        assert_eq!(cache.stored_bytes(), 306 * 3 * 2 * 2 * 4 * 4);
        assert_eq!(cache.allocated_bytes(), 512 * 3 * 2 * 2 * 4 * 4);
    }

    #[test]
    fn a_fork_keeps_the_history_and_writes_apart() {
        let shape = KvShape::gqa(2, 4);
        let mut cache = KvCache::new(2, shape, 100, KvFormat::Dense(DType::F32), &Device::Cpu);
        step(&mut cache, 3, 1.0).unwrap();
        let mut fork = cache.fork().unwrap();
        assert_eq!((fork.len(), fork.capacity()), (3, cache.capacity()));
        let value_at = |k: &Tensor, pos: usize| -> f32 {
            k.narrow(2, pos, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[0]
        };
        let (forked, _) = step(&mut fork, 1, 5.0).unwrap();
        let (original, _) = step(&mut cache, 1, 9.0).unwrap();
        assert_eq!(value_at(&forked, 0), 1.0, "the prompt's keys are copied");
        assert_eq!(value_at(&forked, 2), 1.0, "every stored position is copied");
        assert_eq!(value_at(&forked, 3), 5.0);
        assert_eq!(value_at(&original, 3), 9.0, "the fork's write is its own");
    }

    #[test]
    fn spans_copy_positions_out_and_start_another_cache_from_them() {
        let shape = KvShape::gqa(2, 4);
        let mut source = KvCache::new(2, shape, 600, KvFormat::Dense(DType::F32), &Device::Cpu);
        step(&mut source, 3, 1.0).unwrap();
        step(&mut source, 2, 2.0).unwrap();
        step(&mut source, 1, 3.0).unwrap();
        let first = source.copy_span(0, 3).unwrap();
        let second = source.copy_span(3, 2).unwrap();
        assert_eq!((first.len(), second.len()), (3, 2));
        assert_eq!(first.allocated_bytes(), 2 * 2 * 3 * 2 * 4 * 4);
        assert!(source.copy_span(4, 3).is_err(), "position 6 is not stored");
        // The copies are their own: writing the source later does not change them.
        source.truncate(0).unwrap();
        step(&mut source, 6, 9.0).unwrap();
        let mut cache = KvCache::new(2, shape, 600, KvFormat::Dense(DType::F32), &Device::Cpu);
        cache.extend_from_spans(&[&first, &second]).unwrap();
        assert_eq!(cache.len(), 5);
        let (k, v) = step(&mut cache, 1, 4.0).unwrap();
        let keys: Vec<f32> = k
            .narrow(1, 0, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let per_position: Vec<f32> = keys.chunks(4).map(|c| c[0]).collect();
        assert_eq!(per_position, [1.0, 1.0, 1.0, 2.0, 2.0, 4.0]);
        assert_eq!(v.dims(), &[1, 2, 6, 4]);
        let mut small = KvCache::new(2, shape, 4, KvFormat::Dense(DType::F32), &Device::Cpu);
        assert!(small.extend_from_spans(&[&first, &second]).is_err());
        assert_eq!(small.len(), 0, "nothing committed");
    }

    /// Elements the storage under `t` holds (CPU): what keeping `t` keeps alive.
    fn storage_elems(t: &Tensor) -> usize {
        let (storage, _) = t.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(cpu) => cpu.as_slice::<f32>().unwrap().len(),
            _ => unreachable!("CPU tensors only"),
        }
    }

    #[test]
    fn a_span_keeps_only_its_own_positions_alive() {
        // One key/value head makes the narrowed positions contiguous (where `contiguous()` would
        // hand back the view of the whole buffer), two heads make them strided (where candle's
        // `copy()` clones the whole buffer): either way a span must own just its positions.
        for n_kv_heads in [1, 2] {
            let shape = KvShape::gqa(n_kv_heads, 4);
            let mut cache = KvCache::new(3, shape, 4096, KvFormat::Dense(DType::F32), &Device::Cpu);
            let t = Tensor::ones((1, n_kv_heads, 600, 4), DType::F32, &Device::Cpu).unwrap();
            for i in 0..3 {
                cache.layer_mut(i).unwrap().write(0, &t, &t).unwrap();
            }
            cache.commit(600).unwrap();
            assert_eq!(cache.capacity(), 768);
            let span = cache.copy_span(32, 16).unwrap();
            let per_tensor = n_kv_heads * 16 * 4;
            for (k, v) in &span.layers {
                assert_eq!(storage_elems(k), per_tensor, "{n_kv_heads} heads: keys");
                assert_eq!(storage_elems(v), per_tensor, "{n_kv_heads} heads: values");
            }
            assert_eq!(span.allocated_bytes(), 3 * 2 * per_tensor * 4);
        }
    }

    #[test]
    fn values_in_the_keys_are_a_view_of_one_buffer() {
        // The latent attention's cache: rows of 6 (a latent of 4 and a RoPE part of 2), values
        // the latent.
        let shape = KvShape {
            n_kv_heads: 1,
            head_dim: 6,
            values_in_keys: Some(4),
        };
        let mut cache = KvCache::new(2, shape, 600, KvFormat::Dense(DType::F32), &Device::Cpu);
        let rows = |seq: usize, base: f32| {
            let data: Vec<f32> = (0..seq * 6).map(|i| base + i as f32).collect();
            Tensor::from_vec(data, (1, 1, seq, 6), &Device::Cpu).unwrap()
        };
        let unused = Tensor::zeros((1, 1, 3, 4), DType::F32, &Device::Cpu).unwrap();
        for i in 0..2 {
            let (k, v) = cache
                .layer_mut(i)
                .unwrap()
                .write(0, &rows(3, 0.0), &unused)
                .unwrap();
            assert_eq!((k.dims(), v.dims()), (&[1, 1, 3, 6][..], &[1, 1, 3, 4][..]));
            let values: Vec<f32> = v.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(&values[..8], &[0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0]);
        }
        cache.commit(3).unwrap();
        // One row of 6 per position and layer: no value buffer.
        assert_eq!(cache.stored_bytes(), 3 * 2 * 6 * 4);
        assert_eq!(cache.allocated_bytes(), 256 * 2 * 6 * 4);
        // A fork and a span carry the keys, and the values with them.
        let fork = cache.fork().unwrap();
        assert_eq!(fork.allocated_bytes(), cache.allocated_bytes());
        let span = cache.copy_span(1, 2).unwrap();
        assert_eq!(span.allocated_bytes(), 2 * 2 * 6 * 4);
        let mut other = KvCache::new(2, shape, 600, KvFormat::Dense(DType::F32), &Device::Cpu);
        other.extend_from_spans(&[&span]).unwrap();
        let unused = Tensor::zeros((1, 1, 1, 4), DType::F32, &Device::Cpu).unwrap();
        let (_, v) = other
            .layer_mut(0)
            .unwrap()
            .write(2, &rows(1, 100.0), &unused)
            .unwrap();
        let values: Vec<f32> = v.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(
            values,
            [6.0, 7.0, 8.0, 9.0, 12.0, 13.0, 14.0, 15.0, 100.0, 101.0, 102.0, 103.0]
        );
    }

    #[test]
    fn the_capacity_bound_holds_for_every_way_of_growing() {
        let shape = KvShape::gqa(2, 4);
        let probe = KvCache::new(1, shape, 3000, KvFormat::Dense(DType::F32), &Device::Cpu);
        assert_eq!(probe.capacity_bound(1), 256);
        assert_eq!(probe.capacity_bound(1256), 2048);
        assert_eq!(probe.capacity_bound(2900), 3000, "capped at the limit");
        for (len, steps) in [(1256, 1), (1256, 7), (1000, 300), (513, 512), (2900, 97)] {
            let mut cache = KvCache::new(1, shape, 3000, KvFormat::Dense(DType::F32), &Device::Cpu);
            // A first chunk, then steps of `steps` tokens.
            let mut fed = 0;
            while fed < len {
                let n = if fed == 0 {
                    300.min(len)
                } else {
                    steps.min(len - fed)
                };
                step(&mut cache, n, 1.0).unwrap();
                fed += n;
                assert!(
                    cache.capacity() <= probe.capacity_bound(len),
                    "{len} {steps}"
                );
            }
        }
    }

    #[test]
    fn the_kv_dtype_defaults_to_half_precision_and_a_set_one_is_kept() {
        use DtypeChoice::*;
        // auto: f16 for f32 (GGUF, on the CPU as on CUDA) and f16 activations, bf16 for bf16.
        let dense = KvFormat::Dense;
        assert_eq!(kv_dtype_for(Auto, DType::F32), dense(DType::F16));
        assert_eq!(kv_dtype_for(Auto, DType::F16), dense(DType::F16));
        assert_eq!(kv_dtype_for(Auto, DType::BF16), dense(DType::BF16));
        // llama.cpp's two cache block types; another weight type says nothing of the cache.
        let q = |t| Quantize(t);
        assert_eq!(kv_dtype_for(q(QuantType::Q8_0), DType::F32), KvFormat::Q8_0);
        assert_eq!(kv_dtype_for(q(QuantType::Q4_0), DType::F32), KvFormat::Q4_0);
        assert_eq!(
            kv_dtype_for(q(QuantType::Q6_K), DType::F32),
            dense(DType::F16)
        );
        for compute in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(kv_dtype_for(F32, compute), dense(DType::F32));
            assert_eq!(kv_dtype_for(F16, compute), dense(DType::F16));
            assert_eq!(kv_dtype_for(BF16, compute), dense(DType::BF16));
        }
    }

    #[test]
    fn a_half_precision_cache_stores_its_dtype_in_half_the_bytes() {
        let shape = KvShape::gqa(2, 4);
        let mut wide = KvCache::new(1, shape, 64, KvFormat::Dense(DType::F32), &Device::Cpu);
        let mut half = KvCache::new(1, shape, 64, KvFormat::Dense(DType::F16), &Device::Cpu);
        step(&mut wide, 3, 1.5).unwrap();
        let (k, v) = step(&mut half, 3, 1.5).unwrap();
        assert_eq!((k.dtype(), v.dtype()), (DType::F16, DType::F16));
        assert_eq!(half.allocated_bytes() * 2, wide.allocated_bytes());
        let values: Vec<f32> = v
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(values.iter().all(|&x| x == 3.0), "{values:?}");
    }

    #[test]
    fn a_block_cache_stores_llama_cpp_blocks_and_reads_back_close_values() {
        let shape = KvShape::gqa(2, 64);
        let f16 = KvCache::new(1, shape, 64, KvFormat::Dense(DType::F16), &Device::Cpu);
        for (format, ratio) in [
            (KvFormat::Q8_0, 68.0 / 128.0),
            (KvFormat::Q4_0, 36.0 / 128.0),
        ] {
            let mut cache = KvCache::new(1, shape, 64, format, &Device::Cpu);
            let data: Vec<f32> = (0..2 * 3 * 64).map(|i| (i % 13) as f32 - 6.0).collect();
            let t = Tensor::from_vec(data.clone(), (1, 2, 3, 64), &Device::Cpu).unwrap();
            let (k, _) = cache.layer_mut(0).unwrap().write(0, &t, &t).unwrap();
            cache.commit(3).unwrap();
            assert_eq!(k.dims(), &[1, 2, 3, format.row_bytes(64)]);
            assert_eq!(k.dtype(), DType::U8);
            let bytes = |c: &KvCache| c.stored_bytes() as f64;
            let mut dense = f16.clone();
            dense.len = 3;
            assert_eq!(bytes(&cache) / bytes(&dense), ratio, "{format:?}");
            let back = format.decode(&k, 64).unwrap();
            let back = back.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let worst = data
                .iter()
                .zip(&back)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(worst <= 6.0 / 7.0, "{format:?}: {worst}");
            // A span of a block cache starts another one, as a dense span does.
            let span = cache.copy_span(1, 2).unwrap();
            assert_eq!(span.allocated_bytes(), 2 * 2 * 2 * format.row_bytes(64));
            let mut other = KvCache::new(1, shape, 64, format, &Device::Cpu);
            other.extend_from_spans(&[&span]).unwrap();
            assert_eq!(other.len(), 2);
        }
    }

    #[test]
    fn a_recurrent_layer_keeps_a_fixed_state_that_forks_and_never_goes_back() {
        let shape = KvShape::gqa(2, 4);
        let state = RecurrentShape {
            conv_window: 3,
            conv_channels: 8,
            n_heads: 2,
            head_v_dim: 4,
            head_k_dim: 4,
        };
        let mut cache = KvCache::new(2, shape, 1000, KvFormat::Dense(DType::F32), &Device::Cpu)
            .with_recurrent(&[Some(state), None], &Device::Cpu);
        assert!(cache.has_recurrent());
        assert!(
            cache.layer_mut(0).is_none(),
            "layer 0 has no keys and values"
        );
        assert!(cache.state_mut(0).unwrap().kv_mut().is_err());
        assert!(cache.state_mut(1).unwrap().recurrent_mut().is_err());
        let write = |cache: &mut KvCache, seq: usize, value: f32| {
            let pos = cache.len();
            let t = Tensor::full(value, (1, 2, seq, 4), &Device::Cpu).unwrap();
            cache.layer_mut(1).unwrap().write(pos, &t, &t).unwrap();
            let recurrent = cache.state_mut(0).unwrap().recurrent_mut().unwrap();
            let conv = Tensor::full(value, (3, 8), &Device::Cpu).unwrap();
            let ssm = Tensor::full(value, (2, 4, 4), &Device::Cpu).unwrap();
            recurrent.stage(conv, ssm).unwrap();
            cache.commit(seq).unwrap();
        };
        let state_value = |cache: &mut KvCache| -> f32 {
            let recurrent = cache.state_mut(0).unwrap().recurrent_mut().unwrap();
            let (_, ssm) = recurrent.current().unwrap();
            ssm.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0]
        };
        write(&mut cache, 5, 1.0);
        let state_bytes = state.bytes();
        assert_eq!(state_bytes, (3 * 8 + 2 * 4 * 4) * 4);
        // One attention layer of 5 positions (keys and values), plus the state.
        assert_eq!(cache.stored_bytes(), 5 * 2 * 2 * 4 * 4 + state_bytes);
        write(&mut cache, 300, 2.0);
        assert_eq!(
            cache.stored_bytes(),
            305 * 2 * 2 * 4 * 4 + state_bytes,
            "the state does not grow with the context"
        );
        assert_eq!(cache.device_allocated_bytes(), cache.allocated_bytes());
        let mut fork = cache.fork().unwrap();
        write(&mut fork, 1, 7.0);
        assert_eq!(state_value(&mut cache), 2.0, "the fork's state is its own");
        assert_eq!(state_value(&mut fork), 7.0);
        // No going back to an earlier position, and no prefix blocks.
        assert!(cache.truncate(100).is_err());
        assert_eq!(cache.len(), 305, "a refused cut changes nothing");
        assert!(cache.truncate(305).is_ok());
        assert!(cache.copy_span(0, 16).is_err());
        // Emptying is fine: the state starts again from zeros.
        cache.truncate(0).unwrap();
        assert_eq!((cache.len(), state_value(&mut cache)), (0, 0.0));
        // A failed step's staged state never becomes the state.
        let recurrent = fork.state_mut(0).unwrap().recurrent_mut().unwrap();
        let conv = Tensor::full(9f32, (3, 8), &Device::Cpu).unwrap();
        let ssm = Tensor::full(9f32, (2, 4, 4), &Device::Cpu).unwrap();
        recurrent.stage(conv, ssm).unwrap();
        assert_eq!(state_value(&mut fork), 7.0);
    }

    #[test]
    fn refuses_to_pass_the_limit_and_stays_consistent() {
        let shape = KvShape::gqa(2, 4);
        let mut cache = KvCache::new(2, shape, 10, KvFormat::Dense(DType::F32), &Device::Cpu);
        step(&mut cache, 8, 1.0).unwrap();
        assert_eq!(cache.capacity(), 10, "capacity is capped at the limit");
        let err = step(&mut cache, 3, 1.0).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::ContextOverflow {
                    needed: 11,
                    max: 10
                }
            ),
            "{err}"
        );
        assert_eq!(cache.len(), 8);
        step(&mut cache, 2, 1.0).unwrap();
        assert!(step(&mut cache, 1, 1.0).is_err());
        cache.truncate(4).unwrap();
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn a_host_cache_streams_the_steps_the_link_is_quicker_for() {
        // A 7B-like layer: 4 key/value heads of 128, 28 query heads, f16.
        let shape = KvShape::gqa(4, 128);
        let rates = HostKvRates {
            link_bytes_per_s: 16e9,
            host_read_bytes_per_s: 40e9,
            host_flops_per_s: 200e9,
        };
        let cache = |rates| {
            KvCache::new(1, shape, 1 << 16, KvFormat::Dense(DType::F16), &Device::Cpu)
                .on_host(true, rates)
        };
        let hosted = cache(Some(rates));
        let layer = hosted.layers[0].attention().unwrap();
        assert!(layer.on_host());
        // Decode at 8k: 16.8 MB of cache, read on the host in 0.42 ms, 0.12 GFLOP in 0.59 ms;
        // over the link 1.05 ms: the host.
        assert!(!layer.streams(1, 28, 8192));
        // A 512-row chunk: 60 GFLOP, 0.3 s on the host: the link.
        assert!(layer.streams(512, 28, 8192));
        // A slower host streams even decode (1.17 ms of work at 100 GFLOP/s).
        let slow_host = HostKvRates {
            host_flops_per_s: 100e9,
            ..rates
        };
        assert!(cache(Some(slow_host)).layers[0]
            .attention()
            .unwrap()
            .streams(1, 28, 8192));
        // Without rates, and for a device cache, attention never moves.
        assert!(!cache(None).layers[0]
            .attention()
            .unwrap()
            .streams(512, 28, 8192));
        let on_device = KvCache::new(1, shape, 1 << 16, KvFormat::Dense(DType::F16), &Device::Cpu)
            .on_host(false, Some(rates));
        assert!(!on_device.layers[0]
            .attention()
            .unwrap()
            .streams(512, 28, 8192));
        assert!(!on_device.layers[0].on_host());
    }

    #[test]
    fn host_kv_rates_compare_the_link_with_the_hosts_read_and_work() {
        let rates = HostKvRates {
            link_bytes_per_s: 10.0,
            host_read_bytes_per_s: 20.0,
            host_flops_per_s: 100.0,
        };
        // 100 bytes: 10 s over the link, 5 s read on the host; the work decides.
        assert!(!rates.streams(100.0, 500.0), "5 s of host work: stay");
        assert!(rates.streams(100.0, 2000.0), "20 s of host work: stream");
        let broken = HostKvRates {
            link_bytes_per_s: 0.0,
            ..rates
        };
        assert!(!broken.streams(100.0, 1e9), "no link rate: never stream");
    }
}
