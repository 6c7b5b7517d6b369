//! Dequantization of raw GGUF blocks to f32, by [`GgufType`]: ferry's own for the types candle
//! 0.11.1 lacks (IQ4_NL, IQ4_XS in [`super::iq4`], MXFP4 in [`super::mxfp4`]), candle's block
//! decoders (`GgmlType::to_float`) for the others. Used for embedding lookups on raw blocks and
//! for loads that need a tensor dense (an explicit dtype, or CUDA for types it cannot multiply).

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use candle_core::quantized::GgmlType;
use half::{bf16, f16};

use super::{iq4, mxfp4};
use crate::error::{ModelError, Result};
use crate::header::GgufType;

/// Whether [`dequantize`] can decode `ty`.
pub fn supports(ty: GgufType) -> bool {
    matches!(ty, GgufType::IQ4_NL | GgufType::IQ4_XS | GgufType::MXFP4) || ty.to_candle().is_some()
}

/// Decodes `bytes`, whole blocks of `ty`, into `out` (`bytes.len() / type_size * block_size`
/// values).
pub fn dequantize(ty: GgufType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (block, size) = (ty.block_size(), ty.type_size());
    if !bytes.len().is_multiple_of(size) || bytes.len() / size * block != out.len() {
        return Err(ModelError::Config(format!(
            "{} bytes of {ty} do not decode to {} values",
            bytes.len(),
            out.len()
        )));
    }
    match ty {
        GgufType::IQ4_NL => iq4::dequantize_iq4_nl(bytes, out),
        GgufType::IQ4_XS => iq4::dequantize_iq4_xs(bytes, out),
        GgufType::MXFP4 => mxfp4::dequantize_mxfp4(bytes, out),
        GgufType::F32 => candle_to_float::<f32>(bytes, out),
        GgufType::F16 => candle_to_float::<f16>(bytes, out),
        GgufType::BF16 => candle_to_float::<bf16>(bytes, out),
        GgufType::Q4_0 => candle_to_float::<BlockQ4_0>(bytes, out),
        GgufType::Q4_1 => candle_to_float::<BlockQ4_1>(bytes, out),
        GgufType::Q5_0 => candle_to_float::<BlockQ5_0>(bytes, out),
        GgufType::Q5_1 => candle_to_float::<BlockQ5_1>(bytes, out),
        GgufType::Q8_0 => candle_to_float::<BlockQ8_0>(bytes, out),
        GgufType::Q8_1 => candle_to_float::<BlockQ8_1>(bytes, out),
        GgufType::Q2_K => candle_to_float::<BlockQ2K>(bytes, out),
        GgufType::Q3_K => candle_to_float::<BlockQ3K>(bytes, out),
        GgufType::Q4_K => candle_to_float::<BlockQ4K>(bytes, out),
        GgufType::Q5_K => candle_to_float::<BlockQ5K>(bytes, out),
        GgufType::Q6_K => candle_to_float::<BlockQ6K>(bytes, out),
        GgufType::Q8_K => candle_to_float::<BlockQ8K>(bytes, out),
        _ => {
            return Err(ModelError::Unsupported(format!(
                "dequantizing {ty}, a GGUF type ferry cannot decode yet"
            )))
        }
    }
    Ok(())
}

/// candle's decoder for block type `T`, over a copy of `bytes` aligned for `T` (the raw bytes
/// of a mapped file need not be).
fn candle_to_float<T: GgmlType>(bytes: &[u8], out: &mut [f32]) {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut blocks: Vec<T> = Vec::with_capacity(n);
    // SAFETY: ggml block types are plain old data (integers and floats, every bit pattern
    // valid); exactly `n * size_of::<T>()` bytes are written into the vector's capacity before
    // its length is set.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            blocks.as_mut_ptr().cast::<u8>(),
            n * std::mem::size_of::<T>(),
        );
        blocks.set_len(n);
    }
    T::to_float(&blocks, out);
}
