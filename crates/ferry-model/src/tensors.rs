//! The one table of a checkpoint's tensors: which tensor fills which part of the
//! weights ([`Part`] for a decoder layer, [`FixedPart`] for the rest), its name in each file
//! format (llama.cpp's GGUF names and Hugging Face's), the shape the spec expects, and which ones
//! are optional. [`TensorTable::build`] looks every tensor up once, checks presence and shapes
//! (the checks the loader relies on), and records where its bytes are; the loader, the sizing of
//! `ferry plan` and the host slabs all read from that table, so they cannot disagree about what
//! a model holds.

use std::ops::Range;

use super::error::{ModelError, Result};
use super::header::GgufType;
use super::spec::{Architecture, ModelSpec};

/// The two weight-file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One GGUF file (llama.cpp names: `blk.N.attn_q.weight`, ...).
    Gguf,
    /// Hugging Face safetensors shards (`model.layers.N.self_attn.q_proj.weight`, ...).
    Safetensors,
}

impl Format {
    /// The name prefix of decoder layer tensors, before the layer number.
    fn layer_prefix(self) -> &'static str {
        match self {
            Format::Gguf => "blk.",
            Format::Safetensors => "model.layers.",
        }
    }

    /// The full name of `part` in layer `index` of a model of family `arch`.
    pub fn layer_tensor_name(self, arch: Architecture, index: usize, part: Part) -> String {
        format!("{}{index}.{}", self.layer_prefix(), part.suffix(self, arch))
    }

    /// The decoder layer a tensor name belongs to, if any.
    pub fn layer_of(self, name: &str) -> Option<usize> {
        let rest = name.strip_prefix(self.layer_prefix())?;
        rest.split_once('.')?.0.parse().ok()
    }
}

/// Which weight of a decoder layer a tensor is ([`super::weights::LayerWeights`] holds them by
/// part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// RMSNorm before attention.
    AttnNorm,
    /// Query projection weight.
    Q,
    /// Query bias.
    QBias,
    /// Key projection weight.
    K,
    /// Key bias.
    KBias,
    /// Value projection weight.
    V,
    /// Value bias.
    VBias,
    /// Attention output projection.
    O,
    /// Attention output bias.
    OBias,
    /// RMSNorm before the MLP.
    FfnNorm,
    /// SwiGLU gate.
    Gate,
    /// SwiGLU gate bias.
    GateBias,
    /// SwiGLU up projection.
    Up,
    /// SwiGLU up bias.
    UpBias,
    /// SwiGLU down projection.
    Down,
    /// SwiGLU down bias.
    DownBias,
    /// Per-head RMSNorm of the queries, `[head_dim]` (Qwen3, Gemma 3).
    QNorm,
    /// Per-head RMSNorm of the keys, `[head_dim]` (Qwen3, Gemma 3).
    KNorm,
    /// RMSNorm of the attention output before the residual add (Gemma 2/3).
    PostAttnNorm,
    /// RMSNorm of the MLP output before the residual add (Gemma 2/3).
    PostFfnNorm,
    /// Fused query/key/value projection, rows `[q | k | v]` (Phi-3).
    Qkv,
    /// Fused gate/up projection, rows `[gate | up]` (Phi-3).
    GateUp,
    /// MoE router, `[n_experts, hidden]` (Qwen3-MoE, Mixtral).
    Router,
    /// One expert's SwiGLU gate, `[expert_ff, hidden]`; a layer has one per expert.
    ExpGate,
    /// One expert's SwiGLU up projection, `[expert_ff, hidden]`.
    ExpUp,
    /// One expert's SwiGLU down projection, `[hidden, expert_ff]`.
    ExpDown,
    /// Per query head, the learned logit of its attention sink, `[heads]` (gpt-oss).
    AttnSinks,
    /// MoE router bias, `[n_experts]` (gpt-oss).
    RouterBias,
    /// The experts' gate biases, stacked `[n_experts, expert_ff]` (gpt-oss); a layer part,
    /// not an expert's, so offloaded experts stay their three matrices.
    ExpGateBias,
    /// The experts' up biases, stacked `[n_experts, expert_ff]` (gpt-oss).
    ExpUpBias,
    /// The experts' down biases, stacked `[n_experts, hidden]` (gpt-oss).
    ExpDownBias,
    /// The shared expert's SwiGLU gate, `[shared_ff, hidden]` (Qwen2-MoE): part of the layer,
    /// as every row runs it.
    ShexpGate,
    /// The shared expert's SwiGLU up projection, `[shared_ff, hidden]`.
    ShexpUp,
    /// The shared expert's SwiGLU down projection, `[hidden, shared_ff]`.
    ShexpDown,
    /// The shared expert's gate, `[hidden]`: its output is scaled by `sigmoid(h . w)`.
    ShexpGateInp,
    /// The experts' score correction bias, `[n_experts]` (GLM-4.5, DeepSeek-V3): added to the
    /// scores that choose the experts only.
    ExpProbsBias,
    /// A Gated DeltaNet layer's output gate projection `z`, `[value_dim, hidden]` (Qwen3.5;
    /// its fused q/k/v projection is [`Part::Qkv`]).
    AttnGate,
    /// The DeltaNet's causal depthwise convolution, `[channels, taps]`.
    SsmConv,
    /// The DeltaNet's decay bias, added before the softplus, `[value heads]`.
    SsmDt,
    /// The DeltaNet's decay rate, `-exp(A_log)` as the GGUF stores it, `[value heads]`.
    SsmA,
    /// The DeltaNet's update-strength projection `b` (beta = sigmoid), `[value heads, hidden]`.
    SsmBeta,
    /// The DeltaNet's decay projection `a`, `[value heads, hidden]`.
    SsmAlpha,
    /// The RMSNorm of each value head's output before the gate, `[head_v_dim]`.
    SsmNorm,
    /// The DeltaNet's output projection, `[hidden, value_dim]`.
    SsmOut,
    /// The queries' compression, `[q_lora_rank, hidden]` (DeepSeek-V2/V3's latent attention).
    QA,
    /// RMSNorm of the compressed queries, `[q_lora_rank]`.
    QANorm,
    /// The queries out of their compression, `[heads * (qk_nope + rope), q_lora_rank]`.
    QB,
    /// The cached latent and the shared RoPE key part, `[kv_lora_rank + rope, hidden]`.
    KvAMqa,
    /// RMSNorm of the latent, `[kv_lora_rank]`.
    KvANorm,
    /// One head's key expansion, transposed: `[kv_lora_rank, qk_nope]` (a layer has one per
    /// head: GGUF stacks them, `[heads, kv_lora_rank, qk_nope]`). Absorbed into the queries.
    KB,
    /// One head's value expansion, `[v_head_dim, kv_lora_rank]` (one per head, stacked in the
    /// file like [`Part::KB`]). Applied to the attention's output in the latent space.
    VB,
}

