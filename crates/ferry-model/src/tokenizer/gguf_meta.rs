//! Typed reads of GGUF metadata for the tokenizer builders: a missing key is `None`, a present key
//! of the wrong type is a [`ModelError::Config`] naming the key.

use std::borrow::Cow;

use candle_core::quantized::gguf_file::Value;

use crate::error::{ModelError, Result};
use crate::header::GgufMetadata;

/// Typed access to GGUF metadata; a present key with the wrong type is a config error.
pub(super) struct Meta<'a>(pub GgufMetadata<'a>);

impl<'a> Meta<'a> {
    fn bad(key: &str, what: &str) -> ModelError {
        ModelError::Config(format!("GGUF metadata `{key}` is not {what}"))
    }

    /// The value of `key`, which should be `what`: an array of strings left in the file is not.
    fn value(&self, key: &str, what: &str) -> Result<Option<&'a Value>> {
        match self.0.value(key) {
            None if self.0.in_file(key) => Err(Self::bad(key, what)),
            value => Ok(value),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.value(key, "a string")? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(Self::bad(key, "a string")),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.value(key, "a boolean")? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => int_of(v)
                .map(|i| Some(i != 0))
                .ok_or_else(|| Self::bad(key, "a boolean")),
        }
    }

    pub fn u32(&self, key: &str) -> Result<Option<u32>> {
        match self.value(key, "a token id")? {
            None => Ok(None),
            Some(v) => int_of(v)
                .and_then(|i| u32::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| Self::bad(key, "a token id")),
        }
    }

    /// An array of strings, borrowed from the file (or the values) where it can be.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<Cow<'a, str>>>> {
        self.0
            .strings(key)
            .map_err(|e| ModelError::Config(format!("GGUF metadata {e}")))
    }

    pub fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.value(key, "an array of integers")? {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| int_of(v).ok_or_else(|| Self::bad(key, "an array of integers")))
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(Self::bad(key, "an array of integers")),
        }
    }
}

impl Meta<'_> {
    /// An array of numbers as f32 (llama.cpp reads `tokenizer.ggml.scores` as f32 or i32).
    pub fn floats(&self, key: &str) -> Result<Option<Vec<f32>>> {
        match self.value(key, "an array of numbers")? {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::F32(x) => Ok(*x),
                    Value::F64(x) => Ok(*x as f32),
                    other => int_of(other)
                        .map(|i| i as f32)
                        .ok_or_else(|| Self::bad(key, "an array of numbers")),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(Self::bad(key, "an array of numbers")),
        }
    }
}

/// Any GGUF integer as i64 (`None` for non-integers and u64 beyond i64).
fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::U8(x) => Some(i64::from(*x)),
        Value::I8(x) => Some(i64::from(*x)),
        Value::U16(x) => Some(i64::from(*x)),
        Value::I16(x) => Some(i64::from(*x)),
        Value::U32(x) => Some(i64::from(*x)),
        Value::I32(x) => Some(i64::from(*x)),
        Value::U64(x) => i64::try_from(*x).ok(),
        Value::I64(x) => Some(*x),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::GgufHeader;

    #[test]
    fn an_array_of_strings_left_in_the_file_is_not_any_other_type() {
        // GGUF v3, no tensors, one key `k`: an array (9) of one string (8), "ab".
        let mut bytes = b"GGUF\x03\0\0\0".to_vec();
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.push(b'k');
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&8u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(b"ab");
        let header = GgufHeader::parse(&bytes).expect("parses");
        let meta = Meta(GgufMetadata::new(&header, &bytes));
        let strings = meta.strings("k").expect("strings").expect("present");
        assert_eq!(strings, ["ab"]);
        for err in [
            meta.str("k").map(|_| ()),
            meta.bool("k").map(|_| ()),
            meta.u32("k").map(|_| ()),
            meta.ints("k").map(|_| ()),
            meta.floats("k").map(|_| ()),
        ] {
            let err = err.expect_err("not that type").to_string();
            assert!(err.contains("GGUF metadata `k` is not"), "{err}");
        }
        assert!(matches!(meta.str("missing"), Ok(None)));
    }
}
