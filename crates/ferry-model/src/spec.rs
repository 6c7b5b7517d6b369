//! [`ModelSpec`]: the architecture and dimensions of a decoder model (the Llama family, Qwen3,
//! Qwen3-MoE, Mixtral, Gemma 2/3, Phi-3, and from GGUF only gpt-oss, Qwen2-MoE, GLM-4.5's
//! `glm4moe` and DeepSeek-V2/V3's `deepseek2`), read either from a Hugging Face `config.json` or from GGUF metadata (keys
//! prefixed by `general.architecture`).
//!
//! The spec is everything the blocks need besides weights: head layout, RoPE parameters (and
//! their scalings, Gemma 3's local base), the attention windows per layer, soft-caps, norm
//! conventions, experts, context length, norm epsilon and the special token ids. Together with the tensor table
//! ([`super::tensors`]) it is all the planner needs to size a model before anything is loaded.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use serde::Deserialize;

use super::error::{ModelError, Result};
use super::header::GgufHeader;
use super::tensors::{FixedPart, Format, Part};

/// The model families ferry implements. The Llama family (Llama, Qwen2, Mistral, and the MoE
/// families Mixtral, Qwen2-MoE, gpt-oss and GLM-4.5) shares one block; Qwen3, Gemma 2/3,
/// Phi-3 and DeepSeek's `deepseek2` have blocks of their own (`super::decoder::block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1/2/3, SmolLM, TinyLlama and other `LlamaForCausalLM` checkpoints.
    Llama,
    /// Qwen2 / Qwen2.5: biases on the q, k and v projections.
    Qwen2,
    /// Mistral: Llama blocks with an optional sliding attention window.
    Mistral,
    /// Qwen3 (dense): per-head q/k RMSNorms, no q/k/v biases.
    Qwen3,
    /// Gemma 2: GeGLU, pre- and post-norms, attention and final logit soft-capping,
    /// sliding-window and global layers alternating.
    Gemma2,
    /// Gemma 3: Gemma 2's layout with per-head q/k norms instead of attention soft-capping,
    /// five sliding-window layers (their own RoPE base) to each global one.
    Gemma3,
    /// Phi-3: fused q/k/v and gate/up projections.
    Phi3,
    /// Qwen3-MoE: Qwen3's attention, routed SwiGLU experts (top-k softmax routing), no shared
    /// expert.
    Qwen3Moe,
    /// Mixtral: Llama/Mistral attention, routed SwiGLU experts (top-k of a softmax,
    /// renormalised). GGUFs call it `llama` and carry `expert_count`.
    Mixtral,
    /// gpt-oss: biased q/k/v/o, a learned sink logit per head in the softmax, sliding-window
    /// (even) and global (odd) layers alternating, YaRN RoPE, routed experts with biases and
    /// the clamped SwiGLU, routed by the top-k router logits with the softmax over the chosen
    /// ones. GGUF only.
    GptOss,
    /// Qwen2-MoE (Qwen1.5-MoE): Qwen2's attention, routed SwiGLU experts (top-k of a softmax,
    /// not renormalised) plus a shared expert scaled by a sigmoid gate. GGUF only.
    Qwen2Moe,
    /// GLM-4.5 / 4.6 / 4.7 (`glm4moe`): biased q/k/v, optional q/k norms, RoPE on part of each
    /// head, leading dense layers, then routed experts scored by a sigmoid, chosen with a
    /// correction bias, their weights normalised and scaled, plus an ungated shared expert;
    /// trailing multi-token-prediction blocks are not run. GGUF only.
    Glm4Moe,
    /// Qwen3.5 (dense, `qwen35`): hybrid, three Gated DeltaNet (linear-attention) layers to
    /// each full-attention one ([`DeltaNetSpec`]); the attention layers gate their output by
    /// `sigmoid` of a second half of the query projection, with q/k norms and RoPE on part of
    /// each head. GGUF only.
    Qwen35,
    /// Qwen3.5-MoE (`qwen35moe`): Qwen3.5's layers with routed experts (softmax, renormalised)
    /// plus a shared expert scaled by a sigmoid gate. GGUF only.
    Qwen35Moe,
    /// DeepSeek-V2 / V2-Lite / V3 (and Kimi K2 in the same layout, `deepseek2`): multi-head
    /// latent attention ([`MlaSpec`]: queries optionally through a low-rank compression, keys
    /// and values from one cached latent per token plus a RoPE part shared by the heads),
    /// YaRN with DeepSeek's score scale, leading dense layers, routed experts (softmax, or
    /// sigmoid with a correction bias and expert groups) plus ungated shared experts. GGUF only.
    Deepseek2,
}

impl Architecture {
    /// Every family.
    pub const ALL: [Architecture; 15] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Mistral,
        Architecture::Qwen3,
        Architecture::Gemma2,
        Architecture::Gemma3,
        Architecture::Phi3,
        Architecture::Qwen3Moe,
        Architecture::Mixtral,
        Architecture::GptOss,
        Architecture::Qwen2Moe,
        Architecture::Glm4Moe,
        Architecture::Qwen35,
        Architecture::Qwen35Moe,
        Architecture::Deepseek2,
    ];

    /// The lowercase name used by HF `model_type` and GGUF `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Mistral => "mistral",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Mixtral => "mixtral",
            Architecture::GptOss => "gpt-oss",
            Architecture::Qwen2Moe => "qwen2moe",
            Architecture::Glm4Moe => "glm4moe",
            Architecture::Qwen35 => "qwen35",
            Architecture::Qwen35Moe => "qwen35moe",
            Architecture::Deepseek2 => "deepseek2",
        }
    }

    fn from_name(name: &str) -> Result<Self> {
        let name = match name {
            // Gemma 3's text-only checkpoints (1B) say `gemma3_text`.
            "gemma3_text" => "gemma3",
            // transformers' names; llama.cpp's are `qwen3moe` and `glm4moe`.
            "qwen3_moe" => "qwen3moe",
            "glm4_moe" => "glm4moe",
            other => other,
        };
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|a| a.name()).collect();
                ModelError::Unsupported(format!(
                    "architecture `{name}` (supported: {})",
                    names.join(", ")
                ))
            })
    }

    /// Families ferry reads from GGUF files only (their Hugging Face layouts differ: gpt-oss
    /// fuses gate/up and stores MXFP4 as blocks and scales).
    pub fn gguf_only(self) -> bool {
        matches!(
            self,
            Architecture::GptOss
                | Architecture::Qwen2Moe
                | Architecture::Glm4Moe
                | Architecture::Qwen35
                | Architecture::Qwen35Moe
                | Architecture::Deepseek2
        )
    }

    /// Qwen3.5, dense and MoE: the hybrid families ([`ModelSpec::delta_net`]).
    pub fn is_qwen35(self) -> bool {
        matches!(self, Architecture::Qwen35 | Architecture::Qwen35Moe)
    }

    /// Gemma 2 and 3.
    pub fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }

    /// Every n-th layer is global, the others use the sliding window (Gemma 2: 2,
    /// Gemma 3: 6); `None`: the window, if any, applies to every layer.
    fn default_window_pattern(self) -> Option<usize> {
        match self {
            Architecture::Gemma2 | Architecture::GptOss => Some(2),
            Architecture::Gemma3 => Some(6),
            _ => None,
        }
    }
}

