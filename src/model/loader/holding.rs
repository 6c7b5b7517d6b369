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

use candle_core::{DType, Device};

use super::LoadOptions;
use crate::model::checkpoint::{unsupported_type, Checkpoint};
use crate::model::cpu_qmatmul::{dequant, CpuQMatMul};
use crate::model::error::{ModelError, Result};
use crate::model::header::GgufType;
use crate::model::tensors::{Format, StoredType, TensorRecord};

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
    /// Dtype of dense weights, activations and the KV cache.
    compute: DType,
    /// The device is the CPU (ferry's kernels multiply the types candle lacks).
    cpu: bool,
}

impl Holding {
    /// Resolves `options` for `checkpoint`; refuses a dtype the device cannot multiply.
    pub fn new(checkpoint: &Checkpoint, options: &LoadOptions) -> Result<Self> {
        let dense = options.dtype.dense();
        let compute = match dense {
            Some(dtype) => dtype,
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

    /// How `record`, used as `role`, is held.
    pub fn kind(&self, role: Role, record: &TensorRecord) -> Result<TensorKind> {
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

    /// Whether the device multiplies GGUF blocks of `ty` (so they may stay quantized).
    pub fn has_kernels(&self, ty: GgufType) -> bool {
        ty.to_candle().is_some() || (self.cpu && CpuQMatMul::supports(ty))
    }

    /// Bytes `record` takes once held as `kind`.
    pub fn bytes(kind: TensorKind, record: &TensorRecord) -> usize {
        match kind {
            TensorKind::Blocks(_) => record.stored_bytes(),
            TensorKind::Dense(dtype) => record.elem_count() * dtype.size_in_bytes(),
        }
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
