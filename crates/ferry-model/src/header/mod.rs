//! Weight-file headers, parsed by ferry without reading tensor data:
//!
//! - [`gguf`]: ferry's own GGUF reader (metadata and tensor infos for every ggml type id);
//! - [`ggml_type`]: [`GgufType`], ggml's type table (block size and bytes per block of each id);
//! - [`safetensors`]: mapped safetensors shards with their headers
//!   (`safetensors::SafeTensors::read_metadata`).
//!
//! [`super::checkpoint::Checkpoint`] reads each file's header once per load and everything else
//! (spec, tensor table, sizing, tokenizer, loader) works from it.

pub mod ggml_type;
pub mod gguf;
pub mod safetensors;

use std::path::Path;

use memmap2::Mmap;

use super::error::{ModelError, Result};

pub use ggml_type::GgufType;
pub use gguf::{GgufHeader, GgufMetadata, GgufTensorInfo, StringArray};
pub use safetensors::Shards;

/// Maps `path` read-only.
pub fn map_file(path: &Path) -> Result<Mmap> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: mapped read-only; like every mmap-based loader, ferry relies on the file not being
    // truncated or rewritten while the model is loading.
    unsafe { Mmap::map(&file) }.map_err(io)
}
