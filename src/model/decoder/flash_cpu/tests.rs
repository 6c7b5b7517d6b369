//! The tiled CPU attention against candle's matmul attention on random inputs, with keys and
//! values in a real key/value cache (read in place through its narrowed views).

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::model::decoder::attention::{
    causal_mask, matmul_attention, tiled_attention, AttentionDims,
};
use crate::model::kv_cache::{KvCache, KvShape};

/// Deterministic values in about `[-amp, amp)`.
fn random(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    heads: usize,
    kv_heads: usize,
    dim: usize,
    /// Positions already in the cache.
    pos: usize,
    /// New query rows.
    seq: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    cache: DType,
    /// Spread of the inputs (larger: peakier softmax).
    amp: f32,
}

const BASE: Case = Case {
    heads: 4,
    kv_heads: 2,
    dim: 16,
    pos: 0,
    seq: 17,
    window: None,
    softcap: None,
    cache: DType::F32,
    amp: 1.0,
};

/// Fills a cache with `pos` earlier positions and then the case's new ones, and returns the
/// largest difference between the two attention paths on the new queries.
fn max_difference(c: Case) -> f32 {
    let dev = Device::Cpu;
    let dims = AttentionDims {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.dim,
        scale: 1.0 / (c.dim as f64).sqrt(),
        softcap: c.softcap,
        sliding: c.window.is_some(),
    };
    let shape = KvShape {
        n_kv_heads: c.kv_heads,
        head_dim: c.dim,
    };
    let mut cache = KvCache::new(1, shape, c.pos + c.seq + 7, c.cache, &dev);
    let kv = cache.layer_mut(0).unwrap();
    let tensor = |len: usize, heads: usize, seed: u64| {
        let data = random(heads * len * c.dim, seed, c.amp);
        Tensor::from_vec(data, (1, heads, len, c.dim), &dev).unwrap()
    };
    if c.pos > 0 {
        kv.write(
            0,
            &tensor(c.pos, c.kv_heads, 1),
            &tensor(c.pos, c.kv_heads, 2),
        )
        .unwrap();
    }
    let (k, v) = kv
        .write(
            c.pos,
            &tensor(c.seq, c.kv_heads, 3),
            &tensor(c.seq, c.kv_heads, 4),
        )
        .unwrap();
    let q = tensor(c.seq, c.heads, 5);

    let tiled = tiled_attention(&q, &k, &v, c.pos, c.window, dims).unwrap();
    // The reference reads the cache's values up to f32 first, so both see the same numbers.
    let (k32, v32) = (
        k.to_dtype(DType::F32).unwrap(),
        v.to_dtype(DType::F32).unwrap(),
    );
    let mask = causal_mask(c.seq, c.pos, c.window, &dev).unwrap();
    let reference = matmul_attention(&q, &k32, &v32, mask.as_ref(), dims).unwrap();
    assert_eq!(tiled.dims(), &[1, c.seq, c.heads * c.dim]);
    assert_eq!(tiled.dims(), reference.dims());
    let diff = (tiled - reference).unwrap().abs().unwrap();
    diff.flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn assert_close(c: Case) {
    let d = max_difference(c);
    assert!(d < 2e-5 * c.amp.max(1.0), "{c:?}: max difference {d}");
}

#[test]
fn prefill_of_several_lengths_matches_the_matmul_path() {
    for seq in [1, 2, 15, 16, 17, 63, 64, 65, 300] {
        assert_close(Case { seq, ..BASE });
    }
}

#[test]
fn decode_and_chunks_after_a_cached_prefix_match() {
    for (pos, seq) in [(1, 1), (40, 1), (300, 1), (5, 17), (130, 33)] {
        assert_close(Case { pos, seq, ..BASE });
    }
}

#[test]
fn odd_head_dims_and_grouped_query_ratios_match() {
    for (heads, kv_heads, dim) in [(3, 3, 7), (6, 2, 33), (8, 1, 5), (9, 3, 64), (4, 4, 80)] {
        assert_close(Case {
            heads,
            kv_heads,
            dim,
            seq: 37,
            pos: 11,
            ..BASE
        });
    }
}

#[test]
fn sliding_windows_match() {
    for (pos, seq, window) in [
        (0, 300, 5),
        (0, 70, 64),
        (200, 1, 100),
        (20, 17, 1),
        (3, 40, 200),
    ] {
        assert_close(Case {
            pos,
            seq,
            window: Some(window),
            ..BASE
        });
    }
}

#[test]
fn the_soft_cap_matches() {
    for softcap in [5.0, 50.0] {
        assert_close(Case {
            softcap: Some(softcap),
            amp: 3.0,
            seq: 70,
            ..BASE
        });
    }
}

#[test]
fn peaky_scores_stay_exact_through_the_running_maximum() {
    assert_close(Case {
        amp: 4.0,
        seq: 150,
        dim: 32,
        ..BASE
    });
}

#[test]
fn half_precision_caches_are_read_up_to_f32() {
    for cache in [DType::F16, DType::BF16] {
        for (pos, seq) in [(0, 17), (100, 1), (0, 130)] {
            assert_close(Case {
                cache,
                pos,
                seq,
                ..BASE
            });
        }
    }
}

#[test]
fn the_exponential_is_close_to_the_library_one() {
    for i in 0..2000 {
        let x = -(i as f32) * 0.05;
        let (ours, lib) = (exp_neg(x), x.exp());
        assert!(
            (ours - lib).abs() <= lib * 4e-7 + 1e-37,
            "exp({x}): {ours} vs {lib}"
        );
    }
    assert_eq!(exp_neg(0.0), 1.0);
}

#[test]
fn inconsistent_shapes_are_refused() {
    let shape = Shape {
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 4,
        seq: 1,
        pos: 0,
        scale: 1.0,
        softcap: None,
        window: None,
    };
    let kv = [0f32; 8];
    let heads = KvHeads {
        data: KvData::F32(&kv),
        head_stride: 4,
    };
    let mut out = [0f32; 12];
    let err = attend(&[0.0; 12], heads, heads, &shape, &mut out).unwrap_err();
    assert!(err.to_string().contains("cannot share"), "{err}");
    let shape = Shape {
        n_heads: 2,
        seq: 2,
        ..shape
    };
    let mut out = [0f32; 16];
    let err = attend(&[0.0; 16], heads, heads, &shape, &mut out).unwrap_err();
    assert!(err.to_string().contains("storage"), "{err}");
}
