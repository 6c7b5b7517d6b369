//! Rotary position embeddings: cos/sin tables for the positions in use (grown on demand up to
//! the model's context),
//! with Llama 3, YaRN or linear frequency scaling or per-frequency factors (GGUF
//! `rope_freqs.weight`),
//! a second set for sliding-window layers with their own base (Gemma 3), applied
//! either interleaved (pairs `2i, 2i+1`, GGUF llama layout) or as HF "rotate half" (pairs
//! `i, i + d/2`), to the first `rope_dim` dimensions of each head (GLM-4.5 rotates half of
//! each head and passes the rest through, as llama.cpp's `n_rot`).

use std::f32::consts::PI;
use std::sync::{Arc, RwLock};

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::spec::{Llama3RopeScaling, ModelSpec, YarnScaling};

/// Positions the tables first hold, and the step they grow by at least.
const MIN_POSITIONS: usize = 1024;

/// Rotary tables for one model, made for the positions in use and grown (doubling, up to the
/// model's context) when a step reaches past them: a 128k-context model does not keep 64 MiB
/// of tables for the few thousand positions a request uses. Clones share the tables.
#[derive(Debug, Clone)]
pub struct Rope {
    angles: Arc<Angles>,
    max_positions: usize,
    interleaved: bool,
    tables: Arc<RwLock<Tables>>,
}

/// What the tables are made from.
#[derive(Debug)]
struct Angles {
    /// The (scaled) frequencies, one per rotated pair.
    freqs: Vec<f32>,
    /// `rope_attn_factor`, multiplied into both tables.
    attn_factor: Option<f32>,
    dtype: DType,
    device: Device,
}

/// `cos` and `sin` as `[positions, head_dim / 2]` tensors.
#[derive(Debug)]
struct Tables {
    positions: usize,
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// Rotary embeddings of the global layers: base `rope_theta`, Llama 3, YaRN or linear
    /// scaling.
    /// `freq_factors` (one per frequency) divide the base frequencies, as llama.cpp does with
    /// a GGUF `rope_freqs` tensor. Tables are in `dtype`.
    pub fn new(
        spec: &ModelSpec,
        freq_factors: Option<&[f32]>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut freqs = inverse_frequencies(spec.rope_dim, spec.rope_theta);
        if let Some(scaling) = &spec.rope_scaling {
            freqs = llama3_scale(&freqs, scaling);
        }
        if let Some(factor) = spec.rope_linear_factor {
            freqs.iter_mut().for_each(|f| *f /= factor);
        }
        let mut attn_factor = spec.rope_attn_factor;
        if let Some(yarn) = &spec.rope_yarn {
            freqs = yarn_scale(&freqs, yarn, spec.rope_theta);
            attn_factor = Some(attn_factor.unwrap_or(1.0) * yarn.magnitude);
        }
        // Divisors from the config (longrope) or from the file (`rope_freqs`, GGUF longrope).
        if let Some(factors) = spec.rope_freq_factors.as_deref().or(freq_factors) {
            if factors.len() != freqs.len() {
                return Err(ModelError::BadShape {
                    name: "rope_freqs.weight".into(),
                    actual: vec![factors.len()],
                    expected: vec![freqs.len()],
                });
            }
            for (f, factor) in freqs.iter_mut().zip(factors) {
                *f /= *factor;
            }
        }
        Self::with_freqs(spec, freqs, attn_factor, dtype, device)
    }

    /// The rotary embeddings of the sliding-window layers when their base differs (Gemma 3's
    /// `rope_local_base_freq`, unscaled); `None` when they share the global ones.
    pub fn local(spec: &ModelSpec, dtype: DType, device: &Device) -> Result<Option<Self>> {
        match spec.rope_local_theta {
            None => Ok(None),
            Some(theta) => {
                let freqs = inverse_frequencies(spec.rope_dim, theta);
                Self::with_freqs(spec, freqs, spec.rope_attn_factor, dtype, device).map(Some)
            }
        }
    }

