//! A CPU matmul for GGUF block-quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the k-quants
//! Q2_K..Q6_K, IQ4_NL, IQ4_XS and MXFP4) that reads the raw GGUF blocks in place ([`Blocks`]: on
//! the CPU a view of the memory-mapped model file, nothing copied): activations are quantized to
//! int8, per 32-block for the 32-element formats (llama.cpp's Q8_1 scheme, see [`activation`])
//! and per 256-block for the k-quants ([`kquants::activation`]), once per kind a call needs;
//! each output is an integer dot product over one weight row ([`scalar`], [`q5`],
//! [`kquants::scalar`], or their AVX2 twins when the CPU has it, with AVX-VNNI where it has
//! that; Q5's on AVX-512 [`q5_avx512`]), several activation rows per
//! weight row at once for prompts ([`tile`]; a GEMM kernel on AVX-512 VNNI CPUs,
//! [`avx512_panel`], and its eight-row form on AVX2 ones, [`avx2_panel`]), and output rows are split across rayon's pool (`RAYON_NUM_THREADS`).
//! On AMX CPUs the k-quants' prompts take int8 tile multiplies ([`kquants::amx_tile`]), and so
//! do those of Q4_0, Q8_0, IQ4_NL, IQ4_XS and MXFP4 ([`amx_panel`]).
//!
//! It exists because candle 0.11.1 runs Q4_1 (the default model's format), Q5_0 and Q5_1
//! through scalar code; its runtime-detected AVX2 kernels (Q4_0, Q8_0, the k-quants) are set
//! beside these in `benches/qmatmul_kernels.rs`; it has no IQ4_NL, IQ4_XS or MXFP4 at all
//! ([`iq4`], [`mxfp4`]). The weight is keyed by ferry's [`GgufType`] and shared (e.g. with a
//! tied embedding, which dequantizes the rows it looks up: [`dequant`]), so nothing is copied or
//! repacked at load time.

pub mod activation;
#[cfg(target_arch = "x86_64")]
pub mod activation_avx2;
#[cfg(all(test, target_arch = "x86_64"))]
mod activation_avx2_tests;
#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod amx_panel;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx2_panel;
#[cfg(all(test, target_arch = "x86_64"))]
mod avx2_panel_tests;
#[cfg(target_arch = "x86_64")]
pub mod avx2_tile;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod avx512_panel;
#[cfg(all(test, target_arch = "x86_64"))]
mod avx512_tests;
pub mod blocks;
pub mod dequant;
#[cfg(test)]
mod format_tests;
pub mod iq4;
#[cfg(test)]
mod iq_tests;
#[cfg(test)]
mod iq_tile_tests;
pub mod kquants;
#[cfg(all(test, target_arch = "x86_64"))]
mod layout_panel_tests;
pub mod mxfp4;
pub mod panel8;
pub mod q5;
#[cfg(target_arch = "x86_64")]
pub mod q5_avx512;
#[cfg(target_arch = "x86_64")]
pub mod q5_panel;
#[cfg(all(test, target_arch = "x86_64"))]
mod q5_tests;
pub mod scalar;
pub mod scalar_tile;
#[cfg(target_arch = "x86_64")]
pub mod table_panel;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
pub mod tile;

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Storage, Tensor};

pub use self::blocks::Blocks;

use self::activation::{ActKind, ActRow, Activations, BLOCK};
use self::kquants::activation::QK_K;
use self::kquants::KFormat;
pub use self::panel8::{PanelFormat, PanelShape};
use super::error::{ModelError, Result};
use super::header::GgufType;

/// Which dot-product implementation to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernel {
    /// The fastest the CPU supports (AMX for prompts, AVX-512 VNNI, else AVX2, else scalar).
    #[default]
    Auto,
    /// The AVX-512 kernels (where `Auto` would use them) even where AMX is present: the path
    /// of AVX-512 CPUs without AMX, kept testable and measurable on AMX machines.
    Avx512,
    /// The AVX2 kernels with AVX-VNNI's `vpdpbusd` / `vpdpwssd` where the CPU has it, on
    /// AVX2's sixteen ymm registers (AVX2 without AVX-VNNI, scalar without AVX2): the path of
    /// AVX-VNNI CPUs without AVX-512 (e.g. Alder Lake), kept measurable on AVX-512 machines.
    AvxVnni,
    /// The AVX2 kernels alone (AVX2, FMA, F16C: no AVX-VNNI, no AVX-512 instruction or
    /// register, no AMX; scalar without AVX2): the path of AVX2-only CPUs (AMD Zen 2/3, older
    /// Intel), kept testable and measurable on newer machines.
    Avx2,
    /// The portable scalar kernels (the reference; used in tests to cover the fallback).
    Scalar,
}

