//! A dense f32 projection of a few rows on the CPU (`x W^T` for up to [`MAX_ROWS`] rows), each
//! output a dot product summed in one fixed order, so a row's result never depends on the rows
//! beside it: a decode step's one row and the same position in a speculative verification's
//! few rows compute bit for bit alike. candle's CPU matmul cannot promise that (it takes a
//! matrix-vector path for one row, whose sums round differently from its matrix path), and
//! running one row as two through its matrix path costs three to four times the matrix-vector
//! time. Each weight row is read once for all the rows (the memory traffic of one decode).

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Most rows computed here; more go to candle's matrix path (prompt chunks).
pub const MAX_ROWS: usize = 16;

/// Lanes of the dot product's partial sums (two AVX2 registers, or four SSE ones).
const LANES: usize = 16;

/// Output features per parallel task.
const BLOCK: usize = 64;

/// `x` `[rows, in]` times `weight` `[out, in]` transposed, as f32 `[rows, out]`, when both are
/// f32 on the CPU, `weight` is contiguous and `rows <= MAX_ROWS`; `None` otherwise.
pub fn project(x: &Tensor, weight: &Tensor) -> Result<Option<Tensor>> {
    let (rows, in_dim) = x.dims2()?;
    let (out_dim, w_in) = weight.dims2()?;
    let usable = rows <= MAX_ROWS
        && w_in == in_dim
        && x.dtype() == DType::F32
        && weight.dtype() == DType::F32
        && weight.device().is_cpu()
        && weight.is_contiguous();
    if !usable {
        return Ok(None);
    }
    let x = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let (storage, layout) = weight.storage_and_layout();
    let Storage::Cpu(CpuStorage::F32(all)) = &*storage else {
        return Ok(None);
    };
    let start = layout.start_offset();
    let w = &all[start..start + out_dim * in_dim];
    // Output features in blocks, each block's results for every row ([block][rows]).
    let mut by_feature = vec![0f32; out_dim * rows];
    by_feature
        .par_chunks_mut(BLOCK * rows)
        .enumerate()
        .for_each(|(block, out)| {
            let first = block * BLOCK;
            for (j, outs) in out.chunks_exact_mut(rows).enumerate() {
                let row = &w[(first + j) * in_dim..(first + j + 1) * in_dim];
                for (i, o) in outs.iter_mut().enumerate() {
                    *o = dot(&x[i * in_dim..(i + 1) * in_dim], row);
                }
            }
        });
    drop(storage);
    let mut y = vec![0f32; rows * out_dim];
    for (j, outs) in by_feature.chunks_exact(rows).enumerate() {
        for (i, &v) in outs.iter().enumerate() {
            y[i * out_dim + j] = v;
        }
    }
    Ok(Some(Tensor::from_vec(y, (rows, out_dim), &Device::Cpu)?))
}

/// `a . b` in a fixed order: [`LANES`] partial sums over the whole chunks, added in lane
/// order, then the tail.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { dot_avx2(a, b) };
    }
    dot_plain(a, b)
}

/// [`dot_plain`] compiled for AVX2 (the same additions in the same order: no FMA contraction,
/// so the result is the plain one's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_plain(a, b)
}

#[inline(always)]
fn dot_plain(a: &[f32], b: &[f32]) -> f32 {
    let whole = a.len().min(b.len()) / LANES * LANES;
    let mut acc = [0f32; LANES];
    for (x, y) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for lane in 0..LANES {
            acc[lane] += x[lane] * y[lane];
        }
    }
    let mut sum = 0f32;
    for lane in acc {
        sum += lane;
    }
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_computes_alike_whatever_the_rows_beside_it_and_matches_the_matmul() {
        let w = Tensor::randn(0f32, 1.0, (150, 83), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (7, 83), &Device::Cpu).unwrap();
        let all = project(&x, &w).unwrap().expect("f32 on the CPU");
        let reference = x.matmul(&w.t().unwrap()).unwrap();
        let diff = (&all - &reference)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-4, "{diff}");
        let all = all.to_vec2::<f32>().unwrap();
        for (i, row) in all.iter().enumerate() {
            let one = project(&x.narrow(0, i, 1).unwrap(), &w).unwrap().unwrap();
            assert!(&one.to_vec2::<f32>().unwrap()[0] == row, "row {i}");
        }
        assert_eq!(dot_plain(&[1.0; 37], &[2.0; 37]), 74.0);
        // Too many rows, or another dtype: candle's path.
        let many = Tensor::zeros((MAX_ROWS + 1, 83), DType::F32, &Device::Cpu).unwrap();
        assert!(project(&many, &w).unwrap().is_none());
        let half = w.to_dtype(DType::F16).unwrap();
        assert!(project(&x.to_dtype(DType::F16).unwrap(), &half)
            .unwrap()
            .is_none());
    }
}
