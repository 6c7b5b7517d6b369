//! [`AlignedBytes`]: a fixed-size byte buffer whose start is 8-byte aligned (page-aligned when
//! pinned), the storage of host slabs and of the block region of CPU slots (GGML blocks need the
//! alignment of their f16/f32 scales; the tensors inside are placed 256-byte aligned by
//! [`super::layout`]).
//!
//! A slab is written once: [`AlignedBytes::write_once`] allocates it uninitialised and a
//! [`SlabWriter`] puts each tensor at its offset, zeroing only the alignment gaps between them,
//! so a slab of gigabytes is not zeroed first and overwritten after.
//!
//! [`HostMemory`] says where host slabs live: ordinary heap memory when the compute device is
//! the CPU, page-locked memory ([`ferry_gpu::PinnedBytes`]) when it is a CUDA device, so that
//! copies to the GPU are DMA transfers that overlap compute.

use std::mem::MaybeUninit;

use candle_core::Device;

use ferry_gpu::{GpuError, PinnedBytes};

/// Where host slabs are allocated.
#[derive(Debug, Clone)]
pub enum HostMemory {
    /// Pageable heap memory (the CPU device).
    Heap,
    /// Page-locked memory registered with this CUDA device's context.
    Pinned(Device),
}

impl HostMemory {
    /// Pinned memory for a CUDA device, the heap otherwise.
    pub fn for_device(device: &Device) -> Self {
        if device.is_cuda() {
            HostMemory::Pinned(device.clone())
        } else {
            HostMemory::Heap
        }
    }
}

#[derive(Debug)]
enum Memory {
    /// Backed by `u64` words, so the start is 8-byte aligned.
    Heap(Vec<u64>),
    /// Page-aligned pinned memory.
    Pinned(PinnedBytes),
}

/// A zero-initialised byte buffer whose start is at least 8-byte aligned.
#[derive(Debug)]
pub struct AlignedBytes {
    memory: Memory,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes on the heap (one allocation, rounded up to whole words).
    pub fn zeroed(len: usize) -> Self {
        Self {
            memory: Memory::Heap(vec![0u64; len.div_ceil(8)]),
            len,
        }
    }

    /// `len` bytes in `memory`, written once by `fill` through a [`SlabWriter`]; the bytes it
    /// leaves out are zero. Nothing is zeroed first.
    pub fn write_once<E: From<GpuError> + From<WriteError>>(
        len: usize,
        memory: &HostMemory,
        fill: impl FnOnce(&mut SlabWriter<'_>) -> Result<(), E>,
    ) -> Result<Self, E> {
        match memory {
            HostMemory::Heap => {
                let words = len.div_ceil(8);
                let mut v: Vec<u64> = Vec::with_capacity(words);
                let spare = v.spare_capacity_mut();
                // SAFETY: `spare` is `words` uninitialised u64s; seen as bytes, they are
                // `words * 8` uninitialised bytes of the same allocation.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(
                        spare.as_mut_ptr() as *mut MaybeUninit<u8>,
                        words * 8,
                    )
                };
                let mut writer = SlabWriter::new(bytes);
                fill(&mut writer)?;
                writer.finish();
                // SAFETY: the writer initialised all `words * 8` bytes.
                unsafe { v.set_len(words) };
                Ok(Self {
                    memory: Memory::Heap(v),
                    len,
                })
            }
            HostMemory::Pinned(device) => {
                // SAFETY: every byte is written below (the writer zeroes what `fill` leaves)
                // before the buffer is returned and can be read.
                let mut pinned = unsafe { PinnedBytes::uninit(device, len) }?;
                // SAFETY: `as_mut_ptr` is valid for `len` bytes while `pinned` lives.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(pinned.as_mut_ptr() as *mut MaybeUninit<u8>, len)
                };
                let mut writer = SlabWriter::new(bytes);
                fill(&mut writer)?;
                writer.finish();
                Ok(Self {
                    memory: Memory::Pinned(pinned),
                    len,
                })
            }
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the bytes are page-locked.
    pub fn is_pinned(&self) -> bool {
        matches!(self.memory, Memory::Pinned(_))
    }

    /// Bytes allocated (whole words on the heap).
    pub fn capacity_bytes(&self) -> usize {
        match &self.memory {
            Memory::Heap(words) => words.capacity() * 8,
            Memory::Pinned(p) => p.len(),
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.memory {
            // SAFETY: `words` owns at least `len` initialised bytes; u8 has no alignment needs.
            Memory::Heap(words) => unsafe {
                std::slice::from_raw_parts(words.as_ptr() as *const u8, self.len)
            },
            Memory::Pinned(p) => p.as_bytes(),
        }
    }

    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.memory {
            // SAFETY: as in `as_bytes`, with unique access through `&mut self`.
            Memory::Heap(words) => unsafe {
                std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, self.len)
            },
            Memory::Pinned(p) => p.as_bytes_mut(),
        }
    }
}

