//! What the KV cache stores per position and head: a dense dtype (f32, f16, bf16), or
//! llama.cpp's `q8_0` / `q4_0` blocks (32 values and one f16 scale per block: 34 and 18 bytes,
//! so about 0.53x and 0.28x the bytes of f16).
//!
//! A block-format cache is a `u8` tensor `[1, kv_heads, positions, row_bytes]`: each head's row
//! is its `head_dim / 32` blocks back to back, so the cache's positions are written, narrowed,
//! copied and concatenated by the same tensor operations as a dense cache. Rows are quantized on
//! write (candle's quantizers, llama.cpp's reference rounding) and the CPU's tiled attention
//! decodes them a tile at a time ([`decode_blocks`]); nothing makes a dense copy of the cache.
//!
//! Before a block format stores them, queries, keys and values are rotated ([`rotate`]: an
//! orthonormal Hadamard transform on each group of [`ROTATION`] values of a head, its own
//! inverse), and the attention output is rotated back. A rotation changes no dot product, so
//! the scores and the output are those of the unrotated vectors, but it spreads a few large
//! channels over the group, which 4-bit blocks with one scale per 32 values quantize far
//! better (llama.cpp does the same for its quantized caches since early 2026; measured in
//! docs/BENCHMARKS.md).

use candle_core::quantized::k_quants::{BlockQ4_0, BlockQ8_0};
use candle_core::quantized::GgmlType;
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::kv_cache::KvShape;

/// Values per quantized block.
pub const BLOCK: usize = 32;

/// Values per rotated group of a block-format cache's heads.
pub const ROTATION: usize = 64;

/// The KV cache's storage format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvFormat {
    /// Dense values of this dtype.
    Dense(DType),
    /// llama.cpp's `q8_0` blocks: an f16 scale and 32 signed bytes.
    Q8_0,
    /// llama.cpp's `q4_0` blocks: an f16 scale and 32 four-bit values (offset by 8).
    Q4_0,
}

