//! The AMX core of the CPU quantized matmul: whether this CPU and OS can run Intel's Advanced
//! Matrix Extensions (AMX-TILE and AMX-INT8, Sapphire Rapids and later), the tile
//! configuration, the tile instructions as macros over `asm!`, and the packing of activation
//! rows into the layout of a tile multiply's second operand.
//!
//! A tile multiply `tdpb??d C, A, B` adds to each i32 `C[i][j]` (16 x 16 at most) the dot
//! product of row `i` of `A` (up to 64 bytes) with column `j` of `B`, where `B` is stored four
//! bytes of `K` at a time: row `r` of `B` holds bytes `4r..4r + 4` of each of the (up to 16)
//! columns ([`pack_b`]). The prompt kernels put sixteen decoded *weight* rows in `A` (row
//! major, as the weights are stored) and sixteen *activation* rows in `B`, so the outputs come
//! out with weight rows down `C` and activation rows across it. The two letters after `tdpb`
//! say which operand is signed (`s`) or unsigned (`u`): `tdpbusd` is unsigned `A` times
//! signed `B`, `tdpbssd` both signed.
//!
//! Linux hands out the tile state (8 KiB per thread) only after the process asks for it with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; [`Amx::detect`] asks once and
//! answers `None` if the CPU lacks the features or the kernel refuses (then the AVX-512 and
//! AVX2 paths run). Tile registers are not known to the compiler, which never uses them: a
//! kernel loads a configuration ([`TileConfig::load`]), keeps values in tiles across `asm!`
//! blocks, and calls [`release`] before it returns.

use std::sync::OnceLock;

use super::avx512::Avx512;

/// Proof that this CPU has AMX-TILE and AMX-INT8, that the OS let this process use them, and
/// that the AVX-512 kernels (which scale the tiles' integer sums) run here too.
#[derive(Debug, Clone, Copy)]
pub struct Amx {
    /// The AVX-512 proof the kernels also need.
    pub avx512: Avx512,
}

/// `arch_prctl` request: permission to use an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
/// The extended state component of the tile data.
const XFEATURE_XTILEDATA: libc::c_long = 18;

impl Amx {
    /// `Some` when the tile kernels can run (asks the OS for the tile state the first time).
    pub fn detect() -> Option<Self> {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        let avx512 = Avx512::detect()?;
        let granted = *GRANTED.get_or_init(|| {
            if std::env::var_os("FERRY_NO_AMX").is_some() || !cpu_has_amx_int8() {
                return false;
            }
            // SAFETY: a plain system call with integer arguments; it changes only whether
            // this process may use the tile state.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            if rc != 0 {
                tracing::debug!("the kernel refused AMX tile state (arch_prctl rc {rc})");
            }
            rc == 0
        });
        granted.then_some(Amx { avx512 })
    }
}

/// CPUID leaf 7, sub-leaf 0: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // Leaf 7 exists where the maximum leaf (leaf 0's EAX) reaches it.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Tile registers (palette 1).
pub const TILES: usize = 8;
/// Rows of a tile at most.
pub const MAX_ROWS: usize = 16;
/// Bytes per tile row at most.
pub const MAX_COLSB: usize = 64;

/// A tile configuration (palette 1): each tile's rows and bytes per row; unused tiles zero.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved2: [u8; 16],
}

impl Default for TileConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl TileConfig {
    /// A configuration with no tile in use.
    pub const fn new() -> Self {
        TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            reserved2: [0; 16],
        }
    }

    /// Tile `t` gets `rows` rows of `colsb` bytes.
    pub const fn tile(mut self, t: usize, rows: usize, colsb: usize) -> Self {
        assert!(t < TILES && rows > 0 && rows <= MAX_ROWS);
        assert!(colsb > 0 && colsb <= MAX_COLSB && colsb.is_multiple_of(4));
        self.colsb[t] = colsb as u16;
        self.rows[t] = rows as u8;
        self
    }

    /// Loads this configuration on the calling thread (zeroing every tile).
    ///
    /// # Safety
    /// `amx` proves the CPU and permission; the caller must [`release`] before it returns
    /// control to code that does not know about tiles.
    #[inline]
    pub unsafe fn load(&self, amx: Amx) {
        let _ = amx;
        std::arch::asm!("ldtilecfg [{}]", in(reg) self as *const Self, options(nostack, readonly));
    }
}

/// Returns the tile state of the calling thread to its initial state.
///
/// # Safety
/// The CPU must have AMX (an [`Amx`] exists).
#[inline]
pub unsafe fn release() {
    std::arch::asm!("tilerelease", options(nostack, nomem));
}

/// `tileloadd tmmT, [ptr + stride]`: loads tile `T`'s rows from `ptr`, `stride` bytes apart.
///
/// # Safety
/// A configuration that defines tile `T` is loaded; every row's bytes are readable.
#[macro_export]
#[doc(hidden)]
macro_rules! amx_tile_load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        ::std::arch::asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s} * 1]"),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, readonly)
        )
    };
}

/// `tilestored [ptr + stride], tmmT`: stores tile `T`'s rows to `ptr`, `stride` bytes apart.
///
/// # Safety
/// A configuration that defines tile `T` is loaded; every row's bytes are writable.
#[macro_export]
#[doc(hidden)]
macro_rules! amx_tile_store {
    ($t:literal, $ptr:expr, $stride:expr) => {
        ::std::arch::asm!(
            concat!("tilestored [{p} + {s} * 1], tmm", $t),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack)
        )
    };
}