/// Every layer part with its GGUF and Hugging Face name suffix (after `<prefix>N.`), as the
/// Llama family names them; [`NAME_OVERRIDES`] has the families that name a part otherwise.
const LAYER_NAMES: [(Part, &str, &str); 51] = [
    (Part::AttnNorm, "attn_norm.weight", "input_layernorm.weight"),
    (Part::Q, "attn_q.weight", "self_attn.q_proj.weight"),
    (Part::QBias, "attn_q.bias", "self_attn.q_proj.bias"),
    (Part::K, "attn_k.weight", "self_attn.k_proj.weight"),
    (Part::KBias, "attn_k.bias", "self_attn.k_proj.bias"),
    (Part::V, "attn_v.weight", "self_attn.v_proj.weight"),
    (Part::VBias, "attn_v.bias", "self_attn.v_proj.bias"),
    (Part::O, "attn_output.weight", "self_attn.o_proj.weight"),
    (Part::OBias, "attn_output.bias", "self_attn.o_proj.bias"),
    (
        Part::FfnNorm,
        "ffn_norm.weight",
        "post_attention_layernorm.weight",
    ),
    (Part::Gate, "ffn_gate.weight", "mlp.gate_proj.weight"),
    (Part::GateBias, "ffn_gate.bias", "mlp.gate_proj.bias"),
    (Part::Up, "ffn_up.weight", "mlp.up_proj.weight"),
    (Part::UpBias, "ffn_up.bias", "mlp.up_proj.bias"),
    (Part::Down, "ffn_down.weight", "mlp.down_proj.weight"),
    (Part::DownBias, "ffn_down.bias", "mlp.down_proj.bias"),
    (Part::QNorm, "attn_q_norm.weight", "self_attn.q_norm.weight"),
    (Part::KNorm, "attn_k_norm.weight", "self_attn.k_norm.weight"),
    (
        Part::PostAttnNorm,
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    (
        Part::PostFfnNorm,
        "post_ffw_norm.weight",
        "post_feedforward_layernorm.weight",
    ),
    (Part::Qkv, "attn_qkv.weight", "self_attn.qkv_proj.weight"),
    (Part::GateUp, "ffn_up.weight", "mlp.gate_up_proj.weight"),
    (Part::Router, "ffn_gate_inp.weight", "mlp.gate.weight"),
    // GGUF stacks every expert of a layer in one tensor (`[n_experts, out, in]`); Hugging
    // Face names each (`{}` is the expert index).
    (
        Part::ExpGate,
        "ffn_gate_exps.weight",
        "mlp.experts.{}.gate_proj.weight",
    ),
    (
        Part::ExpUp,
        "ffn_up_exps.weight",
        "mlp.experts.{}.up_proj.weight",
    ),
    (
        Part::ExpDown,
        "ffn_down_exps.weight",
        "mlp.experts.{}.down_proj.weight",
    ),
    // The parts below belong to GGUF-only families; their Hugging Face names are the
    // transformers modules' for reference.
    (Part::AttnSinks, "attn_sinks.weight", "self_attn.sinks"),
    (Part::RouterBias, "ffn_gate_inp.bias", "mlp.router.bias"),
    (
        Part::ExpGateBias,
        "ffn_gate_exps.bias",
        "mlp.experts.gate_proj_bias",
    ),
    (
        Part::ExpUpBias,
        "ffn_up_exps.bias",
        "mlp.experts.up_proj_bias",
    ),
    (
        Part::ExpDownBias,
        "ffn_down_exps.bias",
        "mlp.experts.down_proj_bias",
    ),
    (
        Part::ShexpGate,
        "ffn_gate_shexp.weight",
        "mlp.shared_expert.gate_proj.weight",
    ),
    (
        Part::ShexpUp,
        "ffn_up_shexp.weight",
        "mlp.shared_expert.up_proj.weight",
    ),
    (
        Part::ShexpDown,
        "ffn_down_shexp.weight",
        "mlp.shared_expert.down_proj.weight",
    ),
    (
        Part::ShexpGateInp,
        "ffn_gate_inp_shexp.weight",
        "mlp.shared_expert_gate.weight",
    ),
    (
        Part::ExpProbsBias,
        "exp_probs_b.bias",
        "mlp.gate.e_score_correction_bias",
    ),
    (
        Part::AttnGate,
        "attn_gate.weight",
        "linear_attn.in_proj_z.weight",
    ),
    (
        Part::SsmConv,
        "ssm_conv1d.weight",
        "linear_attn.conv1d.weight",
    ),
    (Part::SsmDt, "ssm_dt.bias", "linear_attn.dt_bias"),
    (Part::SsmA, "ssm_a", "linear_attn.A_log"),
    (
        Part::SsmBeta,
        "ssm_beta.weight",
        "linear_attn.in_proj_b.weight",
    ),
    (
        Part::SsmAlpha,
        "ssm_alpha.weight",
        "linear_attn.in_proj_a.weight",
    ),
    (Part::SsmNorm, "ssm_norm.weight", "linear_attn.norm.weight"),
    (
        Part::SsmOut,
        "ssm_out.weight",
        "linear_attn.out_proj.weight",
    ),
    (Part::QA, "attn_q_a.weight", "self_attn.q_a_proj.weight"),
    (
        Part::QANorm,
        "attn_q_a_norm.weight",
        "self_attn.q_a_layernorm.weight",
    ),
    (Part::QB, "attn_q_b.weight", "self_attn.q_b_proj.weight"),
    (
        Part::KvAMqa,
        "attn_kv_a_mqa.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
    ),
    (
        Part::KvANorm,
        "attn_kv_a_norm.weight",
        "self_attn.kv_a_layernorm.weight",
    ),
    // transformers has one `kv_b_proj`; llama.cpp's converter splits it per head.
    (Part::KB, "attn_k_b.weight", "self_attn.k_b_proj.weight"),
    (Part::VB, "attn_v_b.weight", "self_attn.v_b_proj.weight"),
];

/// Names that differ by family: `(families, part, format, suffix)`. Gemma's Hugging Face
/// checkpoints call the MLP pre-norm `pre_feedforward_layernorm`, since their
/// `post_attention_layernorm` is the norm of the attention output ([`Part::PostAttnNorm`]).
/// (Names shared by two parts, such as llama.cpp's `ffn_up` for both [`Part::Up`] and Phi-3's
/// fused [`Part::GateUp`], belong to families that never have both.)
const NAME_OVERRIDES: [(&[Architecture], Part, Format, &str); 6] = [
    // gpt-oss's and GLM-4.5's MLP pre-norm is their `post_attention_norm` (transformers'
    // `post_attention_layernorm`).
    (
        &[
            Architecture::GptOss,
            Architecture::Glm4Moe,
            Architecture::Qwen35,
            Architecture::Qwen35Moe,
        ],
        Part::FfnNorm,
        Format::Gguf,
        "post_attention_norm.weight",
    ),
    (
        &[Architecture::Gemma2, Architecture::Gemma3],
        Part::FfnNorm,
        Format::Safetensors,
        "pre_feedforward_layernorm.weight",
    ),
    (
        &[Architecture::Mixtral],
        Part::Router,
        Format::Safetensors,
        "block_sparse_moe.gate.weight",
    ),
    (
        &[Architecture::Mixtral],
        Part::ExpGate,
        Format::Safetensors,
        "block_sparse_moe.experts.{}.w1.weight",
    ),
    (
        &[Architecture::Mixtral],
        Part::ExpUp,
        Format::Safetensors,
        "block_sparse_moe.experts.{}.w3.weight",
    ),
    (
        &[Architecture::Mixtral],
        Part::ExpDown,
        Format::Safetensors,
        "block_sparse_moe.experts.{}.w2.weight",
    ),
];

/// Whether a family's layer has a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Every layer must have it.
    Required,
    /// Used when the file has it.
    Optional,
    /// Not part of this family (never looked up).
    Absent,
}

