//! How each tensor of a checkpoint is held once loaded: [`Holding`] resolves the dtype choice
//! against the device and the checkpoint (the compute dtype), and decides per tensor whether it
//! stays as GGUF blocks or becomes dense ([`TensorKind`]). The loader, the host slabs and the
//! planner's sizing all ask it, so a model is sized exactly as it will be loaded and a tensor
//! the loader cannot hold is refused by `ferry plan` too.
//!
//! The rules: with dtype `auto`, block-quantized GGUF matrices (projections, head, embedding)
//! stay quantized where the device has kernels for their type (on the CPU ferry's or candle's;
//! on CUDA candle's, which lack IQ4_NL, IQ4_XS and MXFP4: those are dequantized at load to the
//! compute dtype) and everything else is dense f32; with an explicit dtype every tensor is dense
//! in it. Safetensors checkpoints are always dense: f32 on the CPU with `auto`, the checkpoint's
//! dtype (that of the embedding) on CUDA.
//!
//! A quantized dtype (`q8_0`, `q4_k`, ...) quantizes a dense checkpoint's matrices at load
//! ([`super::quantize`]); norms and biases stay dense f32, as do activations. The embedding is
//! quantized too: it is usually the largest matrix (and the head, when tied), GGUF files ship it
//! quantized, and a lookup dequantizes only the rows it reads. A matrix whose rows are not a
//! whole number of the type's blocks falls back, as llama.cpp's quantizer does, to the nearest
//! type with 32-element blocks ([`fit_row`]), and stays dense when even those do not fit. An
//! already quantized GGUF is refused: requantizing blocks loses precision twice, and `auto`
//! serves its own blocks.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};

use super::LoadOptions;
use crate::checkpoint::{unsupported_type, Checkpoint};
use crate::cpu_qmatmul::{dequant, CpuQMatMul};
use crate::error::{ModelError, Result};
use crate::header::GgufType;
use crate::tensors::{Format, StoredType, TensorRecord};
use ferry_config::QuantType;

/// How a loaded tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// GGUF block-quantized bytes, as in the file.
    Blocks(GgufType),
    /// Dense elements of this dtype.
    Dense(DType),
}

/// What a tensor is used as, which decides whether it may stay quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A projection matrix or the output head (multiplied by a quantized matmul).
    Matrix,
    /// The token embedding (rows dequantized on lookup).
    Embedding,
    /// A norm weight or a bias (always dense).
    Vector,
}

/// The resolved dtype choice of one load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// `None`: keep block-quantized matrices quantized.
    dense: Option<DType>,
    /// Quantize dense matrices into this type at load.
    quantize: Option<GgmlDType>,
    /// Dtype of dense weights, activations and the KV cache.
    compute: DType,
    /// The device is the CPU (ferry's kernels multiply the types candle lacks).
    cpu: bool,
}

impl Holding {
    /// Resolves `options` for `checkpoint`; refuses a dtype the device cannot multiply.
    pub fn new(checkpoint: &Checkpoint, options: &LoadOptions) -> Result<Self> {
        let dense = super::dense_dtype(options.dtype);
        let quantize = options.dtype.quantize();
        if let Some(q) = quantize {
            refuse_quantized_checkpoint(checkpoint, q)?;
        }
        let compute = match dense {
            Some(dtype) => dtype,
            // Quantized matmuls take f32 activations on every device.
            None if quantize.is_some() => DType::F32,
            None if checkpoint.format() == Format::Gguf || options.device.is_cpu() => DType::F32,
            None => match checkpoint.tensors().embedding.stored {
                StoredType::Safetensors(st) => match DType::try_from(st) {
                    Ok(dt @ (DType::F16 | DType::BF16 | DType::F32)) => dt,
                    _ => DType::F32,
                },
                StoredType::Gguf(_) => DType::F32,
            },
        };
        check_dtype_on_device(compute, &options.device)?;
        Ok(Self {
            dense,
            quantize: quantize.map(ggml_type),
            compute,
            cpu: options.device.is_cpu(),
        })
    }

    /// The dtype of dense weights and activations.
    pub fn compute(&self) -> DType {
        self.compute
    }

    /// The explicit dense dtype, if one was chosen.
    pub fn dense(&self) -> Option<DType> {
        self.dense
    }

    /// The type dense matrices are quantized to at load, if a quantized dtype was chosen.
    pub fn quantize(&self) -> Option<GgmlDType> {
        self.quantize
    }

