//! `ferry plan` and the serving loader agree on every model the tests load: the real SmolLM2
//! GGUF, the tiny random GGUF and safetensors checkpoints of the cross-checks, a sharded HF
//! directory, a Q4_K_M-shaped GGUF with mixed types, and files they both must refuse (a tensor
//! type ferry cannot compute, an unknown architecture, a missing tensor, a bad shape, bf16 on
//! the CPU). For an accepted model, the plan's bytes of every decoder layer and of the fixed parts
//! are the bytes the loader holds; a refused one is refused by both with the same reason. The
//! mixed-type model also streams on the CPU with the device accounting within its plan.

use crate::real_model::model_path;
use crate::tiny::{self, config, cpu, Tiny, BIG};

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use ferry::config::{DtypeChoice, OffloadMode};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::loader::{load_model, LoadOptions};
use ferry::model::source::{HubOptions, ModelFiles};
use ferry::offload::plan::Plan;
use ferry::offload::{load_placed, StreamConfig};
use ferry::runtime::planning::{plan_checkpoint, plan_model};

/// The source path of `files` (a GGUF file or an HF directory).
fn source(files: &ModelFiles) -> &Path {
    match files {
        ModelFiles::Gguf { path } => path,
        ModelFiles::HfDir { dir, .. } => dir,
    }
}

/// The plan `ferry plan` prints for `files` (resolved already: the tiny HF directories have no
/// tokenizer, which the source resolver would ask for).
fn ferry_plan(files: &ModelFiles, dtype: DtypeChoice) -> Result<Plan, String> {
    let cfg = config(source(files), dtype, OffloadMode::None);
    let checkpoint = Checkpoint::open(files).map_err(|e| e.to_string())?;
    plan_checkpoint(&cfg, &cpu(), &Device::Cpu, &checkpoint, BIG).map_err(|e| e.to_string())
}

/// Plans `files` the way `ferry plan` does and loads them the way the server's loader does, and
/// checks they agree. Returns the refusal, if both refused.
fn agree(what: &str, files: &ModelFiles, dtype: DtypeChoice, tied: bool) -> Option<String> {
    let plan = ferry_plan(files, dtype);
    let options = LoadOptions {
        device: Device::Cpu,
        dtype,
    };
    let loaded = load_model(files, &options, &mut |_| {});
    match (plan, loaded) {
        (Ok(plan), Ok(loaded)) => {
            assert_eq!(plan.layers.len(), loaded.layers.0.len(), "{what}");
            for (placed, layer) in plan.layers.iter().zip(&loaded.layers.0) {
                assert_eq!(
                    placed.bytes,
                    layer.size_in_bytes() as u64,
                    "{what}: layer {}",
                    placed.index
                );
            }
            assert_eq!(
                plan.fixed_bytes,
                loaded.model.fixed().size_in_bytes(tied) as u64,
                "{what}: fixed parts"
            );
            None
        }
        (Err(planned), Err(loading)) => {
            let loading = loading.to_string();
            assert!(
                planned.contains(&loading),
                "{what}: plan says `{planned}`, the loader `{loading}`"
            );
            Some(loading)
        }
        (Ok(_), Err(e)) => panic!("{what}: ferry plan accepts it, the loader refuses: {e}"),
        (Err(e), Ok(_)) => panic!("{what}: the loader accepts it, ferry plan refuses: {e}"),
    }
}

#[test]
fn plan_and_loader_agree_on_the_real_model() {
    let files = ModelFiles::Gguf { path: model_path() };
    for dtype in [DtypeChoice::Auto, DtypeChoice::F32, DtypeChoice::F16] {
        assert_eq!(agree("smollm2", &files, dtype, true), None, "{dtype:?}");
        // From the source string, as `ferry plan` resolves it: the same plan.
        let cfg = config(&model_path(), dtype, OffloadMode::None);
        let hub = HubOptions::from_env(|_| None);
        let resolved = plan_model(&cfg, &cpu(), &Device::Cpu, &hub, BIG).unwrap();
        assert_eq!(Ok(resolved), ferry_plan(&files, dtype));
    }
    let refused = agree("smollm2 bf16", &files, DtypeChoice::BF16, true).expect("refused");
    assert!(refused.contains("bf16 on the CPU"), "{refused}");
}