/// The routed experts of a mixture-of-experts model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    /// Experts per layer.
    pub n_experts: usize,
    /// Experts each token is routed to (top-k).
    pub n_used: usize,
    /// Width of one expert's SwiGLU.
    pub expert_ff: usize,
    /// Renormalise the top-k routing weights to sum to 1 (Mixtral always; Qwen3-MoE's
    /// `norm_topk_prob`).
    pub norm_topk: bool,
    /// How router logits become the chosen experts' weights.
    pub gating: Gating,
    /// The experts' gated activation.
    pub activation: ExpertActivation,
    /// Width of the shared expert every row runs (Qwen2-MoE, GLM-4.5), if the layer has one.
    pub shared_ff: Option<usize>,
    /// The shared expert's output is scaled by `sigmoid(h . w)` (Qwen2-MoE); otherwise it is
    /// added as it is (GLM-4.5).
    pub shared_gate: bool,
    /// A per-expert correction bias (GGUF `exp_probs_b`) is added to the scores that choose
    /// the experts, not to their weights (GLM-4.5, DeepSeek-V3).
    pub selection_bias: bool,
    /// The chosen experts' weights are multiplied by this after any renormalisation
    /// (`expert_weights_scale`, transformers' `routed_scaling_factor`; 1 for most families).
    pub weights_scale: f32,
    /// Group-limited selection (DeepSeek-V3): the experts are split into `count` equal groups,
    /// each group scored by the sum of its two best selection scores, and the top k are chosen
    /// from the best `used` groups only. `count` 1: no groups.
    pub groups: ExpertGroups,
    /// The first this many decoder layers have a dense MLP instead (GLM-4.5's
    /// `leading_dense_block_count`).
    pub dense_lead: usize,
}

/// How a router's experts are grouped for selection ([`MoeSpec::groups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertGroups {
    /// Groups of experts (1: selection over all experts at once).
    pub count: usize,
    /// Groups the top k are chosen from.
    pub used: usize,
}

impl ExpertGroups {
    /// One group holding every expert.
    pub const NONE: ExpertGroups = ExpertGroups { count: 1, used: 1 };
}

/// How a MoE router's logits choose experts and weigh them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over every expert; the top k by probability, weighted by it (Mixtral,
    /// Qwen-MoE).
    Softmax,
    /// The top k by logit, weighted by a softmax over the k chosen logits (gpt-oss).
    SoftmaxOfTopK,
    /// Each expert scored on its own by `sigmoid(logit)`; the top k by score (plus any
    /// selection bias), weighted by their scores (GLM-4.5, DeepSeek-V3).
    Sigmoid,
}

/// The activation of a routed expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertActivation {
    /// `silu(gate) * up`.
    Swiglu,
    /// gpt-oss's clamped SwiGLU: `g * sigmoid(1.702 g) * (u + 1)` with `g = min(gate, 7)` and
    /// `u = clamp(up, -7, 7)`.
    ClampedSwiglu,
}

impl MoeSpec {
    /// Softmax routing to SwiGLU experts with nothing else (no shared expert, bias, scale,
    /// groups or dense layers), not renormalised; its sizes zero, to be set.
    pub const fn plain() -> Self {
        Self {
            n_experts: 0,
            n_used: 0,
            expert_ff: 0,
            norm_topk: false,
            gating: Gating::Softmax,
            activation: ExpertActivation::Swiglu,
            shared_ff: None,
            shared_gate: false,
            selection_bias: false,
            weights_scale: 1.0,
            groups: ExpertGroups::NONE,
            dense_lead: 0,
        }
    }

    fn checked(self) -> Result<Self> {
        if self.n_experts == 0 || self.n_used == 0 || self.n_used > self.n_experts {
            return Err(ModelError::Config(format!(
                "{} experts with {} used per token",
                self.n_experts, self.n_used
            )));
        }
        if self.expert_ff == 0 || self.shared_ff == Some(0) {
            return Err(ModelError::Config("expert width must be positive".into()));
        }
        let g = self.groups;
        if g.count == 0
            || g.used == 0
            || g.used > g.count
            || !self.n_experts.is_multiple_of(g.count)
            || g.used * (self.n_experts / g.count) < self.n_used
        {
            return Err(ModelError::Config(format!(
                "{} experts in {} groups, {} groups used, {} experts per token",
                self.n_experts, g.count, g.used, self.n_used
            )));
        }
        if !self.weights_scale.is_finite() || self.weights_scale <= 0.0 {
            return Err(ModelError::Config(format!(
                "expert weights scale {}",
                self.weights_scale
            )));
        }
        Ok(self)
    }
}

/// The MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU MLPs).
    Silu,
    /// GELU, tanh approximation (Gemma's GeGLU, `gelu_pytorch_tanh`).
    GeluTanh,
}

impl Activation {
    fn from_name(name: &str) -> Result<Self> {
        match name {
            "silu" | "swish" => Ok(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanh),
            other => Err(ModelError::Unsupported(format!("hidden_act `{other}`"))),
        }
    }
}

/// Llama 3 frequency-dependent RoPE scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Llama3RopeScaling {
    /// Divisor applied to low frequencies.
    pub factor: f32,
    /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are scaled.
    pub low_freq_factor: f32,
    /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The context length the model was pretrained with.
    pub original_max_position_embeddings: usize,
}

/// YaRN RoPE scaling as llama.cpp applies it (`rope.scaling.type = yarn`): each frequency is
/// blended between the interpolated one (divided by `factor`) and the original by a ramp over
/// the rotation count at `original_context` positions (between `beta_fast` and `beta_slow`
/// rotations), and cos/sin are scaled by [`YarnScaling::magnitude`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnScaling {
    /// Context extension factor (positions are interpolated by `1 / factor`).
    pub factor: f32,
    /// The context length the model was pretrained with.
    pub original_context: usize,
    /// Rotations above which a frequency is kept as it is (llama.cpp's default 32).
    pub beta_fast: f32,
    /// Rotations below which a frequency is fully interpolated (llama.cpp's default 1).
    pub beta_slow: f32,
    /// cos and sin are multiplied by this: llama.cpp's `1 + 0.1 ln(factor)`, or 1 for a
    /// DeepSeek file with a `yarn_log_multiplier` (whose correction goes to the scores instead,
    /// [`MlaSpec::score_scale`]).
    pub magnitude: f32,
}

/// Multi-head latent attention (DeepSeek-V2/V3, `deepseek2`). Each head's query is a no-RoPE
/// part (`qk_nope_dim`) and a RoPE part ([`ModelSpec::rope_dim`]); keys and values come from
/// one latent per token (`kv_lora_rank` wide, normed) expanded per head by `attn_k_b` /
/// `attn_v_b`, and one RoPE key part that every head shares. ferry caches only the latent and
/// the rotated RoPE part (one key/value "head" of [`ModelSpec::head_dim`] =
/// `kv_lora_rank + rope_dim`, whose values are its first `kv_lora_rank`), and attends in the
/// absorbed form: each head's no-RoPE query multiplied into the latent space by its `k_b`, the
/// output taken out of it by its `v_b`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MlaSpec {
    /// Rank of the queries' compression (`attn_q_a` -> norm -> `attn_q_b`); 0: one `attn_q`
    /// projection (V2-Lite).
    pub q_lora_rank: usize,
    /// Width of the cached latent.
    pub kv_lora_rank: usize,
    /// The no-RoPE part of each query and (expanded) key head.
    pub qk_nope_dim: usize,
    /// Width of each (expanded) value head.
    pub v_head_dim: usize,
    /// Scores are `q . k * score_scale`: llama.cpp's `1 / sqrt(qk_nope_dim + rope_dim)` times
    /// the square of YaRN's `mscale` (with DeepSeek's `yarn_log_multiplier`).
    pub score_scale: f64,
}

