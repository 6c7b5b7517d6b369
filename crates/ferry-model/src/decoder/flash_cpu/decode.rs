//! The decode schedule of [`super::attend`] (one query row per head), flash-decoding style:
//! the visible keys are cut into ranges and each task takes one key/value head and one range
//! with every query head of the group, so each key and value row is read once per step and a
//! few heads still keep every thread busy at long contexts. A task keeps its own running
//! maximum, sum and weighted sum of values per query head; [`merge`] rescales the ranges to
//! their common maximum and adds them up. The ranges are sized so the tasks fill whole rounds
//! of the pool's threads. The inner loops (dot products, softmax, weighted values) are
//! [`super::simd`]'s kernels, inlined into one function per instruction set. The tasks run on
//! the decode step's spinning pool ([`crate::step_threads`]), as its one-row matmuls do.

use half::{bf16, f16};

#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Elem, Kernel, Scalar, KEY_BLOCK};
use super::{denominator, first_visible, Call, Isa, KvData, KvHeads, Shape};

/// Keys per tile inside a task (the group's scores of one tile are a small buffer).
const TILE: usize = 128;
/// Fewest keys per range when the keys are split.
const MIN_RANGE: usize = 128;
/// Ranges per thread to aim for (more than one evens out the heads).
const RANGES_PER_THREAD: usize = 4;
/// Below this many (query head, key, column) products a call runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;

/// Runs a one-row call whose shape [`super::check`] accepted.
pub(super) fn run(isa: Isa, call: Call<'_>, out: &mut [f32]) {
    let s = call.s;
    let d = s.head_dim;
    let lo = first_visible(s.pos, s.window);
    let n = s.pos + 1 - lo;
    let threads = crate::step_threads::threads();
    let parallel = threads > 1 && s.n_heads * n * d >= PARALLEL_MIN;
    let ranges = if parallel {
        // Whole rounds of tasks for the pool (3 key/value heads on 2 threads: 4 ranges each,
        // 12 tasks, not 3 and 9, where one thread would take a task more than the other).
        let target = (RANGES_PER_THREAD * threads).div_ceil(s.n_kv_heads);
        (target..target + threads)
            .find(|r| (r * s.n_kv_heads).is_multiple_of(threads))
            .unwrap_or(target)
            .min(n.div_ceil(MIN_RANGE))
            .max(1)
    } else {
        1
    };
    run_split(isa, ranges, parallel, call, out);
}

/// [`run`] with the visible keys cut into (at most) `ranges` ranges of equal length (the
/// last one shorter), the tasks on the step's pool when `parallel`.
pub(super) fn run_split(isa: Isa, ranges: usize, parallel: bool, call: Call<'_>, out: &mut [f32]) {
    let Call { q, k, v, s } = call;
    let d = s.head_dim;
    let group = s.n_heads / s.n_kv_heads;
    let lo = first_visible(s.pos, s.window);
    let n = s.pos + 1 - lo;
    let ranges = ranges.clamp(1, n);
    let per = n.div_ceil(ranges);
    let ranges = n.div_ceil(per);
    let width = d + 2;
    let mut partial = vec![0f32; s.n_kv_heads * ranges * group * width];
    let job = |(i, part): (usize, &mut [f32])| {
        let kv_head = i / ranges;
        let a = lo + (i % ranges) * per;
        let keys = a..(a + per).min(s.pos + 1);
        let q = &q[kv_head * group * d..(kv_head + 1) * group * d];
        let task = Task {
            q,
            kv_head,
            keys,
            part,
        };
        match isa {
            // SAFETY: `attend_with` runs an `Isa` only when the CPU has its features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { range_avx512(k, v, s, task) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { range_avx2(k, v, s, task) },
            Isa::Baseline => range::<Scalar>(k, v, s, task),
        }
    };
    if parallel && ranges * s.n_kv_heads > 1 {
        let mut parts: Vec<&mut [f32]> = partial.chunks_mut(group * width).collect();
        crate::step_threads::for_each_mut(&mut parts, |i, part| job((i, part)));
    } else {
        partial.chunks_mut(group * width).enumerate().for_each(job);
    }
    merge(&partial, ranges, group, s, out);
}

