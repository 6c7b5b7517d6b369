//! The loop of the CPU quantized matmul: how the `m x n` outputs of every weight of a call are
//! cut into tasks and what runs inside one.
//!
//! A task is a rectangle of the output: up to [`ACT_ROWS`] activation rows times a run of
//! weight rows of one matrix (sized to stay in L2). Inside it, four activation rows at a time
//! sweep the task's weight rows, each weight row dotted with the four by a micro-kernel that
//! unpacks every weight block once ([`rows4`]: [`super::avx2_tile`] or
//! [`super::scalar_tile`]), so a prompt's matmul reads each weight from memory once per
//! [`ACT_ROWS`] rows instead of once per row and does a quarter of the unpacking; the
//! activations of the four rows stay in L1. Leftover rows (fewer than four) and formats without
//! a micro-kernel go through the one-row dot ([`Dot::row`]). Results land in place in the
//! row-major output (no transposed scratch). The k-quants (Q2_K..Q6_K) have their own
//! four-row kernels ([`rows4_k`]) and, on AVX-512, eight-row ones for Q4_K..Q6_K
//! ([`kquants::tile::rows8`]).
//! The micro-kernels repeat the one-row kernels'
//! arithmetic exactly, so the tiling never changes a result.
//!
//! On AVX-512 VNNI CPUs a call of at least [`GEMM_MIN_ROWS`] rows of a format
//! [`super::avx512_panel`] has runs each task through that GEMM kernel instead (64-row weight
//! panels decoded once per task of up to [`GEMM_TASK_ROWS`] activation rows, every activation
//! row swept over them). It equals the AVX-512
//! one-row kernel bit for bit; where the row-at-a-time products keep the AVX2 kernel
//! ([`super::avx512::Avx512::row_wins`]), or take Q5's own ([`super::q5_avx512`]), the
//! prompt's and the decode's results differ by float summation order only. Off the AVX-512 path (no AVX-512 VNNI, or `Kernel::Avx2` /
//! `Kernel::AvxVnni`) the calls [`super::avx2_panel::takes`] names run through that kernel, the
//! same GEMM on eight-row panels in ymm, with the same order (bit for bit the AVX-512 one-row
//! kernel), and k-quant calls of at least [`kquants::avx2_panel::MIN_ROWS`] rows on the AVX2 /
//! AVX-VNNI tile path (Q2_K / Q3_K below the zmm GEMM's rows on the AVX-512 one too) through [`kquants::avx2_panel`],
//! bit for bit the one-row k-quant dots; on the AVX-512 one calls of at least
//! [`kquants::avx512_panel::MIN_ROWS`] rows of every k-quant through [`kquants::avx512_panel`]
//! instead (64-row zmm panels, tasks of up to [`GEMM_TASK_ROWS`] activation rows, as the AVX2
//! k-quant GEMM's), bit for bit the same.
//! A matrix held in the eight-row panel layout ([`super::panel8`]: on that AVX2 / AVX-VNNI
//! path) runs its tasks from the layout (`Task::run_panels`): prompts through the k-quant GEMM
//! or the 32-element one, each filling its decoded panels from it; decode through the layout's
//! own dot kernels ([`kquants::panel8_avx2`], [`super::table_panel`], [`super::q5_panel`]).
//!
//! On AMX CPUs (`Kernel::Auto`) a call of at least [`kquants::amx_tile::min_rows`] rows of
//! Q4_K, Q5_K or Q6_K runs each task through [`kquants::amx_tile`] (int8 tile multiplies of
//! sixteen decoded weight rows by sixteen activation rows), equal bit for bit to the one-row
//! k-quant dot, so prompts and decode agree exactly. Likewise a call of at least
//! [`amx_panel::AMX_MIN_ROWS`] rows of Q4_0, Q8_0, IQ4_NL, IQ4_XS or MXFP4 runs each task
//! through [`amx_panel`] (32-element blocks, `tdpbssd`), equal bit for bit to the AVX-512
//! one-row kernel (Q5_0 / Q5_1 have no AMX kernel: their prompts take the AVX-512 GEMM
//! there too). The AMX tasks of both take up to 256 activation rows
//! ([`amx_panel::task_rows`], [`kquants::amx_tile::task_rows`]), so a panel's weight decoding
//! is shared by more of them, and their weight runs have no L2 cap (the weights are decoded
//! once per task; longer runs share the task's activation packing). Q8_0's prompts then have
//! the AVX-512 order while its decode keeps the AVX2 kernel (float summation order apart);
//! Q4_1 (the default model) stays off it.
//!
//! The tasks of a call with fewer than [`GEMM_MIN_ROWS`] activation rows (a decode step's) run
//! on the step's spinning pool ([`crate::step_threads`]), longer calls' on rayon's.