impl Part {
    /// Every part, in table order (each bias after its weight).
    pub const ALL: [Part; 51] = {
        let mut all = [Part::AttnNorm; 51];
        let mut i = 0;
        while i < 51 {
            all[i] = LAYER_NAMES[i].0;
            i += 1;
        }
        all
    };

    /// The name suffix in `format` for a model of family `arch`.
    pub fn suffix(self, format: Format, arch: Architecture) -> &'static str {
        if let Some((_, _, _, name)) = NAME_OVERRIDES
            .iter()
            .find(|(archs, p, f, _)| *p == self && *f == format && archs.contains(&arch))
        {
            return name;
        }
        let (_, gguf, hf) = LAYER_NAMES[self as usize];
        match format {
            Format::Gguf => gguf,
            Format::Safetensors => hf,
        }
    }

    /// Whether this part is a projection matrix (may stay block-quantized).
    pub fn is_matrix(self) -> bool {
        matches!(
            self,
            Part::Q
                | Part::K
                | Part::V
                | Part::O
                | Part::Gate
                | Part::Up
                | Part::Down
                | Part::Qkv
                | Part::GateUp
                | Part::Router
                | Part::ExpGate
                | Part::ExpUp
                | Part::ExpDown
                | Part::ShexpGate
                | Part::ShexpUp
                | Part::ShexpDown
                | Part::AttnGate
                | Part::SsmBeta
                | Part::SsmAlpha
                | Part::SsmOut
                | Part::QA
                | Part::QB
                | Part::KvAMqa
                | Part::KB
                | Part::VB
        )
    }

    /// Whether a layer has one of this part per attention head (the latent attention's key
    /// and value expansions: GGUF stacks them in one tensor, each head's record a slice).
    pub fn is_per_head(self) -> bool {
        matches!(self, Part::KB | Part::VB)
    }

    /// Whether a layer has one of this part per expert.
    pub fn is_expert(self) -> bool {
        matches!(self, Part::ExpGate | Part::ExpUp | Part::ExpDown)
    }

    /// The bias of a projection matrix (`None` for the fused ones, which have none).
    pub fn bias(self) -> Option<Part> {
        Some(match self {
            Part::Q => Part::QBias,
            Part::K => Part::KBias,
            Part::V => Part::VBias,
            Part::O => Part::OBias,
            Part::Gate => Part::GateBias,
            Part::Up => Part::UpBias,
            Part::Down => Part::DownBias,
            Part::Router => Part::RouterBias,
            _ => return None,
        })
    }

    /// Whether this part is the bias of a projection matrix.
    pub fn is_bias(self) -> bool {
        matches!(
            self,
            Part::QBias
                | Part::KBias
                | Part::VBias
                | Part::OBias
                | Part::GateBias
                | Part::UpBias
                | Part::DownBias
                | Part::RouterBias
        )
    }

    /// The `[out, in]` (matrices) or `[len]` (norms, biases) shape `spec` expects.
    pub fn expected_shape(self, spec: &ModelSpec) -> Vec<usize> {
        let h = spec.hidden_size;
        let kv = spec.n_kv_heads * spec.head_dim;
        let i = spec.intermediate_size;
        let delta = spec.delta_net.as_ref();
        let v_heads = delta.map_or(0, |d| d.n_v_heads);
        let value_dim = delta.map_or(0, |d| d.value_dim());
        // Latent attention's heads are not the cache's: queries of no-RoPE + RoPE parts, value
        // heads of their own width.
        let (q, o) = match spec.mla {
            Some(m) => (
                spec.n_heads * m.q_head_dim(spec.rope_dim),
                spec.n_heads * m.v_head_dim,
            ),
            None => (spec.n_heads * spec.head_dim, spec.n_heads * spec.head_dim),
        };
        let mla = spec.mla.unwrap_or_default();
        match self {
            // Qwen3.5's attention projects each query head and its output gate together.
            Part::Q if spec.architecture.is_qwen35() => vec![2 * q, h],
            Part::Qkv if delta.is_some() => vec![delta.map_or(0, |d| d.conv_channels()), h],
            Part::AttnGate => vec![value_dim, h],
            Part::SsmConv => delta.map_or(vec![0, 0], |d| vec![d.conv_channels(), d.conv_kernel]),
            Part::SsmDt | Part::SsmA => vec![v_heads],
            Part::SsmBeta | Part::SsmAlpha => vec![v_heads, h],
            Part::SsmNorm => vec![delta.map_or(0, |d| d.head_v_dim)],
            Part::SsmOut => vec![h, value_dim],
            Part::AttnNorm
            | Part::FfnNorm
            | Part::OBias
            | Part::DownBias
            | Part::PostAttnNorm
            | Part::PostFfnNorm => vec![h],
            Part::Q => vec![q, h],
            Part::K | Part::V => vec![kv, h],
            Part::QBias => vec![q],
            Part::KBias | Part::VBias => vec![kv],
            Part::O => vec![h, o],
            Part::Gate | Part::Up => vec![i, h],
            Part::GateBias | Part::UpBias => vec![i],
            Part::Down => vec![h, i],
            Part::QNorm | Part::KNorm => vec![spec.head_dim],
            Part::Qkv => vec![q + 2 * kv, h],
            Part::GateUp => vec![2 * i, h],
            Part::Router => vec![spec.moe.map_or(0, |m| m.n_experts), h],
            Part::ExpGate | Part::ExpUp => vec![spec.moe.map_or(0, |m| m.expert_ff), h],
            Part::ExpDown => vec![h, spec.moe.map_or(0, |m| m.expert_ff)],
            Part::AttnSinks => vec![spec.n_heads],
            Part::RouterBias => vec![spec.moe.map_or(0, |m| m.n_experts)],
            Part::ExpGateBias | Part::ExpUpBias => spec
                .moe
                .map_or(vec![0, 0], |m| vec![m.n_experts, m.expert_ff]),
            Part::ExpDownBias => vec![spec.moe.map_or(0, |m| m.n_experts), h],
            Part::ShexpGate | Part::ShexpUp => {
                vec![spec.moe.and_then(|m| m.shared_ff).unwrap_or(0), h]
            }
            Part::ShexpDown => vec![h, spec.moe.and_then(|m| m.shared_ff).unwrap_or(0)],
            Part::ShexpGateInp => vec![h],
            Part::ExpProbsBias => vec![spec.moe.map_or(0, |m| m.n_experts)],
            Part::QA => vec![mla.q_lora_rank, h],
            Part::QANorm => vec![mla.q_lora_rank],
            Part::QB => vec![q, mla.q_lora_rank],
            Part::KvAMqa => vec![mla.kv_lora_rank + spec.rope_dim, h],
            Part::KvANorm => vec![mla.kv_lora_rank],
            Part::KB => vec![mla.kv_lora_rank, mla.qk_nope_dim],
            Part::VB => vec![mla.v_head_dim, mla.kv_lora_rank],
        }
    }

    /// Whether decoder layer `index` of `spec`'s family has this part: norms and matrices of
    /// the family always (a MoE model's leading dense layers their MLP instead of experts),
    /// the q/k/v biases when the spec says the attention has biases; other biases are used
    /// when present.
    pub fn presence(self, spec: &ModelSpec, index: usize) -> Presence {
        use Architecture as A;
        let arch = spec.architecture;
        let fused = arch == A::Phi3;
        let layer_moe = spec.moe_at(index);
        let moe = layer_moe.is_some();
        let expert_biases = arch == A::GptOss;
        let shared = layer_moe.is_some_and(|m| m.shared_ff.is_some());
        let required = |yes: bool| {
            if yes {
                Presence::Required
            } else {
                Presence::Absent
            }
        };
        let mla = spec.mla;
        let q_lora = mla.is_some_and(|m| m.q_lora_rank > 0);
        let recurrent = spec.is_recurrent_layer(index);
        match self {
            Part::Q | Part::K | Part::V | Part::O if recurrent => Presence::Absent,
            Part::QNorm | Part::KNorm | Part::OBias if recurrent => Presence::Absent,
            Part::QBias | Part::KBias | Part::VBias if recurrent => Presence::Absent,
            Part::Qkv if recurrent => Presence::Required,
            Part::AttnGate
            | Part::SsmConv
            | Part::SsmDt
            | Part::SsmA
            | Part::SsmBeta
            | Part::SsmAlpha
            | Part::SsmNorm
            | Part::SsmOut => required(recurrent),
            Part::Q => required(!fused && !q_lora),
            Part::K | Part::V => required(!fused && mla.is_none()),
            Part::QA | Part::QANorm | Part::QB => required(q_lora),
            Part::KvAMqa | Part::KvANorm | Part::KB | Part::VB => required(mla.is_some()),
            Part::Gate | Part::Up => required(!fused && !moe),
            Part::Down => required(!moe),
            Part::Router | Part::ExpGate | Part::ExpUp | Part::ExpDown => required(moe),
            Part::Qkv | Part::GateUp => required(fused),
            Part::QBias | Part::KBias | Part::VBias if fused => Presence::Absent,
            Part::GateBias | Part::UpBias if fused || moe => Presence::Absent,
            Part::DownBias if moe => Presence::Absent,
            Part::QBias | Part::KBias | Part::VBias if spec.attention_bias => Presence::Required,
            Part::QNorm | Part::KNorm => required(spec.qk_norm),
            Part::AttnSinks => required(spec.attn_sinks),
            Part::RouterBias => required(moe && expert_biases),
            Part::ExpGateBias | Part::ExpUpBias | Part::ExpDownBias => {
                required(moe && expert_biases)
            }
            Part::ShexpGate | Part::ShexpUp | Part::ShexpDown => required(shared),
            Part::ShexpGateInp => required(shared && layer_moe.is_some_and(|m| m.shared_gate)),
            Part::ExpProbsBias => required(layer_moe.is_some_and(|m| m.selection_bias)),
            Part::PostAttnNorm | Part::PostFfnNorm => {
                required(matches!(arch, A::Gemma2 | A::Gemma3))
            }
            _ if self.is_bias() => Presence::Optional,
            _ => Presence::Required,
        }
    }
}

