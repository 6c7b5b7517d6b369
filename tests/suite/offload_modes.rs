//! The offload engine on the real SmolLM2 GGUF, on the CPU device: every mode and prefetch depth
//! decodes the same greedy tokens as mode `none`, for the quantized model and for the model
//! dequantized to f32; the device accounting stays within the plan; the slot ring has at most
//! `prefetch + 1` slots; `none` over budget fails with advice; the host store holds the offloaded
//! bytes and barely more.

use crate::real_model;
use real_model::model_path;

use candle_core::Device;
use ferry::config::{
    DeviceChoice, DeviceConfig, DtypeChoice, MemoryBudget, ModelConfig, OffloadMode,
};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::decoder::LayerSource;
use ferry::model::loader::{Holding, LoadOptions};
use ferry::model::source::{HubOptions, ModelFiles};
use ferry::offload::buffer::HostMemory;
use ferry::offload::plan::Plan;
use ferry::offload::sizing::ModelSizes;
use ferry::offload::{HostStore, SlotKind};
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::load_for_serving_on;
use ferry::runtime::planning::plan_model;

const PROMPT: &str = "The capital of France is";
const NEW_TOKENS: usize = 12;

fn config(
    dtype: DtypeChoice,
    mode: OffloadMode,
    budget: MemoryBudget,
    prefetch: usize,
) -> ModelConfig {
    let source = model_path().to_string_lossy().into_owned();
    config_from(source, 256, dtype, mode, budget, prefetch)
}

/// [`real_model::offloaded`] for the model at `source`.
fn config_from(
    source: String,
    max_context: usize,
    dtype: DtypeChoice,
    mode: OffloadMode,
    budget: MemoryBudget,
    prefetch: usize,
) -> ModelConfig {
    let mut config = real_model::offloaded(dtype, mode);
    config.source = source;
    config.max_context = Some(max_context);
    config.offload.gpu_memory = budget;
    config.offload.prefetch = prefetch;
    // These tests are about whole-layer streaming (mixtures of experts too);
    // tests/suite/expert_offload.rs covers `offload.experts`.
    config.tier.experts = false;
    config
}

pub(crate) fn device_config() -> DeviceConfig {
    DeviceConfig {
        kind: DeviceChoice::Cpu,
        link_bandwidth: None,
        ..DeviceConfig::default()
    }
}

pub(crate) fn hub() -> HubOptions {
    HubOptions::from_env(|_| None)
}

/// Plenty: every mode fits.
const BIG: MemoryBudget = MemoryBudget::Bytes(64 << 30);

pub(crate) fn plan_for(config: &ModelConfig) -> Plan {
    plan_model(config, &device_config(), &Device::Cpu, &hub(), 64 << 30).expect("plan")
}

/// The greedy pick of one step's logits (the last of equal maxima, as `max_by` keeps).
pub(crate) fn top_token(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .expect("non-empty logits")
}

/// Greedy decode of `NEW_TOKENS` after `PROMPT`.
fn greedy(runner: &mut ModelRunner, prompt: &[u32]) -> Vec<u32> {
    let mut seq = runner.new_sequence();
    let mut logits = runner.forward(&mut seq, prompt).expect("prefill");
    let mut out = Vec::new();
    for _ in 0..NEW_TOKENS {
        let next = top_token(&logits);
        out.push(next);
        logits = runner.forward(&mut seq, &[next]).expect("decode");
    }
    out
}

/// The budget with which mode `auto` keeps exactly `k` layers resident (given `prefetch`).
pub(crate) fn budget_for(none: &Plan, k: usize, prefetch: usize) -> u64 {
    let layers: Vec<u64> = none.layers.iter().map(|l| l.bytes).collect();
    let base = none.device_bytes - layers.iter().sum::<u64>();
    let streamed = layers.len() - k;
    let slot = layers[k..].iter().copied().max().unwrap_or(0);
    let slots = (prefetch + 1).min(streamed) as u64;
    base + layers[..k].iter().sum::<u64>() + slots * slot
}

