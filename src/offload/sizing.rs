//! Model sizes from files alone, without loading weights: bytes of every decoder layer and of the
//! fixed parts (embeddings, final norm, output head) from a GGUF file's tensor infos or from
//! safetensors JSON headers; the dimensions the planner needs (from GGUF metadata or config.json);
//! and the KV-cache and activation-workspace estimates.
//!
//! Tensors whose name starts with `blk.N.` (GGUF) or `model.layers.N.` (safetensors) belong to
//! decoder layer `N`; every other tensor is a fixed part. A model with tied embeddings has no
//! separate head tensor, so the shared matrix is counted once.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;

use super::error::{PlanError, Result};
use crate::config::DtypeChoice;
use crate::model::source::ModelFiles;

/// A dense dtype weights can be converted to on load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseDtype {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    BF16,
}

impl DenseDtype {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> u64 {
        match self {
            DenseDtype::F32 => 4,
            DenseDtype::F16 | DenseDtype::BF16 => 2,
        }
    }

    /// The dense dtype a configured choice asks for; `None` for `auto` (keep the file's dtype).
    pub fn from_choice(choice: DtypeChoice) -> Option<Self> {
        match choice {
            DtypeChoice::Auto => None,
            DtypeChoice::F32 => Some(DenseDtype::F32),
            DtypeChoice::F16 => Some(DenseDtype::F16),
            DtypeChoice::BF16 => Some(DenseDtype::BF16),
        }
    }
}

/// Weight bytes of a model, split the way the planner places them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSizes {
    /// Bytes of each decoder layer, by index.
    pub layers: Vec<u64>,
    /// Bytes of everything outside the decoder layers (embeddings, final norm, head, ...).
    pub fixed: u64,
    /// No separate output head tensor: the head reuses the embedding matrix (counted once).
    pub tied_embeddings: bool,
    /// Number of tensors seen.
    pub tensor_count: usize,
}

impl ModelSizes {
    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Sum of the decoder layers' bytes.
    pub fn layer_total(&self) -> u64 {
        self.layers
            .iter()
            .fold(0u64, |sum, &b| sum.saturating_add(b))
    }

    /// All weight bytes: layers + fixed parts.
    pub fn total(&self) -> u64 {
        self.layer_total().saturating_add(self.fixed)
    }
}

/// Accumulates tensor sizes into layers and fixed parts.
#[derive(Default)]
struct SizeAccumulator {
    layers: BTreeMap<usize, u64>,
    fixed: u64,
    has_head: bool,
    tensor_count: usize,
}

impl SizeAccumulator {
    fn add(&mut self, layer: Option<usize>, bytes: u64, is_head: bool) {
        self.tensor_count += 1;
        self.has_head |= is_head;
        match layer {
            Some(index) => {
                let sum = self.layers.entry(index).or_insert(0);
                *sum = sum.saturating_add(bytes);
            }
            None => self.fixed = self.fixed.saturating_add(bytes),
        }
    }

    fn finish(self) -> Result<ModelSizes> {
        let highest = self.layers.keys().next_back().copied();
        if let Some(highest) = highest {
            if let Some(missing) = (0..=highest).find(|i| !self.layers.contains_key(i)) {
                return Err(PlanError::MissingLayer { missing, highest });
            }
        }
        Ok(ModelSizes {
            layers: self.layers.into_values().collect(),
            fixed: self.fixed,
            tied_embeddings: !self.has_head,
            tensor_count: self.tensor_count,
        })
    }
}

/// The layer index of a tensor named `<prefix>N.<rest>`.
fn layer_index(name: &str, prefix: &str) -> Option<usize> {
    let rest = name.strip_prefix(prefix)?;
    let (number, _) = rest.split_once('.')?;
    number.parse().ok()
}

