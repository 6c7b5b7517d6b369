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
//! Metadata values use candle's [`Value`] so the tokenizer reads them unchanged, except arrays of
//! strings (a vocabulary and its merges: about 100,000 strings that only the tokenizer reads):
//! those stay in the file as [`StringArray`]s, walked over once at parse to check their bounds,
//! and read in place (borrowed, no copy) through [`GgufMetadata`] when the tokenizer wants them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

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

/// An array of strings of the metadata, left in the file: how many strings, and where they lie
/// (each a length-prefixed string, as GGUF stores them). The header's parse checked that every
/// one lies inside the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringArray {
    /// Number of strings.
    pub len: usize,
    /// Byte range of the strings in the file.
    pub range: Range<usize>,
    /// 64-bit lengths (v2 and later).
    wide: bool,
}

impl StringArray {
    /// The strings, read from `file` (the bytes the header was parsed from) as candle reads them:
    /// trailing NULs dropped, invalid UTF-8 replaced; borrowed from `file` where they are valid
    /// UTF-8 (nearly always). `None` if `file` is not the bytes the header was parsed from.
    pub fn items<'a>(&self, file: &'a [u8]) -> Option<Vec<Cow<'a, str>>> {
        let mut r = Reader {
            bytes: file.get(self.range.clone())?,
            pos: 0,
            wide: self.wide,
        };
        let mut items = Vec::with_capacity(self.len);
        for _ in 0..self.len {
            let bytes = r.string_bytes().ok()?;
            // `from_utf8` checks ASCII a word at a time; the lossy reading only where it fails.
            items.push(match std::str::from_utf8(bytes) {
                Ok(text) => Cow::Borrowed(text),
                Err(_) => String::from_utf8_lossy(bytes),
            });
        }
        (r.pos == r.bytes.len()).then_some(items)
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Format version (1, 2 or 3).
    pub version: u32,
    /// Metadata key-value pairs, except the arrays of strings ([`GgufHeader::string_arrays`]).
    pub metadata: HashMap<String, Value>,
    /// The metadata's arrays of strings, left in the file ([`GgufMetadata::strings`] reads them;
    /// [`GgufHeader::full_metadata`] makes them values too).
    pub string_arrays: HashMap<String, StringArray>,
    /// Tensors in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Alignment of the data section.
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
    index: HashMap<String, usize>,
    /// The file each tensor lies in (0 unless later splits were [absorbed](Self::absorb_split)).
    tensor_files: Vec<usize>,
    /// Each file's data section offset (`[data_offset]` for an unsplit file).
    file_data_offsets: Vec<u64>,
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
        let mut string_arrays = HashMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let ty = r.u32()?;
            let in_context = |e: String| format!("metadata `{key}`: {e}");
            // A later duplicate key wins, as in a map of values.
            if let Some(array) = r.string_array(ty).map_err(in_context)? {
                metadata.remove(&key);
                string_arrays.insert(key, array);
            } else {
                let value = r.value(ty, 0).map_err(in_context)?;
                string_arrays.remove(&key);
                metadata.insert(key, value);
            }
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
        let tensor_files = vec![0; tensors.len()];
        Ok(Self {
            version,
            metadata,
            string_arrays,
            tensors,
            alignment,
            data_offset,
            index,
            tensor_files,
            file_data_offsets: vec![data_offset],
        })
    }

    /// How many files a split model has (`split.count`; 1 for an ordinary file).
    pub fn split_count(&self) -> usize {
        self.split_key("split.count").map_or(1, |n| n.max(1))
    }

    /// Which split this file is (`split.no`, 0 for the first; 0 for an ordinary file).
    pub fn split_index(&self) -> usize {
        self.split_key("split.no").unwrap_or(0)
    }

    /// One of llama.cpp's `split.*` counts, if the header has it as a whole number.
    fn split_key(&self, key: &str) -> Option<usize> {
        let value = crate::spec::as_u64(self.metadata.get(key)?).ok()?;
        usize::try_from(value).ok()
    }

    /// Adds the tensors of a later split (`split`, parsed from file number `file` of the
    /// model) to this first split's header, so the header describes the whole model; their
    /// bytes lie in that file ([`Self::tensor_file`]).
    pub fn absorb_split(&mut self, split: GgufHeader, file: usize) -> Result<(), String> {
        if file != self.file_data_offsets.len() {
            return Err(format!(
                "split {} absorbed out of order (expected {})",
                file + 1,
                self.file_data_offsets.len() + 1
            ));
        }
        self.file_data_offsets.push(split.data_offset);
        for tensor in split.tensors {
            if self.index.contains_key(&tensor.name) {
                return Err(format!("tensor `{}` appears in two splits", tensor.name));
            }
            self.index.insert(tensor.name.clone(), self.tensors.len());
            self.tensors.push(tensor);
            self.tensor_files.push(file);
        }
        Ok(())
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The file (split) `info`'s data lies in: 0 for an ordinary file.
    pub fn tensor_file(&self, info: &GgufTensorInfo) -> usize {
        self.index
            .get(&info.name)
            .map_or(0, |&i| self.tensor_files[i])
    }

    /// Absolute byte range of `info`'s data in its file ([`Self::tensor_file`]).
    pub fn data_range(&self, info: &GgufTensorInfo) -> std::ops::Range<usize> {
        let data_offset = self.file_data_offsets[self.tensor_file(info)];
        let start = (data_offset + info.offset) as usize;
        start..start + info.len as usize
    }

    /// The number of items of the metadata array `key` (of strings or of values).
    pub fn array_len(&self, key: &str) -> Option<usize> {
        match (self.string_arrays.get(key), self.metadata.get(key)) {
            (Some(strings), _) => Some(strings.len),
            (None, Some(Value::Array(items))) => Some(items.len()),
            _ => None,
        }
    }

    /// Every metadata key as a value, the arrays of strings read from `file` (the bytes the
    /// header was parsed from): the map candle's `Content::read` makes. `None` if `file` is not
    /// those bytes.
    pub fn full_metadata(&self, file: &[u8]) -> Option<HashMap<String, Value>> {
        let mut all = self.metadata.clone();
        for (key, array) in &self.string_arrays {
            let items = array.items(file)?;
            let values = items
                .into_iter()
                .map(|s| Value::String(s.into_owned()))
                .collect();
            all.insert(key.clone(), Value::Array(values));
        }
        Some(all)
    }
}