/// The process-wide kernel choice ([`set_process_kernel`]) as its index in [`KERNELS`].
static PROCESS_KERNEL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Every [`Kernel`], in the order [`PROCESS_KERNEL`] indexes them.
const KERNELS: [Kernel; 5] = [
    Kernel::Auto,
    Kernel::Avx512,
    Kernel::AvxVnni,
    Kernel::Avx2,
    Kernel::Scalar,
];

/// Sets the kernel choice [`CpuQMatMul::forward`] and [`CpuQMatMul::instruction_sets`] use
/// (the `device.cpu_qmatmul` setting; [`Kernel::Auto`] unless set), process-wide.
pub fn set_process_kernel(kernel: Kernel) {
    let index = KERNELS.iter().position(|&k| k == kernel).unwrap_or(0);
    PROCESS_KERNEL.store(index, std::sync::atomic::Ordering::Relaxed);
}

/// The kernel choice [`set_process_kernel`] made ([`Kernel::Auto`] unless set).
pub fn process_kernel() -> Kernel {
    KERNELS[PROCESS_KERNEL.load(std::sync::atomic::Ordering::Relaxed) % KERNELS.len()]
}

/// Whether the kernel choice `kernel` reads k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 weights
/// in the eight-row panel layout on this CPU (the AVX2 / AVX-VNNI k-quant path), where a weight has
/// one.
pub fn reads_panels(kernel: Kernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    return kquants::panel8_avx2::takes(kernel);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kernel;
        false
    }
}

/// Weight block formats this matmul handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
enum Format {
    Q4_0,
    Q4_1,
    Q8_0,
    Q5_0,
    Q5_1,
    /// A k-quant (256-element super-blocks).
    K(KFormat),
    IQ4_NL,
    IQ4_XS,
    MXFP4,
}

impl Format {
    fn of(ty: GgufType) -> Option<Self> {
        match ty {
            GgufType::Q4_0 => Some(Format::Q4_0),
            GgufType::Q4_1 => Some(Format::Q4_1),
            GgufType::Q8_0 => Some(Format::Q8_0),
            GgufType::Q5_0 => Some(Format::Q5_0),
            GgufType::Q5_1 => Some(Format::Q5_1),
            GgufType::Q2_K => Some(Format::K(KFormat::Q2K)),
            GgufType::Q3_K => Some(Format::K(KFormat::Q3K)),
            GgufType::Q4_K => Some(Format::K(KFormat::Q4K)),
            GgufType::Q5_K => Some(Format::K(KFormat::Q5K)),
            GgufType::Q6_K => Some(Format::K(KFormat::Q6K)),
            GgufType::IQ4_NL => Some(Format::IQ4_NL),
            GgufType::IQ4_XS => Some(Format::IQ4_XS),
            GgufType::MXFP4 => Some(Format::MXFP4),
            _ => None,
        }
    }

    /// Elements per block of the activations the kernels read ([`activation`](Self::activation)).
    fn activation_block(self) -> usize {
        match self {
            Format::K(_) => QK_K,
            _ => BLOCK,
        }
    }

    /// The activations its kernels read.
    fn activation(self) -> ActKind {
        match self {
            Format::K(_) => ActKind::Q8K,
            _ => ActKind::Q8,
        }
    }
}

/// A resolved dot product: format plus the kernel to run it with.
#[derive(Debug, Clone, Copy)]
struct Dot {
    format: Format,
    #[cfg(target_arch = "x86_64")]
    avx2: Option<avx2::Avx2>,
    /// Set when the AVX-512 kernels run this format ([`avx512`], [`avx512_panel`]).
    #[cfg(target_arch = "x86_64")]
    avx512: Option<avx512::Avx512>,
    /// Set when the CPU has AMX and the kernel choice allows it ([`amx`]); each prompt
    /// kernel says which formats it takes.
    #[cfg(target_arch = "x86_64")]
    amx: Option<amx::Amx>,
    /// The kernel choice (the k-quant tiles follow it: `kquants::tile::Path::detect`).
    kernel: Kernel,
}

