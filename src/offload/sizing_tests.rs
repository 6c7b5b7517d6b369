//! Tests for model sizing: the real SmolLM2 GGUF, safetensors headers written by candle, and the
//! KV / workspace formulas.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use super::*;

fn test_model() -> PathBuf {
    let path = std::env::var_os("FERRY_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.exists(),
        "test model {} is missing: run scripts/fetch-model.sh (or set FERRY_TEST_MODEL)",
        path.display()
    );
    path
}

#[test]
fn sizes_the_real_gguf_from_its_header() {
    let path = test_model();
    let started = Instant::now();
    let content = read_gguf_header(&path).expect("header");
    let sizes = size_gguf_content(&content, None).expect("sizes");
    let dims = dims_from_gguf(&content).expect("dims");
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");

    assert_eq!(sizes.n_layers(), 30);
    assert_eq!(sizes.tensor_count, content.tensor_infos.len());
    // SmolLM2 ties its head to the embeddings: no output.weight, the matrix counted once.
    assert!(sizes.tied_embeddings);
    assert!(!content.tensor_infos.contains_key("output.weight"));

    // Every layer of this model has the same tensors, hence the same bytes.
    assert!(
        sizes.layers.iter().all(|&b| b == sizes.layers[0]),
        "{sizes:?}"
    );

    // Layers + fixed == every tensor's bytes, and those bytes fill the file's data section
    // up to alignment padding (an independent check of the per-tensor formula).
    let mut extents: Vec<(u64, u64)> = content
        .tensor_infos
        .values()
        .map(|info| {
            let bytes = gguf_tensor_bytes(info.ggml_dtype, info.shape.elem_count());
            (info.offset, bytes)
        })
        .collect();
    let all: u64 = extents.iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(sizes.layer_total() + sizes.fixed, all);
    assert_eq!(sizes.total(), all);
    extents.sort();
    for pair in extents.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "tensors overlap: {pair:?}"
        );
    }
    let data = std::fs::metadata(&path).expect("stat").len() - content.tensor_data_offset;
    let (last_offset, last_bytes) = extents.last().copied().expect("tensors");
    assert!(last_offset + last_bytes <= data);
    let padding = data - all;
    assert!(
        padding <= 32 * extents.len() as u64,
        "{padding} bytes of the data section are not tensors"
    );

    // Dequantized to f32 every tensor takes 4 bytes per element.
    let dense = size_gguf_content(&content, Some(DenseDtype::F32)).expect("dense sizes");
    let elems: u64 = content
        .tensor_infos
        .values()
        .map(|info| info.shape.elem_count() as u64)
        .sum();
    assert_eq!(dense.total(), 4 * elems);
    assert!(
        dense.layers[0] > 6 * sizes.layers[0],
        "Q4_1 is ~5 bits a weight"
    );

    let expected = ModelDims {
        architecture: "llama".into(),
        n_layers: 30,
        hidden_size: 576,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        vocab_size: 49152,
        context_length: Some(8192),
    };
    assert_eq!(dims, expected);

    let summary = summarize(&ModelFiles::Gguf { path }, None).expect("summary");
    assert_eq!(summary.sizes, sizes);
}

fn tensor(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &Device::Cpu).expect("zeros")
}

#[test]
fn sizes_safetensors_shards_from_their_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shard1 = dir.path().join("model-00001-of-00002.safetensors");
    let shard2 = dir.path().join("model-00002-of-00002.safetensors");
    let first = HashMap::from([
        ("model.embed_tokens.weight", tensor(&[16, 8], DType::F32)), // 512 B
        (
            "model.layers.0.self_attn.q_proj.weight",
            tensor(&[8, 8], DType::BF16),
        ), // 128 B
        (
            "model.layers.0.input_layernorm.weight",
            tensor(&[8], DType::F32),
        ), // 32 B
    ]);
    let second = HashMap::from([
        (
            "model.layers.1.self_attn.q_proj.weight",
            tensor(&[8, 8], DType::BF16),
        ), // 128 B
        (
            "model.layers.1.input_layernorm.weight",
            tensor(&[8], DType::F32),
        ), // 32 B
        ("model.layers.1.positions", tensor(&[4], DType::U32)), // 16 B, not a float
        ("model.norm.weight", tensor(&[8], DType::F32)),        // 32 B
        ("lm_head.weight", tensor(&[16, 8], DType::F16)),       // 256 B
    ]);
    candle_core::safetensors::save(&first, &shard1).expect("save");
    candle_core::safetensors::save(&second, &shard2).expect("save");

    let header = read_safetensors_header(&shard2).expect("header");
    assert_eq!(header.len(), 5);
    let head = &header["lm_head.weight"];
    assert_eq!(
        (head.dtype.as_str(), head.shape.as_slice()),
        ("F16", &[16, 8][..])
    );
    assert_eq!(head.data_offsets[1] - head.data_offsets[0], 256);

    let shards = vec![shard1.clone(), shard2.clone()];
    let sizes = size_safetensors(&shards, None).expect("sizes");
    assert_eq!(sizes.layers, vec![160, 176]);
    assert_eq!(sizes.fixed, 512 + 32 + 256);
    assert!(!sizes.tied_embeddings);
    assert_eq!(sizes.tensor_count, 8);

    // Converted to bf16, floats take 2 bytes an element; the u32 tensor keeps its 16 bytes.
    let bf16 = size_safetensors(&shards, Some(DenseDtype::BF16)).expect("sizes");
    assert_eq!(bf16.layers, vec![144, 160]);
    assert_eq!(bf16.fixed, (128 + 8 + 128) * 2);

    // Without lm_head the embeddings are tied and counted once.
    let tied = size_safetensors(&shards[..1], None).expect("sizes");
    assert!(tied.tied_embeddings);
    assert_eq!((tied.layers.clone(), tied.fixed), (vec![160], 512));

    // A gap in the layer numbering is an error, not a silently short model.
    let gap = dir.path().join("gap.safetensors");
    let gapped = HashMap::from([
        ("model.layers.0.w", tensor(&[2], DType::F32)),
        ("model.layers.2.w", tensor(&[2], DType::F32)),
    ]);
    candle_core::safetensors::save(&gapped, &gap).expect("save");
    let error = size_safetensors(&[gap], None).expect_err("gap").to_string();
    assert!(error.contains("decoder layer 1 has no tensors"), "{error}");
}