use std::ops::Range;

use rayon::prelude::*;

use super::activation::{ActRow, Activations, Q8Block};
#[cfg(target_arch = "x86_64")]
use super::kquants::activation::QK_K;
#[cfg(target_arch = "x86_64")]
use super::{amx_panel, avx2_panel, avx2_tile, avx512_panel};
use super::{kquants, scalar_tile, CpuQMatMul, Dot, Format, Kernel, PARALLEL_MIN_BLOCKS};
use crate::error::Result;

/// Four activation rows of the same number of blocks.
pub type Rows4<'a> = [&'a [Q8Block]; 4];

/// Calls of at least this many activation rows take the AVX-512 GEMM kernel where the CPU
/// and format have it (all of the call's rows, so one call never mixes kernels).
pub const GEMM_MIN_ROWS: usize = 4;

/// Activation rows per task.
pub const ACT_ROWS: usize = 64;
/// Activation rows per task of the zmm GEMMs and the AVX2 k-quant one (the decoding of a
/// panel is shared by all of them). Measured at 512 rows, 2 threads: the k-quant zmm GEMM
/// (4096 x 4096) 1.06-1.2x as fast with 128 rows as with 64 and 1.1-1.2x with 256; the
/// 32-element one (5632 x 2048) 1.2-1.4x with 256; the AVX2 k-quant one 1.12-1.14x with 256
/// (the AVX2 32-element panel measured 8-12 % slower with 256 and keeps [`ACT_ROWS`]).
pub const GEMM_TASK_ROWS: usize = 256;
/// Weight rows of the widest GEMM panel (the zmm ones'): the GEMMs' tasks take whole multiples.
const GEMM_PANEL_ROWS: usize = 64;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    GEMM_PANEL_ROWS.is_multiple_of(kquants::avx512_panel::PANEL_ROWS)
        && GEMM_PANEL_ROWS.is_multiple_of(avx512_panel::PANEL_ROWS)
);
/// Bytes of weight rows per task at most (a task's weights are swept once per four activation
/// rows, so they should stay in L2).
const TASK_WEIGHT_BYTES: usize = 256 * 1024;

/// Whether the many-row path uses the four-row micro-kernels (the default) or only the one-row
/// dot (the reference the tiled results are tested against).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tiling {
    /// Four activation rows per weight row where the format has a micro-kernel.
    Tiled,
    /// One activation row per dot product.
    PerRow,
}