impl KvFormat {
    /// The name the `kv_dtype` setting uses.
    pub fn as_str(self) -> &'static str {
        match self {
            KvFormat::Dense(dtype) => dtype.as_str(),
            KvFormat::Q8_0 => "q8_0",
            KvFormat::Q4_0 => "q4_0",
        }
    }

    /// Whether this is a block format.
    pub fn is_quantized(self) -> bool {
        !matches!(self, KvFormat::Dense(_))
    }

    /// Bytes of one block (`None` for a dense format).
    fn block_bytes(self) -> Option<usize> {
        match self {
            KvFormat::Dense(_) => None,
            KvFormat::Q8_0 => Some(std::mem::size_of::<BlockQ8_0>()),
            KvFormat::Q4_0 => Some(std::mem::size_of::<BlockQ4_0>()),
        }
    }

    /// Bytes of one head's row of `head_dim` values.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match (self, self.block_bytes()) {
            (KvFormat::Dense(dtype), _) => head_dim * dtype.size_in_bytes(),
            (_, Some(block)) => head_dim.div_ceil(BLOCK) * block,
            (_, None) => unreachable!("a block format has a block size"),
        }
    }

    /// Whether queries, keys and values are rotated around this format's cache ([`rotate`]):
    /// for block formats, with heads of whole rotation groups.
    pub fn rotates(self, head_dim: usize) -> bool {
        self.is_quantized() && head_dim.is_multiple_of(ROTATION)
    }

    /// The dtype of the cache's buffers.
    pub fn storage_dtype(self) -> DType {
        match self {
            KvFormat::Dense(dtype) => dtype,
            _ => DType::U8,
        }
    }

    /// Elements along the last dimension of the cache's buffers for heads of `head_dim`.
    pub fn row_len(self, head_dim: usize) -> usize {
        match self {
            KvFormat::Dense(_) => head_dim,
            _ => self.row_bytes(head_dim),
        }
    }

    /// Refuses a block format for heads whose width is not whole blocks, for a cache whose
    /// values are in its keys (latent attention), and off the CPU (its attention reads blocks
    /// in the CPU's tiled kernel only, so far).
    pub fn check(self, shape: &KvShape, device: &Device) -> Result<()> {
        if !self.is_quantized() {
            return Ok(());
        }
        let head_dim = shape.head_dim;
        if shape.values_in_keys.is_some() {
            return Err(ModelError::Unsupported(format!(
                "kv_dtype {}: the latent attention's cache (DeepSeek's `deepseek2`) keeps its \
                 values inside its keys, which the block formats' attention does not read; use \
                 f16 or bf16 (`ferry plan` shows how much smaller than the expanded keys and values \
                 the latent cache already is)",
                self.as_str()
            )));
        }
        if !head_dim.is_multiple_of(BLOCK) {
            return Err(ModelError::Config(format!(
                "kv_dtype {}: the heads are {head_dim} wide, not a multiple of the {BLOCK}-value \
                 blocks; use f16",
                self.as_str()
            )));
        }
        if !device.is_cpu() {
            return Err(ModelError::Unsupported(format!(
                "kv_dtype {} runs on the CPU only so far (its attention reads the blocks in the \
                 CPU's tiled kernel): on CUDA set kv_offload = \"on\" (the cache in host memory, \
                 attended there) or use f16 / bf16",
                self.as_str()
            )));
        }
        Ok(())
    }

    /// `rows` (`[1, heads, seq, head_dim]`, any float dtype) as this format stores them.
    pub fn encode(self, rows: &Tensor) -> Result<Tensor> {
        let (b, heads, seq, dim) = rows.dims4()?;
        if let KvFormat::Dense(dtype) = self {
            return Ok(rows.to_dtype(dtype)?.contiguous()?);
        }
        let values = rows.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let bytes = match self {
            KvFormat::Q8_0 => quantize::<BlockQ8_0>(&values),
            _ => quantize::<BlockQ4_0>(&values),
        };
        let shape = (b, heads, seq, self.row_bytes(dim));
        Ok(Tensor::from_vec(bytes, shape, rows.device())?)
    }

    /// The values of `stored` (`[1, heads, len, row_len]` of this format) as f32
    /// `[1, heads, len, head_dim]`: what attention paths that multiply dense tensors read.
    pub fn decode(self, stored: &Tensor, head_dim: usize) -> Result<Tensor> {
        if let KvFormat::Dense(_) = self {
            return Ok(stored.to_dtype(DType::F32)?);
        }
        let (b, heads, len, _) = stored.dims4()?;
        let bytes = stored.flatten_all()?.to_vec1::<u8>()?;
        let mut out = vec![0f32; b * heads * len * head_dim];
        decode_blocks(self, &bytes, &mut out);
        Ok(Tensor::from_vec(
            out,
            (b, heads, len, head_dim),
            stored.device(),
        )?)
    }
}

/// `x` (any shape whose element count is a multiple of [`ROTATION`], in f32 or another float
/// dtype) with each consecutive group of [`ROTATION`] values multiplied by the orthonormal
/// Hadamard matrix of that size (Sylvester's, over `1 / sqrt(64)`), by the fast
/// Walsh-Hadamard butterflies. The matrix is symmetric and its own inverse, so rotating twice
/// gives `x` back. Each group is computed alone, in the same order whatever the number of rows,
/// so a row rotates to the same bits in a one-token step as in a longer one (what speculative
/// verification needs to match decoding exactly).
pub fn rotate(x: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let dtype = x.dtype();
    let mut values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let scale = 1.0 / (ROTATION as f32).sqrt();
    for group in values.chunks_exact_mut(ROTATION) {
        let mut half = 1;
        while half < ROTATION {
            for start in (0..ROTATION).step_by(2 * half) {
                for i in start..start + half {
                    let (a, b) = (group[i], group[i + half]);
                    group[i] = a + b;
                    group[i + half] = a - b;
                }
            }
            half *= 2;
        }
        for v in group.iter_mut() {
            *v *= scale;
        }
    }
    Ok(Tensor::from_vec(values, dims, x.device())?.to_dtype(dtype)?)
}

