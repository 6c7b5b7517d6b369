//! [`WeightReader`]: reads a [`Checkpoint`]'s tensors into model weights, a tensor group at a
//! time, in either format: the tensor table says where each tensor is, [`Holding`] how it is held
//! (GGUF blocks kept, or dense in the compute dtype). On the CPU kept blocks are views of the
//! mapped file ([`Checkpoint::view_blocks`], for ferry's kernels via [`Linear::from_blocks`] and
//! for embedding lookups); on CUDA they are copied into candle tensors ([`Linear::quantized`]). [`read_prefix`] reads the fixed parts plus a prefix of layers:
//! every layer for [`super::load_model`], the resident ones for the offload engine.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use super::holding::{Holding, Role, TensorKind};
use super::panel_cache::{process_panel_cache, PanelCache};
use super::{LoadOptions, LoadProgress};
use crate::checkpoint::Checkpoint;
use crate::cpu_qmatmul::{process_kernel, reads_panels, Blocks};
use crate::decoder::ModelParts;
use crate::error::{ModelError, Result};
use crate::spec::ModelSpec;
use crate::tensors::{Part, TensorRecord};
use crate::weights::{Embedding, FixedWeights, LayerWeights, Linear};

/// Reads weights from an open checkpoint onto one device.
pub struct WeightReader<'a> {
    checkpoint: &'a Checkpoint,
    holding: Holding,
    device: Device,
    done: u64,
    total: u64,
    sink: Option<&'a mut dyn FnMut(LoadProgress)>,
    /// Where matrices' panel layouts are cached (the process's folder unless set otherwise).
    panels: Option<PanelCache>,
}

impl<'a> WeightReader<'a> {
    /// A reader of `checkpoint` for `options` (fails on a dtype the device cannot use).
    pub fn new(checkpoint: &'a Checkpoint, options: &LoadOptions) -> Result<Self> {
        let holding = Holding::new(checkpoint, options)?;
        if let Some(ty) = holding.quantize() {
            tracing::info!(
                threads = rayon::current_num_threads(),
                "quantizing matrices to {ty:?} at load"
            );
        }
        Ok(Self {
            checkpoint,
            holding,
            device: options.device.clone(),
            done: 0,
            total: checkpoint
                .tensors()
                .records()
                .map(|r| r.stored_bytes() as u64)
                .sum(),
            sink: None,
            panels: None,
        }
        .with_panel_cache(process_panel_cache().as_deref()))
    }

    /// Caches the panel layouts of this load's matrices in `folder` ([`PanelCache`]), or in
    /// none (every load makes them); the default is the process's folder
    /// ([`super::panel_cache::set_panel_cache`]). The file is written when the reader is
    /// dropped.
    pub fn with_panel_cache(mut self, folder: Option<&std::path::Path>) -> Self {
        let wanted = folder.filter(|_| self.device.is_cpu() && reads_panels(process_kernel()));
        self.panels = wanted.and_then(|folder| PanelCache::open(folder, self.checkpoint));
        self
    }

    /// Matrices whose panel layouts this load made, and those it mapped from the panel cache.
    pub fn panel_counts(&self) -> (usize, usize) {
        self.panels.as_ref().map_or((0, 0), PanelCache::counts)
    }

    /// Reports progress to `sink` after each tensor read.
    pub fn with_progress(mut self, sink: &'a mut dyn FnMut(LoadProgress)) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Shape and hyper-parameters.
    pub fn spec(&self) -> &ModelSpec {
        self.checkpoint.spec()
    }

    /// How tensors are held (and the activation dtype: f32 for quantized weights).
    pub fn holding(&self) -> Holding {
        self.holding
    }

    /// Embedding, final norm and output head (tied to the embedding when the table has none).
    pub fn fixed(&mut self) -> Result<FixedWeights> {
        let table = self.checkpoint_ref().tensors();
        let (embedding, tied_head) = match self.read(Role::Embedding, &table.embedding)? {
            Held::View(b) => (Embedding::Blocks(b.clone()), Linear::from_blocks(b, None)?),
            Held::Blocks(q) => (Embedding::Quantized(q.clone()), Linear::quantized(q, None)?),
            Held::Dense(t) => {
                let head = Linear::Dense {
                    weight: t.clone(),
                    bias: None,
                };
                (Embedding::Dense(t), head)
            }
        };
        let final_norm = self.vector(&table.final_norm)?;
        let lm_head = match &table.head {
            Some(head) => self.linear(head, None)?,
            None => tied_head,
        };
        Ok(FixedWeights {
            embedding,
            final_norm,
            lm_head,
        })
    }

    /// The weights of decoder layer `index`.
    pub fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        let layer = self.checkpoint_ref().tensors().layer(index)?;
        let parts: Vec<Part> = layer.tensors.iter().map(|(p, _)| *p).collect();
        let record = |i: usize| &layer.tensors[i].1;
        let this = std::cell::RefCell::new(self);
        LayerWeights::assemble(
            &parts,
            |weight, bias| this.borrow_mut().linear(record(weight), bias.map(record)),
            |i| this.borrow_mut().vector(record(i)),
        )
    }

