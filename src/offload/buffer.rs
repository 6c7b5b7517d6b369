//! [`AlignedBytes`]: a fixed-size byte buffer whose start is 8-byte aligned (page-aligned when
//! pinned), the storage of host slabs and of the block region of CPU slots (GGML blocks need the
//! alignment of their f16/f32 scales; the tensors inside are placed 256-byte aligned by
//! [`super::layout`]).
//!
//! [`HostMemory`] says where host slabs live: ordinary heap memory when the compute device is
//! the CPU, page-locked memory ([`crate::gpu::PinnedBytes`]) when it is a CUDA device, so that
//! copies to the GPU are DMA transfers that overlap compute.

use candle_core::Device;

use crate::gpu::{GpuError, PinnedBytes};

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

    /// `len` zero bytes in `memory`.
    pub fn zeroed_in(len: usize, memory: &HostMemory) -> Result<Self, GpuError> {
        match memory {
            HostMemory::Heap => Ok(Self::zeroed(len)),
            HostMemory::Pinned(device) => Ok(Self {
                memory: Memory::Pinned(PinnedBytes::zeroed(device, len)?),
                len,
            }),
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

#[cfg(test)]
mod tests {
    use super::{AlignedBytes, HostMemory};

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
        let b = AlignedBytes::zeroed_in(5, &memory).expect("heap");
        assert_eq!(b.as_bytes(), &[0; 5]);
    }
}