impl Dot {
    fn new(format: Format, kernel: Kernel) -> Self {
        Dot {
            format,
            #[cfg(target_arch = "x86_64")]
            avx2: match kernel {
                Kernel::Auto | Kernel::Avx512 | Kernel::AvxVnni | Kernel::Avx2 => {
                    avx2::Avx2::detect()
                }
                Kernel::Scalar => None,
            },
            #[cfg(target_arch = "x86_64")]
            avx512: match kernel {
                Kernel::Auto | Kernel::Avx512 if avx512::Avx512::enabled(format) => {
                    avx512::Avx512::detect()
                }
                _ => None,
            },
            #[cfg(target_arch = "x86_64")]
            amx: match kernel {
                Kernel::Auto => amx::Amx::detect(),
                _ => None,
            },
            kernel,
        }
    }

    /// Dot product of one weight row with one quantized activation row.
    #[inline]
    fn row(&self, w: &[u8], a: ActRow<'_>) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if let Some(y) = self
            .avx512
            .filter(|_| avx512::Avx512::row_wins(self.format))
            .and_then(|k| k.row(self.format, w, a.q8))
        {
            return y;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = self.avx512 {
            match self.format {
                Format::Q5_0 => return q5_avx512::dot_q5_0(k, w, a.q8),
                Format::Q5_1 => return q5_avx512::dot_q5_1(k, w, a.q8),
                _ => {}
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = self.avx2 {
            // AVX-VNNI's `vpdpbusd` (the same sums) unless plain AVX2 was asked for.
            let vnni = self.kernel != Kernel::Avx2;
            return match self.format {
                Format::Q4_0 => k.dot_q4_0(w, a.q8),
                Format::Q4_1 => k.dot_q4_1(w, a.q8),
                Format::Q8_0 if vnni => k.dot_q8_0_vnni(w, a.q8),
                Format::Q8_0 => k.dot_q8_0(w, a.q8),
                Format::Q5_0 if vnni => q5::avx2::dot_q5_0_vnni(k, w, a.q8),
                Format::Q5_1 if vnni => q5::avx2::dot_q5_1_vnni(k, w, a.q8),
                Format::Q5_0 => q5::avx2::dot_q5_0(k, w, a.q8),
                Format::Q5_1 => q5::avx2::dot_q5_1(k, w, a.q8),
                Format::K(f) => kquants::avx2::dot(k, f, w, a.q8k),
                Format::IQ4_NL => iq4::avx2_dot_iq4_nl(k, w, a.q8),
                Format::IQ4_XS => iq4::avx2_dot_iq4_xs(k, w, a.q8),
                Format::MXFP4 => mxfp4::avx2_dot_mxfp4(k, w, a.q8),
            };
        }
        match self.format {
            Format::Q4_0 => scalar::dot_q4_0(w, a.q8),
            Format::Q4_1 => scalar::dot_q4_1(w, a.q8),
            Format::Q8_0 => scalar::dot_q8_0(w, a.q8),
            Format::Q5_0 => q5::dot_q5_0(w, a.q8),
            Format::Q5_1 => q5::dot_q5_1(w, a.q8),
            Format::K(f) => kquants::scalar::dot(f, w, a.q8k),
            Format::IQ4_NL => iq4::dot_iq4_nl(w, a.q8),
            Format::IQ4_XS => iq4::dot_iq4_xs(w, a.q8),
            Format::MXFP4 => mxfp4::dot_mxfp4(w, a.q8),
        }
    }
}

/// [`CpuQMatMul::instruction_sets`] of `format`.
#[cfg(target_arch = "x86_64")]
fn instruction_sets(format: Format) -> &'static str {
    let kernel = process_kernel();
    let dot = Dot::new(format, kernel);
    // The formats with AMX prompt kernels ([`kquants::amx_tile`], [`amx_panel`]).
    let amx_format = matches!(
        format,
        Format::K(_)
            | Format::Q4_0
            | Format::Q8_0
            | Format::IQ4_NL
            | Format::IQ4_XS
            | Format::MXFP4
    );
    let vnni = avx2_tile::has_vnni() && kernel != Kernel::Avx2;
    match (
        dot.amx.is_some() && amx_format,
        dot.avx512.is_some(),
        dot.avx2.is_some(),
    ) {
        (true, _, _) => "amx+avx512+avx2",
        (false, true, _) => "avx512+avx2",
        (false, false, true) if vnni => "avx-vnni+avx2",
        (false, false, true) => "avx2",
        (false, false, false) => "scalar",
    }
}

/// [`CpuQMatMul::instruction_sets`] of `format`: the portable kernels.
#[cfg(not(target_arch = "x86_64"))]
fn instruction_sets(_format: Format) -> &'static str {
    "scalar"
}

/// Below this many block dot products a matmul runs on the calling thread.
const PARALLEL_MIN_BLOCKS: usize = 4096;

/// `y = x W^T` for a quantized `W` (`[out, in]`) on the CPU.
#[derive(Debug, Clone)]
pub struct CpuQMatMul {
    weight: Blocks,
    format: Format,
    rows: usize,
    cols: usize,
    /// The weight again in the eight-row panel layout ([`with_panels`](Self::with_panels)), which
    /// the AVX2 k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 kernels then read instead of
    /// `weight`.
    panels: Option<Arc<panel8::Panels>>,
}

impl CpuQMatMul {
    /// Whether GGUF type `ty` has a kernel here.
    pub fn supports(ty: GgufType) -> bool {
        Format::of(ty).is_some()
    }