    /// Per-frequency RoPE divisors (`rope_freqs.weight`, written for Llama 3.1+), if present.
    pub fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>> {
        let Some(record) = &self.checkpoint_ref().tensors().rope_freqs else {
            return Ok(None);
        };
        let t = self
            .checkpoint
            .read_dense(record, DType::F32, &Device::Cpu)?;
        self.advance(record);
        Ok(Some(t.to_vec1::<f32>()?))
    }

    /// The checkpoint, with its own lifetime (not tied to a borrow of the reader).
    fn checkpoint_ref(&self) -> &'a Checkpoint {
        self.checkpoint
    }

    fn vector(&mut self, record: &TensorRecord) -> Result<Tensor> {
        match self.read(Role::Vector, record)? {
            Held::Dense(t) => Ok(t),
            Held::View(_) => Err(ModelError::Config(format!(
                "`{}` is a quantized vector",
                record.name
            ))),
            Held::Blocks(q) => Ok(q
                .dequantize(&self.device)?
                .to_dtype(self.holding.compute())?),
        }
    }

    fn linear(&mut self, weight: &TensorRecord, bias: Option<&TensorRecord>) -> Result<Linear> {
        let bias = bias.map(|b| self.vector(b)).transpose()?;
        Ok(match self.read(Role::Matrix, weight)? {
            // A matrix (never the embedding table, which lookups read as the file has it).
            Held::View(b) => self.with_panels(Linear::from_blocks(b, bias)?, weight),
            Held::Blocks(q) => Linear::quantized(q, bias)?,
            Held::Dense(weight) => Linear::Dense { weight, bias },
        })
    }

    /// `linear` (read from `record`) with its panel layout, where the process's kernels read
    /// one: from the panel cache when it has it, else made now.
    fn with_panels(&mut self, linear: Linear, record: &TensorRecord) -> Linear {
        let Some(cache) = self.panels.as_mut() else {
            return linear.with_panels();
        };
        let Linear::CpuQuantized { weight, bias } = linear else {
            return linear;
        };
        let Some(shape) = weight.panel_shape(process_kernel()) else {
            return Linear::CpuQuantized { weight, bias };
        };
        let weight = match cache.panels(self.checkpoint, record, &weight, shape) {
            Ok(panels) => weight.with_these_panels(panels),
            Err(e) => {
                tracing::warn!(
                    "`{}`: no panel layout ({e}); the GGUF rows are used",
                    record.name
                );
                weight
            }
        };
        Linear::CpuQuantized { weight, bias }
    }

    /// Reads `record` as [`Holding`] says a tensor of `role` is held.
    fn read(&mut self, role: Role, record: &TensorRecord) -> Result<Held> {
        let kind = self.holding.kind(role, record)?;
        super::quantize::log_fallback(&self.holding, role, record, kind);
        let held = match kind {
            // On the CPU, blocks kept as the file stores them are views of the mapped file.
            TensorKind::Blocks(ty)
                if self.device.is_cpu() && super::holding::stored_as(record, ty) =>
            {
                Held::View(self.checkpoint.view_blocks(record)?)
            }
            TensorKind::Blocks(ty) => {
                let dtype = ty.to_candle().ok_or_else(|| {
                    ModelError::Unsupported(format!(
                        "tensor `{}`: candle has no {ty} blocks on {:?}",
                        record.name, self.device
                    ))
                })?;
                let q = super::quantize::read_blocks(self.checkpoint, record, dtype, &self.device)?;
                Held::Blocks(Arc::new(q))
            }
            TensorKind::Dense(dtype) => {
                Held::Dense(self.checkpoint.read_dense(record, dtype, &self.device)?)
            }
        };
        self.advance(record);
        Ok(held)
    }

    fn advance(&mut self, record: &TensorRecord) {
        self.done += record.stored_bytes() as u64;
        if let Some(sink) = self.sink.as_mut() {
            sink(LoadProgress {
                done_bytes: self.done,
                total_bytes: self.total,
                what: record.name.clone(),
            });
        }
    }
}

impl Drop for WeightReader<'_> {
    /// Writes the panel cache (in the background) when this load made panels.
    fn drop(&mut self) {
        if let Some(cache) = self.panels.take() {
            cache.finish();
        }
    }
}

impl std::fmt::Debug for WeightReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightReader")
            .field("files", self.checkpoint.files())
            .field("holding", &self.holding)
            .finish_non_exhaustive()
    }
}

/// A tensor as read (quantized ones shared, as `Linear` and `Embedding` hold them).
enum Held {
    /// CPU: the blocks in place in the mapped file.
    View(Blocks),
    /// Elsewhere: a candle tensor on the device.
    Blocks(Arc<QTensor>),
    Dense(Tensor),
}

/// Reads the fixed parts and decoder layers `0..layers` of `reader`.
pub fn read_prefix(
    reader: &mut WeightReader<'_>,
    layers: usize,
) -> Result<(ModelParts, Vec<LayerWeights>)> {
    let fixed = reader.fixed()?;
    let read = (0..layers)
        .map(|i| reader.layer(i))
        .collect::<Result<Vec<_>>>()?;
    let parts = ModelParts {
        spec: reader.spec().clone(),
        fixed,
        rope_freq_factors: reader.rope_freq_factors()?,
        device: reader.device.clone(),
        dtype: reader.holding.compute(),
    };
    Ok((parts, read))
}