/// Loads `config`, decodes, and checks the accounting and ring against its plan.
fn run(config: &ModelConfig, prompt: &[u32]) -> (Vec<u32>, usize, usize) {
    let plan = plan_for(config);
    let loaded = load_for_serving_on(config, &device_config(), &Device::Cpu, &hub())
        .unwrap_or_else(|e| panic!("load {:?}: {e}", config.offload));
    let mut runner = loaded.runner;
    let tokens = greedy(&mut runner, prompt);
    let store = runner.store();
    let (resident, slots) = (store.resident_layers(), store.slots());
    let acc = runner.accounting();
    let what = format!("{:?} {:?}", config.dtype, config.offload);
    assert_eq!(acc.check_within_plan(), Ok(()), "{what}: {acc:?}");
    assert!(acc.device_bytes() <= plan.device_bytes, "{what}");
    assert_eq!(resident, plan.device_layers(), "{what}");
    assert_eq!(slots, plan.slots, "{what}");
    assert!(
        slots <= config.offload.prefetch + 1,
        "{what}: {slots} slots"
    );
    assert!(acc.max_slots_busy <= slots as u64, "{what}: {acc:?}");
    // A store that may wait on a copy is never asked for layers on a pool thread; one that
    // holds every layer (and no expert store) runs each step whole on the pool.
    let expected_never_waits = plan.host_layers() == 0 && store.experts().is_none();
    assert_eq!(store.never_waits(), expected_never_waits, "{what}");
    if plan.host_layers() > 0 {
        // Every streamed layer is copied once per forward pass (prefill + decode steps).
        let passes = NEW_TOKENS as u64 + 1;
        assert!(
            acc.copies >= passes * plan.host_layers() as u64,
            "{what}: {} copies",
            acc.copies
        );
        assert!(
            acc.bytes_copied >= passes * plan.streamed_bytes_per_step,
            "{what}"
        );
    } else {
        assert_eq!(acc.copies, 0, "{what}");
    }
    (tokens, resident, slots)
}

fn check_modes(
    dtype: DtypeChoice,
    auto_cases: &[(Resident, usize)],
    sequential_prefetch: &[usize],
) {
    let source = model_path().to_string_lossy().into_owned();
    check_modes_of(
        &source,
        256,
        None,
        0,
        dtype,
        auto_cases,
        sequential_prefetch,
    );
}

/// Every mode of `auto_cases` and `sequential_prefetch` decodes what mode `none` decodes, for
/// the model at `source` and `prompt` (default: [`PROMPT`] through the model's tokenizer).
/// `slack` bytes are added to each `auto` budget (room for a tiny model's slot padding).
fn check_modes_of(
    source: &str,
    max_context: usize,
    prompt: Option<&[u32]>,
    slack: u64,
    dtype: DtypeChoice,
    auto_cases: &[(Resident, usize)],
    sequential_prefetch: &[usize],
) {
    let config = |mode, budget, prefetch| {
        config_from(source.into(), max_context, dtype, mode, budget, prefetch)
    };
    let none_config = config(OffloadMode::None, BIG, 0);
    let none_plan = plan_for(&none_config);
    let n = none_plan.layers.len();
    let loaded = load_for_serving_on(&none_config, &device_config(), &Device::Cpu, &hub())
        .expect("mode none loads");
    let prompt = match prompt {
        Some(ids) => ids.to_vec(),
        None => loaded.codec.encode(PROMPT, true).expect("encode"),
    };
    let mut runner = loaded.runner;
    let reference = greedy(&mut runner, &prompt);
    assert_eq!(runner.store().resident_layers(), n);
    assert_eq!(runner.accounting().check_within_plan(), Ok(()));
    drop(runner);

    // (layers resident, prefetch): most, half and some layers resident (a few, half, most
    // offloaded), then sequential.
    for &(k, prefetch) in auto_cases {
        let k = k.resolve(n);
        let budget = MemoryBudget::Bytes(budget_for(&none_plan, k, prefetch) + slack);
        let cfg = config(OffloadMode::Auto, budget, prefetch);
        let (tokens, resident, _) = run(&cfg, &prompt);
        assert_eq!(resident, k, "auto prefetch {prefetch}");
        assert_eq!(
            tokens, reference,
            "auto with {k} resident, prefetch {prefetch}"
        );
    }
    for &prefetch in sequential_prefetch {
        let cfg = config(OffloadMode::Sequential, BIG, prefetch);
        let (tokens, resident, slots) = run(&cfg, &prompt);
        assert_eq!(resident, 0);
        assert_eq!(slots, prefetch + 1);
        assert_eq!(tokens, reference, "sequential, prefetch {prefetch}");
    }
}

/// How many layers `auto` keeps resident in a case.
#[derive(Debug, Clone, Copy)]
enum Resident {
    /// All but five.
    Most,
    /// Half.
    Half,
    /// Three.
    Some,
    /// Exactly this many.
    Exactly(usize),
}

impl Resident {
    fn resolve(self, n: usize) -> usize {
        match self {
            Resident::Most => n - 5,
            Resident::Half => n / 2,
            Resident::Some => 3,
            Resident::Exactly(k) => k,
        }
    }
}

#[test]
fn quantized_modes_decode_like_none() {
    let mut cases = Vec::new();
    for prefetch in [0, 1, 2] {
        for resident in [Resident::Most, Resident::Half, Resident::Some] {
            cases.push((resident, prefetch));
        }
    }
    check_modes(DtypeChoice::Auto, &cases, &[0, 1, 2]);
}