/// Reads a GGUF file's metadata and tensor infos (no tensor data).
pub fn read_gguf_header(path: &Path) -> Result<Content> {
    let file = File::open(path).map_err(|source| PlanError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = BufReader::new(file);
    Content::read(&mut reader).map_err(|e| PlanError::Gguf {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Bytes a GGUF tensor occupies in the file: `elem_count / block_size * type_size`.
pub fn gguf_tensor_bytes(dtype: GgmlDType, elem_count: usize) -> u64 {
    (elem_count / dtype.block_size()) as u64 * dtype.type_size() as u64
}

/// Sizes a parsed GGUF header. With `target`, every tensor is counted as dequantized to that dtype
/// (`elem_count * dtype size`); without, as stored.
pub fn size_gguf_content(content: &Content, target: Option<DenseDtype>) -> Result<ModelSizes> {
    let mut acc = SizeAccumulator::default();
    for (name, info) in &content.tensor_infos {
        let elems = info.shape.elem_count();
        let bytes = match target {
            Some(dtype) => (elems as u64).saturating_mul(dtype.size_in_bytes()),
            None => gguf_tensor_bytes(info.ggml_dtype, elems),
        };
        acc.add(layer_index(name, "blk."), bytes, name == "output.weight");
    }
    acc.finish()
}

/// Sizes a GGUF file from its header alone.
pub fn size_gguf(path: &Path, target: Option<DenseDtype>) -> Result<ModelSizes> {
    size_gguf_content(&read_gguf_header(path)?, target)
}

/// One tensor entry of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct SafetensorsEntry {
    /// Stored dtype, e.g. `BF16`, `F32`, `I64`.
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// `[start, end)` byte range in the data section.
    pub data_offsets: [u64; 2],
}

/// Headers larger than this are rejected as corrupt (real ones are a few MiB at most).
const MAX_SAFETENSORS_HEADER: u64 = 100 * 1024 * 1024;

/// Reads only the JSON header of a safetensors file: an 8-byte little-endian length, then that many
/// bytes of JSON mapping tensor names to dtype, shape and data offsets (`__metadata__` skipped).
pub fn read_safetensors_header(path: &Path) -> Result<BTreeMap<String, SafetensorsEntry>> {
    let bad = |message: String| PlanError::Safetensors {
        path: path.to_path_buf(),
        message,
    };
    let io = |source| PlanError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length)
        .map_err(|e| bad(format!("no header length: {e}")))?;
    let length = u64::from_le_bytes(length);
    if length > MAX_SAFETENSORS_HEADER {
        return Err(bad(format!("header length {length} is implausibly large")));
    }
    let mut json = vec![0u8; length as usize];
    file.read_exact(&mut json)
        .map_err(|e| bad(format!("header shorter than its length {length}: {e}")))?;
    let raw: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&json).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let mut entries = BTreeMap::new();
    for (name, value) in raw {
        if name == "__metadata__" {
            continue;
        }
        let entry: SafetensorsEntry =
            serde_json::from_value(value).map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        if entry.data_offsets[1] < entry.data_offsets[0] {
            return Err(bad(format!("tensor `{name}` has reversed data offsets")));
        }
        entries.insert(name, entry);
    }
    Ok(entries)
}

/// Whether a safetensors dtype is a floating-point type (converted by a target dtype).
fn is_float_dtype(dtype: &str) -> bool {
    dtype.starts_with('F') || dtype == "BF16"
}

/// Sizes safetensors shards from their headers. With `target`, floating-point tensors count as
/// `elem_count * dtype size`; integer tensors keep their stored size.
pub fn size_safetensors(paths: &[PathBuf], target: Option<DenseDtype>) -> Result<ModelSizes> {
    let mut acc = SizeAccumulator::default();
    for path in paths {
        for (name, entry) in read_safetensors_header(path)? {
            let stored = entry.data_offsets[1] - entry.data_offsets[0];
            let bytes = match target {
                Some(dtype) if is_float_dtype(&entry.dtype) => {
                    let elems = entry
                        .shape
                        .iter()
                        .fold(1u64, |n, &d| n.saturating_mul(d as u64));
                    elems.saturating_mul(dtype.size_in_bytes())
                }
                _ => stored,
            };
            let layer = layer_index(&name, "model.layers.");
            acc.add(layer, bytes, name == "lm_head.weight");
        }
    }
    acc.finish()
}

/// The dimensions the planner needs, from GGUF metadata or config.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDims {
    /// Architecture name (`llama`, `qwen2`, ...).
    pub architecture: String,
    /// Decoder layers.
    pub n_layers: usize,
    /// Hidden (embedding) size.
    pub hidden_size: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Key/value heads (equal to `n_heads` without grouped-query attention).
    pub n_kv_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Trained context length, when the files say.
    pub context_length: Option<usize>,
}

fn gguf_usize(content: &Content, key: &str) -> Option<usize> {
    match content.metadata.get(key)? {
        Value::I32(v) => usize::try_from(*v).ok(),
        Value::I64(v) => usize::try_from(*v).ok(),
        other => other.to_u64().ok().and_then(|v| usize::try_from(v).ok()),
    }
}

/// Reads dimensions from GGUF metadata (`general.architecture`, `<arch>.block_count`,
/// `<arch>.embedding_length`, `<arch>.attention.head_count[_kv]`, `<arch>.attention.key_length`,
/// `<arch>.context_length`, and the vocabulary from `<arch>.vocab_size` or the token list).
pub fn dims_from_gguf(content: &Content) -> Result<ModelDims> {
    let architecture = match content.metadata.get("general.architecture") {
        Some(Value::String(arch)) => arch.clone(),
        _ => {
            return Err(PlanError::Metadata(
                "GGUF has no general.architecture".into(),
            ))
        }
    };
    let need = |suffix: &str| {
        let key = format!("{architecture}.{suffix}");
        gguf_usize(content, &key).ok_or_else(|| PlanError::Metadata(format!("GGUF has no {key}")))
    };
    let n_layers = need("block_count")?;
    let hidden_size = need("embedding_length")?;
    let n_heads = need("attention.head_count")?;
    let n_kv_heads = need("attention.head_count_kv").unwrap_or(n_heads);
    let head_dim = match need("attention.key_length") {
        Ok(dim) => dim,
        Err(_) => per_head(hidden_size, n_heads)?,
    };
    let vocab_size = match need("vocab_size") {
        Ok(v) => v,
        Err(_) => match content.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => return Err(PlanError::Metadata("GGUF has no vocabulary size".into())),
        },
    };
    Ok(ModelDims {
        n_layers,
        hidden_size,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size,
        context_length: need("context_length").ok(),
        architecture,
    })
}