    /// The instruction sets the process's kernel choice ([`process_kernel`]) multiplies `ty`
    /// with on this CPU, as the start log names them: `amx+avx512+avx2` (AMX tiles for
    /// prompts), `avx512+avx2`, `avx-vnni+avx2`, `avx2` or `scalar`; `None` when `ty` has no
    /// kernel here.
    pub fn instruction_sets(ty: GgufType) -> Option<&'static str> {
        Format::of(ty).map(instruction_sets)
    }

    /// Wraps a CPU-resident 2-D candle quantized weight `[out, in]` (an offload slot's view).
    pub fn new(weight: Arc<QTensor>) -> Result<Self> {
        Self::from_blocks(Blocks::from_qtensor(weight)?)
    }

    /// Wraps raw GGUF blocks of a 2-D weight `[out, in]` (`in` a whole number of the type's
    /// blocks, and of the activation block: 32, or 256 for the k-quants).
    pub fn from_blocks(weight: Blocks) -> Result<Self> {
        let ty = weight.ty();
        let format = Format::of(ty)
            .ok_or_else(|| ModelError::Unsupported(format!("CPU quantized matmul of {ty}")))?;
        let (rows, cols) = (weight.rows(), weight.cols());
        let block = format.activation_block().max(ty.block_size());
        if cols % block != 0 {
            return Err(ModelError::Config(format!(
                "quantized weight {rows}x{cols} of {ty}: {cols} is not a multiple of {block}"
            )));
        }
        Ok(Self {
            weight,
            format,
            rows,
            cols,
            panels: None,
        })
    }

    /// This weight with its eight-row panel layout ([`panel8`]) made, where the process's kernel
    /// choice runs it through the AVX2 k-quant kernels and the format has one (every k-quant,
    /// IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1, with a multiple of eight rows); from then on those
    /// kernels read only the panels (the decode kernel 1.5-2.2x the one-row dots in cache on Zen
    /// 3), and the mapped file's pages of the GGUF rows are handed back to the page cache, so the
    /// process holds the weight once. Unchanged otherwise. Results are bit for bit the same either
    /// way, but for the decode of IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1: their panel kernels sum in
    /// the prompt GEMM's order, their one-row kernels in another (float rounding apart, the same
    /// sums).
    pub fn with_panels(self) -> Self {
        self.with_panels_for(process_kernel())
    }