    fn with_freqs(
        spec: &ModelSpec,
        freqs: Vec<f32>,
        attn_factor: Option<f32>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let angles = Angles {
            freqs,
            attn_factor,
            dtype,
            device: device.clone(),
        };
        let first = angles.tables(MIN_POSITIONS.min(spec.max_context))?;
        Ok(Self {
            angles: Arc::new(angles),
            max_positions: spec.max_context,
            interleaved: spec.rope_interleaved,
            tables: Arc::new(RwLock::new(first)),
        })
    }

    /// The tables' rows `pos..pos + seq`, growing the tables first when they end before
    /// `pos + seq`; positions past the model's context are refused.
    fn rows(&self, pos: usize, seq: usize) -> Result<(Tensor, Tensor)> {
        let end = pos + seq;
        if end > self.max_positions {
            return Err(ModelError::ContextOverflow {
                needed: end,
                max: self.max_positions,
            });
        }
        let narrow = |t: &Tables| -> Result<(Tensor, Tensor)> {
            Ok((t.cos.narrow(0, pos, seq)?, t.sin.narrow(0, pos, seq)?))
        };
        {
            let tables = self.tables.read().unwrap_or_else(|e| e.into_inner());
            if end <= tables.positions {
                return narrow(&tables);
            }
        }
        let mut tables = self.tables.write().unwrap_or_else(|e| e.into_inner());
        if end > tables.positions {
            let grown = (2 * tables.positions)
                .max(end.next_multiple_of(MIN_POSITIONS))
                .min(self.max_positions);
            *tables = self.angles.tables(grown)?;
        }
        narrow(&tables)
    }

    /// Positions the tables hold now.
    #[cfg(test)]
    fn positions(&self) -> usize {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .positions
    }

    /// Rotates `x` (`[batch, heads, seq, head_dim]`) whose first token sits at position `pos`:
    /// its first `rope_dim` dimensions, the others (if any) as they are.
    pub fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let (cos, sin) = self.rows(pos, x.dim(2)?)?;
        let head_dim = x.dim(3)?;
        let rotated = 2 * self.angles.freqs.len();
        if rotated < head_dim {
            let turned = self.rotate(&x.narrow(3, 0, rotated)?, &cos, &sin)?;
            let kept = x.narrow(3, rotated, head_dim - rotated)?;
            return Ok(Tensor::cat(&[&turned, &kept], 3)?);
        }
        self.rotate(x, &cos, &sin)
    }

    /// Every dimension of `x` rotated by the tables' rows `cos` and `sin`.
    fn rotate(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        let y = if self.interleaved {
            candle_nn::rotary_emb::rope_i(&x, cos, sin)?
        } else {
            candle_nn::rotary_emb::rope(&x, cos, sin)?
        };
        Ok(y)
    }
}

impl Angles {
    /// Tables for positions `0..positions`: one pass over the angles `p * f` (the values
    /// candle's `cos`/`sin` of an angle tensor give, without the tensor).
    fn tables(&self, positions: usize) -> Result<Tables> {
        let half = self.freqs.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            let p = p as f32;
            for f in self.freqs.iter() {
                let angle = p * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let mut cos = Tensor::from_vec(cos, (positions, half), &self.device)?;
        let mut sin = Tensor::from_vec(sin, (positions, half), &self.device)?;
        if let Some(a) = self.attn_factor {
            cos = (cos * a as f64)?;
            sin = (sin * a as f64)?;
        }
        Ok(Tables {
            positions,
            cos: cos.to_dtype(self.dtype)?,
            sin: sin.to_dtype(self.dtype)?,
        })
    }
}

/// `theta^(-2i/d)` for `i in 0..d/2`.
fn inverse_frequencies(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim)
        .step_by(2)
        .map(|i| 1.0 / theta.powf(i as f32 / head_dim as f32))
        .collect()
}