/// The tensors outside the decoder layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedPart {
    /// Token embedding, `[vocab, hidden]`.
    Embedding,
    /// RMSNorm after the last layer, `[hidden]`.
    FinalNorm,
    /// Output head, `[vocab, hidden]` (absent when tied to the embedding).
    Head,
    /// Per-frequency RoPE divisors (GGUF of Llama 3.1+), `[head_dim / 2]`.
    RopeFreqs,
}

impl FixedPart {
    /// The tensor name in `format` (`None`: the format has no such tensor).
    pub fn name(self, format: Format) -> Option<&'static str> {
        Some(match (self, format) {
            (FixedPart::Embedding, Format::Gguf) => "token_embd.weight",
            (FixedPart::Embedding, Format::Safetensors) => "model.embed_tokens.weight",
            (FixedPart::FinalNorm, Format::Gguf) => "output_norm.weight",
            (FixedPart::FinalNorm, Format::Safetensors) => "model.norm.weight",
            (FixedPart::Head, Format::Gguf) => "output.weight",
            (FixedPart::Head, Format::Safetensors) => "lm_head.weight",
            (FixedPart::RopeFreqs, Format::Gguf) => "rope_freqs.weight",
            (FixedPart::RopeFreqs, Format::Safetensors) => return None,
        })
    }

    fn expected_shape(self, spec: &ModelSpec) -> Vec<usize> {
        match self {
            FixedPart::Embedding | FixedPart::Head => vec![spec.vocab_size, spec.hidden_size],
            FixedPart::FinalNorm => vec![spec.hidden_size],
            FixedPart::RopeFreqs => vec![spec.rope_dim / 2],
        }
    }
}

