//! Reads a Hugging Face checkpoint (HF tensor names, one or more mmaped safetensors shards)
//! into dense model weights. Auto dtype: f32 on the CPU, the checkpoint's dtype on CUDA.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::{check_dtype_on_device, check_shape, LayerShapes, LoadOptions, LoadProgress, Progress};
use crate::model::error::{ModelError, Result};
use crate::model::spec::ModelSpec;
use crate::model::weights::{Embedding, FixedWeights, LayerWeights, Linear};

/// Shape and stored size of one tensor in the shards.
#[derive(Debug, Clone)]
struct Entry {
    shape: Vec<usize>,
    bytes: u64,
}

/// Mmaped safetensors shards plus the spec from config.json.
pub struct HfWeights<'a> {
    files: MmapedSafetensors,
    index: HashMap<String, Entry>,
    spec: ModelSpec,
    device: Device,
    dtype: DType,
    progress: Progress<'a>,
}

impl<'a> HfWeights<'a> {
    /// Maps `shards` and picks the compute dtype (see the module docs).
    pub fn open(spec: ModelSpec, shards: &[PathBuf], options: &LoadOptions) -> Result<Self> {
        if shards.is_empty() {
            return Err(ModelError::Source(
                "no safetensors files in the model directory".into(),
            ));
        }
        // SAFETY: the shards are mapped read-only; like every mmap-based loader we rely on the
        // files not being truncated or rewritten while the model is loading.
        let files = unsafe { MmapedSafetensors::multi(shards) }
            .map_err(|e| ModelError::Source(format!("reading safetensors: {e}")))?;
        let mut index = HashMap::new();
        let mut checkpoint_dtype = None;
        for (name, view) in files.tensors() {
            if name == "model.embed_tokens.weight" {
                checkpoint_dtype = DType::try_from(view.dtype()).ok();
            }
            let entry = Entry {
                shape: view.shape().to_vec(),
                bytes: view.data().len() as u64,
            };
            index.insert(name, entry);
        }
        let dtype = match options.dtype.dense() {
            Some(dtype) => dtype,
            None if options.device.is_cpu() => DType::F32,
            None => match checkpoint_dtype {
                Some(dt @ (DType::F16 | DType::BF16 | DType::F32)) => dt,
                _ => DType::F32,
            },
        };
        check_dtype_on_device(dtype, &options.device)?;
        let total = index.values().map(|e| e.bytes).sum();
        Ok(Self {
            files,
            index,
            spec,
            device: options.device.clone(),
            dtype,
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

    /// The spec from config.json.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The compute dtype chosen for the weights.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Embedding, final norm and head (`lm_head`, or the embedding when tied or absent).
    pub fn fixed(&mut self) -> Result<FixedWeights> {
        let (vocab, hidden) = (self.spec.vocab_size, self.spec.hidden_size);
        let table = self.tensor("model.embed_tokens.weight", &[vocab, hidden])?;
        let final_norm = self.tensor("model.norm.weight", &[hidden])?;
        let lm_head = if !self.spec.tie_word_embeddings && self.index.contains_key("lm_head.weight")
        {
            self.linear("lm_head", [vocab, hidden], false)?
        } else {
            if !self.spec.tie_word_embeddings {
                tracing::warn!("lm_head.weight is missing; tying the head to the embedding");
            }
            Linear::Dense {
                weight: table.clone(),
                bias: None,
            }
        };
        Ok(FixedWeights {
            embedding: Embedding::Dense(table),
            final_norm,
            lm_head,
        })
    }

    /// The weights of decoder layer `index`.
    pub fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        let s = LayerShapes::of(&self.spec);
        let h = self.spec.hidden_size;
        let p = format!("model.layers.{index}");
        let bias = self.spec.attention_bias;
        Ok(LayerWeights {
            attn_norm: self.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
            q: self.linear(&format!("{p}.self_attn.q_proj"), s.q, bias)?,
            k: self.linear(&format!("{p}.self_attn.k_proj"), s.kv, bias)?,
            v: self.linear(&format!("{p}.self_attn.v_proj"), s.kv, bias)?,
            o: self.linear(&format!("{p}.self_attn.o_proj"), s.o, false)?,
            ffn_norm: self.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
            gate: self.linear(&format!("{p}.mlp.gate_proj"), s.up, false)?,
            up: self.linear(&format!("{p}.mlp.up_proj"), s.up, false)?,
            down: self.linear(&format!("{p}.mlp.down_proj"), s.down, false)?,
        })
    }

    /// Loads `name` onto the device in the compute dtype, checking its shape.
    fn tensor(&mut self, name: &str, expected: &[usize]) -> Result<Tensor> {
        let entry = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        check_shape(name, &entry.shape, expected)?;
        let bytes = entry.bytes;
        let t = self.files.load(name, &self.device)?.to_dtype(self.dtype)?;
        self.progress.advance(bytes, name);
        Ok(t)
    }

    /// `<prefix>.weight` and, if required or present, `<prefix>.bias`.
    fn linear(&mut self, prefix: &str, shape: [usize; 2], with_bias: bool) -> Result<Linear> {
        let weight = self.tensor(&format!("{prefix}.weight"), &shape)?;
        let bias_name = format!("{prefix}.bias");
        let bias = if with_bias || self.index.contains_key(&bias_name) {
            Some(self.tensor(&bias_name, &shape[..1])?)
        } else {
            None
        };
        Ok(Linear::Dense { weight, bias })
    }
}

impl std::fmt::Debug for HfWeights<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfWeights")
            .field("spec", &self.spec)
            .field("dtype", &self.dtype)
            .field("tensors", &self.index.len())
            .finish_non_exhaustive()
    }
}
