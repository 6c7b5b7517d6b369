//! Tiny random Llama-family checkpoints for the cross-checks: configs, weights with HF names,
//! writers for safetensors directories and GGUF files, and a runner for ferry's model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use ferry::model::loader::{load_model, DTypeChoice, LoadOptions};
use ferry::model::source::ModelFiles;

/// The prompt every test prefills.
pub const PROMPT: &[u32] = &[1, 17, 42, 99, 5, 63, 120];
/// Tokens fed one at a time through the cache after the prompt.
pub const STEPS: &[u32] = &[7, 88, 31];
const CONTEXT: usize = 64;

/// Dimensions of a tiny model.
pub struct Tiny {
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

impl Tiny {
    /// Hidden 64, 3 layers, 4 query heads sharing 2 key/value heads, vocab 128.
    pub fn llama() -> Self {
        Self {
            hidden: 64,
            inter: 128,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            vocab: 128,
        }
    }

    fn common_json(&self) -> String {
        format!(
            r#""hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {},
            "num_attention_heads": {}, "num_key_value_heads": {}, "vocab_size": {},
            "max_position_embeddings": {CONTEXT}, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2"#,
            self.hidden, self.inter, self.layers, self.heads, self.kv_heads, self.vocab
        )
    }

    pub fn llama_config(&self, tied: bool, rope_scaling: Option<&str>) -> String {
        let scaling = rope_scaling
            .map(|s| format!(", \"rope_scaling\": {s}"))
            .unwrap_or_default();
        format!(
            r#"{{"model_type": "llama", "architectures": ["LlamaForCausalLM"], {},
            "tie_word_embeddings": {tied}{scaling}}}"#,
            self.common_json()
        )
    }

    pub fn qwen2_config(&self, tied: bool) -> String {
        format!(
            r#"{{"model_type": "qwen2", {}, "tie_word_embeddings": {tied},
            "sliding_window": 4096, "max_window_layers": 2, "use_sliding_window": false}}"#,
            self.common_json()
        )
    }

    pub fn mistral_config(&self) -> String {
        format!(
            r#"{{"model_type": "mistral", {}, "head_dim": {}, "sliding_window": 4096,
            "tie_word_embeddings": false}}"#,
            self.common_json(),
            self.head_dim
        )
    }

    /// Random weights under HF names; `lm_head` only when `untied`.
    pub fn random_weights(&self, qkv_bias: bool, untied: bool) -> HashMap<String, Tensor> {
        let dev = Device::Cpu;
        // Seeded, so every run checks the same weights (an unseeded draw occasionally put an
        // activation on a rounding boundary where the two implementations differ).
        let rng = std::cell::RefCell::new(
            <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0x5eed),
        );
        let randn = |shape: &[usize], std: f32| {
            let n: usize = shape.iter().product();
            let mut rng = rng.borrow_mut();
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    // Box-Muller: two uniforms in (0, 1] -> one standard normal.
                    let u1: f32 = 1.0 - rand::Rng::random::<f32>(&mut *rng);
                    let u2: f32 = rand::Rng::random::<f32>(&mut *rng);
                    std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
                })
                .collect();
            Tensor::from_vec(values, shape.to_vec(), &dev).unwrap()
        };
        let norm = |n: usize| (randn(&[n], 0.1) + 1.0).unwrap();
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let mut w = HashMap::new();
        w.insert(
            "model.embed_tokens.weight".to_string(),
            randn(&[self.vocab, h], 0.5),
        );
        w.insert("model.norm.weight".to_string(), norm(h));
        if untied {
            w.insert("lm_head.weight".to_string(), randn(&[self.vocab, h], 0.1));
        }
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let mut put = |name: &str, t: Tensor| w.insert(format!("{p}.{name}"), t);
            put("input_layernorm.weight", norm(h));
            put("post_attention_layernorm.weight", norm(h));
            put("self_attn.q_proj.weight", randn(&[q, h], 0.1));
            put("self_attn.k_proj.weight", randn(&[kv, h], 0.1));
            put("self_attn.v_proj.weight", randn(&[kv, h], 0.1));
            put("self_attn.o_proj.weight", randn(&[h, q], 0.1));
            put("mlp.gate_proj.weight", randn(&[self.inter, h], 0.1));
            put("mlp.up_proj.weight", randn(&[self.inter, h], 0.1));
            put("mlp.down_proj.weight", randn(&[h, self.inter], 0.1));
            if qkv_bias {
                put("self_attn.q_proj.bias", randn(&[q], 0.2));
                put("self_attn.k_proj.bias", randn(&[kv], 0.2));
                put("self_attn.v_proj.bias", randn(&[kv], 0.2));
            }
        }
        w
    }

    /// Writes config.json and `shards` safetensors files into `dir`.
    pub fn write_hf(
        &self,
        dir: &Path,
        config: &str,
        weights: &HashMap<String, Tensor>,
        shards: usize,
    ) -> ModelFiles {
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config).unwrap();
        let mut names: Vec<&String> = weights.keys().collect();
        names.sort();
        let per_shard = names.len().div_ceil(shards);
        let mut paths = Vec::new();
        for (i, chunk) in names.chunks(per_shard).enumerate() {
            let part: HashMap<String, Tensor> = chunk
                .iter()
                .map(|n| ((*n).clone(), weights[*n].clone()))
                .collect();
            let path = dir.join(format!("model-{:05}-of-{shards:05}.safetensors", i + 1));
            candle_core::safetensors::save(&part, &path).unwrap();
            paths.push(path);
        }
        ModelFiles::HfDir {
            dir: dir.to_path_buf(),
            config: config_path,
            tokenizer: dir.join("tokenizer.json"),
            tokenizer_config: None,
            generation_config: None,
            weights: paths,
        }
    }

    /// Writes a GGUF with llama.cpp tensor names. Matrices use `dtype` (embedding and head
    /// Q8_0 unless `dtype` is F32), vectors stay F32. `permute_qk` reorders q/k rows the way
    /// llama.cpp's converter does for interleaved RoPE.
    pub fn write_gguf(
        &self,
        path: &Path,
        arch: &str,
        weights: &HashMap<String, Tensor>,
        dtype: GgmlDType,
        permute_qk: bool,
    ) {
        let fixed_dtype = if dtype == GgmlDType::F32 {
            dtype
        } else {
            GgmlDType::Q8_0
        };
        let types = |gguf_name: &str| {
            if gguf_name.starts_with("blk.") {
                dtype
            } else {
                fixed_dtype
            }
        };
        self.write_gguf_typed(path, arch, weights, &types, permute_qk);
    }

    /// [`Tiny::write_gguf`] with `types` choosing each matrix's type by its GGUF name (vectors
    /// stay F32), e.g. the mixed types of a Q4_K_M file.
    pub fn write_gguf_typed(
        &self,
        path: &Path,
        arch: &str,
        weights: &HashMap<String, Tensor>,
        types: &dyn Fn(&str) -> GgmlDType,
        permute_qk: bool,
    ) {
        self.write_gguf_full(path, arch, weights, types, permute_qk, CONTEXT);
    }

    /// [`Tiny::write_gguf`] (Q8_0 matrices) declaring a context window of `context` tokens, e.g.
    /// a long one whose full KV cache does not fit a budget.
    pub fn write_gguf_context(
        &self,
        path: &Path,
        arch: &str,
        weights: &HashMap<String, Tensor>,
        context: usize,
    ) {
        let types = |_: &str| GgmlDType::Q8_0;
        self.write_gguf_full(path, arch, weights, &types, false, context);
    }

    fn write_gguf_full(
        &self,
        path: &Path,
        arch: &str,
        weights: &HashMap<String, Tensor>,
        types: &dyn Fn(&str) -> GgmlDType,
        permute_qk: bool,
        context: usize,
    ) {
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        for (name, t) in weights {
            let Some((gguf_name, heads)) = self.gguf_name(name) else {
                panic!("no GGUF name for {name}");
            };
            let t = match heads {
                Some(n) if permute_qk => permute(t, n),
                _ => t.clone(),
            };
            let qdtype = if t.rank() == 1 {
                GgmlDType::F32
            } else {
                types(&gguf_name)
            };
            tensors.push((gguf_name, QTensor::quantize(&t, qdtype).unwrap()));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let u32v = |v: usize| gguf_file::Value::U32(v as u32);
        let meta: Vec<(String, gguf_file::Value)> = vec![
            (
                "general.architecture".into(),
                gguf_file::Value::String(arch.into()),
            ),
            (format!("{arch}.context_length"), u32v(context)),
            (format!("{arch}.embedding_length"), u32v(self.hidden)),
            (format!("{arch}.feed_forward_length"), u32v(self.inter)),
            (format!("{arch}.block_count"), u32v(self.layers)),
            (format!("{arch}.attention.head_count"), u32v(self.heads)),
            (
                format!("{arch}.attention.head_count_kv"),
                u32v(self.kv_heads),
            ),
            (
                format!("{arch}.attention.layer_norm_rms_epsilon"),
                gguf_file::Value::F32(1e-5),
            ),
            (
                format!("{arch}.rope.freq_base"),
                gguf_file::Value::F32(10000.0),
            ),
            (format!("{arch}.rope.dimension_count"), u32v(self.head_dim)),
        ];
        let meta_refs: Vec<(&str, &gguf_file::Value)> =
            meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut file = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
    }

    /// llama.cpp name for an HF name, and the head count to permute by (q and k only).
    fn gguf_name(&self, hf: &str) -> Option<(String, Option<usize>)> {
        match hf {
            "model.embed_tokens.weight" => return Some(("token_embd.weight".into(), None)),
            "model.norm.weight" => return Some(("output_norm.weight".into(), None)),
            "lm_head.weight" => return Some(("output.weight".into(), None)),
            _ => {}
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, name) = rest.split_once('.')?;
        let (gguf, heads) = match name {
            "input_layernorm.weight" => ("attn_norm.weight", None),
            "post_attention_layernorm.weight" => ("ffn_norm.weight", None),
            "self_attn.q_proj.weight" => ("attn_q.weight", Some(self.heads)),
            "self_attn.q_proj.bias" => ("attn_q.bias", Some(self.heads)),
            "self_attn.k_proj.weight" => ("attn_k.weight", Some(self.kv_heads)),
            "self_attn.k_proj.bias" => ("attn_k.bias", Some(self.kv_heads)),
            "self_attn.v_proj.weight" => ("attn_v.weight", None),
            "self_attn.v_proj.bias" => ("attn_v.bias", None),
            "self_attn.o_proj.weight" => ("attn_output.weight", None),
            "mlp.gate_proj.weight" => ("ffn_gate.weight", None),
            "mlp.up_proj.weight" => ("ffn_up.weight", None),
            "mlp.down_proj.weight" => ("ffn_down.weight", None),
            _ => return None,
        };
        Some((format!("blk.{layer}.{gguf}"), heads))
    }
}

/// llama.cpp's `permute`: rows `[head][half][i]` become `[head][i][half]`.
fn permute(t: &Tensor, heads: usize) -> Tensor {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    let mut split = vec![heads, 2, rows / heads / 2];
    split.extend_from_slice(&dims[1..]);
    t.reshape(split)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// ferry's logits for the prompt and each decode step.
pub fn ours(files: &ModelFiles, dtype: DTypeChoice) -> Vec<Vec<f32>> {
    let options = LoadOptions {
        device: Device::Cpu,
        dtype,
    };
    let loaded = load_model(files, &options, &mut |_| {}).unwrap();
    let mut layers = loaded.layers;
    let mut cache = loaded.model.new_cache();
    let mut out = Vec::new();
    let logits = loaded
        .model
        .forward(PROMPT, &mut cache, &mut layers)
        .unwrap();
    out.push(logits.to_vec1().unwrap());
    for &t in STEPS {
        let logits = loaded.model.forward(&[t], &mut cache, &mut layers).unwrap();
        out.push(logits.to_vec1().unwrap());
    }
    out
}

/// Largest element-wise difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}