/// The GGUF tensor of Phi-3's long-context RoPE divisors.
const PHI3_LONG_FACTORS: &str = "rope_factors_long.weight";

/// How a tensor is stored in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredType {
    /// A GGUF tensor type (any ggml type id).
    Gguf(GgufType),
    /// A safetensors dtype.
    Safetensors(safetensors::Dtype),
}

/// One tensor the model uses: name, shape, stored type and where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRecord {
    /// Name in the file.
    pub name: String,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Stored type.
    pub stored: StoredType,
    /// Which file holds it (the shard index; 0 for a GGUF file).
    pub file: usize,
    /// Absolute byte range in that file.
    pub range: Range<usize>,
}

impl TensorRecord {
    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes in the file.
    pub fn stored_bytes(&self) -> usize {
        self.range.len()
    }
}

/// The tensors of one decoder layer, in [`Part::ALL`] order (optional parts only when present).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTensors {
    /// Decoder layer index.
    pub index: usize,
    /// The model's family (decides the names).
    pub architecture: Architecture,
    /// `(part, tensor)` pairs.
    pub tensors: Vec<(Part, TensorRecord)>,
}

impl LayerTensors {
    /// The tensor of `part`, if the layer has one.
    pub fn get(&self, part: Part) -> Option<&TensorRecord> {
        self.tensors
            .iter()
            .find(|(p, _)| *p == part)
            .map(|(_, r)| r)
    }