impl MlaSpec {
    /// Width of one query head (and of one expanded key head): no-RoPE and RoPE parts.
    pub fn q_head_dim(&self, rope_dim: usize) -> usize {
        self.qk_nope_dim + rope_dim
    }
}

/// Shape and hyper-parameters of a decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Which family (decides biases and defaults).
    pub architecture: Architecture,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers that run.
    pub n_layers: usize,
    /// Blocks after the `n_layers` in the file that are never run: GLM-4.5's
    /// multi-token-prediction layers (`nextn_predict_layers`), which llama.cpp loads but skips.
    /// Their tensors are neither loaded nor counted.
    pub unrun_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`; 1 with MLA, whose
    /// one cached "head" is the latent).
    pub n_kv_heads: usize,
    /// Width of one head (with MLA, of the cached key row: `kv_lora_rank + rope_dim`).
    pub head_dim: usize,
    /// Dimensions of each query and key head that RoPE rotates (the first ones; the rest pass
    /// through): `head_dim` unless the model rotates part of each head (GLM-4.5's half).
    pub rope_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Longest supported sequence (`max_position_embeddings` or GGUF `<arch>.context_length`).
    pub max_context: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Llama 3 RoPE scaling, if the checkpoint uses it.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// true: rotate adjacent pairs (2i, 2i+1), the layout of GGUF llama checkpoints whose q/k
    /// rows the converter permuted; false: HF "rotate half" (i, i + d/2).
    pub rope_interleaved: bool,
    /// The output head reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2, or Llama `attention_bias`).
    pub attention_bias: bool,
    /// Attention window in tokens (Mistral); `None` means full causal attention.
    pub sliding_window: Option<usize>,
    /// Every `n`-th layer (`(i + 1) % n == 0`) attends globally and the others within
    /// `sliding_window` (Gemma 2/3); `None`: `sliding_window` applies to every layer.
    pub sliding_window_pattern: Option<usize>,
    /// RoPE base of the sliding-window layers when it differs from `rope_theta` (Gemma 3).
    pub rope_local_theta: Option<f32>,
    /// Linear RoPE scaling (positions divided by the factor) of the global layers.
    pub rope_linear_factor: Option<f32>,
    /// Per-frequency RoPE divisors from the config (Phi-3's `longrope` / `su` scaling: the
    /// long factors when the context exceeds the original one, else the short ones). GGUFs
    /// carry them as a tensor instead (`rope_factors_long.weight`).
    pub rope_freq_factors: Option<Vec<f32>>,
    /// The cos/sin tables are multiplied by this (longrope's attention factor).
    pub rope_attn_factor: Option<f32>,
    /// YaRN RoPE scaling (gpt-oss, DeepSeek), if the checkpoint uses it.
    pub rope_yarn: Option<YarnScaling>,
    /// Multi-head latent attention (DeepSeek's `deepseek2`), replacing the q/k/v projections.
    pub mla: Option<MlaSpec>,
    /// Each query head has a learned sink logit that joins its softmax (gpt-oss's
    /// `attn_sinks`): it takes a share of the probability and contributes no value.
    pub attn_sinks: bool,
    /// Per-head RMSNorms of queries and keys before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Routed experts instead of one MLP (Qwen3-MoE, Mixtral), in every layer from
    /// [`MoeSpec::dense_lead`] on ([`ModelSpec::moe_at`]).
    pub moe: Option<MoeSpec>,
    /// The Gated DeltaNet layers of a hybrid model (Qwen3.5) and their shape; `None`: every
    /// layer attends.
    pub delta_net: Option<DeltaNetSpec>,
    /// The MLP's activation.
    pub activation: Activation,
    /// Added to every RMSNorm weight before it scales: Gemma's Hugging Face checkpoints store
    /// `w` for a scale of `1 + w` (1.0); its GGUFs store `1 + w` already (0.0).
    pub norm_offset: f32,
    /// The embedding output is multiplied by this (Gemma: `sqrt(hidden_size)`).
    pub embed_scale: Option<f32>,
    /// Attention scores are scaled by `1 / sqrt(query_pre_attn_scalar)` (Gemma); `None`:
    /// `1 / sqrt(head_dim)`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Attention scores are soft-capped to `cap * tanh(s / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Output logits are soft-capped the same way (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Beginning-of-sequence token, if the model declares one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (may be several, e.g. Llama 3 instruct).
    pub eos_token_ids: Vec<u32>,
}

impl ModelSpec {
    /// Reads the spec from GGUF metadata; keys are looked up under the `general.architecture`
    /// prefix (`llama.`, `qwen2.`, ...).
    pub fn from_gguf(header: &GgufHeader) -> Result<Self> {
        let md = GgufMeta(&header.metadata);
        let arch_name = md.string("general.architecture")?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_experts = md.opt_usize(&key("expert_count"))?.unwrap_or(0);
        let architecture = match Architecture::from_name(&arch_name)? {
            // llama.cpp writes Mixtral as `llama` with experts.
            Architecture::Llama if n_experts > 0 => Architecture::Mixtral,
            other => other,
        };
        let deepseek = architecture == Architecture::Deepseek2;
        // llama.cpp reads DeepSeek's leading dense layers from this key, GLM-4.5's too.
        let dense_lead = match architecture {
            Architecture::Glm4Moe | Architecture::Deepseek2 => md
                .opt_usize(&key("leading_dense_block_count"))?
                .unwrap_or(0),
            _ => 0,
        };
        let moe = match n_experts {
            0 => None,
            n => Some(
                MoeSpec {
                    n_experts: n,
                    n_used: md.usize(&key("expert_used_count"))?,
                    expert_ff: match md.opt_usize(&key("expert_feed_forward_length"))? {
                        Some(ff) => ff,
                        None => md.usize(&key("feed_forward_length"))?,
                    },
                    // llama.cpp: Mixtral always, Qwen3-MoE by `expert_weights_norm` (its
                    // converter writes true for norm_topk_prob models; default true),
                    // GLM-4.5 by the same key (default false), Qwen2-MoE and gpt-oss never.
                    norm_topk: match architecture {
                        Architecture::Mixtral | Architecture::Qwen35Moe => true,
                        Architecture::Qwen2Moe | Architecture::GptOss => false,
                        Architecture::Glm4Moe | Architecture::Deepseek2 => {
                            md.opt_bool(&key("expert_weights_norm"))?.unwrap_or(false)
                        }
                        _ => md.opt_bool(&key("expert_weights_norm"))?.unwrap_or(true),
                    },
                    gating: match architecture {
                        Architecture::GptOss => Gating::SoftmaxOfTopK,
                        Architecture::Glm4Moe => glm_gating(&md, &key("expert_gating_func"))?,
                        Architecture::Deepseek2 => deepseek_gating(&md, &key, header)?,
                        _ => Gating::Softmax,
                    },
                    activation: match architecture {
                        Architecture::GptOss => ExpertActivation::ClampedSwiglu,
                        _ => ExpertActivation::Swiglu,
                    },
                    // llama.cpp: Qwen2-MoE's shared expert is `expert_shared_feed_forward_length`
                    // wide, else as the dense FFN; GLM-4.5's `expert_shared_count` experts wide.
                    shared_ff: match architecture {
                        Architecture::Qwen2Moe | Architecture::Qwen35Moe => Some(
                            match md.opt_usize(&key("expert_shared_feed_forward_length"))? {
                                Some(ff) => ff,
                                None => md.usize(&key("feed_forward_length"))?,
                            },
                        ),
                        Architecture::Glm4Moe | Architecture::Deepseek2 => {
                            match md.opt_usize(&key("expert_shared_count"))?.unwrap_or(0) {
                                0 => None,
                                n => Some(n * md.usize(&key("expert_feed_forward_length"))?),
                            }
                        }
                        _ => None,
                    },
                    shared_gate: matches!(
                        architecture,
                        Architecture::Qwen2Moe | Architecture::Qwen35Moe
                    ),
                    // DeepSeek-V3 has the correction bias, V2 not: the file says.
                    selection_bias: match architecture {
                        Architecture::Glm4Moe => true,
                        Architecture::Deepseek2 => header
                            .tensor(&Format::Gguf.layer_tensor_name(
                                architecture,
                                dense_lead,
                                Part::ExpProbsBias,
                            ))
                            .is_some(),
                        _ => false,
                    },
                    // llama.cpp scales by `expert_weights_scale` where it is set (GLM-4.5's
                    // converter always writes it); absent or 0 is no scaling.
                    weights_scale: match architecture {
                        Architecture::Glm4Moe | Architecture::Deepseek2 => {
                            md.opt_f64(&key("expert_weights_scale"))?
                                .filter(|s| *s != 0.0)
                                .unwrap_or(1.0) as f32
                        }
                        _ => 1.0,
                    },
                    // llama.cpp's group-limited choice (DeepSeek-V3): `expert_group_count`
                    // groups, the best `expert_group_used_count` of them; 0 or 1 is none.
                    groups: match md.opt_usize(&key("expert_group_count"))?.unwrap_or(0) {
                        0 | 1 => ExpertGroups::NONE,
                        count => ExpertGroups {
                            count,
                            used: md.usize(&key("expert_group_used_count"))?,
                        },
                    },
                    dense_lead,
                }
                .checked()?,
            ),
        };

        let hidden_size = md.usize(&key("embedding_length"))?;
        let n_heads = md.usize(&key("attention.head_count"))?;
        let n_kv_heads = md
            .opt_usize(&key("attention.head_count_kv"))?
            .unwrap_or(n_heads);
        let head_dim = match md.opt_usize(&key("attention.key_length"))? {
            Some(d) => d,
            None => div_exact(hidden_size, n_heads, "embedding_length / head_count")?,
        };
        let rope_dim = md
            .opt_usize(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        if rope_dim != head_dim
            && !matches!(
                architecture,
                Architecture::Glm4Moe | Architecture::Deepseek2
            )
            && !architecture.is_qwen35()
        {
            return Err(ModelError::Unsupported(format!(
                "partial rotary embedding ({rope_dim} of {head_dim} head dims) in `{arch_name}`"
            )));
        }
        if architecture == Architecture::Glm4Moe
            && md
                .opt_usize_array(&key("rope.dimension_sections"))?
                .is_some_and(|s| s.iter().any(|&n| n != 0))
        {
            return Err(ModelError::Unsupported(
                "multi-section RoPE (rope.dimension_sections, GLM's vision models)".into(),
            ));
        }
        let scaling_type = md.opt_string(&key("rope.scaling.type"))?;
        let rope_yarn = match scaling_type.as_deref() {
            Some("yarn") => {
                // llama.cpp: factor from `rope.scaling.factor`, the original context from
                // `rope.scaling.original_context_length` (else the trained one), betas 32 / 1.
                let factor = md.opt_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0) as f32;
                let log_multiplier = md
                    .opt_f64(&key("rope.scaling.yarn_log_multiplier"))?
                    .filter(|m| *m != 0.0);
                if log_multiplier.is_some() && !deepseek {
                    return Err(ModelError::Unsupported(
                        "YaRN with a log multiplier (rope.scaling.yarn_log_multiplier)".into(),
                    ));
                }
                (factor > 1.0)
                    .then(|| -> Result<YarnScaling> {
                        Ok(YarnScaling {
                            factor,
                            original_context: md
                                .opt_usize(&key("rope.scaling.original_context_length"))?
                                .map_or_else(|| md.usize(&key("context_length")), Ok)?,
                            beta_fast: 32.0,
                            beta_slow: 1.0,
                            // llama.cpp: with DeepSeek's log multiplier its attention factor
                            // cancels the rope's magnitude (the scores take it instead).
                            magnitude: match log_multiplier {
                                Some(_) => 1.0,
                                None => 1.0 + 0.1 * factor.ln(),
                            },
                        })
                    })
                    .transpose()?
            }
            _ => None,
        };
        let rope_linear_factor = match scaling_type.as_deref() {
            // Phi-3's longrope factors are tensors; the type key says nothing more; YaRN is
            // `rope_yarn`.
            None | Some("none") | Some("longrope") | Some("su") | Some("yarn") => None,
            Some("linear") => md
                .opt_f64(&key("rope.scaling.factor"))?
                .filter(|f| *f != 1.0)
                .map(|f| f as f32),
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "GGUF rope scaling `{other}`"
                )));
            }
        };
        let rope_attn_factor = md
            .opt_f64(&key("rope.scaling.attn_factor"))?
            .filter(|f| *f != 1.0)
            .map(|f| f as f32);
        let mla = match deepseek {
            true => Some(deepseek_mla(
                &md,
                &key,
                (n_kv_heads, head_dim, rope_dim),
                rope_yarn.as_ref(),
                rope_linear_factor,
                rope_attn_factor,
            )?),
            false => None,
        };
        let (embedding, head) = (
            FixedPart::Embedding.name(Format::Gguf).unwrap_or_default(),
            FixedPart::Head.name(Format::Gguf).unwrap_or_default(),
        );
        let vocab_size = match md.opt_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => match header.array_len("tokenizer.ggml.tokens") {
                Some(tokens) => tokens,
                None => match header.tensor(embedding) {
                    Some(info) if !info.shape.is_empty() => info.shape[0],
                    _ => return Err(ModelError::MissingTensor(embedding.into())),
                },
            },
        };
        let has_output = header.tensor(head).is_some();
        let attention_bias = header
            .tensor(&Format::Gguf.layer_tensor_name(architecture, 0, Part::QBias))
            .is_some();
        let blocks = md.usize(&key("block_count"))?;
        // llama.cpp runs the blocks before GLM-4.5's multi-token-prediction ones.
        let unrun_layers = match architecture {
            Architecture::Glm4Moe
            | Architecture::Deepseek2
            | Architecture::Qwen35
            | Architecture::Qwen35Moe => md.opt_usize(&key("nextn_predict_layers"))?.unwrap_or(0),
            _ => 0,
        };
        if unrun_layers >= blocks {
            return Err(ModelError::Config(format!(
                "{unrun_layers} of {blocks} blocks are multi-token-prediction layers"
            )));
        }
        let n_layers = blocks - unrun_layers;
        let delta_net = match architecture.is_qwen35() {
            true => Some(DeltaNetSpec::from_gguf(&md, &key, n_layers, rope_dim / 2)?),
            false => None,
        };
        let gemma = architecture.is_gemma();
        // llama.cpp scales Gemma's queries by 1/sqrt(head_dim), except in the 27B models
        // (46 layers for Gemma 2, 62 for Gemma 3), whose query_pre_attn_scalar is
        // hidden / heads.
        let query_pre_attn_scalar = gemma.then(|| match (architecture, n_layers) {
            (Architecture::Gemma2, 46) | (Architecture::Gemma3, 62) => {
                (hidden_size / n_heads) as f64
            }
            _ => head_dim as f64,
        });
        let softcap = |k: &str| -> Result<Option<f32>> {
            Ok(md.opt_f64(&key(k))?.filter(|c| *c > 0.0).map(|c| c as f32))
        };
        let spec = ModelSpec {
            architecture,
            hidden_size,
            // A MoE GGUF without a dense FFN width (none of its layers is dense) has its
            // experts' width there.
            intermediate_size: match (md.opt_usize(&key("feed_forward_length"))?, moe) {
                (Some(ff), _) => ff,
                (None, Some(moe)) => moe.expert_ff,
                (None, None) => md.usize(&key("feed_forward_length"))?,
            },
            n_layers,
            unrun_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            rope_dim,
            vocab_size,
            max_context: md.usize(&key("context_length"))?,
            rms_norm_eps: md.f64(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: md.opt_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0) as f32,
            rope_scaling: None,
            // llama.cpp: LLAMA_ROPE_TYPE_NORM for llama-style archs, NEOX for the others.
            rope_interleaved: matches!(
                architecture,
                Architecture::Llama
                    | Architecture::Mistral
                    | Architecture::Mixtral
                    | Architecture::Deepseek2
            ),
            tie_word_embeddings: !has_output,
            attention_bias,
            sliding_window: md.opt_usize(&key("attention.sliding_window"))?,
            sliding_window_pattern: match md.opt_usize(&key("attention.sliding_window_pattern"))? {
                Some(n) => Some(n),
                None => architecture.default_window_pattern(),
            },
            // llama.cpp: the sliding-window layers' base is `rope.freq_base_swa` (what the
            // converter writes from the local rope_theta), 10000 when absent.
            rope_local_theta: (architecture == Architecture::Gemma3)
                .then_some(md.opt_f64(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0) as f32),
            rope_linear_factor,
            rope_freq_factors: None,
            rope_attn_factor,
            rope_yarn,
            mla,
            attn_sinks: architecture == Architecture::GptOss,
            // GLM-4.5 has q/k norms, GLM-4.5-Air none: the file says.
            qk_norm: match architecture {
                Architecture::Qwen3
                | Architecture::Qwen3Moe
                | Architecture::Gemma3
                | Architecture::Qwen35
                | Architecture::Qwen35Moe => true,
                Architecture::Glm4Moe => header
                    .tensor(&Format::Gguf.layer_tensor_name(architecture, 0, Part::QNorm))
                    .is_some(),
                _ => false,
            },
            moe,
            delta_net,
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            // The converter stores Gemma's norms as 1 + w.
            norm_offset: 0.0,
            embed_scale: gemma.then(|| (hidden_size as f32).sqrt()),
            query_pre_attn_scalar,
            attn_softcap: softcap("attn_logit_softcapping")?,
            final_softcap: softcap("final_logit_softcapping")?,
            bos_token_id: md
                .opt_usize("tokenizer.ggml.bos_token_id")?
                .map(|v| v as u32),
            eos_token_ids: md
                .opt_usize("tokenizer.ggml.eos_token_id")?
                .map(|v| vec![v as u32])
                .unwrap_or_default(),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Parses a Hugging Face `config.json` (`model_type` llama, qwen2 or mistral).
    pub fn from_hf_config(config_json: &str) -> Result<Self> {
        let raw: HfConfig = serde_json::from_str(config_json)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        let model_type = match (&raw.model_type, raw.architectures.first()) {
            (Some(t), _) => t.clone(),
            (None, Some(a)) => a.trim_end_matches("ForCausalLM").to_lowercase(),
            (None, None) => {
                return Err(ModelError::Config("config.json has no model_type".into()));
            }
        };
        let architecture = Architecture::from_name(&model_type)?;
        if architecture.gguf_only() {
            return Err(ModelError::Unsupported(format!(
                "`{}` from a Hugging Face config.json (ferry reads it from GGUF files)",
                architecture.name()
            )));
        }
        let gemma = architecture.is_gemma();
        let activation = match raw
            .hidden_activation
            .as_deref()
            .or(raw.hidden_act.as_deref())
        {
            Some(act) => Activation::from_name(act)?,
            None if gemma => Activation::GeluTanh,
            None => Activation::Silu,
        };
        if raw.partial_rotary_factor.is_some_and(|f| f != 1.0) {
            return Err(ModelError::Unsupported(
                "partial rotary embedding (partial_rotary_factor)".into(),
            ));
        }
        let n_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None => div_exact(
                raw.hidden_size,
                raw.num_attention_heads,
                "hidden_size / heads",
            )?,
        };
        let rope_parameters = RopeParameters::of(raw.rope_parameters.as_ref())?;
        let rope = match raw
            .rope_scaling
            .as_ref()
            .or(rope_parameters.global.as_ref())
        {
            None => RopeScalings::default(),
            Some(s) => parse_rope_scaling(
                s,
                raw.max_position_embeddings,
                raw.original_max_position_embeddings,
                head_dim,
            )?,
        };
        let sliding_window = match architecture {
            Architecture::Qwen2 | Architecture::Qwen3
                if !raw.use_sliding_window.unwrap_or(false) =>
            {
                None
            }
            _ => raw.sliding_window,
        };
        let sliding_window_pattern = match (&raw.layer_types, raw.sliding_window_pattern) {
            (Some(types), _) => window_pattern_of(types)?,
            (None, Some(n)) => Some(n),
            (None, None) => architecture.default_window_pattern(),
        };
        let spec = ModelSpec {
            architecture,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            n_layers: raw.num_hidden_layers,
            n_heads: raw.num_attention_heads,
            n_kv_heads,
            head_dim,
            vocab_size: raw.vocab_size,
            max_context: raw.max_position_embeddings,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: raw
                .rope_theta
                .or(rope_parameters.global.as_ref().and_then(|p| p.rope_theta))
                .unwrap_or(10_000.0) as f32,
            rope_scaling: rope.llama3,
            rope_interleaved: false,
            // transformers' Gemma configs tie by default.
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(gemma),
            attention_bias: architecture == Architecture::Qwen2
                || raw.attention_bias.unwrap_or(false),
            sliding_window,
            sliding_window_pattern,
            rope_local_theta: (architecture == Architecture::Gemma3).then(|| {
                raw.rope_local_base_freq
                    .or(rope_parameters.local.as_ref().and_then(|p| p.rope_theta))
                    .unwrap_or(10_000.0) as f32
            }),
            rope_linear_factor: rope.linear,
            rope_freq_factors: rope.freq_factors,
            rope_attn_factor: rope.attn_factor,
            rope_yarn: None,
            mla: None,
            attn_sinks: false,
            unrun_layers: 0,
            rope_dim: head_dim,
            qk_norm: matches!(
                architecture,
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
            ),
            moe: hf_moe(&raw, architecture)?,
            delta_net: None,
            activation,
            norm_offset: if gemma { 1.0 } else { 0.0 },
            embed_scale: gemma.then(|| (raw.hidden_size as f32).sqrt()),
            query_pre_attn_scalar: if gemma {
                Some(raw.query_pre_attn_scalar.unwrap_or(head_dim as f64))
            } else {
                None
            },
            attn_softcap: raw.attn_logit_softcapping.map(|c| c as f32),
            final_softcap: raw.final_logit_softcapping.map(|c| c as f32),
            bos_token_id: raw.bos_token_id,
            eos_token_ids: match raw.eos_token_id {
                None => Vec::new(),
                Some(OneOrMany::One(id)) => vec![id],
                Some(OneOrMany::Many(ids)) => ids,
            },
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Query/key/value heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_context", self.max_context),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ModelError::Config(format!("{name} must be positive")));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(ModelError::Config(format!(
                "{} attention heads are not a multiple of {} key/value heads",
                self.n_heads, self.n_kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::Config(format!(
                "head_dim {} is odd",
                self.head_dim
            )));
        }
        if self.rope_dim == 0 || !self.rope_dim.is_multiple_of(2) || self.rope_dim > self.head_dim {
            return Err(ModelError::Config(format!(
                "RoPE over {} of {} head dims",
                self.rope_dim, self.head_dim
            )));
        }
        if self.sliding_window == Some(0) || self.sliding_window_pattern == Some(0) {
            return Err(ModelError::Config(
                "sliding_window and its pattern must be positive".into(),
            ));
        }
        if self.attn_softcap.is_some_and(|c| c <= 0.0)
            || self.final_softcap.is_some_and(|c| c <= 0.0)
        {
            return Err(ModelError::Config("soft-caps must be positive".into()));
        }
        Ok(())
    }

    /// The experts of decoder layer `index`: none in a dense model or in one of its leading
    /// dense layers ([`MoeSpec::dense_lead`]).
    pub fn moe_at(&self, index: usize) -> Option<MoeSpec> {
        self.moe.filter(|m| index >= m.dense_lead)
    }

    /// The attention window of decoder layer `index` (`None`: global attention).
    pub fn layer_window(&self, index: usize) -> Option<usize> {
        match self.sliding_window_pattern {
            Some(n) if (index + 1).is_multiple_of(n) => None,
            _ => self.sliding_window,
        }
    }

    /// Whether decoder layer `index` attends within a sliding window.
    pub fn is_sliding_layer(&self, index: usize) -> bool {
        self.layer_window(index).is_some()
    }

    /// Whether decoder layer `index` is a Gated DeltaNet layer (a recurrent state, no keys
    /// and values).
    pub fn is_recurrent_layer(&self, index: usize) -> bool {
        self.delta_net
            .as_ref()
            .is_some_and(|d| d.recurrent.get(index).copied().unwrap_or(false))
    }

    /// Whether any decoder layer keeps a recurrent state (which cannot be cut back to fewer
    /// positions or split into prefix blocks).
    pub fn has_recurrent_layers(&self) -> bool {
        (0..self.n_layers).any(|i| self.is_recurrent_layer(i))
    }
}

