//! [`PinnedBytes`]: page-locked host memory for the offload engine's slabs.
//!
//! Filled once on the host at load time (allocated uninitialised and written once, not zeroed
//! first: a slab is gigabytes), then only read by DMA copies on the copy stream. The allocation
//! is plain pinned memory (not write-combined), so the host may also read it (tests compare
//! slabs with the file).

use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
use candle_core::Device;

use super::cuda_device;
use crate::Result;

/// A page-locked host buffer.
pub struct PinnedBytes {
    /// Owns the allocation (freed on drop, after any copy that used it completes).
    _slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; `&self` only reads it and
// `&mut self` gives unique access, like a `Vec<u8>`.
unsafe impl Send for PinnedBytes {}
// SAFETY: as above.
unsafe impl Sync for PinnedBytes {}

impl std::fmt::Debug for PinnedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBytes")
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedBytes {
    /// `len` bytes of pinned memory in `device`'s context, not initialised.
    ///
    /// # Safety
    ///
    /// Every byte must be written (through [`PinnedBytes::as_mut_ptr`]) before any is read
    /// (through [`PinnedBytes::as_bytes`], [`PinnedBytes::as_bytes_mut`] or a copy).
    pub unsafe fn uninit(device: &Device, len: usize) -> Result<Self> {
        let ctx = cuda_device(device)?.cuda_stream().context().clone();
        // SAFETY: the caller writes the memory before anyone reads it.
        let mut slice = unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), 0) }?;
        let ptr = slice.as_mut_ptr()?;
        Ok(Self {
            _slice: slice,
            ptr,
            len,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the buffer, for writing (valid for `len` bytes while `self` lives).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably (only while no copy reads them: at load time).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, with unique access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
