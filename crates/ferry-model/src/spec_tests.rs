//! Unit tests for `ModelSpec` parsing from config.json and GGUF metadata.
use super::*;

const SMOL_LIKE: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2
}"#;

#[test]
fn parses_llama_config() {
    let spec = ModelSpec::from_hf_config(SMOL_LIKE).unwrap();
    assert_eq!(spec.architecture, Architecture::Llama);
    assert_eq!(spec.head_dim, 64);
    assert_eq!(spec.gqa_group(), 3);
    assert_eq!(spec.max_context, 8192);
    assert!(spec.tie_word_embeddings && !spec.attention_bias && !spec.rope_interleaved);
    assert_eq!(spec.eos_token_ids, vec![2]);
    assert_eq!(spec.rope_theta, 100000.0);
}

#[test]
fn parses_llama3_scaling_and_eos_list() {
    let json = SMOL_LIKE.replace(
        "\"eos_token_id\": 2",
        "\"eos_token_id\": [2, 7], \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,
         \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,
         \"original_max_position_embeddings\": 8192}",
    );
    let spec = ModelSpec::from_hf_config(&json).unwrap();
    assert_eq!(spec.eos_token_ids, vec![2, 7]);
    let s = spec.rope_scaling.unwrap();
    assert_eq!((s.factor, s.original_max_position_embeddings), (8.0, 8192));
}

#[test]
fn rejects_bad_configs() {
    let yarn = SMOL_LIKE.replace(
        "\"eos_token_id\": 2",
        "\"eos_token_id\": 2, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}",
    );
    assert!(matches!(
        ModelSpec::from_hf_config(&yarn),
        Err(ModelError::Unsupported(_))
    ));
    let gelu = SMOL_LIKE.replace("\"silu\"", "\"gelu\"");
    assert!(matches!(
        ModelSpec::from_hf_config(&gelu),
        Err(ModelError::Unsupported(_))
    ));
    let gqa = SMOL_LIKE.replace("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4");
    assert!(matches!(
        ModelSpec::from_hf_config(&gqa),
        Err(ModelError::Config(_))
    ));
    let phi = SMOL_LIKE.replace("\"model_type\": \"llama\"", "\"model_type\": \"phi\"");
    assert!(matches!(
        ModelSpec::from_hf_config(&phi),
        Err(ModelError::Unsupported(_))
    ));
    assert!(ModelSpec::from_hf_config("{").is_err());
}

#[test]
fn qwen2_gets_biases_and_no_window_unless_enabled() {
    let json = SMOL_LIKE
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\"")
        .replace(
            "\"hidden_act\"",
            "\"sliding_window\": 4096, \"use_sliding_window\": false, \"hidden_act\"",
        );
    let spec = ModelSpec::from_hf_config(&json).unwrap();
    assert_eq!(spec.architecture, Architecture::Qwen2);
    assert!(spec.attention_bias);
    assert_eq!(spec.sliding_window, None);
}

#[test]
fn qwen2_config_gives_the_planner_its_dims() {
    // Moved from the planner's own config.json reader, which this spec replaced.
    let json = r#"{"model_type":"qwen2","num_hidden_layers":24,"hidden_size":896,
        "intermediate_size":4864,"num_attention_heads":14,"num_key_value_heads":2,
        "vocab_size":151936,"max_position_embeddings":32768,"rms_norm_eps":1e-6}"#;
    let spec = ModelSpec::from_hf_config(json).unwrap();
    assert_eq!(spec.architecture.name(), "qwen2");
    assert_eq!(
        (
            spec.n_layers,
            spec.hidden_size,
            spec.n_heads,
            spec.n_kv_heads
        ),
        (24, 896, 14, 2)
    );
    assert_eq!(
        (spec.head_dim, spec.vocab_size, spec.max_context),
        (64, 151936, 32768)
    );
    let error = ModelSpec::from_hf_config(r#"{"model_type":"qwen2","hidden_size":896}"#)
        .unwrap_err()
        .to_string();
    assert!(error.contains("missing field"), "{error}");
}