/// The Gated DeltaNet layers of a hybrid model (llama.cpp's `ssm.*` keys for Qwen3.5): which
/// layers they are and their shape. A layer projects `qkv` (`2 * n_k_heads * head_k_dim +
/// n_v_heads * head_v_dim` channels), runs them through a causal depthwise convolution of
/// `conv_kernel` taps and SiLU, and updates one `head_v_dim x head_k_dim` state per value head.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaNetSpec {
    /// Taps of the short causal convolution (`ssm.conv_kernel`); a sequence keeps the last
    /// `conv_kernel - 1` inputs.
    pub conv_kernel: usize,
    /// Width of a query/key head (`ssm.state_size`).
    pub head_k_dim: usize,
    /// Query/key heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); value head `h` reads key head `h % n_k_heads`.
    pub n_v_heads: usize,
    /// Width of a value head (`ssm.inner_size / n_v_heads`).
    pub head_v_dim: usize,
    /// Per decoder layer: a DeltaNet layer (`true`) or full attention.
    pub recurrent: Vec<bool>,
}

impl DeltaNetSpec {
    /// Reads the shape from `md` (keys through `key`) for `n_layers` layers: the layer pattern
    /// from `attention.recurrent_layers` when the file has it, else every
    /// `full_attention_interval`-th layer (default 4) attends, as llama.cpp reads it. RoPE
    /// sections (`rope.dimension_sections`, IMRoPE) are accepted where every one of the
    /// `rope_pairs` rotated pairs takes the text position (llama.cpp gives text tokens the
    /// same position in the first three sections and 0 in the fourth).
    fn from_gguf(
        md: &GgufMeta,
        key: &dyn Fn(&str) -> String,
        n_layers: usize,
        rope_pairs: usize,
    ) -> Result<Self> {
        let recurrent = match md.opt_bool_array(&key("attention.recurrent_layers"))? {
            Some(list) if list.len() >= n_layers => list[..n_layers].to_vec(),
            Some(list) => {
                return Err(ModelError::Config(format!(
                    "attention.recurrent_layers has {} entries for {n_layers} layers",
                    list.len()
                )))
            }
            None => {
                let interval = md.opt_usize(&key("full_attention_interval"))?.unwrap_or(4);
                if interval == 0 {
                    return Err(ModelError::Config("full_attention_interval 0".into()));
                }
                (0..n_layers)
                    .map(|i| !(i + 1).is_multiple_of(interval))
                    .collect()
            }
        };
        if let Some(sections) = md.opt_usize_array(&key("rope.dimension_sections"))? {
            imrope_is_plain(&sections, rope_pairs)?;
        }
        let inner = md.usize(&key("ssm.inner_size"))?;
        let n_v_heads = md.usize(&key("ssm.time_step_rank"))?;
        let spec = Self {
            conv_kernel: md.usize(&key("ssm.conv_kernel"))?,
            head_k_dim: md.usize(&key("ssm.state_size"))?,
            n_k_heads: md.usize(&key("ssm.group_count"))?,
            n_v_heads,
            head_v_dim: div_exact(inner, n_v_heads, "ssm.inner_size / ssm.time_step_rank")?,
            recurrent,
        };
        if spec.conv_kernel < 2
            || spec.n_k_heads == 0
            || spec.head_k_dim == 0
            || !spec.n_v_heads.is_multiple_of(spec.n_k_heads)
            || spec.head_v_dim != spec.head_k_dim
        {
            return Err(ModelError::Config(format!(
                "Gated DeltaNet shape {spec:?}: a convolution of at least 2 taps, value heads a \
                 multiple of key heads, and heads as wide as the state"
            )));
        }
        Ok(spec)
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim
    }