#[test]
fn rejects_malformed_safetensors_headers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("short", vec![1, 2, 3], "no header length"),
        ("huge", u64::MAX.to_le_bytes().to_vec(), "implausibly large"),
        (
            "truncated",
            [&100u64.to_le_bytes()[..], b"{}"].concat(),
            "shorter than",
        ),
        (
            "not json",
            [&3u64.to_le_bytes()[..], b"abc"].concat(),
            "not JSON",
        ),
    ];
    for (name, bytes, expect) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        let error = read_safetensors_header(&path).expect_err(name).to_string();
        assert!(error.contains(expect), "{name}: {error}");
    }
    let reversed = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#;
    let path = dir.path().join("reversed");
    std::fs::write(
        &path,
        [&(reversed.len() as u64).to_le_bytes()[..], reversed].concat(),
    )
    .expect("write");
    let error = read_safetensors_header(&path)
        .expect_err("reversed")
        .to_string();
    assert!(error.contains("reversed data offsets"), "{error}");
}

#[test]
fn reads_dims_from_config_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        r#"{"model_type":"qwen2","num_hidden_layers":24,"hidden_size":896,
            "num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,
            "max_position_embeddings":32768}"#,
    )
    .expect("write");
    let dims = dims_from_config_json(&path).expect("dims");
    assert_eq!(
        dims,
        ModelDims {
            architecture: "qwen2".into(),
            n_layers: 24,
            hidden_size: 896,
            n_heads: 14,
            n_kv_heads: 2,
            head_dim: 64,
            vocab_size: 151936,
            context_length: Some(32768),
        }
    );
    std::fs::write(&path, r#"{"hidden_size":896}"#).expect("write");
    let error = dims_from_config_json(&path)
        .expect_err("incomplete")
        .to_string();
    assert!(error.contains("num_attention_heads"), "{error}");
}

#[test]
fn kv_and_workspace_formulas() {
    // SmolLM2-135M: 3 KV heads of 64 dims in f16 = 768 bytes per token per layer.
    assert_eq!(kv_bytes_per_token_per_layer(3, 64, 2), 768);
    // Llama-3-8B: 8 KV heads of 128 in bf16 = 4 KiB.
    assert_eq!(kv_bytes_per_token_per_layer(8, 128, 2), 4096);

    let input = WorkspaceInput {
        hidden_size: 576,
        vocab_size: 49152,
        n_heads: 9,
        max_batch: 8,
        prefill_chunk: 512,
        max_context: 2048,
    };
    let activations = 512 * 576 * 16 * 4;
    let scores = 2 * 9 * 512 * 2048 * 4;
    let logits = 2 * 8 * 49152 * 4;
    assert_eq!(workspace_bytes(&input), activations + scores + logits);
    // Decode batches larger than the prefill chunk size the activations instead.
    let wide = WorkspaceInput {
        max_batch: 1024,
        ..input
    };
    assert!(workspace_bytes(&wide) > workspace_bytes(&input));
    assert_eq!(DenseDtype::from_choice(DtypeChoice::Auto), None);
    assert_eq!(
        DenseDtype::from_choice(DtypeChoice::BF16).map(DenseDtype::size_in_bytes),
        Some(2)
    );
}

#[test]
fn plans_the_real_model_end_to_end() {
    use crate::config::OffloadMode;
    use crate::offload::plan::{plan, Home, PlanInput, DEFAULT_LINK_BANDWIDTH};
    use crate::offload::render::render_text;

    let summary = summarize(&ModelFiles::Gguf { path: test_model() }, None).expect("summary");
    let (sizes, dims) = (summary.sizes, summary.dims);
    let mut input = PlanInput::new(OffloadMode::Auto, sizes.layers.clone(), sizes.fixed, 0);
    input.max_batch = 4;
    input.max_context = 2048;
    input.kv_bytes_per_token_per_layer =
        kv_bytes_per_token_per_layer(dims.n_kv_heads, dims.head_dim, 2);
    input.workspace_bytes = workspace_bytes(&WorkspaceInput {
        hidden_size: dims.hidden_size,
        vocab_size: dims.vocab_size,
        n_heads: dims.n_heads,
        max_batch: 4,
        prefill_chunk: 256,
        max_context: 2048,
    });
    input.link_bandwidth = Some(DEFAULT_LINK_BANDWIDTH);
    // A budget for everything but the last ten layers (and the ring of three slots).
    let layer = sizes.layers[0];
    input.budget_bytes =
        input.fixed_bytes + input.kv_bytes() + input.workspace_bytes + 20 * layer + 3 * layer;
    let plan = plan(&input).expect("fits");
    println!("{}", render_text(&plan));
    assert_eq!(plan.device_layers(), 20);
    assert!(plan.layers[20..].iter().all(|l| l.home == Home::Host));
    assert_eq!(plan.device_bytes, input.budget_bytes);
    assert_eq!(plan.host_bytes, 10 * layer);
    let rate = plan.estimated_decode_tokens_per_s.expect("streams");
    assert!((rate - 16e9 / (10 * layer) as f64).abs() < 1e-6);
}
