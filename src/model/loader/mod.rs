//! Loads a model's weights from GGUF or safetensors into [`LayerWeights`] and [`FixedWeights`].
//!
//! - [`gguf`]: a GGUF file, kept quantized (candle `QMatMul`) or dequantized to a dense dtype.
//! - [`safetensors`]: a Hugging Face directory (config.json + mmaped safetensors shards).
//!
//! Both implement [`WeightReader`] (`spec`, `fixed()`, `layer(i)`), and [`read_prefix`] reads
//! the fixed parts plus a prefix of layers through it: every layer for [`load_model`], the
//! resident ones for the offload engine.

pub mod gguf;
pub mod reader;
pub mod safetensors;

pub use reader::{open_hf, read_prefix, WeightReader};

use candle_core::{DType, Device};

use super::error::{ModelError, Result};
use super::llama::{Model, ModelParts, ResidentLayers};
use super::source::ModelFiles;
use super::spec::ModelSpec;
use super::weights::LayerWeights;

/// Which dtype dense weights and activations use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeChoice {
    /// GGUF stays quantized; safetensors become f32 on the CPU and keep the checkpoint's dtype
    /// on CUDA.
    #[default]
    Auto,
    /// Dense f32 (GGUF is dequantized).
    F32,
    /// Dense f16 (GGUF is dequantized).
    F16,
    /// Dense bf16 (GGUF is dequantized). Not available on the CPU, whose matmul lacks bf16.
    BF16,
}

impl DTypeChoice {
    /// The explicit dense dtype, or `None` for [`DTypeChoice::Auto`].
    pub fn dense(self) -> Option<DType> {
        match self {
            DTypeChoice::Auto => None,
            DTypeChoice::F32 => Some(DType::F32),
            DTypeChoice::F16 => Some(DType::F16),
            DTypeChoice::BF16 => Some(DType::BF16),
        }
    }
}

/// Where and how to load.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The compute device the weights go to.
    pub device: Device,
    /// Dense dtype selection.
    pub dtype: DTypeChoice,
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

/// Loads every weight of `files` onto `options.device`, calling `progress` after each tensor.
pub fn load_model(
    files: &ModelFiles,
    options: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<LoadedModel> {
    let mut reader: Box<dyn WeightReader + '_> = match files {
        ModelFiles::Gguf { path } => {
            Box::new(gguf::GgufWeights::open(path, options)?.with_progress(progress))
        }
        ModelFiles::HfDir {
            config, weights, ..
        } => Box::new(open_hf(config, weights, options)?.with_progress(progress)),
    };
    let n_layers = reader.spec().n_layers;
    let (parts, layers) = read_prefix(reader.as_mut(), n_layers, &options.device)?;
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

/// Refuses dtypes the device cannot multiply.
pub(crate) fn check_dtype_on_device(dtype: DType, device: &Device) -> Result<()> {
    if device.is_cpu() && dtype == DType::BF16 {
        return Err(ModelError::Unsupported(
            "bf16 on the CPU (candle's CPU matmul has no bf16); use dtype f32 or f16".into(),
        ));
    }
    Ok(())
}

/// Fails with [`ModelError::BadShape`] unless `actual == expected`.
pub(crate) fn check_shape(name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
    if actual != expected {
        return Err(ModelError::BadShape {
            name: name.to_string(),
            actual: actual.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

/// The expected `[out, in]` shapes of a layer's projections, in `LayerWeights` order.
pub(crate) struct LayerShapes {
    pub q: [usize; 2],
    pub kv: [usize; 2],
    pub o: [usize; 2],
    pub up: [usize; 2],
    pub down: [usize; 2],
}

impl LayerShapes {
    pub(crate) fn of(spec: &ModelSpec) -> Self {
        let h = spec.hidden_size;
        let q = spec.n_heads * spec.head_dim;
        let kv = spec.n_kv_heads * spec.head_dim;
        let i = spec.intermediate_size;
        Self {
            q: [q, h],
            kv: [kv, h],
            o: [h, q],
            up: [i, h],
            down: [h, i],
        }
    }
}

/// Reports progress; shared by both readers.
pub(crate) struct Progress<'a> {
    pub done: u64,
    pub total: u64,
    pub sink: Option<&'a mut dyn FnMut(LoadProgress)>,
}

impl Progress<'_> {
    pub(crate) fn advance(&mut self, bytes: u64, what: &str) {
        self.done += bytes;
        if let Some(sink) = self.sink.as_mut() {
            sink(LoadProgress {
                done_bytes: self.done,
                total_bytes: self.total,
                what: what.into(),
            });
        }
    }
}
