//! The tiled CPU attention against candle's matmul attention on random inputs, with keys and
//! values in a real key/value cache (read in place through its narrowed views).

use candle_core::{DType, Device, Tensor};

use super::Isa;
use super::*;
use crate::decoder::attention::{
    causal_mask, matmul_attention, tiled_attention, AttentionDims, Queries,
};
use crate::kv_cache::{KvCache, KvShape};
use crate::kv_format::KvFormat;

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
    /// A block-format cache instead of the dense `cache` dtype.
    blocks: Option<KvFormat>,
    /// Spread of the inputs (larger: peakier softmax).
    amp: f32,
    /// Random attention sinks, one per query head.
    sinks: bool,
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
    blocks: None,
    amp: 1.0,
    sinks: false,
};

impl Case {
    /// One decode step (a single query row) after `pos` cached positions, the rest as [`BASE`].
    fn decode(heads: usize, kv_heads: usize, dim: usize, pos: usize, cache: DType) -> Case {
        Case {
            heads,
            kv_heads,
            dim,
            pos,
            seq: 1,
            cache,
            ..BASE
        }
    }

    /// The cache's format.
    fn format(&self) -> KvFormat {
        self.blocks.unwrap_or(KvFormat::Dense(self.cache))
    }
}

/// The case's dimensions for candle's attention paths.
fn dims_of(c: &Case) -> AttentionDims {
    AttentionDims {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.dim,
        value_dim: c.dim,
        scale: 1.0 / (c.dim as f64).sqrt(),
        softcap: c.softcap,
        sliding: c.window.is_some(),
    }
}