/// A small valid spec of family `arch` (from a config.json of that family; the GGUF-only
/// families from Qwen3-MoE's with their own fields set as the GGUF reader sets them).
pub(crate) fn tiny_spec(arch: Architecture) -> ModelSpec {
    if arch.gguf_only() {
        let mut spec = tiny_spec(Architecture::Qwen3Moe);
        spec.architecture = arch;
        spec.qk_norm = false;
        let moe = spec.moe.as_mut().unwrap();
        moe.norm_topk = false;
        if arch == Architecture::GptOss {
            moe.gating = Gating::SoftmaxOfTopK;
            moe.activation = ExpertActivation::ClampedSwiglu;
            spec.attn_sinks = true;
            spec.attention_bias = true;
            spec.sliding_window = Some(128);
            spec.sliding_window_pattern = Some(2);
        } else if arch == Architecture::Deepseek2 {
            moe.shared_ff = Some(moe.expert_ff);
            moe.dense_lead = 1;
            spec.n_kv_heads = 1;
            spec.rope_dim = 16;
            spec.head_dim = 64 + 16;
            spec.rope_interleaved = true;
            spec.mla = Some(crate::spec::MlaSpec {
                q_lora_rank: 48,
                kv_lora_rank: 64,
                qk_nope_dim: 32,
                v_head_dim: 32,
                score_scale: 0.125,
            });
        } else if arch == Architecture::Glm4Moe {
            moe.gating = Gating::Sigmoid;
            moe.norm_topk = true;
            moe.shared_ff = Some(moe.expert_ff);
            moe.selection_bias = true;
            moe.weights_scale = 2.5;
            moe.dense_lead = 1;
            spec.attention_bias = true;
            spec.qk_norm = true;
            spec.rope_dim = spec.head_dim / 2;
        } else {
            moe.shared_ff = Some(96);
            moe.shared_gate = true;
            spec.attention_bias = true;
        }
        return spec;
    }
    let name = match arch {
        Architecture::Gemma3 => "gemma3_text",
        Architecture::Qwen3Moe => "qwen3_moe",
        other => other.name(),
    };
    let moe = "\"num_experts\": 8, \"num_local_experts\": 8, \"num_experts_per_tok\": 2,
        \"moe_intermediate_size\": 64, \"norm_topk_prob\": true, \"hidden_act\"";
    let json = SMOL_LIKE
        .replace("\"hidden_act\"", moe)
        .replace(
            "\"model_type\": \"llama\"",
            &format!("\"model_type\": \"{name}\""),
        )
        .replace(
            "\"silu\"",
            if arch.is_gemma() {
                "\"gelu_pytorch_tanh\""
            } else {
                "\"silu\""
            },
        );
    let spec = ModelSpec::from_hf_config(&json).unwrap();
    assert_eq!(spec.architecture, arch);
    spec
}

#[test]
fn gemma3_config_alternates_windows_and_rope_bases() {
    let json = SMOL_LIKE
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"gemma3_text\"")
        .replace("\"silu\"", "\"gelu_pytorch_tanh\"")
        .replace(
            "\"tie_word_embeddings\": true,",
            "\"sliding_window\": 512, \"sliding_window_pattern\": 6, \"query_pre_attn_scalar\": 256,
             \"rope_local_base_freq\": 10000.0,
             \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0},",
        );
    let spec = ModelSpec::from_hf_config(&json).unwrap();
    assert_eq!(spec.architecture, Architecture::Gemma3);
    assert!(spec.qk_norm && spec.tie_word_embeddings);
    assert_eq!(spec.activation, Activation::GeluTanh);
    assert_eq!(spec.norm_offset, 1.0);
    assert_eq!(spec.embed_scale, Some(24.0));
    assert_eq!(spec.query_pre_attn_scalar, Some(256.0));
    assert_eq!(spec.rope_local_theta, Some(10_000.0));
    assert_eq!(spec.rope_linear_factor, Some(8.0));
    let windows: Vec<Option<usize>> = (0..7).map(|i| spec.layer_window(i)).collect();
    let w = Some(512);
    assert_eq!(windows, [w, w, w, w, w, None, w]);

    // The same layout given as `layer_types` (newer configs), and one that is not a pattern.
    let types = |t: &[&str]| {
        let list: Vec<String> = t.iter().map(|s| format!("\"{s}\"")).collect();
        json.replace(
            "\"sliding_window_pattern\": 6,",
            &format!("\"layer_types\": [{}],", list.join(",")),
        )
    };
    let (s, f) = ("sliding_attention", "full_attention");
    let spec = ModelSpec::from_hf_config(&types(&[s, s, f, s, s, f])).unwrap();
    assert_eq!(spec.sliding_window_pattern, Some(3));
    assert!(matches!(
        ModelSpec::from_hf_config(&types(&[s, f, f])),
        Err(ModelError::Unsupported(_))
    ));
}

#[test]
fn qwen3_and_phi3_configs() {
    let qwen3 = tiny_spec(Architecture::Qwen3);
    assert!(qwen3.qk_norm && !qwen3.attention_bias && qwen3.norm_offset == 0.0);
    let gemma2 = tiny_spec(Architecture::Gemma2);
    assert!(!gemma2.qk_norm);
    assert_eq!(gemma2.sliding_window_pattern, Some(2));
    let phi3 = tiny_spec(Architecture::Phi3);
    assert_eq!(phi3.activation, Activation::Silu);
    assert!(!phi3.qk_norm && phi3.embed_scale.is_none());
}

