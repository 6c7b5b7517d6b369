//! [`WeightReader`]: the reader shape the GGUF and safetensors loaders share, and
//! [`read_prefix`], the one place that reads a model's fixed parts and a prefix of its decoder
//! layers through it (every layer for [`super::load_model`], the resident ones for the offload
//! engine).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::gguf::GgufWeights;
use super::safetensors::HfWeights;
use super::LoadOptions;
use crate::model::error::{ModelError, Result};
use crate::model::llama::ModelParts;
use crate::model::spec::ModelSpec;
use crate::model::weights::{FixedWeights, LayerWeights};

/// One checkpoint, read a tensor group at a time.
pub trait WeightReader {
    /// Shape and hyper-parameters.
    fn spec(&self) -> &ModelSpec;
    /// The activation dtype (f32 for quantized weights).
    fn dtype(&self) -> DType;
    /// Embedding, final norm and output head.
    fn fixed(&mut self) -> Result<FixedWeights>;
    /// Decoder layer `index`.
    fn layer(&mut self, index: usize) -> Result<LayerWeights>;
    /// Per-frequency RoPE divisors, if the checkpoint has them.
    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>>;
}

/// Reads the fixed parts and decoder layers `0..layers` of `reader` for `device`.
pub fn read_prefix(
    reader: &mut dyn WeightReader,
    layers: usize,
    device: &Device,
) -> Result<(ModelParts, Vec<LayerWeights>)> {
    let fixed = reader.fixed()?;
    let read = (0..layers)
        .map(|i| reader.layer(i))
        .collect::<Result<Vec<_>>>()?;
    let parts = ModelParts {
        spec: reader.spec().clone(),
        fixed,
        rope_freq_factors: reader.rope_freq_factors()?,
        device: device.clone(),
        dtype: reader.dtype(),
    };
    Ok((parts, read))
}

/// Opens a Hugging Face directory's reader: its config.json, then its safetensors shards.
pub fn open_hf<'a>(
    config: &Path,
    shards: &[PathBuf],
    options: &LoadOptions,
) -> Result<HfWeights<'a>> {
    let json = std::fs::read_to_string(config).map_err(|source| ModelError::Io {
        path: config.to_path_buf(),
        source,
    })?;
    HfWeights::open(ModelSpec::from_hf_config(&json)?, shards, options)
}

impl WeightReader for GgufWeights<'_> {
    fn spec(&self) -> &ModelSpec {
        GgufWeights::spec(self)
    }

    fn dtype(&self) -> DType {
        GgufWeights::dtype(self)
    }

    fn fixed(&mut self) -> Result<FixedWeights> {
        GgufWeights::fixed(self)
    }

    fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        GgufWeights::layer(self, index)
    }

    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>> {
        GgufWeights::rope_freq_factors(self)
    }
}

impl WeightReader for HfWeights<'_> {
    fn spec(&self) -> &ModelSpec {
        HfWeights::spec(self)
    }

    fn dtype(&self) -> DType {
        HfWeights::dtype(self)
    }

    fn fixed(&mut self) -> Result<FixedWeights> {
        HfWeights::fixed(self)
    }

    fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        HfWeights::layer(self, index)
    }

    /// Hugging Face checkpoints carry RoPE scaling in config.json, never as a tensor.
    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>> {
        Ok(None)
    }
}