#[test]
fn plan_and_loader_agree_on_the_tiny_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::llama();
    let untied = tiny.random_weights(false, true);
    let tied = tiny.random_weights(false, false);
    let biased = tiny.random_weights(true, false);
    let sub = |name: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    };
    let hf: Vec<(&str, ModelFiles, bool)> = vec![
        (
            "llama untied",
            tiny.write_hf(&sub("a"), &tiny.llama_config(false, None), &untied, 1),
            false,
        ),
        (
            "llama tied, llama3 rope, 2 shards",
            tiny.write_hf(
                &sub("b"),
                &tiny.llama_config(
                    true,
                    Some(
                        r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}"#,
                    ),
                ),
                &tied,
                2,
            ),
            true,
        ),
        (
            "qwen2 with biases",
            tiny.write_hf(&sub("c"), &tiny.qwen2_config(false), &biased, 1),
            true,
        ),
        (
            "mistral",
            tiny.write_hf(&sub("d"), &tiny.mistral_config(), &untied, 3),
            false,
        ),
    ];
    for (what, files, is_tied) in &hf {
        for dtype in [DtypeChoice::Auto, DtypeChoice::F16] {
            assert_eq!(
                agree(what, files, dtype, *is_tied),
                None,
                "{what} {dtype:?}"
            );
        }
    }
    for (what, arch, weights, dtype, permute, is_tied) in [
        ("llama q4_1", "llama", &untied, GgmlDType::Q4_1, true, false),
        ("llama f32", "llama", &tied, GgmlDType::F32, true, true),
        ("qwen2 f32", "qwen2", &biased, GgmlDType::F32, false, true),
    ] {
        let path = dir.path().join(format!("{}.gguf", what.replace(' ', "-")));
        tiny.write_gguf(&path, arch, weights, dtype, permute);
        let files = ModelFiles::Gguf { path };
        for choice in [DtypeChoice::Auto, DtypeChoice::F32] {
            assert_eq!(
                agree(what, &files, choice, is_tied),
                None,
                "{what} {choice:?}"
            );
        }
    }
}

/// Q4_K_M's choice of types on a tiny model of k-quant-friendly width: q6_K for attn_v and
/// ffn_down of the first and last layers and for the head, q4_K for every other matrix.
fn q4_k_m(name: &str) -> GgmlDType {
    let sensitive = name.contains("attn_v") || name.contains("ffn_down");
    let more_bits = name.starts_with("blk.0.") || name.starts_with("blk.3.");
    if (sensitive && more_bits) || name == "output.weight" {
        GgmlDType::Q6K
    } else {
        GgmlDType::Q4K
    }
}

fn wide_tiny() -> Tiny {
    Tiny {
        hidden: 256,
        inter: 512,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 256,
        ..Tiny::llama()
    }
}

#[test]
fn a_mixed_type_gguf_is_planned_as_loaded_and_streams_within_its_plan() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = wide_tiny();
    let weights = tiny.random_weights(false, true);
    let path = dir.path().join("q4_k_m.gguf");
    tiny.write_gguf_typed(&path, "llama", &weights, &q4_k_m, true);
    let files = ModelFiles::Gguf { path: path.clone() };
    assert_eq!(agree("q4_k_m", &files, DtypeChoice::Auto, false), None);

    // Stream every layer through two CPU slots and decode: the device accounting never exceeds
    // the plan, and the logits are the resident model's.
    let checkpoint = Checkpoint::open(&files).unwrap();
    let cfg = config(&path, DtypeChoice::Auto, OffloadMode::Sequential);
    let plan = plan_checkpoint(&cfg, &cpu(), &Device::Cpu, &checkpoint, BIG).unwrap();
    assert_eq!((plan.host_layers(), plan.slots), (4, 2));
    let slot = plan.slot_layout.as_ref().expect("a slot layout");
    assert_eq!(slot.total_bytes(), plan.slot_bytes);
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let stream = StreamConfig {
        prefetch: 1,
        link_bandwidth: None,
    };
    let mut placed = load_placed(&checkpoint, &options, &plan, stream, &mut |_| {}).unwrap();
    let mut cache = placed.model.new_cache();
    let streamed = placed
        .model
        .forward(tiny::PROMPT, &mut cache, &mut placed.store)
        .unwrap();
    let snapshot = placed.store.accounting().snapshot();
    assert!(snapshot.copies >= 4, "{snapshot:?}");
    snapshot.check_within_plan().unwrap();
    assert_eq!(snapshot.slots, 2 * plan.slot_bytes);

    let mut resident = load_model(&files, &options, &mut |_| {}).unwrap();
    let mut cache = resident.model.new_cache();
    let expected = resident
        .model
        .forward(tiny::PROMPT, &mut cache, &mut resident.layers)
        .unwrap();
    let diff = tiny::max_abs_diff(
        &streamed.to_vec1::<f32>().unwrap(),
        &expected.to_vec1::<f32>().unwrap(),
    );
    assert_eq!(diff, 0.0);
}

