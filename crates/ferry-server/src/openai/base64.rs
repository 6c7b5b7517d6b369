//! Standard base64 (RFC 4648, `=` padded) of bytes, for `encoding_format: "base64"` embeddings:
//! the only place the server writes base64, too small to take a dependency for.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` as base64 text.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `values` as little-endian f32 bytes in base64 (what OpenAI sends for `base64` embeddings).
pub fn encode_f32_le(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    encode(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_rfc_4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, coded) in cases {
            assert_eq!(encode(plain.as_bytes()), coded, "{plain:?}");
        }
        assert_eq!(encode(&[0xff, 0xfe, 0x3e]), "//4+");
    }

    #[test]
    fn floats_are_little_endian() {
        // 1.0f32 = 0x3f800000, little-endian 00 00 80 3f; -2.0 = 0xc0000000.
        assert_eq!(encode_f32_le(&[1.0]), "AACAPw==");
        assert_eq!(encode_f32_le(&[1.0, -2.0]), "AACAPwAAAMA=");
    }
}