/// One task: a key/value head's range of keys against every query head of its group.
struct Task<'a> {
    /// The group's query rows (`[group, head_dim]`).
    q: &'a [f32],
    kv_head: usize,
    keys: std::ops::Range<usize>,
    /// Per query head of the group: its weighted sum of values (`head_dim`), then its
    /// maximum and its sum of exponentials.
    part: &'a mut [f32],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn range_avx512(k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    range::<Avx512>(k, v, s, task)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn range_avx2(k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    range::<Avx2>(k, v, s, task)
}

/// [`range_typed`] with the keys' and values' element types.
#[inline(always)]
fn range<K: Kernel>(k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    let (d, r) = (s.head_dim, task.keys.clone());
    let keys_at = task.kv_head * k.head_stride;
    let values_at = task.kv_head * v.head_stride;
    let rows = |at: usize| at + r.start * d..at + r.end * d;
    if k.data.is_blocks() || v.data.is_blocks() {
        return range_decoded::<K>(k, v, keys_at, values_at, s, task);
    }
    match k.data {
        KvData::F32(x) => with_values::<K, f32>(&x[rows(keys_at)], v, rows(values_at), s, task),
        KvData::F16(x) => with_values::<K, f16>(&x[rows(keys_at)], v, rows(values_at), s, task),
        KvData::BF16(x) => with_values::<K, bf16>(&x[rows(keys_at)], v, rows(values_at), s, task),
        KvData::Q8_0(_) | KvData::Q4_0(_) => unreachable!("block caches are decoded above"),
    }
}

/// The task on a block-format cache: each tile's key and value rows decoded into two buffers of
/// [`TILE`] rows (never more of the cache at once), then the same tile step as the dense path.
#[inline(always)]
fn range_decoded<K: Kernel>(
    k: &KvHeads<'_>,
    v: &KvHeads<'_>,
    keys_at: usize,
    values_at: usize,
    s: &Shape,
    task: Task<'_>,
) {
    let d = s.head_dim;
    let group = task.q.len() / d;
    let part = task.part;
    start(part, d);
    let (mut scores, mut scratch) = (vec![0f32; group * TILE], vec![0f32; KEY_BLOCK * d]);
    let (mut k_tile, mut v_tile) = (vec![0f32; TILE * d], vec![0f32; TILE * d]);
    let mut t0 = task.keys.start;
    while t0 < task.keys.end {
        let n = (task.keys.end - t0).min(TILE);
        k.data.read(keys_at + t0 * d, &mut k_tile[..n * d]);
        v.data.read(values_at + t0 * d, &mut v_tile[..n * d]);
        tile_step::<K, f32, f32>(
            task.q,
            &k_tile[..n * d],
            &v_tile[..n * d],
            s,
            part,
            &mut scores,
            &mut scratch,
        );
        t0 += n;
    }
}

#[inline(always)]
fn with_values<K: Kernel, TK: Elem>(
    keys: &[TK],
    v: &KvHeads<'_>,
    at: std::ops::Range<usize>,
    s: &Shape,
    task: Task<'_>,
) {
    match v.data {
        KvData::F32(x) => range_typed::<K, TK, f32>(keys, &x[at], s, task),
        KvData::F16(x) => range_typed::<K, TK, f16>(keys, &x[at], s, task),
        KvData::BF16(x) => range_typed::<K, TK, bf16>(keys, &x[at], s, task),
        KvData::Q8_0(_) | KvData::Q4_0(_) => unreachable!("block caches take range_decoded"),
    }
}