/// The dot products of one weight row with four activation rows, when `dot`'s format has a
/// four-row micro-kernel (`None`: use [`Dot::row`] four times).
#[inline]
#[allow(unreachable_patterns)]
pub(super) fn rows4(dot: &Dot, w: &[u8], a: Rows4<'_>) -> Option<[f32; 4]> {
    #[cfg(target_arch = "x86_64")]
    if dot.avx512.is_some() {
        // Its formats go through `avx512_panel` (or its one-row kernel), never these.
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = dot.avx2 {
        if dot.kernel == Kernel::AvxVnni && avx2_tile::has_vnni() {
            return avx2_tile::narrow_vnni(dot.format, w, a);
        }
        // AVX-VNNI (on AVX-512 VL's 32 registers where the CPU has them) unless plain AVX2
        // was asked for.
        let vnni = dot.kernel != Kernel::Avx2;
        return match dot.format {
            Format::Q4_0 => Some(avx2_tile::q4_0(k, vnni, w, a)),
            Format::Q4_1 => Some(avx2_tile::q4_1(k, vnni, w, a)),
            Format::Q8_0 => Some(avx2_tile::q8_0(k, vnni, w, a)),
            Format::Q5_0 => Some(avx2_tile::q5_0(k, vnni, w, a)),
            Format::Q5_1 => Some(avx2_tile::q5_1(k, vnni, w, a)),
            Format::IQ4_NL => Some(avx2_tile::iq4_nl(k, vnni, w, a)),
            Format::IQ4_XS => Some(avx2_tile::iq4_xs(k, vnni, w, a)),
            Format::MXFP4 => Some(avx2_tile::mxfp4(k, vnni, w, a)),
            _ => None,
        };
    }
    match dot.format {
        Format::Q4_0 => Some(scalar_tile::q4_0(w, a)),
        Format::Q4_1 => Some(scalar_tile::q4_1(w, a)),
        Format::Q8_0 => Some(scalar_tile::q8_0(w, a)),
        Format::Q5_0 => Some(scalar_tile::q5_0(w, a)),
        Format::Q5_1 => Some(scalar_tile::q5_1(w, a)),
        Format::IQ4_NL => Some(scalar_tile::iq4_nl(w, a)),
        Format::IQ4_XS => Some(scalar_tile::iq4_xs(w, a)),
        Format::MXFP4 => Some(scalar_tile::mxfp4(w, a)),
        _ => None,
    }
}

/// [`rows4`] for the k-quants ([`kquants::tile`]: Q4_K, Q5_K, Q6_K on the fastest SIMD path
/// the CPU has; `None` for the scalar kernel, which then runs four one-row dots).
#[inline]
pub(super) fn rows4_k(dot: &Dot, w: &[u8], a: kquants::tile::Rows4K<'_>) -> Option<[f32; 4]> {
    let Format::K(f) = dot.format else {
        return None;
    };
    #[cfg(target_arch = "x86_64")]
    if dot.avx2.is_some() {
        return kquants::tile::rows4(kquants::tile::Path::detect(dot.kernel)?, f, w, a);
    }
    let _ = (f, w, a);
    None
}

/// The path and format of `dot`'s eight-row k-quant kernel, if it has one
/// ([`kquants::tile::rows8`]).
#[inline]
fn rows8_k(dot: &Dot) -> Option<(kquants::tile::Path, kquants::KFormat)> {
    let Format::K(f) = dot.format else {
        return None;
    };
    #[cfg(target_arch = "x86_64")]
    if dot.avx2.is_some() {
        let path = kquants::tile::Path::detect(dot.kernel)?;
        return kquants::tile::has_rows8(path, f).then_some((path, f));
    }
    let _ = f;
    None
}

/// Computes every job's `out = act W^T` (`out` row major `[m, rows]`) from the quantized
/// activations `act` (`m` rows of `kb` 32-element blocks, in every kind the jobs read).
pub fn run(
    jobs: &mut [(&CpuQMatMul, &mut [f32])],
    act: &Activations,
    m: usize,
    kb: usize,
    kernel: Kernel,
    tiling: Tiling,
) -> Result<()> {
    let n_total: usize = jobs.iter().map(|(mm, _)| mm.rows).sum();
    let parallel = n_total * kb * m >= PARALLEL_MIN_BLOCKS;
    // A decode step's calls (fewer rows than a GEMM takes) run on the step's spinning pool
    // (`step_threads`), longer ones on rayon's.
    let step_sized = m < GEMM_MIN_ROWS;
    let threads = match step_sized {
        true => crate::step_threads::threads(),
        false => rayon::current_num_threads(),
    };
    // Enough tasks for the pool to balance (four per thread), counting the activation chunks
    // of the rows a task takes (`ACT_ROWS`, or a GEMM's longer runs: see below).
    let weight_chunks = |act_rows: usize| match parallel {
        true => (4 * threads).div_ceil(m.div_ceil(act_rows)),
        false => 1,
    };
    let mats: Vec<&CpuQMatMul> = jobs.iter().map(|(mm, _)| *mm).collect();
    let datas = mats
        .iter()
        .map(|mm| mm.weight.bytes())
        .collect::<Result<Vec<_>>>()?;
    let mut tasks = Vec::new();
    for ((mm, out), data) in jobs.iter_mut().zip(&datas) {
        let row_bytes = mm.weight.row_bytes();
        let out = Out::new(out, mm.rows);
        let dot = Dot::new(mm.format, kernel);
        // The AMX, zmm and AVX2 k-quant GEMMs decode each weight panel once per task and sweep
        // all the task's activation rows over it: longer activation runs share that decoding
        // and the task's weights are read once (no L2 cap on them; a longer run of weight rows
        // shares the task's activation packing). Their panels (64 rows at most) are not split
        // between tasks.
        #[cfg(target_arch = "x86_64")]
        let gemm_rows = amx_task_rows(&dot, m, kb).or_else(|| match dot.format {
            Format::K(f) => (kquants::avx512_panel::takes(kernel, f, m)
                || tiling == Tiling::Tiled && kquants::avx2_panel::takes(kernel, f, m))
            .then_some(GEMM_TASK_ROWS),
            _ => (dot.avx512.is_some() && tiling == Tiling::Tiled && m >= GEMM_MIN_ROWS)
                .then_some(GEMM_TASK_ROWS),
        });
        #[cfg(not(target_arch = "x86_64"))]
        let gemm_rows: Option<usize> = None;
        let (weight_cap, panel_rows) = match gemm_rows {
            Some(_) => (usize::MAX, GEMM_PANEL_ROWS),
            None => (TASK_WEIGHT_BYTES / row_bytes.max(1), 1),
        };
        let act_rows = gemm_rows.unwrap_or(ACT_ROWS);
        #[cfg(target_arch = "x86_64")]
        let panels = match (tiling, dot.avx2, &mm.panels) {
            (Tiling::Tiled, Some(k), Some(panels)) if kquants::panel8_avx2::takes(kernel) => {
                Some((&**panels, k))
            }
            _ => None,
        };
        #[cfg(target_arch = "x86_64")]
        let panel_rows = match panels {
            Some(_) => panel_rows.max(super::panel8::ROWS),
            None => panel_rows,
        };
        let per_task = n_total
            .div_ceil(weight_chunks(act_rows))
            .min(weight_cap)
            .max(4);
        let per_task = per_task.next_multiple_of(panel_rows);
        for first in (0..m).step_by(act_rows) {
            for w0 in (0..mm.rows).step_by(per_task) {
                tasks.push(Task {
                    gemm: m >= GEMM_MIN_ROWS,
                    m,
                    data,
                    row_bytes,
                    dot,
                    weights: w0..(w0 + per_task).min(mm.rows),
                    acts: first..(first + act_rows).min(m),
                    out,
                    #[cfg(target_arch = "x86_64")]
                    panels,
                });
            }
        }
    }
    let run = |task: &Task<'_>| task.run(act, tiling);
    if !parallel {
        tasks.iter().for_each(run);
    } else if step_sized {
        crate::step_threads::for_each_mut(&mut tasks, |_, task| run(task));
    } else {
        tasks.par_iter().for_each(run);
    }
    Ok(())
}

/// Activation rows per task when a call of `m` rows of `kb` 32-element blocks runs on one of
/// the AMX GEMMs ([`amx_panel`], [`kquants::amx_tile`]), `None` when it does not.
#[cfg(target_arch = "x86_64")]
fn amx_task_rows(dot: &Dot, m: usize, kb: usize) -> Option<usize> {
    match dot.format {
        Format::K(f) => dot
            .amx
            .and_then(|_| kquants::amx_tile::task_rows(f, m, kb * 32 / QK_K)),
        format => amx_panel::task_rows(dot.amx.is_some(), format, m, kb),
    }
}

/// One rectangle of one matrix's output: activation rows `acts` times weight rows `weights`.
struct Task<'a> {
    /// Whether the call is long enough for the GEMM kernel ([`GEMM_MIN_ROWS`]).
    gemm: bool,
    /// The call's activation rows (the AMX kernels' thresholds are on it).
    m: usize,
    data: &'a [u8],
    row_bytes: usize,
    dot: Dot,
    weights: Range<usize>,
    acts: Range<usize>,
    out: Out<'a>,
    /// The matrix in the panel layout, when the call's kernel reads it (the AVX2 path's
    /// k-quants, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1, tiled): `weights` are then whole panels.
    #[cfg(target_arch = "x86_64")]
    panels: Option<(&'a super::panel8::Panels, super::avx2::Avx2)>,
}

impl Task<'_> {
    fn run(&self, act: &Activations, tiling: Tiling) {
        let row = |i: usize| -> ActRow<'_> { act.row(i) };
        let weight = |r: usize| &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        let mut i = self.acts.start;
        #[cfg(target_arch = "x86_64")]
        if let Some((panels, k)) = self.panels {
            self.run_panels(panels, k, act);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let (Tiling::Tiled, Some(amx)) = (tiling, self.dot.amx) {
            // The AMX GEMM of the 32-element formats (equal bit for bit to `Avx512::row`).
            let format = self.dot.format;
            if self.m >= amx_panel::AMX_MIN_ROWS && amx_panel::enabled(format) {
                let rows: Vec<&[Q8Block]> = self.acts.clone().map(|i| row(i).q8).collect();
                let first = self.acts.start;
                let mut put = |j: usize, r0: usize, ys: &[f32]| self.out.set_run(first + j, r0, ys);
                let (data, stride, weights) = (self.data, self.row_bytes, self.weights.clone());
                if amx_panel::run(amx, format, data, stride, weights, &rows, &mut put) {
                    return;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Tiling::Tiled, true, Some(k)) = (tiling, self.gemm, self.dot.avx512) {
            // The AVX-512 GEMM kernel (equal bit for bit to `Avx512::row`; to `Dot::row`
            // where that is it, see `Avx512::row_wins`).
            let rows: Vec<&[Q8Block]> = self.acts.clone().map(|i| row(i).q8).collect();
            let (first, format) = (self.acts.start, self.dot.format);
            let mut put = |i: usize, r0: usize, ys: &[f32]| self.out.set_run(first + i, r0, ys);
            let weights = self.weights.clone();
            if avx512_panel::run(
                k,
                format,
                self.data,
                self.row_bytes,
                weights,
                &rows,
                &mut put,
            ) {
                return;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Tiling::Tiled, None, Some(k)) = (tiling, self.dot.avx512, self.dot.avx2) {
            // The AVX2 GEMM kernel (the AVX-512 one's order, on eight lanes).
            let (kernel, format) = (self.dot.kernel, self.dot.format);
            if avx2_panel::takes(kernel, format, self.m) {
                let rows: Vec<&[Q8Block]> = self.acts.clone().map(|i| row(i).q8).collect();
                let first = self.acts.start;
                let mut put = |i: usize, r0: usize, ys: &[f32]| self.out.set_run(first + i, r0, ys);
                let (data, stride, weights) = (self.data, self.row_bytes, self.weights.clone());
                let vnni = avx2_panel::vnni_for(kernel);
                if avx2_panel::run(k, vnni, format, data, stride, weights, &rows, &mut put) {
                    return;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Tiling::Tiled, Some(amx), Format::K(f)) = (tiling, self.dot.amx, self.dot.format) {
            // k-quant prompts on AMX (equal bit for bit to the one-row kernels).
            if self.m >= kquants::amx_tile::min_rows(f) && kquants::amx_tile::supports(f) {
                let rows: Vec<_> = self.acts.clone().map(|i| row(i).q8k).collect();
                let first = self.acts.start;
                let mut put = |i: usize, r0: usize, ys: &[f32]| self.out.set_run(first + i, r0, ys);
                let (data, stride, weights) = (self.data, self.row_bytes, self.weights.clone());
                if kquants::amx_tile::run(amx, f, data, stride, weights, &rows, &mut put) {
                    return;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Tiling::Tiled, Some(_), Format::K(f)) = (tiling, self.dot.avx2, self.dot.format) {
            // Q2_K / Q3_K prompts on AVX-512 (equal bit for bit to the one-row kernels).
            let k = kquants::avx512_tile::Avx512::detect();
            if let Some(k) = k.filter(|_| kquants::avx512_panel::takes(self.dot.kernel, f, self.m))
            {
                let rows: Vec<_> = self.acts.clone().map(|i| row(i).q8k).collect();
                let first = self.acts.start;
                let mut put = |i: usize, r0: usize, ys: &[f32]| self.out.set_run(first + i, r0, ys);
                let (data, stride, weights) = (self.data, self.row_bytes, self.weights.clone());
                if kquants::avx512_panel::run(k, f, data, stride, weights, &rows, &mut put) {
                    return;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let (Tiling::Tiled, Some(k), Format::K(f)) = (tiling, self.dot.avx2, self.dot.format) {
            // k-quant prompts on AVX2 / AVX-VNNI (equal bit for bit to the one-row kernels).
            if kquants::avx2_panel::takes(self.dot.kernel, f, self.m) {
                let rows: Vec<_> = self.acts.clone().map(|i| row(i).q8k).collect();
                let first = self.acts.start;
                let mut put = |i: usize, r0: usize, ys: &[f32]| self.out.set_run(first + i, r0, ys);
                let (data, stride, weights) = (self.data, self.row_bytes, self.weights.clone());
                if kquants::avx2_panel::run(k, f, data, stride, weights, &rows, &mut put) {
                    return;
                }
            }
        }
        if let (Tiling::Tiled, Some((path, f))) = (tiling, rows8_k(&self.dot)) {
            // k-quants on AVX-512: eight activation rows per weight block.
            while i + 8 <= self.acts.end {
                let a: [ActRow<'_>; 8] = std::array::from_fn(|d| row(i + d));
                let q8k = a.map(|a| a.q8k);
                for r in self.weights.clone() {
                    let w = weight(r);
                    let y = kquants::tile::rows8(path, f, w, q8k)
                        .unwrap_or_else(|| a.map(|a| self.dot.row(w, a)));
                    for (di, v) in y.into_iter().enumerate() {
                        self.out.set(i + di, r, v);
                    }
                }
                i += 8;
            }
        }
        if tiling == Tiling::Tiled {
            while i + 4 <= self.acts.end {
                let a = [row(i), row(i + 1), row(i + 2), row(i + 3)];
                let q8: Rows4<'_> = a.map(|a| a.q8);
                let q8k = a.map(|a| a.q8k);
                for r in self.weights.clone() {
                    let w = weight(r);
                    let y = rows4(&self.dot, w, q8)
                        .or_else(|| rows4_k(&self.dot, w, q8k))
                        .unwrap_or_else(|| a.map(|a| self.dot.row(w, a)));
                    for (di, v) in y.into_iter().enumerate() {
                        self.out.set(i + di, r, v);
                    }
                }
                i += 4;
            }
        }
        for i in i..self.acts.end {
            let a = row(i);
            for r in self.weights.clone() {
                self.out.set(i, r, self.dot.row(weight(r), a));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Task<'_> {
    /// [`Task::run`] on the matrix's panel layout: the GEMM from it (the k-quant one, or the
    /// AVX2 32-element one for IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1), or the panel dots row by row.
    fn run_panels(&self, panels: &super::panel8::Panels, k: super::avx2::Avx2, act: &Activations) {
        use super::panel8::{PanelFormat, ROWS};
        let first = self.acts.start;
        let mut put = |i: usize, r0: usize, ys: &[f32]| self.out.set_run(first + i, r0, ys);
        let weights = self.weights.clone();
        let panel_starts = weights.clone().step_by(ROWS);
        match panels.format() {
            PanelFormat::K(format) => {
                let rows: Vec<_> = self.acts.clone().map(|i| act.row(i).q8k).collect();
                if self.m >= kquants::avx2_panel::MIN_ROWS {
                    kquants::avx2_panel::run_panels(k, panels, weights, &rows, &mut put);
                    return;
                }
                for (i, a) in rows.into_iter().enumerate() {
                    for r0 in panel_starts.clone() {
                        let panel = panels.panel(r0 / ROWS);
                        put(i, r0, &kquants::panel8_avx2::dots(k, format, panel, a));
                    }
                }
            }
            format => {
                let rows: Vec<_> = self.acts.clone().map(|i| act.row(i).q8).collect();
                let kernel = self.dot.kernel;
                if avx2_panel::takes(kernel, self.dot.format, self.m) {
                    let vnni = avx2_panel::vnni_for(kernel);
                    avx2_panel::run_panels(k, vnni, panels, weights, &rows, &mut put);
                    return;
                }
                for (i, a) in rows.into_iter().enumerate() {
                    for r0 in panel_starts.clone() {
                        let panel = panels.panel(r0 / ROWS);
                        if let Some(ys) = avx2_panel::panel_dots(k, format, panel, a) {
                            put(i, r0, &ys);
                        }
                    }
                }
            }
        }
    }
}

/// The GEMM kernels' argument check: the blocks per activation row of `acts` (all rows equally
/// long), after asserting that the rows `weights` of `row_stride` bytes each hold
/// `row_bytes(blocks)` bytes within `data` (`what` names the format in the panic). Callers
/// rely on it to bound their unchecked reads.
pub(super) fn checked_blocks<A>(
    acts: &[&[A]],
    data: &[u8],
    row_stride: usize,
    weights: &Range<usize>,
    row_bytes: impl FnOnce(usize) -> Option<usize>,
    what: &dyn std::fmt::Debug,
) -> usize {
    let kb = acts.first().map_or(0, |a| a.len());
    assert!(
        acts.iter().all(|a| a.len() == kb),
        "activation rows differ in length"
    );
    let need = row_bytes(kb).unwrap_or(usize::MAX);
    assert!(
        row_stride >= need && data.len() >= (weights.end.max(1) - 1) * row_stride + need,
        "{what:?} weights too short"
    );
    kb
}

/// A row-major `[m, n]` output that tasks write in disjoint rectangles.
#[derive(Clone, Copy)]
struct Out<'a> {
    ptr: *mut f32,
    len: usize,
    n: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: `Out` is a `&mut [f32]` split into rectangles: the tasks made from one `Out` write
// disjoint elements (`run` gives each a distinct activation-row x weight-row rectangle) and
// nothing reads the slice until every task is done.
unsafe impl Send for Out<'_> {}
// SAFETY: as above; a shared `Out` is only used through `set` on its own task's elements.
unsafe impl Sync for Out<'_> {}

impl<'a> Out<'a> {
    fn new(out: &'a mut [f32], n: usize) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            n,
            _out: std::marker::PhantomData,
        }
    }

    /// Writes output `(i, r)`.
    #[inline]
    fn set(&self, i: usize, r: usize, v: f32) {
        let at = i * self.n + r;
        assert!(
            r < self.n && at < self.len,
            "quantized matmul output out of range"
        );
        // SAFETY: in bounds (checked), and no other task writes element `at` (see `Send`).
        unsafe { self.ptr.add(at).write(v) }
    }

    /// Writes outputs `(i, r0..r0 + ys.len())`.
    #[inline]
    fn set_run(&self, i: usize, r0: usize, ys: &[f32]) {
        let at = i * self.n + r0;
        assert!(
            r0 + ys.len() <= self.n && at + ys.len() <= self.len,
            "quantized matmul output out of range"
        );
        // SAFETY: in bounds (checked), and no other task writes these elements (see `Send`).
        unsafe { std::ptr::copy_nonoverlapping(ys.as_ptr(), self.ptr.add(at), ys.len()) }
    }
}

#[cfg(test)]
#[path = "tile_tests.rs"]
mod tests;