#[test]
fn dequantized_f32_modes_decode_like_none() {
    // Dense loads are slower (the whole model is dequantized): one budget per prefetch depth.
    let cases = [
        (Resident::Most, 0),
        (Resident::Half, 1),
        (Resident::Some, 2),
    ];
    check_modes(DtypeChoice::F32, &cases, &[0, 1, 2]);
}

/// The same check on tiny random models of the other families (3 layers, quantized and
/// dequantized): Qwen3's q/k norms, Gemma 3's extra norms and alternating window, Phi-3's fused
/// projections and Qwen3-MoE's experts (each its own slice of the stacked GGUF tensors) all
/// reach their blocks through streamed slots as through resident layers.
#[test]
fn tiny_families_decode_like_none_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    // (With 3 equal layers, k resident and prefetch p fit exactly when k + p + 1 < 3.)
    let cases = [(Resident::Exactly(1), 0), (Resident::Exactly(0), 1)];
    for arch in ["qwen3", "gemma3", "phi3", "qwen3moe"] {
        let path = dir.path().join(format!("{arch}.gguf"));
        crate::tiny::family_gguf(&path, arch, candle_core::quantized::GgmlDType::Q8_0);
        let source = path.to_string_lossy().into_owned();
        let prompt = Some(crate::tiny::PROMPT);
        for dtype in [DtypeChoice::Auto, DtypeChoice::F32] {
            println!("{arch} {dtype:?}");
            // A quarter layer of slack: slot padding fits, another layer does not.
            let layer = plan_for(&config_from(
                source.clone(),
                64,
                dtype,
                OffloadMode::None,
                BIG,
                0,
            ))
            .layers[0]
                .bytes;
            check_modes_of(&source, 64, prompt, layer / 4, dtype, &cases, &[0, 1]);
        }
    }
}

/// Issue 28's families (the llama.cpp-checked fixtures, 2 layers: gpt-oss with MXFP4 and f32
/// experts, Qwen2-MoE; 3 for GLM-4.5 in f32 and Q8_0, its first one dense) and issue 29's
/// Qwen3.5-MoE (4 layers, 3 of them Gated DeltaNet, in f32 and Q8_0) and DeepSeek (`deepseek2`,
/// V2-Lite's layout in f32 and V3's in Q8_0, 3 layers, the first dense) stream whole layers like
/// the others: their sinks, biases, stacked expert biases, correction bias, shared expert,
/// DeltaNet tensors and per-head latent expansions travel in the layer's slot (a recurrent state
/// stays with the sequence). No layer resident (with 2 layers, one resident and a
/// slot is as big as both resident).
#[test]
fn issue_28_moe_families_decode_like_none_in_every_mode() {
    let cases = [(Resident::Exactly(0), 0)];
    for file in [
        "gpt-oss-mxfp4.gguf",
        "gpt-oss.gguf",
        "qwen2moe.gguf",
        "glm4moe.gguf",
        "glm4moe-q8.gguf",
        "qwen35moe.gguf",
        "qwen35moe-q8.gguf",
        "deepseek2.gguf",
        "deepseek2-v3.gguf",
    ] {
        let source = crate::fixtures::path("arch-llamacpp")
            .join(file)
            .to_string_lossy()
            .into_owned();
        let prompt = Some(crate::tiny::PROMPT);
        for dtype in [DtypeChoice::Auto, DtypeChoice::F32] {
            println!("{file} {dtype:?}");
            let layer = plan_for(&config_from(
                source.clone(),
                64,
                dtype,
                OffloadMode::None,
                BIG,
                0,
            ))
            .layers[0]
                .bytes;
            check_modes_of(&source, 64, prompt, layer / 4, dtype, &cases, &[0, 1]);
        }
    }
}

#[test]
fn none_over_budget_fails_with_advice() {
    let cfg = config(
        DtypeChoice::Auto,
        OffloadMode::None,
        MemoryBudget::Bytes(100 << 20),
        1,
    );
    let err = match load_for_serving_on(&cfg, &device_config(), &Device::Cpu, &hub()) {
        Ok(_) => panic!("a 100 MiB budget cannot hold the whole model"),
        Err(err) => err.to_string(),
    };
    assert!(err.contains("needs"), "{err}");
    assert!(err.contains("budget 100.0 MiB"), "{err}");
    assert!(
        err.contains("--offload auto") || err.contains("--offload sequential"),
        "{err}"
    );
}

#[test]
fn auto_with_room_for_everything_streams_nothing() {
    let cfg = config(DtypeChoice::Auto, OffloadMode::Auto, BIG, 2);
    let plan = plan_for(&cfg);
    assert_eq!(plan.host_layers(), 0);
    assert_eq!(plan.slots, 0);
}

