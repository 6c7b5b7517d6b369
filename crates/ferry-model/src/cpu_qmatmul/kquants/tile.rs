//! The k-quant micro-kernels of the tiled matmul ([`crate::cpu_qmatmul::tile`]): one
//! raw GGUF weight row dotted with four rows of [`Q8KBlock`]s at once ([`rows4`]; eight on
//! AVX-512, [`rows8`]), each weight super-block (its quants and its scales) unpacked once for
//! all of them.
//!
//! Three implementations, picked at run time by [`Path::detect`] after the caller's [`Kernel`]
//! choice: AVX-512 (BW + VNNI, zmm: [`super::avx512_tile`], Q4_K..Q6_K; Q2_K and Q3_K take
//! the ymm kernels there), AVX2 with AVX-VNNI's `vpdpwssd` and plain AVX2
//! ([`super::avx2_tile`], every k-quant); without AVX2 the tile falls back to four one-row scalar dots
//! ([`super::scalar`], the reference). Every path reduces each block to the same two exact
//! integers per activation row as the one-row kernels and combines them with the same f32
//! operations in the same order ([`super::block_value`]), so the tiled results are bit for
//! bit the one-row ones. Prompts on AMX CPUs take [`super::amx_tile`] instead (equal too).

use super::activation::Q8KBlock;
use super::KFormat;
use crate::cpu_qmatmul::Kernel;

/// Four activation rows of the same number of super-blocks.
pub type Rows4K<'a> = [&'a [Q8KBlock]; 4];

/// A SIMD implementation of the four-row kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// zmm, `vpmaddubsw` + `vpdpwssd` (AVX-512 F, BW and VNNI).
    Avx512,
    /// ymm, `vpmaddubsw` + VEX `vpdpwssd` (AVX2 and AVX-VNNI).
    Avx2Vnni,
    /// ymm, `vpmaddubsw` + `vpmaddwd` + `vpaddd` (AVX2, FMA, F16C).
    Avx2,
}

impl Path {
    /// The fastest path this CPU runs that `kernel` allows (read once per choice): the
    /// AVX-512 tiles for [`Kernel::Auto`] and [`Kernel::Avx512`], AVX-VNNI or AVX2 for
    /// [`Kernel::AvxVnni`], AVX2 for [`Kernel::Avx2`], `None` for [`Kernel::Scalar`] and
    /// without AVX2.
    pub fn detect(kernel: Kernel) -> Option<Path> {
        use std::sync::OnceLock;
        static FASTEST: OnceLock<Option<Path>> = OnceLock::new();
        static VNNI: OnceLock<Option<Path>> = OnceLock::new();
        static AVX2: OnceLock<Option<Path>> = OnceLock::new();
        let first = |allowed: fn(Path) -> bool| {
            Path::all()
                .into_iter()
                .find(|&p| allowed(p) && p.available())
        };
        match kernel {
            Kernel::Auto | Kernel::Avx512 => *FASTEST.get_or_init(|| first(|_| true)),
            Kernel::AvxVnni => *VNNI.get_or_init(|| first(|p| p != Path::Avx512)),
            Kernel::Avx2 => *AVX2.get_or_init(|| first(|p| p == Path::Avx2)),
            Kernel::Scalar => None,
        }
    }

    /// Every path, fastest first.
    pub fn all() -> [Path; 3] {
        [Path::Avx512, Path::Avx2Vnni, Path::Avx2]
    }

    /// Whether this CPU runs the path.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::cpu_qmatmul::{avx2::Avx2, avx2_tile::has_vnni};
            match self {
                Path::Avx512 => super::avx512_tile::Avx512::detect().is_some(),
                Path::Avx2Vnni => has_vnni(),
                Path::Avx2 => Avx2::detect().is_some(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }
}

/// Panics unless the activation rows `a` are equally long and `w` holds a `format` row of
/// their length (what the SIMD kernels' unchecked reads rely on).
fn check_rows(format: KFormat, w: &[u8], a: &[&[Q8KBlock]]) {
    let kb = a[0].len();
    assert!(
        a.iter().all(|r| r.len() == kb),
        "{format:?}: activation rows differ in length"
    );
    assert!(
        w.len() >= format.block_bytes() * kb,
        "{format:?} row too short"
    );
}

/// Whether `format` has four-row kernels (the others use four one-row dots): every k-quant
/// (Q2_K and Q3_K only on the ymm kernels: on [`Path::Avx512`] they take the AVX2 ones).
pub fn has_tile(format: KFormat) -> bool {
    let _ = format;
    true
}

/// Whether `format` has zmm kernels ([`super::avx512_tile`]).
fn has_zmm_tile(format: KFormat) -> bool {
    matches!(format, KFormat::Q4K | KFormat::Q5K | KFormat::Q6K)
}

/// The dot products of one `format` row `w` with each of the four rows `a` on `path`, `None`
/// when the path is not available on this CPU or `format` has no four-row kernel.
pub fn rows4(path: Path, format: KFormat, w: &[u8], a: Rows4K<'_>) -> Option<[f32; 4]> {
    if !has_tile(format) || !path.available() {
        return None;
    }
    check_rows(format, w, &a);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `path.available()` proves the features the path needs; the asserts bound
        // every read of `w` and make the four rows equally long.
        unsafe {
            Some(match path {
                Path::Avx512 if has_zmm_tile(format) => {
                    super::avx512_tile::rows4(format, w.as_ptr(), a)
                }
                Path::Avx512 if Path::Avx2Vnni.available() => {
                    super::avx2_tile::rows4::<true>(format, w.as_ptr(), a)
                }
                Path::Avx512 => super::avx2_tile::rows4::<false>(format, w.as_ptr(), a),
                Path::Avx2Vnni => super::avx2_tile::rows4::<true>(format, w.as_ptr(), a),
                Path::Avx2 => super::avx2_tile::rows4::<false>(format, w.as_ptr(), a),
            })
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Eight activation rows of the same number of super-blocks.
pub type Rows8K<'a> = [&'a [Q8KBlock]; 8];

/// Whether `format` has an eight-row kernel on `path` (AVX-512 only: eight zmm accumulators
/// fit its 32 registers, eight ymm ones do not fit AVX2's 16).
pub fn has_rows8(path: Path, format: KFormat) -> bool {
    path == Path::Avx512 && has_zmm_tile(format) && path.available()
}

/// [`rows4`] for eight rows: one weight block unpacked for eight activation rows (`None`
/// where [`has_rows8`] is false).
pub fn rows8(path: Path, format: KFormat, w: &[u8], a: Rows8K<'_>) -> Option<[f32; 8]> {
    if !has_rows8(path, format) {
        return None;
    }
    check_rows(format, w, &a);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `has_rows8` proves AVX-512 (and AVX2); the asserts bound every read of `w`
        // and make the rows equally long.
        unsafe { Some(super::avx512_tile::rows8(format, w.as_ptr(), a)) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(test)]
#[path = "tile_tests.rs"]
mod tests;
