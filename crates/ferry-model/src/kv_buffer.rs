//! Zero-filled CPU buffers for the KV cache whose memory becomes resident only where it is
//! written.
//!
//! A cache buffer holds `[1, n_kv_heads, capacity, head_dim]` and grows by doubling, so up to
//! half of its positions are not written yet, and in every head the unwritten positions are one
//! run of whole pages. `Tensor::zeros` writes every byte (and glibc's `calloc` clears reused
//! heap memory too), which makes the whole capacity resident. Here the page-aligned interior of
//! the allocation is handed back to the kernel instead (`madvise(MADV_DONTNEED)`: anonymous
//! memory reads as zeros afterwards and costs no page until it is written), and only the
//! partial pages at its two ends are cleared by hand. Where that call is not available or
//! fails, every byte is cleared as before. On other devices the buffer is `Tensor::zeros`.

use candle_core::{DType, Device, Shape, Tensor};

use super::error::Result;

/// A tensor of zeros of `shape` and `dtype` on `device`; on the CPU its untouched pages are not
/// resident.
pub fn zeroed(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
    let shape = shape.into();
    if !device.is_cpu() {
        return Ok(Tensor::zeros(shape, dtype, device)?);
    }
    let n = shape.elem_count();
    let tensor = match dtype {
        DType::F32 => Tensor::from_vec(zeroed_vec::<f32>(n), shape, device)?,
        DType::F16 => Tensor::from_vec(zeroed_vec::<half::f16>(n), shape, device)?,
        DType::BF16 => Tensor::from_vec(zeroed_vec::<half::bf16>(n), shape, device)?,
        DType::U8 => Tensor::from_vec(zeroed_vec::<u8>(n), shape, device)?,
        other => Tensor::zeros(shape, other, device)?,
    };
    Ok(tensor)
}

/// Element types whose all-zero bytes are a valid value (+0.0 for the floats, and the raw
/// bytes of a block-format cache).
trait ZeroBytes: Copy {}
impl ZeroBytes for u8 {}
impl ZeroBytes for f32 {}
impl ZeroBytes for half::f16 {}
impl ZeroBytes for half::bf16 {}

/// `n` zeros, with the page-aligned interior of the allocation left to the kernel to fill.
fn zeroed_vec<T: ZeroBytes>(n: usize) -> Vec<T> {
    let mut data: Vec<T> = Vec::with_capacity(n);
    let bytes = n * std::mem::size_of::<T>();
    let start = data.as_mut_ptr().cast::<u8>();
    // SAFETY: `start..start + bytes` is this vector's own allocation (capacity `n`), not yet
    // read by anyone; every byte of it is set to zero below (by the kernel for the interior
    // pages, by `write_bytes` for the rest) before the length is set, and zero bytes are a
    // valid `T` (`ZeroBytes`).
    unsafe {
        let (head, interior) = released_interior(start, bytes);
        std::ptr::write_bytes(start, 0, head);
        std::ptr::write_bytes(start.add(head + interior), 0, bytes - head - interior);
        data.set_len(n);
    }
    data
}

/// Gives the whole pages inside `start..start + bytes` back to the kernel, which fills them
/// with zeros when they are next touched. Returns the bytes before them and their length
/// (`(bytes, 0)` when nothing was released).
///
/// # Safety
/// `start..start + bytes` must be memory the caller owns, from the process's anonymous
/// (heap) memory, whose contents it no longer needs.
unsafe fn released_interior(start: *mut u8, bytes: usize) -> (usize, usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if page == 0 {
            return (bytes, 0);
        }
        let address = start as usize;
        let first = address.next_multiple_of(page);
        let end = (address + bytes) / page * page;
        if end <= first {
            return (bytes, 0);
        }
        // SAFETY: `first..end` lies inside the caller's anonymous allocation, page aligned;
        // MADV_DONTNEED on private anonymous memory only drops its pages (zero-filled on the
        // next touch), which the caller allows.
        let released =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
        if released == 0 {
            return (first - address, end - first);
        }
        (bytes, 0)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = start;
        (bytes, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident pages of `bytes` bytes at `start` (mincore), on Linux.
    #[cfg(target_os = "linux")]
    fn resident_pages(start: *const u8, bytes: usize) -> usize {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let first = (start as usize) / page * page;
        let end = (start as usize + bytes).next_multiple_of(page);
        let mut flags = vec![0u8; (end - first) / page];
        let rc = unsafe {
            libc::mincore(
                first as *mut libc::c_void,
                end - first,
                flags.as_mut_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mincore failed");
        flags.iter().filter(|f| *f & 1 == 1).count()
    }

    #[test]
    fn every_element_is_zero_even_over_reused_memory() {
        // Dirty heap memory first, so the allocation below may reuse non-zero bytes.
        for _ in 0..4 {
            let dirty = vec![0x5au8; 3 << 20];
            std::hint::black_box(&dirty);
        }
        for n in [0, 1, 7, 1000, 4096, 300_001, 1 << 20] {
            let data = zeroed_vec::<f32>(n);
            assert_eq!(data.len(), n);
            assert!(data.iter().all(|x| x.to_bits() == 0), "n = {n}");
            let data = zeroed_vec::<half::f16>(n);
            assert!(data.iter().all(|x| x.to_bits() == 0), "n = {n}");
        }
        let t = zeroed((1, 3, 1024, 64), DType::BF16, &Device::Cpu).unwrap();
        assert_eq!(t.dims(), &[1, 3, 1024, 64]);
        assert_eq!(t.dtype(), DType::BF16);
        let sum: f32 = t
            .to_dtype(DType::F32)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(sum, 0.0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn untouched_pages_are_not_resident_and_written_ones_are() {
        // Dirty memory the allocator will hand out again.
        let dirty = vec![0x5au8; 8 << 20];
        std::hint::black_box(&dirty);
        drop(dirty);
        let bytes = 8 << 20;
        let mut data = zeroed_vec::<f32>(bytes / 4);
        let pages = bytes / 4096;
        assert!(
            resident_pages(data.as_ptr().cast(), bytes) <= 2,
            "a fresh buffer should hold at most its two partial end pages"
        );
        for x in data.iter_mut().take(bytes / 8) {
            *x = 1.0;
        }
        let resident = resident_pages(data.as_ptr().cast(), bytes);
        assert!(
            resident >= pages / 2 && resident <= pages / 2 + 2,
            "{resident} of {pages} pages resident after writing half"
        );
        assert!(data[bytes / 8..].iter().all(|x| x.to_bits() == 0));
    }
}
