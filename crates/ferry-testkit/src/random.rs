//! Seeded pseudo-random data for tests and benches.

/// `len` pseudo-random bytes (a xorshift stream from `seed`), every bit pattern equally likely:
/// raw quant, high-bit and scale bytes before a caller writes its finite scales over them.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}