    /// [`with_panels`](Self::with_panels) for the kernel choice `kernel`.
    pub fn with_panels_for(self, kernel: Kernel) -> Self {
        if self.panel_shape(kernel).is_none() {
            return self;
        }
        match self.pack_panels() {
            Ok(panels) => self.with_these_panels(Arc::new(panels)),
            Err(e) => {
                tracing::warn!(
                    "{:?} weight {}x{}: no panel layout ({e}); the GGUF rows are used",
                    self.weight.ty(),
                    self.rows,
                    self.cols
                );
                self
            }
        }
    }

    /// The panel layout the kernel choice `kernel` would read this weight in (format, rows,
    /// super-blocks per row); `None` where it reads the GGUF rows (not a k-quant, IQ4_XS, IQ4_NL,
    /// Q5_0 or Q5_1, no AVX2 k-quant path, rows not a multiple of eight).
    pub fn panel_shape(&self, kernel: Kernel) -> Option<PanelShape> {
        self.layout_shape().filter(|_| reads_panels(kernel))
    }

    /// The shape of this weight's panel layout, whichever kernels run: `None` for a weight that is
    /// not a k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 or Q5_1, or whose rows are not a multiple of
    /// eight.
    fn layout_shape(&self) -> Option<PanelShape> {
        let format = match self.format {
            Format::K(format) => PanelFormat::K(format),
            Format::IQ4_XS => PanelFormat::Iq4Xs,
            Format::IQ4_NL => PanelFormat::Iq4Nl,
            Format::MXFP4 => PanelFormat::Mxfp4,
            Format::Q5_0 => PanelFormat::Q5_0,
            Format::Q5_1 => PanelFormat::Q5_1,
            _ => return None,
        };
        let kb = self.cols / format.block_elements();
        panel8::fits(self.rows, kb).then_some(PanelShape {
            format,
            rows: self.rows,
            kb,
        })
    }

    /// The weight's panel layout, made from its GGUF rows (in parallel, into memory of its
    /// own); an error for a weight without one ([`panel_shape`](Self::panel_shape)) or when no
    /// memory could be mapped.
    pub fn pack_panels(&self) -> std::result::Result<panel8::Panels, String> {
        let shape = self.layout_shape().ok_or_else(|| {
            format!(
                "{:?} {}x{} has no panel layout",
                self.weight.ty(),
                self.rows,
                self.cols
            )
        })?;
        let raw = self.weight.bytes().map_err(|e| e.to_string())?;
        panel8::Panels::pack(shape.format, &raw, shape.rows, shape.kb).map_err(|e| e.to_string())
    }

    /// This weight reading `panels` (its own layout, made by [`pack_panels`](Self::pack_panels)
    /// now or at an earlier load: bit for bit the same) from now on; the mapped file's pages of
    /// the GGUF rows are handed back. Panels of another shape are refused (the weight is
    /// returned unchanged, with a warning).
    pub fn with_these_panels(mut self, panels: Arc<panel8::Panels>) -> Self {
        if self.layout_shape() != Some(panels.shape()) {
            tracing::warn!(
                "{:?} {}x{} weight: panels of {:?} refused",
                self.weight.ty(),
                self.rows,
                self.cols,
                panels.shape()
            );
            return self;
        }
        self.weight.release_pages();
        self.panels = Some(panels);
        self
    }

    /// Whether the weight is held in the panel layout too ([`with_panels`](Self::with_panels)).
    pub fn has_panels(&self) -> bool {
        self.panels.is_some()
    }

    /// The wrapped weight.
    pub fn weight(&self) -> &Blocks {
        &self.weight
    }

    /// Output features (weight rows).
    pub fn out_features(&self) -> usize {
        self.rows
    }

    /// Input features (weight columns).
    pub fn in_features(&self) -> usize {
        self.cols
    }