/// Fills a cache with `pos` earlier positions and then the case's new ones, and returns the
/// largest difference between the two attention paths on the new queries.
fn max_difference(c: Case) -> f32 {
    let dev = Device::Cpu;
    let dims = dims_of(&c);
    let shape = KvShape::gqa(c.kv_heads, c.dim);
    let mut cache = KvCache::new(1, shape, c.pos + c.seq + 7, c.format(), &dev);
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

    let sinks = sinks_of(&c);
    let queries = Queries {
        pos: c.pos,
        window: c.window,
        sinks: sinks.as_deref(),
    };
    let tiled = tiled_attention(&q, &k, &v, c.format(), dims, queries).unwrap();
    // The reference reads the cache's values up to f32 first, so both see the same numbers.
    let (k32, v32) = (
        c.format().decode(&k, c.dim).unwrap(),
        c.format().decode(&v, c.dim).unwrap(),
    );
    let mask = causal_mask(c.seq, c.pos, c.window, &dev).unwrap();
    let reference =
        matmul_attention(&q, &k32, &v32, mask.as_ref(), dims, sinks.as_deref()).unwrap();
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
fn attention_sinks_match_in_prefill_decode_and_windows() {
    for (pos, seq, window) in [
        (0, 70, None),
        (40, 1, None),
        (300, 1, Some(128)),
        (5, 33, Some(4)),
    ] {
        assert_close(Case {
            pos,
            seq,
            window,
            sinks: true,
            ..BASE
        });
    }
    for (pos, seq, ranges) in [(0, 40, None), (299, 1, Some(7)), (1000, 1, None)] {
        assert_isas_close(
            Case {
                pos,
                seq,
                heads: 8,
                kv_heads: 2,
                dim: 32,
                sinks: true,
                ..BASE
            },
            ranges,
        );
    }
}

#[test]
fn attention_sinks_take_probability_away() {
    // A sink far above every score takes (almost) all the probability: the output goes to 0.
    let c = Case { seq: 3, ..BASE };
    let cache = Cache::new(&c);
    let q = random(c.heads * c.seq * c.dim, 13, c.amp);
    let plain = reference(&c, &q, &cache, None);
    let sunk = reference(&c, &q, &cache, Some(&[60.0; 4]));
    assert!(plain.iter().any(|x| x.abs() > 1e-2));
    assert!(sunk.iter().all(|x| x.abs() < 1e-12), "{sunk:?}");
    let (k, v) = cache.heads();
    let sinks = [60.0f32; 4];
    let mut out = vec![f32::NAN; q.len()];
    attend(&q, k, v, &shape_of(&c, Some(&sinks)), &mut out).unwrap();
    assert!(out.iter().all(|x| x.abs() < 1e-12), "{out:?}");
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
fn block_caches_are_decoded_tile_by_tile() {
    // Through a real cache (the blocks written by `LayerKv::write`) against the matmul path on
    // the decoded values: prefill, decode and a chunk after cached positions, with a window.
    for blocks in [KvFormat::Q8_0, KvFormat::Q4_0] {
        for (pos, seq, window) in [(0, 17, None), (300, 1, None), (130, 33, Some(40))] {
            assert_close(Case {
                dim: 32,
                blocks: Some(blocks),
                pos,
                seq,
                window,
                ..BASE
            });
        }
    }
}

#[test]
fn block_caches_match_on_every_instruction_set_and_key_range_split() {
    for blocks in [KvFormat::Q8_0, KvFormat::Q4_0] {
        let c = Case {
            heads: 8,
            kv_heads: 2,
            dim: 64,
            blocks: Some(blocks),
            ..BASE
        };
        for (pos, seq) in [(0, 40), (9, 1), (500, 1)] {
            assert_isas_close(Case { pos, seq, ..c }, None);
        }
        assert_isas_close(
            Case {
                pos: 299,
                seq: 1,
                ..c
            },
            Some(7),
        );
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
        sinks: None,
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

/// Keys and values of every key/value head in the cache's layout (`head_stride` apart, with
/// room past the used rows) in `dtype`, and the same numbers as f32 `[1, kv_heads, len, dim]`
/// tensors for the reference.
struct Cache {
    k: Stored,
    v: Stored,
    stride: usize,
    k32: Tensor,
    v32: Tensor,
}

enum Stored {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
    Q8_0(Vec<u8>),
    Q4_0(Vec<u8>),
}

impl Stored {
    fn new(values: &[f32], format: KvFormat) -> (Self, Vec<f32>) {
        let dtype = match format {
            KvFormat::Dense(dtype) => dtype,
            blocks => {
                let t = Tensor::from_vec(values.to_vec(), (1, 1, 1, values.len()), &Device::Cpu);
                let stored = blocks.encode(&t.unwrap()).unwrap();
                let back = blocks.decode(&stored, values.len()).unwrap();
                let back = back.flatten_all().unwrap().to_vec1().unwrap();
                let bytes = stored.flatten_all().unwrap().to_vec1::<u8>().unwrap();
                return match blocks {
                    KvFormat::Q8_0 => (Stored::Q8_0(bytes), back),
                    _ => (Stored::Q4_0(bytes), back),
                };
            }
        };
        match dtype {
            DType::F16 => {
                let h: Vec<_> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
                let back = h.iter().map(|x| x.to_f32()).collect();
                (Stored::F16(h), back)
            }
            DType::BF16 => {
                let h: Vec<_> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
                let back = h.iter().map(|x| x.to_f32()).collect();
                (Stored::BF16(h), back)
            }
            _ => (Stored::F32(values.to_vec()), values.to_vec()),
        }
    }

    fn data(&self) -> KvData<'_> {
        match self {
            Stored::F32(s) => KvData::F32(s),
            Stored::F16(s) => KvData::F16(s),
            Stored::BF16(s) => KvData::BF16(s),
            Stored::Q8_0(b) => KvData::Q8_0(b),
            Stored::Q4_0(b) => KvData::Q4_0(b),
        }
    }
}

impl Cache {
    fn new(c: &Case) -> Self {
        let len = c.pos + c.seq;
        let stride = (len + 5) * c.dim;
        let store = |seed: u64| {
            let mut all = random(c.kv_heads * stride, seed, c.amp);
            // Past the used rows: values that would show if read.
            for h in 0..c.kv_heads {
                all[h * stride + len * c.dim..(h + 1) * stride].fill(1e4);
            }
            let (stored, back) = Stored::new(&all, c.format());
            let used: Vec<f32> = (0..c.kv_heads)
                .flat_map(|h| back[h * stride..h * stride + len * c.dim].to_vec())
                .collect();
            let t = Tensor::from_vec(used, (1, c.kv_heads, len, c.dim), &Device::Cpu).unwrap();
            (stored, t)
        };
        let ((k, k32), (v, v32)) = (store(11), store(12));
        Self {
            k,
            v,
            stride,
            k32,
            v32,
        }
    }

    fn heads(&self) -> (KvHeads<'_>, KvHeads<'_>) {
        let stride = self.stride;
        (
            KvHeads {
                data: self.k.data(),
                head_stride: stride,
            },
            KvHeads {
                data: self.v.data(),
                head_stride: stride,
            },
        )
    }
}

/// The case's sinks (random logits around 0, some above the scores), if it has them.
fn sinks_of(c: &Case) -> Option<Vec<f32>> {
    c.sinks.then(|| random(c.heads, 6, 4.0))
}

fn shape_of<'a>(c: &Case, sinks: Option<&'a [f32]>) -> Shape<'a> {
    Shape {
        n_heads: c.heads,
        n_kv_heads: c.kv_heads,
        head_dim: c.dim,
        seq: c.seq,
        pos: c.pos,
        scale: 1.0 / (c.dim as f32).sqrt(),
        softcap: c.softcap,
        window: c.window,
        sinks,
    }
}

/// candle's plain `softmax(q k^T * scale) v` (the matmul path) on the cache's numbers, as
/// `[heads, seq, dim]`.
fn reference(c: &Case, q: &[f32], cache: &Cache, sinks: Option<&[f32]>) -> Vec<f32> {
    let dims = dims_of(c);
    let dev = Device::Cpu;
    let qt = Tensor::from_vec(q.to_vec(), (1, c.heads, c.seq, c.dim), &dev).unwrap();
    let mask = causal_mask(c.seq, c.pos, c.window, &dev).unwrap();
    let y = matmul_attention(&qt, &cache.k32, &cache.v32, mask.as_ref(), dims, sinks).unwrap();
    y.reshape((c.seq, c.heads, c.dim))
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn max_abs_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The largest difference between candle's reference and each instruction set this CPU runs
/// (the baseline always; AVX2 and AVX-512 where present), and between each and the baseline;
/// with the decode split into `ranges` key ranges when given.
fn isa_differences(c: Case, ranges: Option<usize>) -> Vec<(Isa, f32, f32)> {
    let cache = Cache::new(&c);
    let (k, v) = cache.heads();
    let q = random(c.heads * c.seq * c.dim, 13, c.amp);
    let sinks = sinks_of(&c);
    let s = shape_of(&c, sinks.as_deref());
    let expected = reference(&c, &q, &cache, sinks.as_deref());
    let run = |isa: Isa| {
        let mut out = vec![f32::NAN; q.len()];
        match ranges {
            Some(r) => {
                let call = Call {
                    q: &q,
                    k: &k,
                    v: &v,
                    s: &s,
                };
                super::decode::run_split(isa, r, r % 2 == 0, call, &mut out)
            }
            None => attend_with(isa, &q, k, v, &s, &mut out).unwrap(),
        }
        out
    };
    let baseline = run(Isa::Baseline);
    Isa::available()
        .into_iter()
        .map(|isa| {
            let out = run(isa);
            let vs_reference = max_abs_difference(&out, &expected);
            (isa, vs_reference, max_abs_difference(&out, &baseline))
        })
        .collect()
}

/// Every instruction set within `2e-5 * max(amp, 1)` (f32 rounding of sums of a few hundred
/// terms) of candle's reference and of the baseline.
fn assert_isas_close(c: Case, ranges: Option<usize>) {
    let tolerance = 2e-5 * c.amp.max(1.0);
    let results = isa_differences(c, ranges);
    for (isa, vs_reference, vs_baseline) in &results {
        assert!(
            *vs_reference < tolerance && *vs_baseline < tolerance,
            "{isa:?} {c:?} ranges {ranges:?}: {vs_reference} from the reference, \
             {vs_baseline} from the baseline"
        );
    }
}

#[test]
fn every_instruction_set_this_cpu_runs_is_tested() {
    // Says which paths the other tests compare here (a CPU without AVX-512 or AVX2 skips
    // those: they are not available, so the loops below cover only what runs).
    let available = Isa::available();
    eprintln!("CPU attention paths tested on this CPU: {available:?}");
    assert_eq!(available.last(), Some(&Isa::Baseline));
    assert_eq!(Isa::detect(), available[0]);
}

#[test]
fn the_kernel_choice_holds_attention_to_its_instruction_sets() {
    use crate::cpu_qmatmul::Kernel;
    let available = Isa::available();
    assert_eq!(Isa::for_kernel(Kernel::Auto), available[0]);
    assert_eq!(Isa::for_kernel(Kernel::Avx512), available[0]);
    assert_eq!(Isa::for_kernel(Kernel::Scalar), Isa::Baseline);
    // The AVX2-only path: AVX2 where the CPU has it, never AVX-512.
    let without_avx512 = available[available.len().saturating_sub(2)];
    for kernel in [Kernel::AvxVnni, Kernel::Avx2] {
        let isa = Isa::for_kernel(kernel);
        assert_eq!(isa, without_avx512, "{kernel:?}");
        #[cfg(target_arch = "x86_64")]
        assert_ne!(isa, Isa::Avx512, "{kernel:?}");
    }
}

#[test]
fn decode_at_many_context_lengths_matches_on_every_instruction_set() {
    let (heads, kv_heads, dim) = (9, 3, 64);
    for pos in [0, 1, 15, 16, 63, 127, 128, 129, 300, 1000, 2100] {
        assert_isas_close(Case::decode(heads, kv_heads, dim, pos, DType::F32), None);
    }
}

#[test]
fn decode_split_into_key_ranges_matches_with_a_partial_last_range() {
    for (pos, ranges) in [(9, 2), (100, 3), (299, 7), (500, 4), (999, 16), (40, 41)] {
        for cache in [DType::F32, DType::F16, DType::BF16] {
            assert_isas_close(Case::decode(8, 2, 32, pos, cache), Some(ranges));
        }
    }
}

#[test]
fn decode_of_odd_dims_and_wide_groups_matches_on_every_instruction_set() {
    // Groups past the kernels' four rows per pass, and widths with a scalar tail.
    for (heads, kv_heads, dim) in [(7, 1, 64), (12, 2, 80), (6, 3, 33), (5, 5, 7), (16, 2, 128)] {
        assert_isas_close(Case::decode(heads, kv_heads, dim, 260, DType::F32), Some(3));
    }
}

#[test]
fn decode_windows_soft_cap_and_half_caches_match_on_every_instruction_set() {
    for window in [1, 5, 100, 700] {
        assert_isas_close(
            Case {
                pos: 600,
                seq: 1,
                window: Some(window),
                ..BASE
            },
            Some(5),
        );
    }
    assert_isas_close(
        Case {
            pos: 400,
            seq: 1,
            softcap: Some(5.0),
            amp: 3.0,
            ..BASE
        },
        Some(3),
    );
    for cache in [DType::F16, DType::BF16] {
        assert_isas_close(Case::decode(9, 3, 64, 777, cache), None);
    }
}

#[test]
fn prefill_matches_on_every_instruction_set() {
    for (heads, kv_heads, dim, pos, seq) in
        [(9, 3, 64, 0, 100), (8, 2, 33, 7, 40), (4, 1, 16, 0, 17)]
    {
        for cache in [DType::F32, DType::F16, DType::BF16] {
            assert_isas_close(
                Case {
                    heads,
                    kv_heads,
                    dim,
                    pos,
                    seq,
                    cache,
                    ..BASE
                },
                None,
            );
        }
    }
    assert_isas_close(
        Case {
            seq: 90,
            window: Some(20),
            softcap: Some(30.0),
            amp: 2.0,
            ..BASE
        },
        None,
    );
}

#[test]
fn the_vector_exponentials_are_within_one_ulp_and_zero_below_the_range() {
    // Every 1/4096 from 0 down to -87, then past the clamp: the relative error against f64's
    // exp stays under 1.2e-7 (1 ulp at 1; measured 8.0e-8 on AVX-512 and AVX2); below -87 (and
    // at -inf) the weight is exactly 0.
    let mut xs: Vec<f32> = (0..87 * 4096).map(|i| -(i as f32) / 4096.0).collect();
    let in_range = xs.len();
    xs.extend([-87.001, -88.0, -100.0, -1e30, f32::MIN, f32::NEG_INFINITY]);
    xs.resize(xs.len().div_ceil(16) * 16, f32::NEG_INFINITY);
    for isa in Isa::available() {
        let Some(ys) = super::lanes::exp_neg_with(isa, &xs) else {
            continue;
        };
        let mut worst = 0f64;
        for (&x, &y) in xs[..in_range].iter().zip(&ys) {
            let exact = f64::from(x).exp();
            worst = worst.max((f64::from(y) - exact).abs() / exact);
        }
        eprintln!("{isa:?} vector exp: max relative error {worst:.3e} on [-87, 0]");
        assert!(worst < 1.2e-7, "{isa:?}: relative error {worst}");
        assert_eq!(ys[0], 1.0, "{isa:?}: exp(0)");
        assert!(ys[in_range..].iter().all(|&y| y == 0.0), "{isa:?}: {ys:?}");
    }
}

#[test]
fn long_prefill_chunks_wide_groups_and_window_edges_match_on_every_instruction_set() {
    // Chunks after a prefix of several key tiles, groups wider than one register block (the
    // blocked kernels take up to 4 row vectors at once), a partial last query tile, and
    // windows whose edge falls inside a key tile.
    for (heads, kv_heads, dim, pos, seq, window, cache) in [
        (9, 3, 64, 200, 70, None, DType::F16),
        (16, 2, 32, 130, 33, None, DType::F32),
        (6, 1, 20, 64, 64, None, DType::BF16),
        (9, 3, 64, 150, 50, Some(100), DType::F16),
        (4, 2, 16, 0, 260, Some(77), DType::F32),
    ] {
        assert_isas_close(
            Case {
                heads,
                kv_heads,
                dim,
                pos,
                seq,
                window,
                cache,
                ..BASE
            },
            None,
        );
    }
}

#[test]
fn decode_key_blocks_their_tails_and_odd_widths_match_on_every_instruction_set() {
    // The SIMD dot products take keys a register's lanes at a time (8 or 16) and fold them into
    // one score per lane, then the keys past the last whole block one by one, and the columns
    // past the last whole vector one by one: widths of whole vectors (64, 128), with a column
    // tail (40, 33) and narrower than one vector (7); groups of 1, 3, 4 and 5 query heads (past
    // the four rows of one pass); ranges whose key counts end on, just past and just before a
    // block; each cache dtype widened into the blocks.
    for (heads, kv_heads) in [(3, 3), (9, 3), (8, 2), (10, 2)] {
        for dim in [64, 128, 40, 33, 7] {
            for (pos, ranges) in [(15, 1), (16, 1), (46, 2), (142, 1), (300, 3)] {
                for cache in [DType::F32, DType::F16, DType::BF16] {
                    assert_isas_close(Case::decode(heads, kv_heads, dim, pos, cache), Some(ranges));
                }
            }
        }
    }
}

#[test]
fn decode_with_the_soft_cap_and_peaky_scores_matches_on_every_instruction_set() {
    // The vector softmax's two paths (scale fused with the maximum; soft cap first) on scores
    // whose maximum moves from tile to tile.
    for softcap in [None, Some(20.0)] {
        assert_isas_close(
            Case {
                heads: 9,
                kv_heads: 3,
                dim: 64,
                pos: 700,
                seq: 1,
                amp: 4.0,
                softcap,
                cache: DType::F16,
                ..BASE
            },
            Some(2),
        );
    }
}
