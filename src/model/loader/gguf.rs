//! Reads a GGUF file (llama.cpp layout: `token_embd`, `blk.N.attn_q`, ..., `output_norm`,
//! `output`) into model weights. With [`DTypeChoice::Auto`](super::DTypeChoice::Auto) the block
//! quantized matrices stay quantized: on the CPU, Q4_0 / Q4_1 / Q8_0 go through ferry's own
//! kernels ([`CpuQMatMul`]), everything else (and every CUDA weight) through candle's
//! `QMatMul`. With an explicit dtype every tensor is dequantized, so the dense path runs on the
//! same weights.
//!
//! Setting `FERRY_CPU_QMATMUL=candle` in the environment keeps candle's `QMatMul` on the CPU too
//! (for A/B measurements and as an escape hatch).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::{check_dtype_on_device, check_shape, LayerShapes, LoadOptions, LoadProgress, Progress};
use crate::model::error::{ModelError, Result};
use crate::model::spec::ModelSpec;
use crate::model::weights::{Embedding, FixedWeights, LayerWeights, Linear};

/// An open GGUF file and its spec; reads tensors on demand.
pub struct GgufWeights<'a> {
    path: PathBuf,
    file: File,
    content: Content,
    spec: ModelSpec,
    device: Device,
    /// `None`: keep quantized tensors quantized (activations in f32).
    dense: Option<DType>,
    progress: Progress<'a>,
}