/// `tilezero tmmT`.
///
/// # Safety
/// A configuration that defines tile `T` is loaded.
#[macro_export]
#[doc(hidden)]
macro_rules! amx_tile_zero {
    ($t:literal) => {
        ::std::arch::asm!(concat!("tilezero tmm", $t), options(nostack, nomem))
    };
}

/// `tdpbXYd tmmC, tmmA, tmmB` with `$op` one of `tdpbusd` (unsigned A, signed B), `tdpbssd`,
/// `tdpbsud` (signed A, unsigned B), `tdpbuud`: `C[i][j] += sum_k A[i][k] * B[k][j]`.
///
/// # Safety
/// A configuration is loaded whose tile shapes agree (`A`'s bytes per row = 4 x `B`'s rows,
/// `C` has `A`'s rows and `B`'s bytes per row).
#[macro_export]
#[doc(hidden)]
macro_rules! amx_dot {
    ($op:literal, $c:literal, $a:literal, $b:literal) => {
        ::std::arch::asm!(
            concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem)
        )
    };
}

pub use crate::{
    amx_dot as dot, amx_tile_load as load, amx_tile_store as store, amx_tile_zero as zero,
};

/// Packs `k` bytes (a multiple of 4, at most 64) of each of `rows.len()` (at most 16) rows
/// into the second-operand layout of a tile multiply: `k / 4` rows of 64 bytes, row `r`
/// holding bytes `4r..4r + 4` of row `j` at bytes `4j..4j + 4`. Columns of missing rows are
/// zero. `dst` must hold `16 * k` bytes.
pub fn pack_b(rows: &[&[i8]], k: usize, dst: &mut [i8]) {
    assert!(rows.len() <= MAX_ROWS && k.is_multiple_of(4) && k <= MAX_COLSB && dst.len() >= 16 * k);
    let quads = k / 4;
    for r in 0..quads {
        let line = &mut dst[r * 64..(r + 1) * 64];
        for (j, word) in line.chunks_exact_mut(4).enumerate() {
            match rows.get(j) {
                Some(row) => word.copy_from_slice(&row[4 * r..4 * r + 4]),
                None => word.fill(0),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C[i][j] = sum_k A[i][k] * B[k][j]` for unsigned `A` (`m x k`) and signed `B` given as
    /// its `n` columns (`n x k`).
    fn reference(a: &[u8], cols: &[Vec<i8>], m: usize, k: usize) -> Vec<i32> {
        let mut c = vec![0i32; m * 16];
        for i in 0..m {
            for (j, col) in cols.iter().enumerate() {
                c[i * 16 + j] = (0..k)
                    .map(|x| i32::from(a[i * k + x]) * i32::from(col[x]))
                    .sum();
            }
        }
        c
    }

    #[test]
    fn a_tile_product_equals_the_integer_dot_products_of_rows_and_packed_columns() {
        let Some(amx) = Amx::detect() else {
            eprintln!("skipped: this CPU or OS has no AMX-INT8");
            return;
        };
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        // Full and partial tiles: 16 x 16 over 64 bytes, and 5 weight rows x 11 columns
        // over 32 bytes (the shapes of a 32-element block with a short last task).
        for (m, n, k) in [(16usize, 16usize, 64usize), (5, 11, 32)] {
            let a: Vec<u8> = (0..m * k).map(|_| next() as u8).collect();
            let cols: Vec<Vec<i8>> = (0..n)
                .map(|_| (0..k).map(|_| next() as i8).collect())
                .collect();
            let views: Vec<&[i8]> = cols.iter().map(Vec::as_slice).collect();
            let mut b = vec![0i8; 16 * k];
            pack_b(&views, k, &mut b);
            let mut c = vec![-1i32; m * 16];
            let cfg = TileConfig::new()
                .tile(0, m, 64)
                .tile(1, m, k)
                .tile(2, k / 4, 64);
            // SAFETY: `amx` proves the features; the tiles' rows lie within `a`, `b`, `c`.
            unsafe {
                cfg.load(amx);
                zero!("0");
                load!("1", a.as_ptr(), k);
                load!("2", b.as_ptr(), 64usize);
                dot!("tdpbusd", "0", "1", "2");
                store!("0", c.as_mut_ptr(), 64usize);
                release();
            }
            assert_eq!(c, reference(&a, &cols, m, k), "{m} x {n} over {k}");
        }
    }

    #[test]
    fn packing_puts_four_bytes_of_each_row_side_by_side_and_zeroes_missing_rows() {
        let rows: Vec<Vec<i8>> = (0..3)
            .map(|j| (0..8).map(|x| (10 * j + x) as i8).collect())
            .collect();
        let views: Vec<&[i8]> = rows.iter().map(Vec::as_slice).collect();
        let mut b = vec![7i8; 16 * 8];
        pack_b(&views, 8, &mut b);
        assert_eq!(&b[..12], &[0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]);
        assert_eq!(&b[64..76], &[4, 5, 6, 7, 14, 15, 16, 17, 24, 25, 26, 27]);
        assert!(b[12..64].iter().chain(&b[76..128]).all(|&x| x == 0));
    }
}
