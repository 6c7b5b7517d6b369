//! The math of a Gated DeltaNet layer (Qwen3.5's linear attention), on one sequence's rows,
//! from candle ops (the same on the CPU and CUDA): the short causal convolution that carries
//! `taps - 1` inputs over from the previous step ([`short_conv`]), the L2 norm of queries and
//! keys ([`l2_norm`]), the decay's softplus ([`softplus`]), and the gated delta rule itself
//! ([`delta_rule`]) in its recurrent form: one token after another, for prefill chunks as for
//! decode (a chunked form would batch a prefill's tokens; this one is the slow path there).
//!
//! Per value head, with the state `S` (`head_v_dim x head_k_dim`), a token's decay `g` (a log,
//! at most 0), strength `beta`, L2-normed key `k` and query `q`, and value `v`:
//! `S <- exp(g) S`, `S <- S + beta (v - S k) k^T`, output `S q / sqrt(head_k_dim)`.
//!
//! Facts (not code) from llama.cpp's `delta-net-base.cpp`, `qwen35.cpp` and ggml's
//! `gated_delta_net` and `ssm_conv` operators.

use candle_core::{DType, Tensor, D};

use super::error::Result;

/// The causal depthwise convolution of `x` (`[tokens, channels]`) after the `window` of
/// earlier inputs (`[taps - 1, channels]`) with `weight` (`[channels, taps]`, the oldest
/// input's tap first): returns the output (`[tokens, channels]`) and the new window (the last
/// `taps - 1` inputs).
pub fn short_conv(x: &Tensor, window: &Tensor, weight: &Tensor) -> Result<(Tensor, Tensor)> {
    let tokens = x.dim(0)?;
    let held = window.dim(0)?;
    let taps = weight.dim(1)?;
    let all = Tensor::cat(&[window, x], 0)?;
    let mut out: Option<Tensor> = None;
    for tap in 0..taps {
        let w = weight.narrow(1, tap, 1)?.t()?;
        let term = all.narrow(0, tap, tokens)?.broadcast_mul(&w)?;
        out = Some(match out {
            None => term,
            Some(sum) => (sum + term)?,
        });
    }
    let out = out.ok_or_else(|| candle_core::Error::Msg("a convolution of no taps".into()))?;
    let next = all.narrow(0, tokens, held)?.contiguous()?;
    Ok((out, next))
}

/// `x / sqrt(sum(x^2) + eps)` over the last dimension (llama.cpp's L2 norm of DeltaNet queries
/// and keys).
pub fn l2_norm(x: &Tensor, eps: f64) -> Result<Tensor> {
    let norm = (x.sqr()?.sum_keepdim(D::Minus1)? + eps)?.sqrt()?;
    Ok(x.broadcast_div(&norm)?)
}

/// `ln(1 + e^x)`, as `max(x, 0) + ln(1 + e^-|x|)` (no overflow for large `x`).
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    let tail = ((x.abs()?.neg()?.exp()? + 1.0)?).log()?;
    Ok((x.relu()? + tail)?)
}

/// The gated delta rule over `tokens` in order: `q` and `k` `[tokens, heads, head_k_dim]`
/// (L2-normed, one per value head), `v` `[tokens, heads, head_v_dim]`, the log decay `g` and
/// the strength `beta` `[tokens, heads]`, from `state` `[heads, head_v_dim, head_k_dim]` (all
/// f32). Returns each token's output `[tokens, heads, head_v_dim]` (scaled by `scale`) and the
/// state after the last token.
pub fn delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let (tokens, heads, _) = q.dims3()?;
    let decay = g.exp()?;
    let mut s = state.to_dtype(DType::F32)?;
    let mut outputs = Vec::with_capacity(tokens);
    for t in 0..tokens {
        let at = |x: &Tensor| -> Result<Tensor> { Ok(x.narrow(0, t, 1)?.squeeze(0)?) };
        let (qt, kt, vt) = (at(q)?, at(k)?, at(v)?);
        let per_head = |x: &Tensor| -> Result<Tensor> { Ok(at(x)?.reshape((heads, 1, 1))?) };
        s = s.broadcast_mul(&per_head(&decay)?)?;
        let column = kt.unsqueeze(2)?;
        let predicted = s.matmul(&column)?;
        let delta = (vt.unsqueeze(2)? - predicted)?.broadcast_mul(&per_head(beta)?)?;
        s = (s + delta.matmul(&kt.unsqueeze(1)?)?)?;
        outputs.push((s.matmul(&qt.unsqueeze(2)?)?.squeeze(2)? * scale)?);
    }
    Ok((Tensor::stack(&outputs, 0)?, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(data: &[f32], dims: &[usize]) -> Tensor {
        Tensor::from_slice(data, dims, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_convolution_carries_its_window_across_calls() {
        // Two channels, three taps; the oldest input's tap first.
        let weight = t(&[1.0, 10.0, 100.0, 2.0, 20.0, 200.0], &[2, 3]);
        let x: Vec<f32> = (1..=10).map(|i| i as f32).collect();
        let x = t(&x, &[5, 2]);
        let empty = Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
        let (whole, _) = short_conv(&x, &empty, &weight).unwrap();
        let (first, window) = short_conv(&x.narrow(0, 0, 2).unwrap(), &empty, &weight).unwrap();
        let (rest, _) = short_conv(&x.narrow(0, 2, 3).unwrap(), &window, &weight).unwrap();
        let split = Tensor::cat(&[first, rest], 0).unwrap();
        let (a, b) = (
            whole.to_vec2::<f32>().unwrap(),
            split.to_vec2::<f32>().unwrap(),
        );
        assert_eq!(a, b);
        // Row 2, channel 0: inputs 1, 3, 5 at taps 1, 10, 100.
        assert_eq!(a[2][0], 1.0 + 30.0 + 500.0);
    }

    #[test]
    fn the_delta_rule_writes_a_value_under_its_key_and_decays() {
        // One head of width 2: beta 1 and no decay store v under k exactly.
        let k = t(&[1.0, 0.0], &[1, 1, 2]);
        let v = t(&[3.0, 4.0], &[1, 1, 2]);
        let zero = Tensor::zeros((1, 2, 2), DType::F32, &Device::Cpu).unwrap();
        let (out, s) = delta_rule(
            &k,
            &k,
            &v,
            &t(&[0.0], &[1, 1]),
            &t(&[1.0], &[1, 1]),
            &zero,
            1.0,
        )
        .unwrap();
        assert_eq!(
            out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [3.0, 4.0]
        );
        // A decay of ln(0.5) halves the state before the next write, beta 0 writes nothing.
        let (out, _) = delta_rule(
            &k,
            &k,
            &v,
            &t(&[0.5f32.ln()], &[1, 1]),
            &t(&[0.0], &[1, 1]),
            &s,
            1.0,
        )
        .unwrap();
        let got = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!((got[0] - 1.5).abs() < 1e-6 && (got[1] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn softplus_and_l2_norm_match_their_formulas() {
        let x = t(&[-30.0, -1.0, 0.0, 2.0, 40.0], &[5]);
        let y = softplus(&x).unwrap().to_vec1::<f32>().unwrap();
        for (x, y) in [-30.0f32, -1.0, 0.0, 2.0, 40.0].iter().zip(y) {
            assert!((y - (1.0 + x.exp()).ln()).abs() < 1e-5, "{x}: {y}");
        }
        let n = l2_norm(&t(&[3.0, 4.0], &[1, 2]), 0.0).unwrap();
        assert_eq!(n.to_vec2::<f32>().unwrap(), [[0.6, 0.8]]);
    }
}