/// Rewrites the GGUF type id of tensor `name` in the file at `path` (same block layout, so the
/// file stays well-formed).
fn retype_tensor(path: &Path, name: &str, id: u32) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor info");
    let dims_at = at + needle.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let type_at = dims_at + 4 + 8 * n_dims;
    bytes[type_at..type_at + 4].copy_from_slice(&id.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn plan_and_loader_refuse_the_same_files() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::llama();
    let weights = tiny.random_weights(false, false);

    // IQ4_NL has Q4_0's block layout (32 elements in 18 bytes) and no kernel in candle 0.11.1;
    // ferry's own kernels and dequantizer take it, kept as blocks or made dense.
    let iq4 = dir.path().join("iq4_nl.gguf");
    tiny.write_gguf(&iq4, "llama", &weights, GgmlDType::Q4_0, true);
    retype_tensor(&iq4, "blk.1.ffn_down.weight", 20);
    let files = ModelFiles::Gguf { path: iq4 };
    assert_eq!(agree("iq4_nl", &files, DtypeChoice::Auto, true), None);
    assert_eq!(agree("iq4_nl f32", &files, DtypeChoice::F32, true), None);
    // MXFP4 (32 elements in 17 bytes: odd-sized blocks, rows at any byte offset) likewise.
    let mxfp4 = dir.path().join("mxfp4.gguf");
    tiny.write_gguf(&mxfp4, "llama", &weights, GgmlDType::Q4_0, true);
    retype_tensor(&mxfp4, "blk.2.attn_q.weight", 39);
    let files = ModelFiles::Gguf { path: mxfp4 };
    assert_eq!(agree("mxfp4", &files, DtypeChoice::Auto, true), None);
    assert_eq!(agree("mxfp4 f32", &files, DtypeChoice::F32, true), None);
    // IQ2_XXS (256 elements in 66 bytes) has no kernel or decoder in ferry or candle: refused
    // by both, kept quantized or made dense.
    let iq2 = dir.path().join("iq2_xxs.gguf");
    tiny.write_gguf(&iq2, "llama", &weights, GgmlDType::Q4_0, true);
    retype_tensor(&iq2, "blk.1.ffn_down.weight", 16);
    let files = ModelFiles::Gguf { path: iq2 };
    let refused = agree("iq2_xxs", &files, DtypeChoice::Auto, true).expect("refused");
    assert!(
        refused.contains("`blk.1.ffn_down.weight` is stored as IQ2_XXS"),
        "{refused}"
    );
    assert!(agree("iq2_xxs f32", &files, DtypeChoice::F32, true).is_some());

    let phi = dir.path().join("phi.gguf");
    tiny.write_gguf(&phi, "phi2", &weights, GgmlDType::F32, false);
    let refused = agree(
        "phi2",
        &ModelFiles::Gguf { path: phi },
        DtypeChoice::Auto,
        true,
    )
    .expect("refused");
    assert!(refused.contains("architecture `phi2`"), "{refused}");
    // A supported family whose file lacks that family's tensors (Phi-3 without its fused
    // projections) is refused by both, naming the first missing one.
    let phi3 = dir.path().join("phi3.gguf");
    tiny.write_gguf(&phi3, "phi3", &weights, GgmlDType::F32, false);
    let refused = agree(
        "phi3",
        &ModelFiles::Gguf { path: phi3 },
        DtypeChoice::Auto,
        true,
    )
    .expect("refused");
    assert!(
        refused.contains("missing tensor `blk.0.attn_qkv.weight`"),
        "{refused}"
    );

    let missing_dir = dir.path().join("missing");
    std::fs::create_dir_all(&missing_dir).unwrap();
    let mut partial: HashMap<String, Tensor> = weights.clone();
    partial.remove("model.layers.2.mlp.gate_proj.weight");
    let files = tiny.write_hf(&missing_dir, &tiny.llama_config(true, None), &partial, 1);
    let refused = agree("missing", &files, DtypeChoice::Auto, true).expect("refused");
    assert!(
        refused.contains("missing tensor `model.layers.2.mlp.gate_proj.weight`"),
        "{refused}"
    );

    let shape_dir = dir.path().join("shape");
    std::fs::create_dir_all(&shape_dir).unwrap();
    let config = tiny
        .llama_config(true, None)
        .replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
    let files = tiny.write_hf(&shape_dir, &config, &weights, 1);
    let refused = agree("bad shape", &files, DtypeChoice::Auto, true).expect("refused");
    assert!(
        refused.contains("has shape [128, 64], expected [96, 64]"),
        "{refused}"
    );
}