    /// Width of the values (and of the output gate `z`): `n_v_heads * head_v_dim`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }

    /// f32 elements of one sequence's state in one layer: the convolution window
    /// (`conv_kernel - 1` inputs) and one `head_v_dim x head_k_dim` matrix per value head.
    pub fn state_elems(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
            + self.n_v_heads * self.head_v_dim * self.head_k_dim
    }
}

/// Refuses IMRoPE `sections` under which some of the `pairs` rotated pairs of a text token
/// would not take its position (llama.cpp's interleaved sections: pair `i` is in sector
/// `i % sum`; sectors `3j`, `3j + 1`, `3j + 2` below three times the first, second, third
/// section take the token's position, every other one the fourth position, 0 for text).
fn imrope_is_plain(sections: &[usize], pairs: usize) -> Result<()> {
    let s = |i: usize| sections.get(i).copied().unwrap_or(0);
    let total: usize = (0..4).map(s).sum();
    if total == 0 {
        return Ok(());
    }
    let plain = (0..pairs).all(|pair| {
        let sector = pair % total;
        let bound = s(sector % 3);
        sector < 3 * bound
    });
    if plain {
        Ok(())
    } else {
        Err(ModelError::Unsupported(format!(
            "RoPE sections {sections:?} that leave some of {pairs} rotated pairs at position 0 \
             for text"
        )))
    }
}