/// A write out of order or past the end of a slab.
#[derive(Debug, thiserror::Error)]
#[error("slab write of {len} bytes at {start}: {reason}")]
pub struct WriteError {
    start: usize,
    len: usize,
    reason: &'static str,
}

/// Writes a slab once, front to back: [`SlabWriter::put`] places bytes at increasing offsets and
/// zeroes the gap before them; the tail is zeroed when the writer finishes.
pub struct SlabWriter<'a> {
    bytes: &'a mut [MaybeUninit<u8>],
    cursor: usize,
}

impl<'a> SlabWriter<'a> {
    fn new(bytes: &'a mut [MaybeUninit<u8>]) -> Self {
        Self { bytes, cursor: 0 }
    }

    /// Writes `src` at `start`, which must not be before the end of the previous write.
    pub fn put(&mut self, start: usize, src: &[u8]) -> Result<(), WriteError> {
        let err = |reason| WriteError {
            start,
            len: src.len(),
            reason,
        };
        if start < self.cursor {
            return Err(err("before the end of the previous write"));
        }
        let end = start
            .checked_add(src.len())
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| err("past the end of the slab"))?;
        self.bytes[self.cursor..start].fill(MaybeUninit::new(0));
        for (d, s) in self.bytes[start..end].iter_mut().zip(src) {
            *d = MaybeUninit::new(*s);
        }
        self.cursor = end;
        Ok(())
    }

    fn finish(mut self) {
        let cursor = self.cursor;
        self.bytes[cursor..].fill(MaybeUninit::new(0));
        self.cursor = self.bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::{AlignedBytes, HostMemory, WriteError};

    #[derive(Debug)]
    enum TestError {
        #[allow(dead_code)]
        Gpu(ferry_gpu::GpuError),
        Write(WriteError),
    }
    impl From<ferry_gpu::GpuError> for TestError {
        fn from(e: ferry_gpu::GpuError) -> Self {
            TestError::Gpu(e)
        }
    }
    impl From<WriteError> for TestError {
        fn from(e: WriteError) -> Self {
            TestError::Write(e)
        }
    }

    #[test]
    fn a_slab_is_written_once_with_zero_gaps() {
        let slab = AlignedBytes::write_once(13, &HostMemory::Heap, |w| -> Result<(), TestError> {
            w.put(2, &[1, 2])?;
            w.put(6, &[3])?;
            Ok(())
        })
        .expect("written");
        assert_eq!(slab.as_bytes(), &[0, 0, 1, 2, 0, 0, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(slab.as_bytes().as_ptr() as usize % 8, 0);
    }

    #[test]
    fn out_of_order_or_oversized_writes_are_errors() {
        let back = AlignedBytes::write_once(8, &HostMemory::Heap, |w| -> Result<(), TestError> {
            w.put(4, &[1, 2])?;
            w.put(5, &[3])?;
            Ok(())
        });
        assert!(matches!(back, Err(TestError::Write(ref e)) if e.to_string().contains("previous")));
        let long = AlignedBytes::write_once(8, &HostMemory::Heap, |w| -> Result<(), TestError> {
            w.put(6, &[1, 2, 3])?;
            Ok(())
        });
        assert!(
            matches!(long, Err(TestError::Write(ref e)) if e.to_string().contains("past the end"))
        );
    }

    #[test]
    fn is_aligned_and_sized() {
        let mut b = AlignedBytes::zeroed(13);
        assert_eq!(b.len(), 13);
        assert!(!b.is_pinned());
        assert_eq!(b.as_bytes().as_ptr() as usize % 8, 0);
        assert!(b.capacity_bytes() >= 13 && b.capacity_bytes() < 13 + 8);
        b.as_bytes_mut()[12] = 7;
        assert_eq!(b.as_bytes()[12], 7);
        assert!(b.as_bytes()[..12].iter().all(|&x| x == 0));
    }

    #[test]
    fn the_cpu_device_gets_heap_memory() {
        let memory = HostMemory::for_device(&candle_core::Device::Cpu);
        assert!(matches!(memory, HostMemory::Heap));
        let b = AlignedBytes::write_once(5, &memory, |_| Ok::<(), TestError>(())).expect("heap");
        assert_eq!(b.as_bytes(), &[0; 5]);
        assert!(!b.is_pinned());
    }
}
