//! Feasibility probe for a faster CPU path for Q4_1 weights (not used by the model yet).
//!
//! A Q4_1 block stores `w = d * q + m` (q in 0..16); a Q4_0 block stores `w = d * (q - 8)`.
//! With the same `d` and nibbles, `w_q4_1 = w_q4_0 + (8d + m)`, so
//! `W x = Q4_0(W) x + C s(x)`, where `C[n, b] = 8 d + m` per block and `s(x)[b]` is the sum of
//! `x` over block `b`. The Q4_0 part runs candle's SIMD kernel; `C s(x)` is a small dense
//! matmul (k/32 columns). This measures both paths on the real SmolLM2 matrices.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release --example q4_1_probe -- [model.gguf]
//! ```

use std::borrow::Cow;
use std::time::Instant;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor, D};
use half::f16;

/// Splits a Q4_1 tensor into a Q4_0 tensor with the same nibbles and scales, plus the
/// per-block offsets `8d + m` as a dense `[n, k / 32]` matrix.
fn split_q4_1(q: &QTensor) -> anyhow::Result<(QTensor, Tensor)> {
    let (n, k) = q.shape().dims2()?;
    let data = q.data()?;
    let blocks = n * k / 32;
    anyhow::ensure!(q.dtype() == GgmlDType::Q4_1 && data.len() == blocks * 20);
    let mut q4_0 = Vec::with_capacity(blocks * 18);
    let mut offsets = Vec::with_capacity(blocks);
    for block in data.chunks_exact(20) {
        let d = f16::from_le_bytes([block[0], block[1]]);
        let m = f16::from_le_bytes([block[2], block[3]]);
        q4_0.extend_from_slice(&block[0..2]);
        q4_0.extend_from_slice(&block[4..20]);
        offsets.push(8.0 * d.to_f32() + m.to_f32());
    }
    let storage = QStorage::from_data(Cow::Owned(q4_0), &Device::Cpu, GgmlDType::Q4_0)?;
    let q4_0 = QTensor::new(storage, (n, k))?;
    let offsets = Tensor::from_vec(offsets, (n, k / 32), &Device::Cpu)?;
    Ok((q4_0, offsets))
}

fn split_forward(q4_0: &QMatMul, offsets_t: &Tensor, x: &Tensor) -> anyhow::Result<Tensor> {
    let (rows, k) = x.dims2()?;
    let sums = x.reshape((rows, k / 32, 32))?.sum(D::Minus1)?;
    Ok((q4_0.forward(x)? + sums.matmul(offsets_t)?)?)
}

fn time(iters: usize, mut f: impl FnMut() -> anyhow::Result<Tensor>) -> anyhow::Result<f64> {
    f()?;
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    for name in [
        "blk.0.attn_q.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_down.weight",
    ] {
        let q = content.tensor(&mut file, name, &Device::Cpu)?;
        let (n, k) = q.shape().dims2()?;
        let exact_w = q.dequantize(&Device::Cpu)?;
        let (q4_0, offsets) = split_q4_1(&q)?;
        // The split is lossless: dequantizing both parts gives the Q4_1 weights back.
        let rebuilt = (q4_0.dequantize(&Device::Cpu)?
            + offsets
                .repeat((1, 32))?
                .reshape((n, 32, k / 32))?
                .transpose(1, 2)?
                .reshape((n, k))?)?;
        let rebuild_err = (rebuilt - &exact_w)?.abs()?.max_all()?.to_scalar::<f32>()?;

        let x = Tensor::randn(0f32, 1.0, (1, k), &Device::Cpu)?;
        let exact = x.matmul(&exact_w.t()?)?;
        let q4_1 = QMatMul::from_qtensor(q)?;
        let q4_0 = QMatMul::from_qtensor(q4_0)?;
        let offsets_t = offsets.t()?.contiguous()?;
        let err = |y: &Tensor| -> anyhow::Result<f32> {
            Ok((y - &exact)?.abs()?.max_all()?.to_scalar::<f32>()?)
        };
        let base = q4_1.forward(&x)?;
        let split = split_forward(&q4_0, &offsets_t, &x)?;
        let t_base = time(500, || Ok(q4_1.forward(&x)?))?;
        let t_split = time(500, || split_forward(&q4_0, &offsets_t, &x))?;
        println!(
            "{name} [{n}x{k}]: q4_1 {t_base:.1} us (err {:.2e}), q4_0+offsets {t_split:.1} us \
             (err {:.2e}), speedup {:.2}x, split rebuild err {rebuild_err:e}",
            err(&base)?,
            err(&split)?,
            t_base / t_split
        );
    }
    Ok(())
}