fn div_exact(a: usize, b: usize, what: &str) -> Result<usize> {
    if b == 0 || !a.is_multiple_of(b) {
        return Err(ModelError::Config(format!(
            "{what} is not an integer ({a} / {b})"
        )));
    }
    Ok(a / b)
}

/// The experts of a Qwen3-MoE or Mixtral config.
fn hf_moe(raw: &HfConfig, architecture: Architecture) -> Result<Option<MoeSpec>> {
    let moe = match architecture {
        Architecture::Qwen3Moe => {
            if raw.decoder_sparse_step.unwrap_or(1) != 1 || !raw.mlp_only_layers.is_empty() {
                return Err(ModelError::Unsupported(
                    "Qwen3-MoE with dense layers (decoder_sparse_step, mlp_only_layers)".into(),
                ));
            }
            MoeSpec {
                // transformers 5 writes `num_local_experts` for Qwen3-MoE too.
                n_experts: raw.num_experts.or(raw.num_local_experts).unwrap_or(0),
                n_used: raw.num_experts_per_tok.unwrap_or(0),
                expert_ff: raw.moe_intermediate_size.unwrap_or(0),
                norm_topk: raw.norm_topk_prob.unwrap_or(false),
                ..MoeSpec::plain()
            }
        }
        Architecture::Mixtral => MoeSpec {
            n_experts: raw.num_local_experts.unwrap_or(0),
            n_used: raw.num_experts_per_tok.unwrap_or(0),
            expert_ff: raw.intermediate_size,
            norm_topk: true,
            ..MoeSpec::plain()
        },
        _ => return Ok(None),
    };
    moe.checked().map(Some)
}

