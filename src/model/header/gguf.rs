//! ferry's GGUF header reader: metadata and tensor infos (name, shape, type, offset) for every
//! ggml type id, read from the file's bytes without touching tensor data.
//!
//! Layout (GGUF v2/v3, little-endian; v1 has 32-bit counts and lengths):
//!
//! ```text
//! "GGUF" u32 version  u64 tensor_count  u64 kv_count
//! kv_count x    (string key, u32 value type, value)
//! tensor_count x (string name, u32 n_dims, u64 dims[n_dims] (fastest first), u32 type, u64 offset)
//! padding to `general.alignment` (default 32), then the tensor data; offsets are relative to it
//! ```
//!
//! candle's `gguf_file::Content::read` rejects a file as soon as one tensor has a type candle
//! does not know (IQ4_NL, IQ4_XS, MXFP4, ...); this reader knows every type of
//! [`GgufType`], so such files can be sized, planned and refused (or, later, run) by name.
//! Metadata values use candle's [`Value`] so the tokenizer reads them unchanged.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::ggml_type::GgufType;

/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest string or array accepted (llama.cpp's caps).
const MAX_LENGTH: u64 = 1 << 30;
/// Most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted.
const MAX_DEPTH: usize = 64;

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Row-major dimensions (GGUF stores them fastest first; this is reversed, as candle does).
    pub shape: Vec<usize>,
    /// Element type.
    pub ty: GgufType,
    /// Byte offset of the data, relative to [`GgufHeader::data_offset`].
    pub offset: u64,
    /// Bytes of the data.
    pub len: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn elem_count(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Format version (1, 2 or 3).
    pub version: u32,
    /// Metadata key-value pairs.
    pub metadata: HashMap<String, Value>,
    /// Tensors in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Alignment of the data section.
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
    index: HashMap<String, usize>,
}

impl GgufHeader {
    /// Parses the header at the start of `bytes` (the whole file, usually memory-mapped), and
    /// checks that every tensor's data lies inside it.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader {
            bytes,
            pos: 0,
            wide: true,
        };
        let magic = r.take(4)?;
        if magic != b"GGUF" {
            return Err(format!("bad magic {magic:02x?} (expected \"GGUF\")"));
        }
        let version = r.u32()?;
        if !(1..=3).contains(&version) {
            return Err(format!("unsupported GGUF version {version}"));
        }
        r.wide = version >= 2;
        let tensor_count = r.length("tensor count")?;
        let kv_count = r.length("metadata count")?;
        let mut metadata = HashMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r
                .value(ty, 0)
                .map_err(|e| format!("metadata `{key}`: {e}"))?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::new();
        for _ in 0..tensor_count {
            tensors.push(r.tensor_info()?);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.to_u32() {
                Ok(a) if a > 0 && a.is_power_of_two() => a as u64,
                _ => return Err(format!("general.alignment {v:?} is not a power of two")),
            },
        };
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|start| start.checked_add(t.len));
            if end.is_none_or(|end| end > file_len) {
                return Err(format!(
                    "tensor `{}` ({} bytes at data offset {}) lies past the end of the file ({file_len} bytes)",
                    t.name, t.len, t.offset
                ));
            }
            if index.insert(t.name.clone(), i).is_some() {
                return Err(format!("tensor `{}` appears twice", t.name));
            }
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            index,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute byte range of `info`'s data in the file.
    pub fn data_range(&self, info: &GgufTensorInfo) -> std::ops::Range<usize> {
        let start = (self.data_offset + info.offset) as usize;
        start..start + info.len as usize
    }
}

/// A little-endian cursor over the header bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// 64-bit counts and lengths (v2 and later).
    wide: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "the header ends early ({} bytes needed at offset {}, the file has {})",
                n,
                self.pos,
                self.bytes.len()
            ));
        };
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count or length: u64 (u32 in v1), capped.
    fn length(&mut self, what: &str) -> Result<u64, String> {
        let n = if self.wide {
            self.u64()?
        } else {
            self.u32()? as u64
        };
        if n > MAX_LENGTH {
            return Err(format!("{what} {n} is implausibly large"));
        }
        Ok(n)
    }

    /// A string; trailing NULs are dropped and invalid UTF-8 replaced, as candle does.
    fn string(&mut self) -> Result<String, String> {
        let n = self.length("string length")? as usize;
        let mut bytes = self.take(n)?;
        while let [rest @ .., 0] = bytes {
            bytes = rest;
        }
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err("arrays nested too deeply".into());
                }
                let item = self.u32()?;
                let n = self.length("array length")?;
                // Every item takes at least a byte: a length beyond the file is corrupt.
                if n > (self.bytes.len() - self.pos) as u64 {
                    return Err(format!("array of {n} items is longer than the file"));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(item, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown value type {other}")),
        })
    }

    fn tensor_info(&mut self) -> Result<GgufTensorInfo, String> {
        let name = self.string()?;
        let n_dims = self.u32()?;
        if n_dims > MAX_DIMS {
            return Err(format!(
                "tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})"
            ));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = if self.wide {
                self.u64()?
            } else {
                self.u32()? as u64
            };
            shape.push(usize::try_from(d).map_err(|_| format!("tensor `{name}`: dim {d}"))?);
        }
        shape.reverse();
        let id = self.u32()?;
        let ty = GgufType::from_id(id)
            .ok_or_else(|| format!("tensor `{name}` has unknown ggml type id {id}"))?;
        let offset = self.u64()?;
        let elems = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
            .ok_or_else(|| format!("tensor `{name}`: shape {shape:?} overflows"))?;
        let len = ty.bytes_for(elems).ok_or_else(|| {
            format!(
                "tensor `{name}` of {elems} elements is not a whole number of {ty} blocks ({} elements)",
                ty.block_size()
            )
        })?;
        Ok(GgufTensorInfo {
            name,
            shape,
            ty,
            offset,
            len,
        })
    }
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
mod tests;