    /// How `record`, used as `role`, is held.
    pub fn kind(&self, role: Role, record: &TensorRecord) -> Result<TensorKind> {
        if let Some(target) = self.quantize {
            // `new` refused quantized GGUFs, so every tensor here is stored dense.
            self.check_stored(record)?;
            let row = record.shape.last().copied().unwrap_or(0);
            let fitted = (role != Role::Vector && record.shape.len() >= 2)
                .then(|| fit_row(target, row))
                .flatten();
            return Ok(match fitted {
                Some(ty) => TensorKind::Blocks(GgufType::from_candle(ty)),
                None => TensorKind::Dense(self.compute),
            });
        }
        match record.stored {
            StoredType::Gguf(ty) => {
                let stays_quantized = self.dense.is_none() && role != Role::Vector;
                if stays_quantized && ty.is_block() && self.has_kernels(ty) {
                    Ok(TensorKind::Blocks(ty))
                } else if dequant::supports(ty) {
                    Ok(TensorKind::Dense(self.compute))
                } else {
                    Err(unsupported_type(record, ty))
                }
            }
            StoredType::Safetensors(st) => {
                DType::try_from(st).map_err(|_| {
                    ModelError::Unsupported(format!(
                        "tensor `{}` is stored as {st}, which candle cannot read",
                        record.name
                    ))
                })?;
                Ok(TensorKind::Dense(self.compute))
            }
        }
    }

    /// Refuses a stored type candle cannot read.
    fn check_stored(&self, record: &TensorRecord) -> Result<()> {
        match record.stored {
            StoredType::Gguf(ty) => ty
                .to_candle()
                .map(|_| ())
                .ok_or_else(|| unsupported_type(record, ty)),
            StoredType::Safetensors(st) => DType::try_from(st).map(|_| ()).map_err(|_| {
                ModelError::Unsupported(format!(
                    "tensor `{}` is stored as {st}, which candle cannot read",
                    record.name
                ))
            }),
        }
    }

    /// Whether the device multiplies GGUF blocks of `ty` (so they may stay quantized).
    pub fn has_kernels(&self, ty: GgufType) -> bool {
        ty.to_candle().is_some() || (self.cpu && CpuQMatMul::supports(ty))
    }

    /// Bytes `record` takes once held as `kind`.
    pub fn bytes(kind: TensorKind, record: &TensorRecord) -> usize {
        match kind {
            TensorKind::Blocks(ty) if stored_as(record, ty) => record.stored_bytes(),
            TensorKind::Blocks(ty) => record.elem_count() / ty.block_size() * ty.type_size(),
            TensorKind::Dense(dtype) => record.elem_count() * dtype.size_in_bytes(),
        }
    }
}

/// Whether `record` is stored in the file as blocks of `ty` (its bytes can be used as they are).
pub fn stored_as(record: &TensorRecord, ty: GgufType) -> bool {
    matches!(record.stored, StoredType::Gguf(stored) if stored == ty)
}

/// candle's type for a quantization choice.
pub fn ggml_type(q: QuantType) -> GgmlDType {
    match q {
        QuantType::Q4_0 => GgmlDType::Q4_0,
        QuantType::Q4_1 => GgmlDType::Q4_1,
        QuantType::Q5_0 => GgmlDType::Q5_0,
        QuantType::Q5_1 => GgmlDType::Q5_1,
        QuantType::Q8_0 => GgmlDType::Q8_0,
        QuantType::Q2_K => GgmlDType::Q2K,
        QuantType::Q3_K => GgmlDType::Q3K,
        QuantType::Q4_K => GgmlDType::Q4K,
        QuantType::Q5_K => GgmlDType::Q5K,
        QuantType::Q6_K => GgmlDType::Q6K,
    }
}

/// The type a matrix with rows of `row` elements is quantized to when `target` was asked for:
/// `target` when a row is a whole number of its blocks, else llama.cpp's fallback for a
/// k-quant (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0; llama.cpp picks
/// IQ4_NL for the last two, which candle cannot write), else `None` (the matrix stays dense).
pub fn fit_row(target: GgmlDType, row: usize) -> Option<GgmlDType> {
    let fallback = match target {
        GgmlDType::Q2K | GgmlDType::Q3K => GgmlDType::Q4_0,
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        other => other,
    };
    [target, fallback]
        .into_iter()
        .find(|ty| row > 0 && row.is_multiple_of(ty.block_size()))
}

/// The error for a quantized dtype on a checkpoint that already holds quantized blocks.
fn refuse_quantized_checkpoint(checkpoint: &Checkpoint, q: QuantType) -> Result<()> {
    let quantized = checkpoint.tensors().records().find_map(|r| match r.stored {
        StoredType::Gguf(ty) if ty.is_block() => Some((r, ty)),
        _ => None,
    });
    match quantized {
        Some((record, ty)) => Err(ModelError::Unsupported(format!(
            "dtype {} quantizes a dense model at load, but this GGUF is already quantized \
             (`{}` is {ty}); use dtype auto to serve its own blocks, or a dense (f32/f16/bf16) \
             checkpoint",
            q.as_str(),
            record.name
        ))),
        None => Ok(()),
    }
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