/// `values` (a multiple of [`BLOCK`]) quantized to blocks of `T`, as bytes.
fn quantize<T: GgmlType>(values: &[f32]) -> Vec<u8> {
    let mut blocks = vec![T::zeros(); values.len() / BLOCK];
    T::from_float(values, &mut blocks);
    let size = std::mem::size_of::<T>();
    let mut bytes = vec![0u8; blocks.len() * size];
    // SAFETY: ggml block types are plain old data (f16 and integer fields, no padding: their
    // size is the sum of their fields, 34 and 18 bytes); the copy reads exactly the vector's
    // `blocks.len() * size` bytes into a buffer of that length.
    unsafe {
        std::ptr::copy_nonoverlapping(
            blocks.as_ptr().cast::<u8>(),
            bytes.as_mut_ptr(),
            bytes.len(),
        );
    }
    bytes
}

/// Decodes whole blocks of `format` from `bytes` into `out` (`BLOCK` values per block; `out`
/// says how many): a q8_0 value is `scale * q`, a q4_0 value `scale * (nibble - 8)` with the
/// block's first 16 values in the low nibbles and the next 16 in the high ones. Byte-level
/// reads, so `bytes` need not be aligned. A dense `format` leaves `out` untouched.
#[inline(always)]
pub fn decode_blocks(format: KvFormat, bytes: &[u8], out: &mut [f32]) {
    match format {
        KvFormat::Dense(_) => {}
        KvFormat::Q8_0 => {
            for (block, values) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(BLOCK)) {
                let scale = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                for (v, &q) in values.iter_mut().zip(&block[2..]) {
                    *v = scale * f32::from(q as i8);
                }
            }
        }
        KvFormat::Q4_0 => {
            for (block, values) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(BLOCK)) {
                let scale = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                let (low, high) = values.split_at_mut(BLOCK / 2);
                for ((l, h), &q) in low.iter_mut().zip(high.iter_mut()).zip(&block[2..]) {
                    *l = scale * (f32::from(q & 0x0f) - 8.0);
                    *h = scale * (f32::from(q >> 4) - 8.0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect()
    }

    #[test]
    fn block_rows_are_llama_cpp_sized() {
        assert_eq!(KvFormat::Q8_0.row_bytes(64), 68);
        assert_eq!(KvFormat::Q4_0.row_bytes(128), 72);
        assert_eq!(KvFormat::Dense(DType::F16).row_bytes(64), 128);
        assert_eq!(KvFormat::Q8_0.storage_dtype(), DType::U8);
        assert_eq!(KvFormat::Q4_0.row_len(64), 36);
        assert_eq!(KvFormat::Dense(DType::BF16).row_len(64), 64);
    }

    #[test]
    fn decoding_matches_candles_decoder_and_the_values_within_a_step() {
        let xs = values(4 * 64);
        let rows = Tensor::from_vec(xs.clone(), (1, 4, 1, 64), &Device::Cpu).unwrap();
        for (format, step) in [(KvFormat::Q8_0, 1.0 / 127.0), (KvFormat::Q4_0, 1.0 / 7.0)] {
            let stored = format.encode(&rows).unwrap();
            assert_eq!(stored.dims(), &[1, 4, 1, format.row_bytes(64)]);
            let bytes = stored.flatten_all().unwrap().to_vec1::<u8>().unwrap();
            let mut ours = vec![0f32; xs.len()];
            decode_blocks(format, &bytes, &mut ours);
            let mut theirs = vec![0f32; xs.len()];
            let ty = match format {
                KvFormat::Q8_0 => crate::header::GgufType::Q8_0,
                _ => crate::header::GgufType::Q4_0,
            };
            crate::cpu_qmatmul::dequant::dequantize(ty, &bytes, &mut theirs).unwrap();
            assert_eq!(ours, theirs, "{format:?}");
            // Every value within one quantization step of its block's largest magnitude.
            for (block, decoded) in xs.chunks(BLOCK).zip(ours.chunks(BLOCK)) {
                let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (x, y) in block.iter().zip(decoded) {
                    assert!(
                        (x - y).abs() <= amax * step * 1.01,
                        "{format:?}: {x} -> {y}"
                    );
                }
            }
            let back = format.decode(&stored, 64).unwrap();
            assert_eq!(back.flatten_all().unwrap().to_vec1::<f32>().unwrap(), ours);
        }
    }

    #[test]
    fn the_rotation_keeps_dot_products_and_undoes_itself() {
        let a = Tensor::from_vec(values(128), (2, 64), &Device::Cpu).unwrap();
        let b = Tensor::from_vec(values(131)[3..].to_vec(), (2, 64), &Device::Cpu).unwrap();
        let (ra, rb) = (rotate(&a).unwrap(), rotate(&b).unwrap());
        let dot = |x: &Tensor, y: &Tensor| (x * y).unwrap().sum_all().unwrap().to_scalar::<f32>();
        let (before, after) = (dot(&a, &b).unwrap(), dot(&ra, &rb).unwrap());
        assert!(
            (before - after).abs() < 1e-3 * before.abs().max(1.0),
            "{before} {after}"
        );
        let back = rotate(&ra).unwrap();
        let diff = (back - &a).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);
        // It mixes: a single large channel is spread over the whole group.
        let mut spike = vec![0f32; 64];
        spike[5] = 8.0;
        let spread = rotate(&Tensor::from_vec(spike, (1, 64), &Device::Cpu).unwrap()).unwrap();
        let spread = spread.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(
            spread.iter().all(|x| (x.abs() - 1.0).abs() < 1e-6),
            "{spread:?}"
        );
        assert!(KvFormat::Q4_0.rotates(64) && !KvFormat::Q4_0.rotates(96));
        // The butterflies are the matrix: row r of Sylvester's matrix has sign
        // (-1)^popcount(r & c) in column c.
        for r in [0usize, 1, 5, 37, 63] {
            let mut unit = vec![0f32; 64];
            unit[r] = 1.0;
            let row = rotate(&Tensor::from_vec(unit, (1, 64), &Device::Cpu).unwrap()).unwrap();
            let row = row.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (c, x) in row.iter().enumerate() {
                let sign = if (r & c).count_ones() % 2 == 0 {
                    1.0
                } else {
                    -1.0
                };
                assert!((x - sign / 8.0).abs() < 1e-7, "row {r} column {c}: {x}");
            }
        }
        assert!(!KvFormat::Dense(DType::F16).rotates(64));
    }

    #[test]
    fn blocks_need_whole_blocks_the_cpu_and_values_apart() {
        let gqa = |dim| KvShape::gqa(2, dim);
        assert!(KvFormat::Q8_0.check(&gqa(64), &Device::Cpu).is_ok());
        let err = KvFormat::Q4_0.check(&gqa(80), &Device::Cpu).unwrap_err();
        assert!(
            err.to_string().contains("not a multiple of the 32"),
            "{err}"
        );
        assert!(KvFormat::Dense(DType::F16)
            .check(&gqa(80), &Device::Cpu)
            .is_ok());
        // DeepSeek's latent cache: whole blocks, but its values are inside its keys.
        let latent = KvShape {
            n_kv_heads: 1,
            head_dim: 576,
            values_in_keys: Some(512),
        };
        for format in [KvFormat::Q8_0, KvFormat::Q4_0] {
            let err = format.check(&latent, &Device::Cpu).unwrap_err();
            assert!(err.to_string().contains("latent attention"), "{err}");
        }
        assert!(KvFormat::Dense(DType::F16)
            .check(&latent, &Device::Cpu)
            .is_ok());
    }
}
