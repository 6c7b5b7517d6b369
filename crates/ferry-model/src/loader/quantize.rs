//! Quantize on load: a dense matrix of the checkpoint becomes GGUF blocks of the type
//! [`super::Holding`] chose for it (dtype `q8_0`, `q4_k`, ...), once, when it is read. The rows
//! are split into chunks quantized on rayon's threads with candle's CPU quantizer (the same
//! `from_float` its `QTensor::quantize` runs), so a load uses every core; the blocks then go to
//! the device as GGUF bytes read from a file would. The loader and the host slabs of the offload
//! engine both take their bytes from [`quantized_bytes`], so a streamed layer holds exactly what
//! a resident one would.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::holding::{stored_as, Holding, Role, TensorKind};
use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::header::GgufType;
use crate::tensors::TensorRecord;

/// Rows per chunk are chosen so each thread gets a few chunks (uneven rows even out) and a
/// chunk is at least this many elements (small ones cost more to hand out than to quantize).
const MIN_CHUNK_ELEMS: usize = 1 << 16;

/// `record` as a quantized tensor of `ty` on `device`: its own blocks when the file stores it as
/// `ty`, else its dense values quantized now.
pub fn read_blocks(
    checkpoint: &Checkpoint,
    record: &TensorRecord,
    ty: GgmlDType,
    device: &Device,
) -> Result<QTensor> {
    if stored_as(record, GgufType::from_candle(ty)) {
        return checkpoint.read_blocks(record, device);
    }
    let bytes = quantized_bytes(checkpoint, record, ty)?;
    let storage = QStorage::from_data(Cow::Owned(bytes), device, ty)?;
    Ok(QTensor::new(storage, record.shape.as_slice())?)
}

/// The GGUF blocks of `ty` for the dense tensor `record`, row-major as a file would store them
/// (quantized in parallel over row chunks).
pub fn quantized_bytes(
    checkpoint: &Checkpoint,
    record: &TensorRecord,
    ty: GgmlDType,
) -> Result<Vec<u8>> {
    let row = record.shape.last().copied().unwrap_or(0);
    if record.shape.len() < 2 || row == 0 || row % ty.block_size() != 0 {
        return Err(ModelError::Unsupported(format!(
            "`{}` (shape {:?}) cannot be quantized to {ty:?}: its rows are not whole \
             {}-element blocks",
            record.name,
            record.shape,
            ty.block_size()
        )));
    }
    let dense = checkpoint.read_dense(record, DType::F32, &Device::Cpu)?;
    let values = dense.flatten_all()?.to_vec1::<f32>()?;
    let rows = values.len() / row;
    let threads = rayon::current_num_threads().max(1);
    let chunk_rows = rows
        .div_ceil(threads * 4)
        .max(MIN_CHUNK_ELEMS.div_ceil(row))
        .min(rows.max(1));
    let chunks = values
        .par_chunks(chunk_rows * row)
        .map(|chunk| -> Result<Vec<u8>> {
            let t = Tensor::from_slice(chunk, (chunk.len() / row, row), &Device::Cpu)?;
            Ok(QTensor::quantize(&t, ty)?.data()?.into_owned())
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = chunks.concat();
    let expected = record.elem_count() / ty.block_size() * ty.type_size();
    if bytes.len() != expected {
        return Err(ModelError::Source(format!(
            "`{}`: quantizing to {ty:?} gave {} bytes, expected {expected}",
            record.name,
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Logs a matrix quantized to another type than the one asked for, or kept dense (once per
/// tensor per load: the reader calls it as it reads).
pub fn log_fallback(holding: &Holding, role: Role, record: &TensorRecord, kind: TensorKind) {
    let Some(target) = holding.quantize() else {
        return;
    };
    if role == Role::Vector
        || record.shape.len() < 2
        || kind == TensorKind::Blocks(GgufType::from_candle(target))
    {
        return;
    }
    let row = record.shape.last().copied().unwrap_or(0);
    match kind {
        TensorKind::Blocks(ty) => tracing::info!(
            tensor = %record.name,
            row,
            "rows are not whole {target:?} blocks ({} elements): quantized to {ty:?} instead",
            target.block_size()
        ),
        TensorKind::Dense(dtype) => tracing::info!(
            tensor = %record.name,
            row,
            "rows are not whole blocks of {target:?} or its fallback: kept dense {dtype:?}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::holding::fit_row;
    use super::*;

    #[test]
    fn k_quants_fall_back_like_llama_cpp_and_odd_rows_stay_dense() {
        assert_eq!(fit_row(GgmlDType::Q4K, 512), Some(GgmlDType::Q4K));
        assert_eq!(fit_row(GgmlDType::Q4K, 576), Some(GgmlDType::Q5_0));
        assert_eq!(fit_row(GgmlDType::Q5K, 576), Some(GgmlDType::Q5_1));
        assert_eq!(fit_row(GgmlDType::Q6K, 576), Some(GgmlDType::Q8_0));
        assert_eq!(fit_row(GgmlDType::Q2K, 96), Some(GgmlDType::Q4_0));
        assert_eq!(fit_row(GgmlDType::Q8_0, 64), Some(GgmlDType::Q8_0));
        assert_eq!(fit_row(GgmlDType::Q8_0, 48), None);
        assert_eq!(fit_row(GgmlDType::Q6K, 100), None);
        assert_eq!(fit_row(GgmlDType::Q4_0, 0), None);
    }
}
