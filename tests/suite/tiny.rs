//! Tiny random Llama-family checkpoints for the cross-checks: configs, weights with HF names,
//! writers for safetensors directories and GGUF files, and a runner for ferry's model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use ferry::config::{
    DeviceChoice, DeviceConfig, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode,
};
use ferry::model::loader::{load_model, DtypeChoice, LoadOptions};
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
    pub rope_theta: f32,
    /// Family metadata added to written GGUFs (without the `<arch>.` prefix, except for
    /// `general.` and `tokenizer.` keys).
    pub gguf_meta: Vec<(&'static str, gguf_file::Value)>,
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
            rope_theta: 10000.0,
            gguf_meta: Vec::new(),
        }
    }

    /// [`Tiny::llama`] with widths that are whole k-quant super-blocks (hidden 256,
    /// intermediate 512, head dim 64, vocab 256), every matrix a whole number of eight-row
    /// panels, 2 layers: every k-quant type applies as asked.
    pub fn k_quant_wide() -> Self {
        Self {
            hidden: 256,
            inter: 512,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            vocab: 256,
            ..Self::llama()
        }
    }

    fn common_json(&self) -> String {
        format!(
            r#""hidden_size": {}, "intermediate_size": {}, "num_hidden_layers": {},
            "num_attention_heads": {}, "num_key_value_heads": {}, "vocab_size": {},
            "max_position_embeddings": {CONTEXT}, "rms_norm_eps": 1e-5, "rope_theta": {:.1},
            "bos_token_id": 1, "eos_token_id": 2, "head_dim": {}"#,
            self.hidden,
            self.inter,
            self.layers,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.rope_theta,
            self.head_dim
        )
    }

    /// Qwen3: explicit head_dim, no biases, no sliding window.
    pub fn qwen3_config(&self, tied: bool) -> String {
        format!(
            r#"{{"model_type": "qwen3", {}, "hidden_act": "silu", "attention_bias": false,
            "sliding_window": null, "max_window_layers": {}, "use_sliding_window": false,
            "tie_word_embeddings": {tied}}}"#,
            self.common_json(),
            self.layers
        )
    }

    /// Gemma 2 (`gemma3` false) or Gemma 3: every `pattern`-th layer global, soft-caps as
    /// given (`null` for none).
    pub fn gemma_config(
        &self,
        gemma3: bool,
        window: usize,
        pattern: usize,
        softcaps: (&str, &str),
    ) -> String {
        let model_type = if gemma3 { "gemma3_text" } else { "gemma2" };
        format!(
            r#"{{"model_type": "{model_type}", {}, "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": false, "query_pre_attn_scalar": {}, "sliding_window": {window},
            "sliding_window_pattern": {pattern}, "rope_local_base_freq": 10000.0,
            "attn_logit_softcapping": {}, "final_logit_softcapping": {},
            "tie_word_embeddings": true}}"#,
            self.common_json(),
            self.head_dim,
            softcaps.0,
            softcaps.1
        )
    }

    /// Qwen3-MoE with `experts` experts of width `expert_ff`, two used per token.
    pub fn qwen3_moe_config(&self, experts: usize, expert_ff: usize) -> String {
        self.qwen3_config(false).replace(
            r#""model_type": "qwen3""#,
            &format!(
                r#""model_type": "qwen3_moe", "decoder_sparse_step": 1, "num_experts": {experts},
                "num_experts_per_tok": 2, "moe_intermediate_size": {expert_ff},
                "norm_topk_prob": true, "mlp_only_layers": []"#
            ),
        )
    }

    /// Mixtral with `experts` experts (of the MLP's width), two used per token.
    pub fn mixtral_config(&self, experts: usize) -> String {
        format!(
            r#"{{"model_type": "mixtral", {}, "hidden_act": "silu", "sliding_window": 4096,
            "num_local_experts": {experts}, "num_experts_per_tok": 2, "use_flash_attn": false,
            "tie_word_embeddings": false}}"#,
            self.common_json()
        )
    }

    /// Replaces each layer's MLP of `w` by a router and `experts` random experts of width
    /// `ff`, under Qwen3-MoE's names (`mlp.experts.E.gate_proj`) or, with `mixtral`, Mixtral's
    /// (`block_sparse_moe.experts.E.w1`).
    pub fn add_experts(
        &self,
        w: &mut HashMap<String, Tensor>,
        experts: usize,
        ff: usize,
        mixtral: bool,
    ) {
        let mut g = Gauss::seeded(0xe4e4);
        let h = self.hidden;
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            for n in ["gate_proj", "up_proj", "down_proj"] {
                w.remove(&format!("{p}.mlp.{n}.weight"));
            }
            let (block, names) = if mixtral {
                ("block_sparse_moe", ["w1", "w3", "w2"])
            } else {
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            };
            // A wide router, so that the top two differ between tokens.
            w.insert(
                format!("{p}.{block}.gate.weight"),
                g.randn(&[experts, h], 0.5),
            );
            for e in 0..experts {
                let [gate, up, down] = names;
                let mut put =
                    |n: &str, t| w.insert(format!("{p}.{block}.experts.{e}.{n}.weight"), t);
                put(gate, g.randn(&[ff, h], 0.1));
                put(up, g.randn(&[ff, h], 0.1));
                put(down, g.randn(&[h, ff], 0.1));
            }
        }
    }

    /// Phi-3: fused projections, no rope scaling.
    pub fn phi3_config(&self) -> String {
        format!(
            r#"{{"model_type": "phi3", {}, "hidden_act": "silu", "rope_scaling": null,
            "tie_word_embeddings": false}}"#,
            self.common_json()
        )
    }

    pub fn llama_config(&self, tied: bool, rope_scaling: Option<&str>) -> String {
        let scaling = rope_scaling
            .map(|s| format!(", \"rope_scaling\": {s}"))
            .unwrap_or_default();
        format!(
            r#"{{"model_type": "llama", "architectures": ["LlamaForCausalLM"], {},
            "hidden_act": "silu", "tie_word_embeddings": {tied}{scaling}}}"#,
            self.common_json()
        )
    }

    pub fn qwen2_config(&self, tied: bool) -> String {
        format!(
            r#"{{"model_type": "qwen2", {}, "hidden_act": "silu", "tie_word_embeddings": {tied},
            "sliding_window": 4096, "max_window_layers": 2, "use_sliding_window": false}}"#,
            self.common_json()
        )
    }

    pub fn mistral_config(&self) -> String {
        format!(
            r#"{{"model_type": "mistral", {}, "hidden_act": "silu", "sliding_window": 4096,
            "tie_word_embeddings": false}}"#,
            self.common_json()
        )
    }

    /// Random weights under HF names; `lm_head` only when `untied`.
    pub fn random_weights(&self, qkv_bias: bool, untied: bool) -> HashMap<String, Tensor> {
        // Seeded, so every run checks the same weights (an unseeded draw occasionally put an
        // activation on a rounding boundary where the two implementations differ).
        let mut g = Gauss::seeded(0x5eed);
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let mut w = HashMap::new();
        w.insert(
            "model.embed_tokens.weight".to_string(),
            g.randn(&[self.vocab, h], 0.5),
        );
        w.insert("model.norm.weight".to_string(), g.norm(h));
        if untied {
            w.insert("lm_head.weight".to_string(), g.randn(&[self.vocab, h], 0.1));
        }
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let mut put = |name: &str, t: Tensor| w.insert(format!("{p}.{name}"), t);
            put("input_layernorm.weight", g.norm(h));
            put("post_attention_layernorm.weight", g.norm(h));
            put("self_attn.q_proj.weight", g.randn(&[q, h], 0.1));
            put("self_attn.k_proj.weight", g.randn(&[kv, h], 0.1));
            put("self_attn.v_proj.weight", g.randn(&[kv, h], 0.1));
            put("self_attn.o_proj.weight", g.randn(&[h, q], 0.1));
            put("mlp.gate_proj.weight", g.randn(&[self.inter, h], 0.1));
            put("mlp.up_proj.weight", g.randn(&[self.inter, h], 0.1));
            put("mlp.down_proj.weight", g.randn(&[h, self.inter], 0.1));
            if qkv_bias {
                put("self_attn.q_proj.bias", g.randn(&[q], 0.2));
                put("self_attn.k_proj.bias", g.randn(&[kv], 0.2));
                put("self_attn.v_proj.bias", g.randn(&[kv], 0.2));
            }
        }
        w
    }

    /// Adds random per-layer norms `names` (suffixes after `model.layers.N.`) of width `dim`.
    pub fn add_norms(&self, w: &mut HashMap<String, Tensor>, names: &[&str], dim: usize) {
        let mut g = Gauss::seeded(0x0a0b);
        for i in 0..self.layers {
            for name in names {
                w.insert(format!("model.layers.{i}.{name}"), g.norm(dim));
            }
        }
    }

    /// Qwen3 weights: the Llama layers plus per-head q/k norms.
    pub fn qwen3_weights(&self, untied: bool) -> HashMap<String, Tensor> {
        let mut w = self.random_weights(false, untied);
        let qk = ["self_attn.q_norm.weight", "self_attn.k_norm.weight"];
        self.add_norms(&mut w, &qk, self.head_dim);
        w
    }

    /// Gemma 2/3 weights (tied head): pre- and post-norms around attention and MLP, and q/k
    /// norms for Gemma 3.
    pub fn gemma_weights(&self, gemma3: bool) -> HashMap<String, Tensor> {
        let mut w = self.random_weights(false, false);
        let post = [
            "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight",
        ];
        self.add_norms(&mut w, &post, self.hidden);
        if gemma3 {
            let qk = ["self_attn.q_norm.weight", "self_attn.k_norm.weight"];
            self.add_norms(&mut w, &qk, self.head_dim);
        }
        w
    }

    /// Phi-3 weights: the Llama layers with q/k/v and gate/up fused, as Phi-3 stores them.
    pub fn phi3_weights(&self) -> HashMap<String, Tensor> {
        let mut w = self.random_weights(false, true);
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let mut take = |n: &str| w.remove(&format!("{p}.{n}")).unwrap();
            let qkv = Tensor::cat(
                &[
                    take("self_attn.q_proj.weight"),
                    take("self_attn.k_proj.weight"),
                    take("self_attn.v_proj.weight"),
                ],
                0,
            )
            .unwrap();
            let gate_up = Tensor::cat(
                &[take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")],
                0,
            )
            .unwrap();
            w.insert(format!("{p}.self_attn.qkv_proj.weight"), qkv);
            w.insert(format!("{p}.mlp.gate_up_proj.weight"), gate_up);
        }
        w
    }

    /// Adds a small SentencePiece vocabulary of `vocab` tokens (`<unk>`, `<s>`, `</s>`, then
    /// letters and letter pairs) to the GGUF metadata, so the file loads for serving.
    pub fn add_spm_vocab(&mut self) {
        let letters: Vec<char> = ('a'..='z').collect();
        let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
        let mut pairs = letters
            .iter()
            .flat_map(|a| letters.iter().map(move |b| format!("{a}{b}")));
        while tokens.len() < self.vocab {
            let i = tokens.len() - 3;
            tokens.push(match i {
                i if i < 26 => letters[i].to_string(),
                i if i < 52 => format!("\u{2581}{}", letters[i - 26]),
                _ => pairs.next().unwrap(),
            });
        }
        let types = (0..self.vocab).map(|i| match i {
            0 => 2,
            1 | 2 => 3,
            _ => 1,
        });
        let strings = tokens.into_iter().map(gguf_file::Value::String).collect();
        self.gguf_meta.extend([
            (
                "tokenizer.ggml.model",
                gguf_file::Value::String("llama".into()),
            ),
            ("tokenizer.ggml.tokens", gguf_file::Value::Array(strings)),
            (
                "tokenizer.ggml.scores",
                gguf_file::Value::Array(
                    (0..self.vocab)
                        .map(|i| gguf_file::Value::F32(-(i as f32)))
                        .collect(),
                ),
            ),
            (
                "tokenizer.ggml.token_type",
                gguf_file::Value::Array(types.map(gguf_file::Value::I32).collect()),
            ),
            ("tokenizer.ggml.bos_token_id", gguf_file::Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", gguf_file::Value::U32(2)),
        ]);
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
        let gemma = arch.starts_with("gemma");
        // GGUF stacks a layer's experts: `blk.N.ffn_{gate,up,down}_exps.weight`.
        let mut stacks: std::collections::BTreeMap<String, Vec<(usize, Tensor)>> =
            Default::default();
        for (name, t) in weights {
            if let Some((stacked, e)) = expert_gguf_name(name) {
                stacks.entry(stacked).or_default().push((e, t.clone()));
            }
        }
        for (name, mut experts) in stacks {
            experts.sort_by_key(|(e, _)| *e);
            let parts: Vec<Tensor> = experts.into_iter().map(|(_, t)| t).collect();
            let t = Tensor::stack(&parts, 0).unwrap();
            tensors.push((name.clone(), QTensor::quantize(&t, types(&name)).unwrap()));
        }
        for (name, t) in weights {
            if expert_gguf_name(name).is_some() {
                continue;
            }
            let Some((gguf_name, heads)) = self.gguf_name(name, gemma) else {
                panic!("no GGUF name for {name}");
            };
            let t = match heads {
                Some(n) if permute_qk => permute(t, n),
                _ => t.clone(),
            };
            // llama.cpp's converter stores Gemma's norms as 1 + w.
            let t = if gemma && gguf_name.ends_with("norm.weight") {
                (t + 1.0).unwrap()
            } else {
                t
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
                gguf_file::Value::F32(self.rope_theta),
            ),
            (format!("{arch}.rope.dimension_count"), u32v(self.head_dim)),
            (format!("{arch}.attention.key_length"), u32v(self.head_dim)),
            (
                format!("{arch}.attention.value_length"),
                u32v(self.head_dim),
            ),
        ];
        let mut meta = meta;
        meta.extend(self.gguf_meta.iter().map(|(k, v)| {
            if k.starts_with("general.") || k.starts_with("tokenizer.") {
                (k.to_string(), v.clone())
            } else {
                (format!("{arch}.{k}"), v.clone())
            }
        }));
        let meta_refs: Vec<(&str, &gguf_file::Value)> =
            meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut file = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
    }

    /// llama.cpp name for an HF name, and the head count to permute by (q and k only).
    fn gguf_name(&self, hf: &str, gemma: bool) -> Option<(String, Option<usize>)> {
        match hf {
            "model.embed_tokens.weight" => return Some(("token_embd.weight".into(), None)),
            "model.norm.weight" => return Some(("output_norm.weight".into(), None)),
            "lm_head.weight" => return Some(("output.weight".into(), None)),
            "rope_factors_long.weight" => return Some((hf.into(), None)),
            _ => {}
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, name) = rest.split_once('.')?;
        let (gguf, heads) = match name {
            "post_attention_layernorm.weight" if gemma => ("post_attention_norm.weight", None),
            "pre_feedforward_layernorm.weight" => ("ffn_norm.weight", None),
            "post_feedforward_layernorm.weight" => ("post_ffw_norm.weight", None),
            "self_attn.q_norm.weight" => ("attn_q_norm.weight", None),
            "self_attn.k_norm.weight" => ("attn_k_norm.weight", None),
            "self_attn.qkv_proj.weight" => ("attn_qkv.weight", None),
            "mlp.gate_up_proj.weight" => ("ffn_up.weight", None),
            "mlp.gate.weight" | "block_sparse_moe.gate.weight" => ("ffn_gate_inp.weight", None),
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

/// The stacked GGUF tensor an HF expert weight goes into, and its expert index.
fn expert_gguf_name(hf: &str) -> Option<(String, usize)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (e, kind) = rest.split_once('.')?;
    let kind = match kind {
        "gate_proj.weight" | "w1.weight" => "gate",
        "up_proj.weight" | "w3.weight" => "up",
        "down_proj.weight" | "w2.weight" => "down",
        _ => return None,
    };
    Some((
        format!("blk.{layer}.ffn_{kind}_exps.weight"),
        e.parse().ok()?,
    ))
}

/// Writes a tiny servable GGUF of family `arch` (`qwen3`, `gemma3`, `phi3`) with matrices of
/// `dtype` and a SentencePiece vocabulary; Gemma 3's layers 0 and 2 get a 3-token window.
pub fn family_gguf(path: &Path, arch: &str, dtype: GgmlDType) {
    let mut tiny = Tiny::llama();
    tiny.add_spm_vocab();
    let weights = match arch {
        "qwen3" => tiny.qwen3_weights(true),
        "gemma3" => {
            tiny.rope_theta = 1_000_000.0;
            tiny.gguf_meta.extend([
                ("attention.sliding_window", gguf_file::Value::U32(3)),
                ("attention.sliding_window_pattern", gguf_file::Value::U32(2)),
            ]);
            tiny.gemma_weights(true)
        }
        "phi3" => tiny.phi3_weights(),
        "qwen3moe" => {
            tiny.gguf_meta.extend(moe_meta(4, 32));
            let mut w = tiny.qwen3_weights(true);
            tiny.add_experts(&mut w, 4, 32, false);
            w
        }
        other => panic!("no tiny {other}"),
    };
    tiny.write_gguf(path, arch, &weights, dtype, false);
}

/// GGUF metadata of `experts` experts of width `ff`, two used per token.
pub fn moe_meta(experts: usize, ff: usize) -> [(&'static str, gguf_file::Value); 3] {
    [
        ("expert_count", gguf_file::Value::U32(experts as u32)),
        ("expert_used_count", gguf_file::Value::U32(2)),
        (
            "expert_feed_forward_length",
            gguf_file::Value::U32(ff as u32),
        ),
    ]
}

/// Seeded normal draws (Box-Muller over two uniforms in (0, 1]).
struct Gauss(rand::rngs::StdRng);

impl Gauss {
    fn seeded(seed: u64) -> Self {
        Self(<rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(
            seed,
        ))
    }

    fn randn(&mut self, shape: &[usize], std: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let u1: f32 = 1.0 - rand::Rng::random::<f32>(&mut self.0);
                let u2: f32 = rand::Rng::random::<f32>(&mut self.0);
                std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect();
        Tensor::from_vec(values, shape.to_vec(), &Device::Cpu).unwrap()
    }

    /// A norm weight near 1.
    fn norm(&mut self, n: usize) -> Tensor {
        (self.randn(&[n], 0.1) + 1.0).unwrap()
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
pub fn ours(files: &ModelFiles, dtype: DtypeChoice) -> Vec<Vec<f32>> {
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

/// A device budget every tiny model fits in.
pub const BIG: u64 = 64 << 30;

/// A model entry for the checkpoint at `source`: one sequence of 64 tokens, prefetch 1, a
/// budget everything fits in ([`BIG`]).
pub fn config(source: &Path, dtype: DtypeChoice, mode: OffloadMode) -> ModelConfig {
    ModelConfig {
        name: "m".into(),
        source: source.to_string_lossy().into_owned(),
        dtype,
        max_context: Some(64),
        max_batch: Some(1),
        offload: OffloadConfig {
            mode,
            gpu_memory: MemoryBudget::Bytes(BIG),
            prefetch: 1,
            keep_alive: std::time::Duration::from_secs(1),
        },
        ..ModelConfig::default()
    }
}

/// The CPU device.
pub fn cpu() -> DeviceConfig {
    DeviceConfig {
        kind: DeviceChoice::Cpu,
        ..DeviceConfig::default()
    }
}