impl<'a> GgufWeights<'a> {
    /// Opens `path` and reads its metadata and tensor directory (no tensor data yet).
    pub fn open(path: &Path, options: &LoadOptions) -> Result<Self> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        // Buffered: the header is hundreds of thousands of small fields (vocabulary, merges).
        let content = Content::read(&mut std::io::BufReader::new(&mut file)).map_err(|e| {
            ModelError::Source(format!("{} is not a GGUF file: {e}", path.display()))
        })?;
        let spec = ModelSpec::from_gguf(&content)?;
        let dense = options.dtype.dense();
        if let Some(dtype) = dense {
            check_dtype_on_device(dtype, &options.device)?;
        }
        let total = content
            .tensor_infos
            .values()
            .map(|info| stored_bytes(info.ggml_dtype, info.shape.elem_count()))
            .sum();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
            spec,
            device: options.device.clone(),
            dense,
            progress: Progress {
                done: 0,
                total,
                sink: None,
            },
        })
    }

    /// Reports progress to `sink` after each tensor read.
    pub fn with_progress(mut self, sink: &'a mut dyn FnMut(LoadProgress)) -> Self {
        self.progress.sink = Some(sink);
        self
    }

    /// The spec read from the metadata.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The activation dtype: f32 when quantized, else the chosen dense dtype.
    pub fn dtype(&self) -> DType {
        self.dense.unwrap_or(DType::F32)
    }

    /// The parsed GGUF header (metadata and tensor directory).
    pub fn content(&self) -> &Content {
        &self.content
    }

    /// Embedding, final norm and output head (tied to the embedding when `output` is absent).
    pub fn fixed(&mut self) -> Result<FixedWeights> {
        let (vocab, hidden) = (self.spec.vocab_size, self.spec.hidden_size);
        let embd = self.qtensor("token_embd.weight", &[vocab, hidden])?;
        let final_norm = self.norm("output_norm.weight")?;
        let (embedding, tied_head) = match (self.dense, is_block_quantized(embd.dtype())) {
            (None, true) => {
                let embd = Arc::new(embd);
                let head = Linear::quantized(embd.clone(), None)?;
                (Embedding::Quantized(embd), head)
            }
            _ => {
                let table = embd.dequantize(&self.device)?.to_dtype(self.dtype())?;
                let head = Linear::Dense {
                    weight: table.clone(),
                    bias: None,
                };
                (Embedding::Dense(table), head)
            }
        };
        let lm_head = if self.content.tensor_infos.contains_key("output.weight") {
            self.linear("output", [vocab, hidden], false)?
        } else {
            tied_head
        };
        Ok(FixedWeights {
            embedding,
            final_norm,
            lm_head,
        })
    }

    /// The weights of decoder layer `index`.
    pub fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        let s = LayerShapes::of(&self.spec);
        let p = format!("blk.{index}");
        let bias = self.spec.attention_bias;
        Ok(LayerWeights {
            attn_norm: self.norm(&format!("{p}.attn_norm.weight"))?,
            q: self.linear(&format!("{p}.attn_q"), s.q, bias)?,
            k: self.linear(&format!("{p}.attn_k"), s.kv, bias)?,
            v: self.linear(&format!("{p}.attn_v"), s.kv, bias)?,
            o: self.linear(&format!("{p}.attn_output"), s.o, false)?,
            ffn_norm: self.norm(&format!("{p}.ffn_norm.weight"))?,
            gate: self.linear(&format!("{p}.ffn_gate"), s.up, false)?,
            up: self.linear(&format!("{p}.ffn_up"), s.up, false)?,
            down: self.linear(&format!("{p}.ffn_down"), s.down, false)?,
        })
    }

    /// Per-frequency RoPE divisors (`rope_freqs.weight`, written for Llama 3.1+), if present.
    pub fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>> {
        let name = "rope_freqs.weight";
        if !self.content.tensor_infos.contains_key(name) {
            return Ok(None);
        }
        let t = self.qtensor(name, &[self.spec.head_dim / 2])?;
        Ok(Some(t.dequantize(&Device::Cpu)?.to_vec1::<f32>()?))
    }

    /// Reads `name`, checking its shape.
    fn qtensor(&mut self, name: &str, expected: &[usize]) -> Result<QTensor> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        check_shape(name, info.shape.dims(), expected)?;
        let bytes = stored_bytes(info.ggml_dtype, info.shape.elem_count());
        let t = info
            .read(
                &mut self.file,
                self.content.tensor_data_offset,
                &self.device,
            )
            .map_err(|e| {
                ModelError::Source(format!("{}: reading `{name}`: {e}", self.path.display()))
            })?;
        self.progress.advance(bytes, name);
        Ok(t)
    }

    /// A `[hidden]` norm weight as a dense tensor in the activation dtype.
    fn norm(&mut self, name: &str) -> Result<Tensor> {
        let t = self.qtensor(name, &[self.spec.hidden_size])?;
        Ok(t.dequantize(&self.device)?.to_dtype(self.dtype())?)
    }

    /// `<prefix>.weight` (`[out, in]`) and, if `with_bias` or present, `<prefix>.bias`.
    fn linear(&mut self, prefix: &str, shape: [usize; 2], with_bias: bool) -> Result<Linear> {
        let weight = self.qtensor(&format!("{prefix}.weight"), &shape)?;
        let bias_name = format!("{prefix}.bias");
        let bias = if with_bias || self.content.tensor_infos.contains_key(&bias_name) {
            let b = self.qtensor(&bias_name, &shape[..1])?;
            Some(b.dequantize(&self.device)?.to_dtype(self.dtype())?)
        } else {
            None
        };
        match self.dense {
            None if is_block_quantized(weight.dtype()) => Linear::quantized(Arc::new(weight), bias),
            _ => Ok(Linear::Dense {
                weight: weight.dequantize(&self.device)?.to_dtype(self.dtype())?,
                bias,
            }),
        }
    }
}

impl std::fmt::Debug for GgufWeights<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWeights")
            .field("path", &self.path)
            .field("spec", &self.spec)
            .field("dense", &self.dense)
            .finish_non_exhaustive()
    }
}

/// Whether `dtype` is a block format (kept quantized) rather than a plain float format.
fn is_block_quantized(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// Bytes a tensor of `elems` elements occupies in the file.
fn stored_bytes(dtype: GgmlDType, elems: usize) -> u64 {
    (elems / dtype.block_size() * dtype.type_size()) as u64
}