/// Llama 3 scaling: keep high frequencies, divide low ones by `factor`, blend in between.
fn llama3_scale(freqs: &[f32], s: &Llama3RopeScaling) -> Vec<f32> {
    let old_context = s.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_context / s.low_freq_factor;
    let high_freq_wavelen = old_context / s.high_freq_factor;
    freqs
        .iter()
        .map(|&freq| {
            let wavelen = 2.0 * PI / freq;
            if wavelen < high_freq_wavelen {
                freq
            } else if wavelen > low_freq_wavelen {
                freq / s.factor
            } else {
                let smooth = (old_context / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * freq / s.factor + smooth * freq
            }
        })
        .collect()
}

/// YaRN as ggml computes it (`rope_yarn`, ext_factor 1): the angle of pair `i` blends the
/// interpolated `theta / factor` and the original `theta` by a ramp that is 1 (keep) below
/// correction dimension `low` and 0 (interpolate) above `high`; the correction dimensions are
/// where a frequency turns `beta_fast` and `beta_slow` times over the original context.
/// Both angles are linear in the position, so the blend is a scaled frequency.
fn yarn_scale(freqs: &[f32], y: &YarnScaling, base: f32) -> Vec<f32> {
    let dims = 2 * freqs.len();
    let corr_dim = |rotations: f32| {
        dims as f32 * (y.original_context as f32 / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln())
    };
    let low = corr_dim(y.beta_fast).floor().max(0.0);
    let high = corr_dim(y.beta_slow).ceil().min(dims as f32 - 1.0);
    let scale = 1.0 / y.factor;
    freqs
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
            let interp = f * scale;
            interp * (1.0 - ramp) + f * ramp
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let freqs = inverse_frequencies(128, 500_000.0);
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let scaled = llama3_scale(&freqs, &s);
        assert_eq!(scaled[0], freqs[0]);
        let last = freqs.len() - 1;
        assert!((scaled[last] - freqs[last] / 8.0).abs() < 1e-12);
        assert!(scaled
            .iter()
            .zip(&freqs)
            .all(|(a, b)| a <= b && *a >= b / 8.0));
    }

    #[test]
    fn yarn_keeps_fast_frequencies_and_interpolates_slow_ones() {
        // gpt-oss's numbers: head_dim 64, base 150000, factor 32 over 4096 positions. The
        // correction dimensions are floor(8.09) = 8 and ceil(17.4) = 18.
        let y = YarnScaling {
            factor: 32.0,
            original_context: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            magnitude: 1.0 + 0.1 * 32f32.ln(),
        };
        let freqs = inverse_frequencies(64, 150_000.0);
        let scaled = yarn_scale(&freqs, &y, 150_000.0);
        for i in 0..=8 {
            assert_eq!(scaled[i], freqs[i], "pair {i} is kept");
        }
        for i in 18..32 {
            assert!(
                (scaled[i] - freqs[i] / 32.0).abs() <= 1e-6 * freqs[i],
                "pair {i}"
            );
        }
        for i in 9..18 {
            assert!(
                scaled[i] < freqs[i] && scaled[i] > freqs[i] / 32.0,
                "pair {i}"
            );
        }
    }

    #[test]
    fn position_zero_is_identity() {
        let json = r#"{"model_type":"llama","hidden_size":8,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,
            "max_position_embeddings":4,"rms_norm_eps":1e-5}"#;
        let mut spec = ModelSpec::from_hf_config(json).unwrap();
        for interleaved in [false, true] {
            spec.rope_interleaved = interleaved;
            let rope = Rope::new(&spec, None, DType::F32, &Device::Cpu).unwrap();
            let x = Tensor::arange(0f32, 16.0, &Device::Cpu)
                .unwrap()
                .reshape((1, 2, 2, 4))
                .unwrap();
            let y = rope.apply(&x, 0).unwrap();
            let first = |t: &Tensor| {
                t.narrow(2, 0, 1)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            assert_eq!(first(&x), first(&y));
            assert!(
                rope.apply(&x, 3).is_err(),
                "positions past the table are refused"
            );
        }
    }

    #[test]
    fn partial_rope_rotates_the_first_dims_as_a_narrower_head_and_keeps_the_rest() {
        let json = r#"{"model_type":"qwen2","hidden_size":64,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,
            "max_position_embeddings":64,"rms_norm_eps":1e-5}"#;
        let full = ModelSpec::from_hf_config(json).unwrap();
        let partial = ModelSpec {
            rope_dim: full.head_dim / 2,
            ..full.clone()
        };
        // The rotated half alone, as a head of that width with the same frequencies.
        let narrow = ModelSpec {
            head_dim: partial.rope_dim,
            rope_dim: partial.rope_dim,
            ..full.clone()
        };
        let x = Tensor::arange(0f32, (2 * 3 * full.head_dim) as f32, &Device::Cpu)
            .unwrap()
            .reshape((1, 2, 3, full.head_dim))
            .unwrap();
        let rope = |spec: &ModelSpec| Rope::new(spec, None, DType::F32, &Device::Cpu).unwrap();
        let y = rope(&partial).apply(&x, 5).unwrap();
        let half = partial.rope_dim;
        let rotated = rope(&narrow)
            .apply(&x.narrow(3, 0, half).unwrap(), 5)
            .unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&y.narrow(3, 0, half).unwrap()), flat(&rotated));
        let rest = full.head_dim - half;
        assert_eq!(
            flat(&y.narrow(3, half, rest).unwrap()),
            flat(&x.narrow(3, half, rest).unwrap())
        );
        assert_ne!(
            flat(&y),
            flat(&rope(&full).apply(&x, 5).unwrap()),
            "a full rotation differs"
        );
    }

    #[test]
    fn tables_are_candles_cos_and_sin_of_the_angles_bit_for_bit() {
        let json = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,
            "max_position_embeddings":3000,"rms_norm_eps":1e-5,"rope_theta":100000.0}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        let rope = Rope::new(&spec, None, DType::F32, &Device::Cpu).unwrap();
        // The tensor ops the tables were first made with.
        let freqs = inverse_frequencies(spec.head_dim, spec.rope_theta);
        let angles: Vec<f32> = (0..spec.max_context)
            .flat_map(|p| freqs.iter().map(move |f| p as f32 * f))
            .collect();
        let angles =
            Tensor::from_vec(angles, (spec.max_context, freqs.len()), &Device::Cpu).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        // A step at the last position grows the tables to the whole context.
        let x = Tensor::zeros((1, 1, 1, spec.head_dim), DType::F32, &Device::Cpu).unwrap();
        rope.apply(&x, spec.max_context - 1).unwrap();
        assert_eq!(rope.positions(), spec.max_context);
        let (cos, sin) = rope.rows(0, spec.max_context).unwrap();
        assert_eq!(bits(&cos), bits(&angles.cos().unwrap()));
        assert_eq!(bits(&sin), bits(&angles.sin().unwrap()));
    }

    #[test]
    fn tables_start_small_and_grown_ones_equal_ones_made_at_once() {
        let json = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4,
            "max_position_embeddings":131072,"rms_norm_eps":1e-5}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        let rope = Rope::new(&spec, None, DType::F32, &Device::Cpu).unwrap();
        let copy = rope.clone();
        assert_eq!(rope.positions(), MIN_POSITIONS);
        let x = Tensor::arange(0f32, 2.0 * 3.0 * 32.0, &Device::Cpu)
            .unwrap()
            .reshape((1, 2, 3, 32))
            .unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        let before = bits(&rope.apply(&x, 1000).unwrap());
        // 5000 + 3 positions: doubling (2048) is not enough; the need in whole steps (5120).
        let far = bits(&rope.apply(&x, 5000).unwrap());
        assert_eq!(rope.positions(), 5120);
        assert_eq!(copy.positions(), 5120, "clones share the tables");
        assert_eq!(bits(&rope.apply(&x, 1000).unwrap()), before);
        let at_once = Rope {
            tables: Arc::new(RwLock::new(rope.angles.tables(5120).unwrap())),
            ..rope.clone()
        };
        assert_eq!(bits(&at_once.apply(&x, 5000).unwrap()), far);
        assert!(rope.apply(&x, 131070).is_err());
        assert_eq!(
            rope.positions(),
            5120,
            "a refused step does not grow the tables"
        );
    }
}
