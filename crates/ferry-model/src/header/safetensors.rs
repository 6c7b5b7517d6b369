//! The safetensors shards of a Hugging Face checkpoint, each memory-mapped once and its JSON
//! header parsed once with [`safetensors::SafeTensors::read_metadata`] (which also checks that
//! the offsets cover the data exactly). Tensor bytes are then slices of the maps.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo};

use crate::error::{ModelError, Result};

/// Bytes before a safetensors JSON header: its little-endian u64 length.
const LENGTH_PREFIX: usize = 8;

/// One mapped shard and its parsed header.
#[derive(Debug)]
pub struct Shard {
    /// The file.
    pub path: PathBuf,
    map: Mmap,
    /// Absolute offset of the data section (after the length prefix and the JSON).
    data_start: usize,
    metadata: Metadata,
}

/// Every shard of a checkpoint, with an index from tensor name to shard.
#[derive(Debug)]
pub struct Shards {
    shards: Vec<Shard>,
    index: HashMap<String, usize>,
}

/// Where a tensor lives: its shard and its header entry.
#[derive(Debug, Clone, Copy)]
pub struct ShardTensor<'a> {
    /// Index of the shard in [`Shards::shards`].
    pub shard: usize,
    /// dtype, shape and data offsets (relative to the data section).
    pub info: &'a TensorInfo,
}

impl Shards {
    /// Maps and parses every file of `paths` (a tensor may appear in one shard only).
    pub fn open(paths: &[PathBuf]) -> Result<Self> {
        if paths.is_empty() {
            return Err(ModelError::Source(
                "no safetensors files in the model directory".into(),
            ));
        }
        let mut shards = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for path in paths {
            let shard = Shard::open(path)?;
            for name in shard.metadata.offset_keys() {
                if let Some(first) = index.insert(name.clone(), shards.len()) {
                    return Err(ModelError::Source(format!(
                        "tensor `{name}` is in both {} and {}",
                        paths[first].display(),
                        path.display()
                    )));
                }
            }
            shards.push(shard);
        }
        Ok(Self { shards, index })
    }

    /// The mapped shards, in the order given.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<ShardTensor<'_>> {
        let &shard = self.index.get(name)?;
        let info = self.shards[shard].metadata.info(name)?;
        Some(ShardTensor { shard, info })
    }

    /// Every tensor name, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Absolute byte range of `tensor` in its shard.
    pub fn data_range(&self, tensor: &ShardTensor<'_>) -> std::ops::Range<usize> {
        let start = self.shards[tensor.shard].data_start;
        let (begin, end) = tensor.info.data_offsets;
        start + begin..start + end
    }

    /// The bytes of shard `shard`.
    pub fn bytes(&self, shard: usize) -> &[u8] {
        &self.shards[shard].map
    }
}

impl Shard {
    fn open(path: &Path) -> Result<Self> {
        let map = super::map_file(path)?;
        let (header_len, metadata) =
            safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
                ModelError::Source(format!(
                    "{} is not a valid safetensors file: {e}",
                    path.display()
                ))
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            data_start: LENGTH_PREFIX + header_len,
            metadata,
        })
    }
}