/// The sliding-window pattern of a `layer_types` list (`sliding_attention` / `full_attention`):
/// every `n`-th layer global, as [`ModelSpec::sliding_window_pattern`] says.
fn window_pattern_of(types: &[String]) -> Result<Option<usize>> {
    let sliding: Vec<bool> = types
        .iter()
        .map(|t| match t.as_str() {
            "sliding_attention" => Ok(true),
            "full_attention" => Ok(false),
            other => Err(ModelError::Unsupported(format!("layer type `{other}`"))),
        })
        .collect::<Result<_>>()?;
    let Some(first_global) = sliding.iter().position(|s| !s) else {
        return Ok(None);
    };
    let n = first_global + 1;
    if sliding
        .iter()
        .enumerate()
        .any(|(i, &s)| s == ((i + 1) % n == 0))
    {
        return Err(ModelError::Unsupported(
            "layer_types that are not every n-th layer global".into(),
        ));
    }
    Ok(Some(n))
}

/// What a config's `rope_scaling` sets.
#[derive(Debug, Default)]
struct RopeScalings {
    llama3: Option<Llama3RopeScaling>,
    linear: Option<f32>,
    freq_factors: Option<Vec<f32>>,
    attn_factor: Option<f32>,
}

fn parse_rope_scaling(
    raw: &RawRopeScaling,
    max_positions: usize,
    original: Option<usize>,
    head_dim: usize,
) -> Result<RopeScalings> {
    let kind = raw
        .rope_type
        .as_deref()
        .or(raw.kind.as_deref())
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeScalings::default()),
        "linear" => match raw.factor {
            Some(f) if f > 0.0 => Ok(RopeScalings {
                linear: (f != 1.0).then_some(f),
                ..RopeScalings::default()
            }),
            _ => Err(ModelError::Config(
                "linear rope_scaling needs a positive factor".into(),
            )),
        },
        "llama3" => {
            let need = |v: Option<f32>, name: &str| {
                v.ok_or_else(|| ModelError::Config(format!("rope_scaling.{name} is missing")))
            };
            let scaling = Llama3RopeScaling {
                factor: need(raw.factor, "factor")?,
                low_freq_factor: need(raw.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: need(raw.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: raw.original_max_position_embeddings.ok_or_else(
                    || ModelError::Config("rope_scaling.original_max_position_embeddings".into()),
                )?,
            };
            if scaling.high_freq_factor <= scaling.low_freq_factor || scaling.factor <= 0.0 {
                return Err(ModelError::Config(format!(
                    "bad llama3 rope_scaling {scaling:?}"
                )));
            }
            Ok(RopeScalings {
                llama3: Some(scaling),
                ..RopeScalings::default()
            })
        }
        "longrope" | "su" => {
            // transformers' longrope: divisors per frequency, the long ones past the original
            // context (chosen once here, for the model's whole window, as llama.cpp does at
            // full context), and cos/sin scaled by sqrt(1 + ln(s) / ln(original)).
            let original = original
                .or(raw.original_max_position_embeddings)
                .ok_or_else(|| {
                    ModelError::Config("longrope needs original_max_position_embeddings".into())
                })?;
            let factors = if max_positions > original {
                &raw.long_factor
            } else {
                &raw.short_factor
            };
            let factors = factors
                .clone()
                .filter(|f| f.len() == head_dim / 2)
                .ok_or_else(|| {
                    ModelError::Config(format!(
                        "longrope needs short_factor and long_factor of {} values",
                        head_dim / 2
                    ))
                })?;
            let scale = max_positions as f32 / original as f32;
            let attn_factor = match raw.attention_factor {
                Some(a) => a,
                None if scale <= 1.0 => 1.0,
                None => (1.0 + scale.ln() / (original as f32).ln()).sqrt(),
            };
            Ok(RopeScalings {
                freq_factors: Some(factors),
                attn_factor: (attn_factor != 1.0).then_some(attn_factor),
                ..RopeScalings::default()
            })
        }
        other => Err(ModelError::Unsupported(format!(
            "rope_scaling type `{other}`"
        ))),
    }
}

/// The subset of `config.json` the families use.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: usize,
    original_max_position_embeddings: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeScaling>,
    /// transformers 5's form of `rope_theta` + `rope_scaling`: one object, or one per layer
    /// type (`full_attention`, `sliding_attention`) for Gemma 3.
    rope_parameters: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    partial_rotary_factor: Option<f64>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
struct RawRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    short_factor: Option<Vec<f32>>,
    long_factor: Option<Vec<f32>>,
    attention_factor: Option<f32>,
    /// Only in transformers 5's `rope_parameters`.
    rope_theta: Option<f64>,
}

/// transformers 5's `rope_parameters`, split into the global (full-attention) layers' and the
/// sliding-window layers' parameters.
#[derive(Debug, Default)]
struct RopeParameters {
    global: Option<RawRopeScaling>,
    local: Option<RawRopeScaling>,
}

impl RopeParameters {
    fn of(value: Option<&serde_json::Value>) -> Result<Self> {
        let parse = |v: &serde_json::Value| {
            serde_json::from_value::<RawRopeScaling>(v.clone())
                .map_err(|e| ModelError::Config(format!("config.json rope_parameters: {e}")))
        };
        let Some(value) = value else {
            return Ok(Self::default());
        };
        match (value.get("full_attention"), value.get("sliding_attention")) {
            (None, None) => Ok(Self {
                global: Some(parse(value)?),
                local: None,
            }),
            (global, local) => Ok(Self {
                global: global.map(parse).transpose()?,
                local: local.map(parse).transpose()?,
            }),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

/// Typed access to GGUF metadata with errors that name the key.
struct GgufMeta<'a>(&'a HashMap<String, Value>);

impl GgufMeta<'_> {
    fn get(&self, key: &str) -> Result<&Value> {
        self.0
            .get(key)
            .ok_or_else(|| ModelError::Config(format!("GGUF metadata `{key}` is missing")))
    }

    fn bad(key: &str, e: candle_core::Error) -> ModelError {
        ModelError::Config(format!("GGUF metadata `{key}`: {e}"))
    }

    fn string(&self, key: &str) -> Result<String> {
        self.get(key)?
            .to_string()
            .cloned()
            .map_err(|e| Self::bad(key, e))
    }

    fn opt_string(&self, key: &str) -> Result<Option<String>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v
                .to_string()
                .cloned()
                .map(Some)
                .map_err(|e| Self::bad(key, e)),
        }
    }

    fn usize(&self, key: &str) -> Result<usize> {
        as_u64(self.get(key)?)
            .map(|v| v as usize)
            .map_err(|e| Self::bad(key, e))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v.to_bool().map(Some).map_err(|e| Self::bad(key, e)),
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => as_u64(v)
                .map(|v| Some(v as usize))
                .map_err(|e| Self::bad(key, e)),
        }
    }

    fn opt_bool_array(&self, key: &str) -> Result<Option<Vec<bool>>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| v.to_bool())
                .collect::<candle_core::Result<Vec<_>>>()
                .map(Some)
                .map_err(|e| Self::bad(key, e)),
            Some(other) => Err(Self::bad(
                key,
                candle_core::Error::Msg(format!("expected an array of booleans, got {other:?}")),
            )),
        }
    }

    fn opt_usize_array(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| as_u64(v).map(|v| v as usize))
                .collect::<candle_core::Result<Vec<_>>>()
                .map(Some)
                .map_err(|e| Self::bad(key, e)),
            Some(other) => as_u64(other)
                .map(|v| Some(vec![v as usize]))
                .map_err(|e| Self::bad(key, e)),
        }
    }

    fn f64(&self, key: &str) -> Result<f64> {
        as_f64(self.get(key)?).map_err(|e| Self::bad(key, e))
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => as_f64(v).map(Some).map_err(|e| Self::bad(key, e)),
        }
    }
}