    /// Applies `x W^T` to a CPU tensor `x` of shape `[.., in]` (any float dtype; computed in
    /// f32 and returned in `x`'s dtype), with the process's kernel choice ([`process_kernel`]).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, process_kernel())
    }

    /// [`forward`](Self::forward) with an explicit kernel choice.
    pub fn forward_with(&self, x: &Tensor, kernel: Kernel) -> Result<Tensor> {
        let mut out = Self::forward_many(&[self], x, kernel)?;
        out.pop()
            .ok_or_else(|| candle_core::Error::Msg("quantized matmul: no output".into()).into())
    }

    /// Applies several weights with the same input width to one input `x` (`[.., in]`) in a
    /// single parallel pass: the activations are quantized once and the rows of every weight
    /// are split across the pool together, so e.g. the query, key and value projections cost
    /// one fork/join instead of three. Each result equals that weight's own
    /// [`forward_with`](Self::forward_with) exactly (same per-row kernel and activations).
    pub fn forward_many(mats: &[&Self], x: &Tensor, kernel: Kernel) -> Result<Vec<Tensor>> {
        let dims = x.dims();
        let Some((&last, lead)) = dims.split_last() else {
            return Err(candle_core::Error::Msg("quantized matmul: scalar input".into()).into());
        };
        if let Some(bad) = mats.iter().find(|mm| mm.cols != last) {
            return Err(ModelError::Config(format!(
                "quantized matmul: input has {last} features, the weight {}",
                bad.cols
            )));
        }
        let m: usize = lead.iter().product();
        let xf = x.to_dtype(DType::F32)?.contiguous()?;
        let mut outs: Vec<Vec<f32>> = mats.iter().map(|mm| vec![0f32; m * mm.rows]).collect();
        {
            let (storage, layout) = xf.storage_and_layout();
            let Storage::Cpu(cpu) = &*storage else {
                return Err(ModelError::Unsupported(
                    "CPU quantized matmul of an input that is not on the CPU".into(),
                ));
            };
            let all = cpu.as_slice::<f32>()?;
            let start = layout.start_offset();
            let input = all.get(start..start + m * last).ok_or_else(|| {
                candle_core::Error::Msg("quantized matmul: input storage too short".into())
            })?;
            let mut jobs: Vec<(&Self, &mut [f32])> = mats
                .iter()
                .copied()
                .zip(outs.iter_mut().map(Vec::as_mut_slice))
                .collect();
            matmul_many(&mut jobs, input, m, kernel)?;
        }
        mats.iter()
            .zip(outs)
            .map(|(mm, out)| {
                let mut shape = lead.to_vec();
                shape.push(mm.rows);
                Ok(Tensor::from_vec(out, shape, &Device::Cpu)?.to_dtype(x.dtype())?)
            })
            .collect()
    }

    /// `out[i, r] = sum_c x[i, c] * W[r, c]` for `x` of `m` rows of `in` features (row major)
    /// and `out` of `m` rows of `out` features.
    pub fn matmul_f32(&self, x: &[f32], m: usize, out: &mut [f32], kernel: Kernel) -> Result<()> {
        matmul_many(&mut [(self, out)], x, m, kernel)
    }
}

/// [`CpuQMatMul::matmul_f32`] for several weights of the same input width at once: `x` is
/// quantized once and every weight's rows go through one parallel pass.
fn matmul_many(
    jobs: &mut [(&CpuQMatMul, &mut [f32])],
    x: &[f32],
    m: usize,
    kernel: Kernel,
) -> Result<()> {
    matmul_many_with(jobs, x, m, kernel, tile::Tiling::Tiled)
}

/// [`matmul_many`] with the tiling chosen (the per-row one is the reference in tests).
fn matmul_many_with(
    jobs: &mut [(&CpuQMatMul, &mut [f32])],
    x: &[f32],
    m: usize,
    kernel: Kernel,
    tiling: tile::Tiling,
) -> Result<()> {
    let Some(k) = jobs.first().map(|(mm, _)| mm.cols) else {
        return Ok(());
    };
    for (mm, out) in jobs.iter() {
        if mm.cols != k || x.len() != m * k || out.len() != m * mm.rows {
            return Err(ModelError::Config(format!(
                "quantized matmul: {} inputs and {} outputs for {m} rows of {} -> {}",
                x.len(),
                out.len(),
                mm.cols,
                mm.rows
            )));
        }
    }
    let n_total: usize = jobs.iter().map(|(mm, _)| mm.rows).sum();
    if m == 0 || n_total == 0 {
        return Ok(());
    }
    let kb = k / BLOCK;
    let kinds = jobs.iter().map(|(mm, _)| mm.format.activation());
    let act = Activations::quantize(x, k, kinds, m * kb >= PARALLEL_MIN_BLOCKS);

    // The tiled loop (see `tile`): output rectangles of activation rows x weight rows.
    tile::run(jobs, &act, m, kb, kernel, tiling)
}
