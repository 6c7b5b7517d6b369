//! Where a model comes from: a GGUF file, a Hugging Face directory, or a hub id resolved through
//! hf-hub and the standard HF cache. Produces [`ModelFiles`], the list of local files to load.

use std::path::PathBuf;

/// The local files a model is loaded from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelFiles {
    /// A single GGUF file: weights, spec, tokenizer and chat template all come from it.
    Gguf {
        /// The .gguf file.
        path: PathBuf,
    },
    /// A Hugging Face layout: config.json, tokenizer files and safetensors shards.
    HfDir {
        /// The directory (or hub snapshot directory).
        dir: PathBuf,
        /// config.json.
        config: PathBuf,
        /// tokenizer.json.
        tokenizer: PathBuf,
        /// tokenizer_config.json (chat template, bos/eos), if present.
        tokenizer_config: Option<PathBuf>,
        /// generation_config.json (extra eos ids), if present.
        generation_config: Option<PathBuf>,
        /// The safetensors files, in shard order.
        weights: Vec<PathBuf>,
    },
}