/// The task on its keys' and values' rows (`[range, head_dim]` each).
#[inline(always)]
fn range_typed<K: Kernel, TK: Elem, TV: Elem>(
    keys: &[TK],
    values: &[TV],
    s: &Shape,
    task: Task<'_>,
) {
    let d = s.head_dim;
    let group = task.q.len() / d;
    let part = task.part;
    start(part, d);
    let mut scores = vec![0f32; group * TILE];
    let mut scratch = vec![0f32; KEY_BLOCK * d];
    let n_keys = keys.len() / d;
    let mut t0 = 0;
    while t0 < n_keys {
        let n = (n_keys - t0).min(TILE);
        let (k_tile, v_tile) = (&keys[t0 * d..(t0 + n) * d], &values[t0 * d..(t0 + n) * d]);
        tile_step::<K, TK, TV>(task.q, k_tile, v_tile, s, part, &mut scores, &mut scratch);
        t0 += n;
    }
}

/// Clears a task's running state: per query head, weighted sum 0, maximum -inf, sum 0.
#[inline(always)]
fn start(part: &mut [f32], d: usize) {
    for state in part.chunks_exact_mut(d + 2) {
        state[..d].fill(0.0);
        state[d] = f32::NEG_INFINITY;
        state[d + 1] = 0.0;
    }
}

/// Folds one tile of key and value rows (`[n, head_dim]` each, `n <= TILE`) into the group's
/// running state `part`, with `scores` (`group * TILE`) and `scratch` ([`KEY_BLOCK`] rows, for
/// the key rows the dot products widen) as scratch.
#[inline(always)]
fn tile_step<K: Kernel, TK: Elem, TV: Elem>(
    q: &[f32],
    k_tile: &[TK],
    v_tile: &[TV],
    s: &Shape,
    part: &mut [f32],
    scores: &mut [f32],
    scratch: &mut [f32],
) {
    let d = s.head_dim;
    let width = d + 2;
    let group = q.len() / d;
    let n = k_tile.len() / d;
    // SAFETY: `range`'s callers run a kernel only on a CPU with its features.
    unsafe { K::dots(q, group, k_tile, d, scores, TILE, scratch) };
    for (g, state) in part.chunks_exact_mut(width).enumerate() {
        let (acc, running) = state.split_at_mut(d);
        let (max, sum) = running.split_at_mut(1);
        let row = &mut scores[g * TILE..g * TILE + n];
        // SAFETY: as above.
        let correction = unsafe { K::softmax(s, row, &mut max[0], &mut sum[0]) };
        if correction != 1.0 {
            for o in acc.iter_mut() {
                *o *= correction;
            }
        }
    }
    // SAFETY: as above.
    unsafe { K::weighted(scores, TILE, group, v_tile, d, part, width) };
}

/// Writes each query head's output from its ranges' partial results (`partial`: per key/value
/// head, per range, per query head of the group, `head_dim + 2` values as [`Task::part`]).
fn merge(partial: &[f32], ranges: usize, group: usize, s: &Shape<'_>, out: &mut [f32]) {
    let d = s.head_dim;
    let width = d + 2;
    for (head, out) in out.chunks_exact_mut(d).enumerate() {
        let (kv_head, g) = (head / group, head % group);
        let part = |r: usize| {
            let at = ((kv_head * ranges + r) * group + g) * width;
            &partial[at..at + width]
        };
        let max = (0..ranges).fold(f32::NEG_INFINITY, |m, r| m.max(part(r)[d]));
        out.fill(0.0);
        let mut sum = 0.0;
        for r in 0..ranges {
            let p = part(r);
            let scale = (p[d] - max).exp();
            sum += p[d + 1] * scale;
            for (o, &x) in out.iter_mut().zip(&p[..d]) {
                *o += x * scale;
            }
        }
        let inv = 1.0 / denominator(s, head, max, sum);
        for o in out.iter_mut() {
            *o *= inv;
        }
    }
}
