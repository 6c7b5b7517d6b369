//! Loads a model's weights from an open [`Checkpoint`] (GGUF or safetensors) into
//! [`LayerWeights`] and [`FixedWeights`].
//!
//! - [`holding`]: [`Holding`], how each tensor is held (GGUF blocks or dense, in which dtype);
//!   the planner sizes models with the same rules.
//! - [`panel_cache`]: the k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 matrices' panel layouts of
//!   an AVX2 machine kept in a file per model, mapped by the next load instead of made again.
//! - [`quantize`]: a dense matrix quantized at load (dtype `q8_0`, `q4_k`, ...), rows split
//!   over rayon's threads.
//! - [`reader`]: [`WeightReader`], one reader for both formats, and [`read_prefix`], which reads
//!   the fixed parts plus a prefix of layers: every layer for [`load_model`], the resident ones
//!   for the offload engine.
//! - [`summary`]: what the loaded weights are and what multiplies them (the start log).
//!
//! On the CPU, GGUF matrices are views of the mapped file; Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, the
//! k-quants, IQ4_NL / IQ4_XS and MXFP4 go through ferry's own kernels in place, everything else
//! (and every CUDA weight) through candle's `QMatMul` ([`crate::weights::Linear::from_blocks`], [`Linear::quantized`]).
//!
//! [`Linear::quantized`]: crate::weights::Linear::quantized
//! Setting `FERRY_CPU_QMATMUL=candle` keeps candle's `QMatMul` on the CPU too (for A/B
//! measurements and as an escape hatch).

pub mod holding;
pub mod panel_cache;
pub mod quantize;
pub mod reader;
pub mod summary;

pub use holding::{Holding, Role, TensorKind};
pub use reader::{read_prefix, WeightReader};

use candle_core::{DType, Device};

use super::checkpoint::Checkpoint;
use super::decoder::{Model, ModelParts, ResidentLayers};
use super::error::Result;
use super::source::ModelFiles;
use super::spec::ModelSpec;
use super::weights::LayerWeights;

/// Which dtype dense weights and activations use: the configuration's choice type, read here.
pub use ferry_config::DtypeChoice;

/// The explicit dense dtype of a dtype choice, or `None` for [`DtypeChoice::Auto`] and a
/// quantized choice. (A free function: the choice is `ferry-config`'s type, which knows no
/// candle.)
pub fn dense_dtype(choice: DtypeChoice) -> Option<DType> {
    match choice {
        DtypeChoice::Auto | DtypeChoice::Quantize(_) => None,
        DtypeChoice::F32 => Some(DType::F32),
        DtypeChoice::F16 => Some(DType::F16),
        DtypeChoice::BF16 => Some(DType::BF16),
    }
}

/// Where and how to load.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The compute device the weights go to.
    pub device: Device,
    /// Dense dtype selection.
    pub dtype: DtypeChoice,
}

/// Loading progress, reported after each tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadProgress {
    /// Bytes read so far (as stored in the file).
    pub done_bytes: u64,
    /// Bytes of all tensors the model uses.
    pub total_bytes: u64,
    /// The tensor just read.
    pub what: String,
}

/// A model with every layer resident.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// Shape and hyper-parameters (same as `model.spec()`).
    pub spec: ModelSpec,
    /// Fixed weights, RoPE tables and the forward loop.
    pub model: Model,
    /// All decoder layers, resident on the device.
    pub layers: ResidentLayers,
}

/// Opens `files` and loads every weight onto `options.device`, calling `progress` after each
/// tensor.
pub fn load_model(
    files: &ModelFiles,
    options: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<LoadedModel> {
    load_checkpoint(&Checkpoint::open(files)?, options, progress)
}

/// Loads every weight of an open `checkpoint` onto `options.device`.
pub fn load_checkpoint(
    checkpoint: &Checkpoint,
    options: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<LoadedModel> {
    let mut reader = WeightReader::new(checkpoint, options)?.with_progress(progress);
    let n_layers = reader.spec().n_layers;
    let (parts, layers) = read_prefix(&mut reader, n_layers)?;
    finish(parts, layers)
}

fn finish(parts: ModelParts, layers: Vec<LayerWeights>) -> Result<LoadedModel> {
    let spec = parts.spec.clone();
    let model = Model::new(parts)?;
    Ok(LoadedModel {
        spec,
        model,
        layers: ResidentLayers(layers),
    })
}