#[test]
fn host_store_holds_the_offloaded_bytes_within_two_percent() {
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf { path: model_path() }).expect("opens");
    for dtype in [DtypeChoice::Auto, DtypeChoice::F32] {
        let options = LoadOptions {
            device: Device::Cpu,
            dtype,
        };
        let holding = Holding::new(&checkpoint, &options).expect("holding");
        let sizes = ModelSizes::of(&checkpoint, &holding, SlotKind::Cpu).expect("sizes");
        // Offload all but the first two layers.
        let layers: Vec<usize> = (2..sizes.n_layers()).collect();
        let store =
            HostStore::fill(&checkpoint, &holding, &layers, &HostMemory::Heap).expect("host store");
        let expected: u64 = sizes.layers[2..].iter().sum();
        assert_eq!(store.weight_bytes(), expected, "{dtype:?}");
        let allocated = store.allocated_bytes();
        assert!(allocated >= expected, "{dtype:?}");
        assert!(
            (allocated as f64) <= expected as f64 * 1.02,
            "{dtype:?}: {allocated} host bytes for {expected} offloaded bytes"
        );
        assert_eq!(store.layers().len(), layers.len());
    }
}

/// A CUDA slot holds each expert of a streamed MoE layer in its own buffer (experts share a
/// part, type and shape, so the part alone would put them all in one).
#[test]
fn cuda_slots_give_every_expert_its_own_buffer() {
    use ferry::model::tensors::Part;
    use ferry::offload::{LayerLayout, SlotKind, SlotLayout};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3moe.gguf");
    crate::tiny::family_gguf(&path, "qwen3moe", candle_core::quantized::GgmlDType::Q8_0);
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf { path }).expect("opens");
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let holding = Holding::new(&checkpoint, &options).expect("holding");
    let layers: Vec<LayerLayout> = (0..3)
        .map(|i| LayerLayout::of(&checkpoint, &holding, i).expect("layout"))
        .collect();
    let slot = SlotLayout::of(SlotKind::Cuda, &layers);
    let gates: Vec<_> = layers[1]
        .entries
        .iter()
        .filter(|e| e.part == Part::ExpGate)
        .collect();
    assert_eq!(gates.len(), 4);
    let buffers: Vec<*const ferry::offload::SlotMatrix> = gates
        .iter()
        .map(|e| slot.matrix(e).expect("a buffer") as *const _)
        .collect();
    for (i, b) in buffers.iter().enumerate() {
        assert!(
            !buffers[..i].contains(b),
            "expert {i} shares a buffer: {:?}",
            slot.matrices
        );
    }
    // q, k, v, o, the router and 4 experts x (gate, up, down): one buffer each.
    assert_eq!(slot.matrices.len(), 5 + 12, "{:?}", slot.matrices);
}

/// Layers of IQ4_NL, IQ4_XS and MXFP4 (types candle has no block type for) stream through CPU
/// slots, read in place by ferry's kernels, and decode what mode `none` decodes: the tiny
/// llama.cpp-quantized fixtures (2 layers) in mode `auto` with no layer resident (with 2 layers,
/// one resident and a slot is as big as both resident) and in mode `sequential`.
#[test]
fn iq4_and_mxfp4_layers_stream_like_none() {
    use ferry::model::header::GgufType;
    use ferry::model::loader::TensorKind;
    use ferry::offload::LayerLayout;

    let cases = [(Resident::Exactly(0), 0)];
    for (file, ty) in [
        ("tiny-iq4_nl.gguf", GgufType::IQ4_NL),
        ("tiny-iq4_xs.gguf", GgufType::IQ4_XS),
        ("tiny-mxfp4.gguf", GgufType::MXFP4),
    ] {
        let path = crate::fixtures::path("quant-llamacpp").join(file);
        // The streamed layers really hold blocks of the type (else this tests nothing new).
        let checkpoint = Checkpoint::open(&ModelFiles::Gguf { path: path.clone() }).expect("opens");
        let options = LoadOptions {
            device: Device::Cpu,
            dtype: DtypeChoice::Auto,
        };
        let holding = Holding::new(&checkpoint, &options).expect("holding");
        let layout = LayerLayout::of(&checkpoint, &holding, 1).expect("layout");
        assert!(
            layout
                .entries
                .iter()
                .any(|e| e.kind == TensorKind::Blocks(ty)),
            "{file}: layer 1 holds no {ty} blocks: {:?}",
            layout.entries
        );
        drop(checkpoint);
        println!("{file}");
        let source = path.to_string_lossy().into_owned();
        let layer = plan_for(&config_from(
            source.clone(),
            64,
            DtypeChoice::Auto,
            OffloadMode::None,
            BIG,
            0,
        ))
        .layers[0]
            .bytes;
        let prompt = Some(crate::tiny::PROMPT);
        check_modes_of(
            &source,
            64,
            prompt,
            layer / 4,
            DtypeChoice::Auto,
            &cases,
            &[0, 1],
        );
    }
}