    /// The tensor of `part`, or [`ModelError::MissingTensor`].
    pub fn need(&self, part: Part, format: Format) -> Result<&TensorRecord> {
        self.get(part).ok_or_else(|| {
            ModelError::MissingTensor(format.layer_tensor_name(self.architecture, self.index, part))
        })
    }
}

/// Every tensor a model uses, looked up and checked once.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorTable {
    /// The file format (decides the names).
    pub format: Format,
    /// Token embedding.
    pub embedding: TensorRecord,
    /// Final norm.
    pub final_norm: TensorRecord,
    /// Output head; `None` when it is tied to the embedding.
    pub head: Option<TensorRecord>,
    /// RoPE frequency divisors, if the file has them.
    pub rope_freqs: Option<TensorRecord>,
    /// Decoder layers, by index.
    pub layers: Vec<LayerTensors>,
}

impl TensorTable {
    /// Looks up every tensor `spec` needs through `lookup` (name -> record) and checks shapes;
    /// `names` lists every tensor in the files, so that layers beyond the spec's count (and
    /// its unrun blocks, [`ModelSpec::unrun_layers`]) are refused rather than silently
    /// dropped. A model whose spec does not tie the head but whose
    /// file has none gets a tied head (with a warning), as transformers does.
    pub fn build<'n>(
        format: Format,
        spec: &ModelSpec,
        lookup: &dyn Fn(&str) -> Option<TensorRecord>,
        names: impl Iterator<Item = &'n str>,
    ) -> Result<Self> {
        if let Some(beyond) = names
            .filter_map(|n| format.layer_of(n).map(|i| (i, n)))
            .filter(|(i, _)| *i >= spec.n_layers + spec.unrun_layers)
            .min()
        {
            return Err(ModelError::Config(format!(
                "tensor `{}` belongs to layer {}, but the model has {} layers",
                beyond.1,
                beyond.0,
                spec.n_layers + spec.unrun_layers
            )));
        }
        let fixed = |part: FixedPart| -> Result<Option<TensorRecord>> {
            let Some(name) = part.name(format) else {
                return Ok(None);
            };
            lookup(name)
                .map(|r| check_shape(r, &part.expected_shape(spec)))
                .transpose()
        };
        let need = |part: FixedPart| {
            fixed(part)?
                .ok_or_else(|| ModelError::MissingTensor(part.name(format).unwrap_or("").into()))
        };
        let head = if spec.tie_word_embeddings {
            None
        } else {
            let head = fixed(FixedPart::Head)?;
            if head.is_none() {
                tracing::warn!("the output head is missing; tying it to the embedding");
            }
            head
        };
        let layers = (0..spec.n_layers)
            .map(|index| layer(format, spec, index, lookup))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            format,
            embedding: need(FixedPart::Embedding)?,
            final_norm: need(FixedPart::FinalNorm)?,
            head,
            rope_freqs: match fixed(FixedPart::RopeFreqs)? {
                // llama.cpp's Phi-3 longrope divisors; the long ones, as ferry runs the
                // model's whole window (see `ModelSpec::rope_freq_factors`).
                None if spec.architecture == Architecture::Phi3 && format == Format::Gguf => {
                    lookup(PHI3_LONG_FACTORS)
                        .map(|r| check_shape(r, &FixedPart::RopeFreqs.expected_shape(spec)))
                        .transpose()?
                }
                other => other,
            },
            layers,
        })
    }

    /// Decoder layer `index`.
    pub fn layer(&self, index: usize) -> Result<&LayerTensors> {
        self.layers.get(index).ok_or_else(|| {
            ModelError::Config(format!(
                "layer {index} is out of range ({} layers)",
                self.layers.len()
            ))
        })
    }

    /// Every tensor of the table: fixed parts, then layers in order.
    pub fn records(&self) -> impl Iterator<Item = &TensorRecord> {
        let fixed = [Some(&self.embedding), Some(&self.final_norm)]
            .into_iter()
            .chain([self.head.as_ref(), self.rope_freqs.as_ref()])
            .flatten();
        fixed.chain(
            self.layers
                .iter()
                .flat_map(|l| l.tensors.iter().map(|(_, r)| r)),
        )
    }
}