fn per_head(hidden: usize, heads: usize) -> Result<usize> {
    if heads == 0 || hidden % heads != 0 {
        return Err(PlanError::Metadata(format!(
            "hidden size {hidden} is not a multiple of {heads} heads"
        )));
    }
    Ok(hidden / heads)
}

/// Reads dimensions from an HF `config.json` (`num_hidden_layers`, `hidden_size`,
/// `num_attention_heads`, `num_key_value_heads`, `head_dim`, `vocab_size`,
/// `max_position_embeddings`, `model_type`).
pub fn dims_from_config_json(path: &Path) -> Result<ModelDims> {
    let text = std::fs::read_to_string(path).map_err(|source| PlanError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| PlanError::Metadata(format!("{} is not JSON: {e}", path.display())))?;
    let get = |key: &str| json.get(key).and_then(|v| v.as_u64()).map(|v| v as usize);
    let need = |key: &str| {
        get(key).ok_or_else(|| PlanError::Metadata(format!("{} has no {key}", path.display())))
    };
    let hidden_size = need("hidden_size")?;
    let n_heads = need("num_attention_heads")?;
    let head_dim = match get("head_dim") {
        Some(dim) => dim,
        None => per_head(hidden_size, n_heads)?,
    };
    Ok(ModelDims {
        architecture: json
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_string(),
        n_layers: need("num_hidden_layers")?,
        hidden_size,
        n_heads,
        n_kv_heads: get("num_key_value_heads").unwrap_or(n_heads),
        head_dim,
        vocab_size: need("vocab_size")?,
        context_length: get("max_position_embeddings"),
    })
}

/// Sizes and dimensions of a model, for a `ferry plan` summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSummary {
    /// Weight bytes per layer and fixed parts.
    pub sizes: ModelSizes,
    /// Dimensions.
    pub dims: ModelDims,
}

/// Sizes a model from its files (GGUF header, or config.json + safetensors headers), checking that
/// the layer count in the metadata matches the tensors found.
pub fn summarize(files: &ModelFiles, target: Option<DenseDtype>) -> Result<ModelSummary> {
    let (sizes, dims) = match files {
        ModelFiles::Gguf { path } => {
            let content = read_gguf_header(path)?;
            (
                size_gguf_content(&content, target)?,
                dims_from_gguf(&content)?,
            )
        }
        ModelFiles::HfDir {
            config, weights, ..
        } => (
            size_safetensors(weights, target)?,
            dims_from_config_json(config)?,
        ),
    };
    if sizes.n_layers() != dims.n_layers {
        return Err(PlanError::Metadata(format!(
            "metadata says {} layers but the weights have {}",
            dims.n_layers,
            sizes.n_layers()
        )));
    }
    Ok(ModelSummary { sizes, dims })
}

/// KV-cache bytes one token takes in one layer: keys and values, `2 * n_kv_heads * head_dim *
/// dtype_bytes`.
pub fn kv_bytes_per_token_per_layer(n_kv_heads: usize, head_dim: usize, dtype_bytes: u64) -> u64 {
    (2 * n_kv_heads as u64)
        .saturating_mul(head_dim as u64)
        .saturating_mul(dtype_bytes)
}

/// What the activation workspace estimate depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceInput {
    /// Hidden size.
    pub hidden_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Sequences decoded together.
    pub max_batch: usize,
    /// Prompt tokens prefilled in one step.
    pub prefill_chunk: usize,
    /// Longest sequence (keys one query attends to).
    pub max_context: usize,
}

/// Activation workspace estimate in bytes, with f32 activations (4 bytes) and one step at a time
/// (either a prefill chunk or a decode batch, so `tokens = max(max_batch, prefill_chunk)`):
///
/// ```text
/// activations = tokens * hidden_size * 16 * 4          residual, norm, q/k/v, attention output
///                                                      and the MLP's gate/up/activation (~8x hidden)
/// scores      = 2 * n_heads * tokens * max_context * 4 attention scores and their softmax
/// logits      = 2 * max_batch * vocab_size * 4         last-position logits and sampling copy
/// workspace   = activations + scores + logits
/// ```
///
/// It is deliberately generous (no fused attention assumed): an underestimate would be a device
/// out-of-memory error at run time, an overestimate only a layer more on the host.
pub fn workspace_bytes(input: &WorkspaceInput) -> u64 {
    let product = |factors: &[u64]| factors.iter().fold(1u64, |p, &f| p.saturating_mul(f));
    let tokens = input.max_batch.max(input.prefill_chunk) as u64;
    let activations = product(&[tokens, input.hidden_size as u64, 16, 4]);
    let scores = product(&[2, input.n_heads as u64, tokens, input.max_context as u64, 4]);
    let logits = product(&[2, input.max_batch as u64, input.vocab_size as u64, 4]);
    activations.saturating_add(scores).saturating_add(logits)
}

#[cfg(test)]
#[path = "sizing_tests.rs"]
mod tests;