/// GLM-4.5's gating from `key` (llama.cpp's `expert_gating_func`: 2 sigmoid, GLM's default
/// when absent or 0; 1 softmax).
fn glm_gating(md: &GgufMeta, key: &str) -> Result<Gating> {
    match md.opt_usize(key)?.unwrap_or(0) {
        0 | 2 => Ok(Gating::Sigmoid),
        1 => Ok(Gating::Softmax),
        other => Err(ModelError::Unsupported(format!(
            "expert gating function {other} (`{key}`)"
        ))),
    }
}

/// DeepSeek's gating from `expert_gating_func` (1 softmax, 2 sigmoid). Absent, llama.cpp
/// takes a softmax (DeepSeek-V2's files have no key), except for GLM-4.7-Flash's files (47 or
/// 48 blocks and 154,880 tokens), which are sigmoid.
fn deepseek_gating(
    md: &GgufMeta,
    key: &dyn Fn(&str) -> String,
    header: &GgufHeader,
) -> Result<Gating> {
    let name = key("expert_gating_func");
    match md.opt_usize(&name)?.unwrap_or(0) {
        0 => {
            let blocks = md.usize(&key("block_count"))?;
            let vocab = match md.opt_usize(&key("vocab_size"))? {
                Some(v) => Some(v),
                None => header.array_len("tokenizer.ggml.tokens"),
            };
            Ok(match (blocks, vocab) {
                (47 | 48, Some(154_880)) => Gating::Sigmoid,
                _ => Gating::Softmax,
            })
        }
        1 => Ok(Gating::Softmax),
        2 => Ok(Gating::Sigmoid),
        other => Err(ModelError::Unsupported(format!(
            "expert gating function {other} (`{name}`)"
        ))),
    }
}

/// The latent attention of a `deepseek2` file whose cached head (`head_count_kv`, `key_length`,
/// `value_length`) is `(kv_heads, head_dim, rope_dim)`'s latent, with its score scale as
/// llama.cpp computes it: `mscale^2 / sqrt(qk_nope + rope)`, where `mscale` is the rope's
/// attention factor before YaRN's magnitude is cancelled (`rope_attn_factor` times
/// `1 + 0.1 ln(factor)` for a file without the log multiplier, else 1) times
/// `1 + 0.1 mscale_all_dim ln(factor)` (`yarn_log_multiplier` is `0.1 mscale_all_dim`).
/// `linear` is the factor of a non-YaRN scaling, if any.
fn deepseek_mla(
    md: &GgufMeta,
    key: &dyn Fn(&str) -> String,
    (kv_heads, head_dim, rope_dim): (usize, usize, usize),
    yarn: Option<&YarnScaling>,
    linear: Option<f32>,
    rope_attn_factor: Option<f32>,
) -> Result<MlaSpec> {
    let (Some(k_mla), Some(v_mla)) = (
        md.opt_usize(&key("attention.key_length_mla"))?,
        md.opt_usize(&key("attention.value_length_mla"))?,
    ) else {
        return Err(ModelError::Unsupported(
            "a deepseek2 GGUF without `attention.key_length_mla` (the unsplit `attn_kv_b` of \
             older conversions): convert it again with a current llama.cpp, which writes \
             `attn_k_b` and `attn_v_b`"
                .into(),
        ));
    };
    if md
        .opt_f64(&key("attention.temperature_scale"))?
        .is_some_and(|t| t != 0.0)
    {
        return Err(ModelError::Unsupported(
            "attention temperature scaling (`attention.temperature_scale`)".into(),
        ));
    }
    let kv_lora_rank = md.usize(&key("attention.kv_lora_rank"))?;
    let value_length = md
        .opt_usize(&key("attention.value_length"))?
        .unwrap_or(kv_lora_rank);
    if kv_heads != 1 || head_dim != kv_lora_rank + rope_dim || value_length != kv_lora_rank {
        return Err(ModelError::Config(format!(
            "deepseek2: a latent cache of {kv_heads} heads of {head_dim} (values {value_length}) \
             is not one head of kv_lora_rank {kv_lora_rank} + {rope_dim} RoPE dims"
        )));
    }
    if k_mla <= rope_dim || v_mla == 0 {
        return Err(ModelError::Config(format!(
            "deepseek2: heads of {k_mla} (keys) and {v_mla} (values) with {rope_dim} RoPE dims"
        )));
    }
    let attn_factor = rope_attn_factor.unwrap_or(1.0) as f64;
    let factor = match yarn {
        Some(y) => y.factor as f64,
        None => linear.unwrap_or(1.0) as f64,
    };
    let log_multiplier = md
        .opt_f64(&key("rope.scaling.yarn_log_multiplier"))?
        .unwrap_or(0.0)
        / 0.1;
    let ln = factor.ln();
    let original_factor = match yarn {
        Some(y) => attn_factor * y.magnitude as f64,
        None => attn_factor * (1.0 + 0.1 * ln),
    };
    let mscale = original_factor * (1.0 + 0.1 * log_multiplier * ln);
    Ok(MlaSpec {
        q_lora_rank: md.opt_usize(&key("attention.q_lora_rank"))?.unwrap_or(0),
        kv_lora_rank,
        qk_nope_dim: k_mla - rope_dim,
        v_head_dim: v_mla,
        score_scale: mscale * mscale / (k_mla as f64).sqrt(),
    })
}

/// Integer metadata: writers disagree on the width, so accept any unsigned or non-negative type.
pub(crate) fn as_u64(v: &Value) -> candle_core::Result<u64> {
    match v {
        Value::U8(x) => Ok(*x as u64),
        Value::U16(x) => Ok(*x as u64),
        Value::U32(x) => Ok(*x as u64),
        Value::U64(x) => Ok(*x),
        Value::I8(x) if *x >= 0 => Ok(*x as u64),
        Value::I16(x) if *x >= 0 => Ok(*x as u64),
        Value::I32(x) if *x >= 0 => Ok(*x as u64),
        Value::I64(x) if *x >= 0 => Ok(*x as u64),
        other => candle_core::bail!("expected a non-negative integer, got {other:?}"),
    }
}

pub(crate) fn as_f64(v: &Value) -> candle_core::Result<f64> {
    match v {
        Value::F32(x) => Ok(*x as f64),
        Value::F64(x) => Ok(*x),
        other => as_u64(other).map(|x| x as f64),
    }
}

#[cfg(test)]
#[path = "spec_tests.rs"]
pub(crate) mod tests;