fn layer(
    format: Format,
    spec: &ModelSpec,
    index: usize,
    lookup: &dyn Fn(&str) -> Option<TensorRecord>,
) -> Result<LayerTensors> {
    let mut tensors = Vec::new();
    let arch = spec.architecture;
    for part in Part::ALL {
        let presence = part.presence(spec, index);
        if presence == Presence::Absent {
            continue;
        }
        if part.is_expert() {
            continue;
        }
        let name = format.layer_tensor_name(arch, index, part);
        if part.is_per_head() {
            let stacked = lookup(&name).ok_or_else(|| ModelError::MissingTensor(name))?;
            tensors.extend(
                stacked_slices(stacked, spec.n_heads, &part.expected_shape(spec))?
                    .into_iter()
                    .map(|r| (part, r)),
            );
            continue;
        }
        match lookup(&name) {
            Some(record) => tensors.push((part, check_shape(record, &part.expected_shape(spec))?)),
            None if presence == Presence::Required => return Err(ModelError::MissingTensor(name)),
            None => {}
        }
    }
    if let Some(moe) = spec.moe_at(index) {
        tensors.extend(experts(format, spec, index, moe.n_experts, lookup)?);
    }
    Ok(LayerTensors {
        index,
        architecture: arch,
        tensors,
    })
}