#[test]
fn phi3_longrope_picks_the_long_factors_past_the_original_context() {
    let json = SMOL_LIKE
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"phi3\"")
        .replace(
            "\"tie_word_embeddings\": true,",
            &format!(
                "\"original_max_position_embeddings\": 4096, \"rope_scaling\": {{\"type\": \"su\",
                 \"short_factor\": {:?}, \"long_factor\": {:?}}},",
                vec![1.0f32; 32],
                vec![2.0f32; 32]
            ),
        );
    let spec = ModelSpec::from_hf_config(&json).unwrap();
    assert_eq!(spec.rope_freq_factors, Some(vec![2.0; 32]));
    let expected = (1.0f32 + 2f32.ln() / 4096f32.ln()).sqrt();
    assert!((spec.rope_attn_factor.unwrap() - expected).abs() < 1e-6);
    let short = json.replace(
        "\"max_position_embeddings\": 8192",
        "\"max_position_embeddings\": 4096",
    );
    let spec = ModelSpec::from_hf_config(&short).unwrap();
    assert_eq!(spec.rope_freq_factors, Some(vec![1.0; 32]));
    assert_eq!(spec.rope_attn_factor, None);
    let wrong = json.replace(&format!("{:?}", vec![2.0f32; 32]), "[2.0]");
    assert!(matches!(
        ModelSpec::from_hf_config(&wrong),
        Err(ModelError::Config(_))
    ));
}

#[test]
fn moe_configs_give_their_experts() {
    let qwen = tiny_spec(Architecture::Qwen3Moe);
    let moe = qwen.moe.unwrap();
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ff), (8, 2, 64));
    assert!(moe.norm_topk && qwen.qk_norm);
    let mixtral = tiny_spec(Architecture::Mixtral);
    assert_eq!(mixtral.moe.unwrap().expert_ff, mixtral.intermediate_size);
    assert!(tiny_spec(Architecture::Llama).moe.is_none());
    let bad = SMOL_LIKE
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"mixtral\"")
        .replace(
            "\"hidden_act\"",
            "\"num_local_experts\": 2, \"num_experts_per_tok\": 3, \"hidden_act\"",
        );
    assert!(matches!(
        ModelSpec::from_hf_config(&bad),
        Err(ModelError::Config(_))
    ));
}

#[test]
fn transformers5_rope_parameters_and_qwen3_moe_expert_count() {
    // transformers 5 folds `rope_theta` and `rope_scaling` into `rope_parameters` and writes
    // Qwen3-MoE's expert count as `num_local_experts`.
    let json = SMOL_LIKE
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"qwen3_moe\"")
        .replace(
            "\"rope_theta\": 100000.0",
            "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}",
        )
        .replace(
            "\"hidden_act\"",
            "\"num_local_experts\": 16, \"num_experts_per_tok\": 2,
             \"moe_intermediate_size\": 64, \"hidden_act\"",
        );
    let spec = ModelSpec::from_hf_config(&json).unwrap();
    assert_eq!(spec.rope_theta, 1_000_000.0);
    assert_eq!(spec.moe.unwrap().n_experts, 16);

    let llama3 = SMOL_LIKE.replace(
        "\"rope_theta\": 100000.0",
        "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0,
         \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,
         \"original_max_position_embeddings\": 8192}",
    );
    let spec = ModelSpec::from_hf_config(&llama3).unwrap();
    assert_eq!(spec.rope_theta, 500_000.0);
    assert_eq!(spec.rope_scaling.unwrap().factor, 8.0);

    // Gemma 3: one object per layer type.
    let gemma = SMOL_LIKE
        .replace("\"model_type\": \"llama\"", "\"model_type\": \"gemma3_text\"")
        .replace("\"silu\"", "\"gelu_pytorch_tanh\"")
        .replace(
            "\"rope_theta\": 100000.0",
            "\"sliding_window\": 512, \"sliding_window_pattern\": 6,
             \"rope_parameters\": {
                \"full_attention\": {\"rope_type\": \"linear\", \"factor\": 8.0, \"rope_theta\": 1000000.0},
                \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}",
        );
    let spec = ModelSpec::from_hf_config(&gemma).unwrap();
    assert_eq!(spec.rope_theta, 1_000_000.0);
    assert_eq!(spec.rope_local_theta, Some(10_000.0));
    assert_eq!(spec.rope_linear_factor, Some(8.0));
}

#[test]
fn gguf_only_families_are_refused_from_a_config_json() {
    for model_type in ["gpt-oss", "qwen2moe", "glm4moe", "glm4_moe"] {
        let json = SMOL_LIKE.replace(
            "\"model_type\": \"llama\"",
            &format!("\"model_type\": \"{model_type}\""),
        );
        let err = ModelSpec::from_hf_config(&json).unwrap_err().to_string();
        assert!(err.contains("GGUF"), "{model_type}: {err}");
    }
}

#[test]
fn imrope_sections_are_taken_where_every_rotated_pair_takes_the_text_position() {
    // Qwen3.5's [11, 11, 10, 0] over 32 pairs (64 of 256 head dims rotated).
    assert!(imrope_is_plain(&[11, 11, 10, 0], 32).is_ok());
    assert!(imrope_is_plain(&[2, 1, 1, 0], 4).is_ok());
    assert!(imrope_is_plain(&[], 4).is_ok());
    // A fourth section's pair would take position 0 for text (llama.cpp's fourth position).
    assert!(imrope_is_plain(&[1, 1, 1, 1], 4).is_err());
    // Sector 3 (3 % 3 == 0) is past 3 x 1 for the first section: the fourth position.
    assert!(imrope_is_plain(&[1, 2, 1, 0], 4).is_err());
}