/// GGUF metadata to read keys from: a [`GgufHeader`] with the bytes it was parsed from (its
/// arrays of strings read in place), or a map holding every key as a value (candle's
/// `Content::metadata`, or [`GgufHeader::full_metadata`]).
#[derive(Debug, Clone, Copy)]
pub struct GgufMetadata<'a> {
    values: &'a HashMap<String, Value>,
    in_file: Option<(&'a HashMap<String, StringArray>, &'a [u8])>,
}

impl<'a> GgufMetadata<'a> {
    /// `header`'s metadata; `file` is the bytes it was parsed from.
    pub fn new(header: &'a GgufHeader, file: &'a [u8]) -> Self {
        Self {
            values: &header.metadata,
            in_file: Some((&header.string_arrays, file)),
        }
    }

    /// The value of `key`, unless it is an array of strings left in the file (see
    /// [`GgufMetadata::strings`]).
    pub fn value(&self, key: &str) -> Option<&'a Value> {
        self.values.get(key)
    }

    /// Whether `key` is an array of strings left in the file (so [`GgufMetadata::value`] has
    /// none for it).
    pub fn in_file(&self, key: &str) -> bool {
        self.in_file
            .is_some_and(|(arrays, _)| arrays.contains_key(key))
    }

    /// The array of strings `key` (`Ok(None)` when there is no such key; an error when it holds
    /// something else), borrowed from the file or the values where it can be.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<Cow<'a, str>>>, String> {
        if let Some((arrays, file)) = self.in_file {
            if let Some(array) = arrays.get(key) {
                return array.items(file).map(Some).ok_or_else(|| {
                    format!("`{key}` does not lie where the header said in these bytes")
                });
            }
        }
        match self.values.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(Cow::Borrowed(s.as_str())),
                    _ => Err(format!("`{key}` is not an array of strings")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("`{key}` is not an array of strings")),
        }
    }
}

impl<'a> From<&'a HashMap<String, Value>> for GgufMetadata<'a> {
    fn from(values: &'a HashMap<String, Value>) -> Self {
        Self {
            values,
            in_file: None,
        }
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
        Ok(String::from_utf8_lossy(self.string_bytes()?).into_owned())
    }

    /// A string's bytes, trailing NULs dropped.
    fn string_bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.length("string length")? as usize;
        let mut bytes = self.take(n)?;
        while let [rest @ .., 0] = bytes {
            bytes = rest;
        }
        Ok(bytes)
    }

    /// A value of type `ty` that is an array of strings, stepped over and left in the file;
    /// `None` (nothing read) for any other value.
    fn string_array(&mut self, ty: u32) -> Result<Option<StringArray>, String> {
        const ARRAY: u32 = 9;
        const STRING: u32 = 8;
        let start = self.pos;
        if ty != ARRAY || self.u32().ok() != Some(STRING) {
            self.pos = start;
            return Ok(None);
        }
        let n = self.length("array length")?;
        // Every item takes at least a byte: a length beyond the file is corrupt.
        if n > (self.bytes.len() - self.pos) as u64 {
            return Err(format!("array of {n} items is longer than the file"));
        }
        let items = self.pos;
        for _ in 0..n {
            let len = self.length("string length")? as usize;
            self.take(len)?;
        }
        Ok(Some(StringArray {
            len: n as usize,
            range: items..self.pos,
            wide: self.wide,
        }))
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