/// The experts of layer `index`, expert by expert (gate, up, down of expert 0, then of
/// expert 1, ...): each expert's three matrices are one unit the offload engine can place.
/// A GGUF stacks each kind in one `[n_experts, out, in]` tensor, kept as one tensor in the
/// file: each expert's record is its slice of the stacked bytes (whole rows of blocks).
fn experts(
    format: Format,
    spec: &ModelSpec,
    index: usize,
    n_experts: usize,
    lookup: &dyn Fn(&str) -> Option<TensorRecord>,
) -> Result<Vec<(Part, TensorRecord)>> {
    let kinds = [Part::ExpGate, Part::ExpUp, Part::ExpDown];
    let arch = spec.architecture;
    let per_kind: Vec<Vec<TensorRecord>> = match format {
        Format::Gguf => kinds
            .iter()
            .map(|&part| {
                let name = format.layer_tensor_name(arch, index, part);
                let stacked = lookup(&name).ok_or_else(|| ModelError::MissingTensor(name))?;
                stacked_slices(stacked, n_experts, &part.expected_shape(spec))
            })
            .collect::<Result<_>>()?,
        Format::Safetensors => kinds
            .iter()
            .map(|&part| {
                (0..n_experts)
                    .map(|e| {
                        let name = format
                            .layer_tensor_name(arch, index, part)
                            .replace("{}", &e.to_string());
                        let record =
                            lookup(&name).ok_or_else(|| ModelError::MissingTensor(name))?;
                        check_shape(record, &part.expected_shape(spec))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?,
    };
    Ok((0..n_experts)
        .flat_map(|e| {
            kinds
                .iter()
                .zip(&per_kind)
                .map(move |(&p, r)| (p, r[e].clone()))
        })
        .collect())
}

/// The `n` slices of a `[n, ..each]` tensor (whole rows of blocks each, in order), named
/// `name[i]`: GGUF's stacked experts and per-head matrices.
fn stacked_slices(stacked: TensorRecord, n: usize, each: &[usize]) -> Result<Vec<TensorRecord>> {
    let mut shape = vec![n];
    shape.extend(each);
    let stacked = check_shape(stacked, &shape)?;
    let len = stacked.range.len() / n;
    Ok((0..n)
        .map(|i| TensorRecord {
            name: format!("{}[{i}]", stacked.name),
            shape: each.to_vec(),
            stored: stacked.stored,
            file: stacked.file,
            range: stacked.range.start + i * len..stacked.range.start + (i + 1) * len,
        })
        .collect())
}

/// `record` if its shape is `expected`, else [`ModelError::BadShape`].
fn check_shape(record: TensorRecord, expected: &[usize]) -> Result<TensorRecord> {
    if record.shape != expected {
        return Err(ModelError::BadShape {
            name: record.name,
            actual: record.shape,
            expected: expected.to_vec(),
        });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_table_covers_every_part_once_per_format() {
        for (i, part) in Part::ALL.into_iter().enumerate() {
            assert_eq!(part as usize, i, "{part:?} is out of table order");
        }
        for arch in Architecture::ALL {
            let spec = crate::spec::tests::tiny_spec(arch);
            for format in [Format::Gguf, Format::Safetensors] {
                let mut names: Vec<&str> = Part::ALL
                    .iter()
                    .filter(|p| p.presence(&spec, 12) != Presence::Absent)
                    .map(|p| p.suffix(format, arch))
                    .collect();
                let n = names.len();
                names.sort();
                names.dedup();
                assert_eq!(names.len(), n, "{arch:?} {format:?}: {names:?}");
                let name = format.layer_tensor_name(arch, 12, Part::Down);
                assert_eq!(format.layer_of(&name), Some(12), "{name}");
            }
        }
        assert_eq!(
            Format::Gguf.layer_tensor_name(Architecture::Llama, 3, Part::QBias),
            "blk.3.attn_q.bias"
        );
        assert_eq!(
            Format::Safetensors.layer_tensor_name(Architecture::Llama, 0, Part::FfnNorm),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(Format::Gguf.layer_of("output.weight"), None);
        assert_eq!(Format::Safetensors.layer_of("model.layers.x.w"), None);
        assert_eq!(
            Format::Safetensors.layer_tensor_name(Architecture::Gemma3, 0, Part::FfnNorm),
            "model.layers.0.pre_feedforward_layernorm.weight"
        );
        // Every unfused dense projection has a bias part, and only projections do (the
        // DeltaNet's projections have none).
        for part in Part::ALL {
            let no_bias = matches!(
                part,
                Part::Qkv
                    | Part::GateUp
                    | Part::ShexpGate
                    | Part::ShexpUp
                    | Part::ShexpDown
                    | Part::AttnGate
                    | Part::SsmBeta
                    | Part::SsmAlpha
                    | Part::SsmOut
                    | Part::QA
                    | Part::QB
                    | Part::KvAMqa
                    | Part::KB
                    | Part::VB
            ) || part.is_expert();
            assert_eq!(
                part.bias().is_some(),
                part.is_matrix() && !no_bias,
                "{part:?}"
            );
            assert_eq!(
                part.is_bias(),
                Part::ALL.iter().any(|w| w.bias() == Some(part))
            );
        }
    }
}
