//! Standard base64 (RFC 4648, `=` padded) for `encoding_format: "base64"` embeddings: the
//! vector's little-endian f32 bytes, as OpenAI sends them. The encoding is the `base64` crate's.

use ::base64::engine::general_purpose::STANDARD;
use ::base64::Engine;

/// `bytes` as base64 text.
pub fn encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
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
