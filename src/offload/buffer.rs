//! [`AlignedBytes`]: a fixed-size, 8-byte-aligned byte buffer, the storage of host slabs and of
//! the block region of device slots (GGML blocks need the alignment of their f16/f32 scales).

/// A zero-initialised byte buffer backed by `u64` words, so its start is 8-byte aligned.
#[derive(Debug, Clone)]
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes (one allocation, rounded up to whole words).
    pub fn zeroed(len: usize) -> Self {
        Self {
            words: vec![0u64; len.div_ceil(8)],
            len,
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

    /// Bytes allocated (whole words).
    pub fn capacity_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `words` owns at least `len` initialised bytes, and u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, with unique access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedBytes;

    #[test]
    fn is_aligned_and_sized() {
        let mut b = AlignedBytes::zeroed(13);
        assert_eq!(b.len(), 13);
        assert_eq!(b.as_bytes().as_ptr() as usize % 8, 0);
        assert!(b.capacity_bytes() >= 13 && b.capacity_bytes() < 13 + 8);
        b.as_bytes_mut()[12] = 7;
        assert_eq!(b.as_bytes()[12], 7);
        assert!(b.as_bytes()[..12].iter().all(|&x| x == 0));
    }
}
