//! The host tier of offloaded dense layers (issue 13, item 3), on the CPU device: an offloaded
//! layer computed where its slab lies decodes the same greedy tokens as mode `none`, for
//! `offload.tier` = host, stream and auto (a cost model that puts one row on the host and two
//! or more on the device, so prefill streams and batch-1 decode does not), prefetch 0, 1 and 2,
//! batch 1 and 4, on SmolLM2 (half its layers offloaded) and on the tiny families; the device
//! accounting stays within the plan; a host-tier layer costs no copy (the copy counters stand
//! still while every offloaded layer runs on the host) and every layer-step decision is counted
//! in the tier metrics.

use std::path::Path;

use candle_core::Device;
use ferry::config::{DtypeChoice, MemoryBudget, ModelConfig, OffloadMode, TierChoice};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::loader::{Holding, LoadOptions};
use ferry::model::source::ModelFiles;
use ferry::offload::tier_report::{unit_kinds, Offloaded};
use ferry::offload::{CostModel, LayerLayout, LayerTiers, Tier, UnitWork};
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::load_for_serving_on;

use crate::offload_modes::{budget_for, device_config, hub, plan_for, top_token};
use crate::real_model::offloaded;

const NEW_TOKENS: usize = 8;

/// Prompts of a batch (different lengths, so prefill rows differ per sequence).
const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Water boils at",
    "One, two, three,",
    "The best way to learn a language is to",
];

/// Greedy decode of `NEW_TOKENS` for each prompt, all prompts in one batch (prefill in one
/// step, then one decode step per token for all of them). Returns the tokens and the copy
/// counters `(copies, bytes)` after the first decode step.
fn greedy_batch(runner: &mut ModelRunner, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, (u64, u64)) {
    let mut seqs: Vec<_> = prompts.iter().map(|_| runner.new_sequence()).collect();
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    let mut out = vec![Vec::new(); prompts.len()];
    let mut after_first = (0, 0);
    for step in 0..=NEW_TOKENS {
        let mut batch: Vec<(&mut _, &[u32])> = seqs
            .iter_mut()
            .zip(&inputs)
            .map(|(s, t)| (s, t.as_slice()))
            .collect();
        let logits = runner.forward_batch(&mut batch).expect("step");
        if step == 1 {
            let acc = runner.accounting();
            after_first = (acc.copies, acc.bytes_copied);
        }
        if step == NEW_TOKENS {
            break;
        }
        for (i, row) in logits.iter().enumerate() {
            let next = top_token(row);
            out[i].push(next);
            inputs[i] = vec![next];
        }
    }
    (out, after_first)
}

/// The work of offloaded layer `index` of the model at `config.source`, as the store computes
/// it (the cost model's input).
fn layer_work(config: &ModelConfig, index: usize) -> UnitWork {
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf {
        path: config.source.clone().into(),
    })
    .expect("opens");
    let holding = Holding::new(
        &checkpoint,
        &LoadOptions {
            device: Device::Cpu,
            dtype: config.dtype,
        },
    )
    .expect("holding");
    let layout = LayerLayout::of(&checkpoint, &holding, index).expect("layout");
    let spec = checkpoint.spec();
    unit_kinds(
        &layout,
        Offloaded::Layers(1),
        spec.moe.as_ref(),
        spec.hidden_size,
        1,
    )
    .into_iter()
    .find(|k| k.name == "layer")
    .expect("a layer unit")
    .work
}

/// A cost model under which one row of `work` runs on the host and two or more stream: a copy
/// takes 1 s, a host row 0.6 s, the device and the host's memory are as fast as can be.
fn one_row_on_host(work: &UnitWork) -> CostModel {
    let cost = CostModel {
        link_bytes_per_s: work.weight_bytes as f64,
        host_flops_per_s: work.flops_per_row / 0.6,
        host_read_bytes_per_s: f64::MAX,
        device_flops_per_s: f64::MAX,
        forced: None,
        activation_bytes_per_s: None,
    };
    assert_eq!(cost.choose(work, 1), Tier::Host);
    assert_eq!(cost.choose(work, 2), Tier::Stream);
    assert_eq!(cost.choose(work, 4), Tier::Stream);
    cost
}

/// How one run's tiers were chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Stream,
    Host,
    /// `auto` with [`one_row_on_host`].
    Auto,
}

/// Loads `config` (offloading `host_layers` layers), sets the tier of `case`, decodes
/// `prompts` in one batch and checks the accounting; returns the tokens.
fn run(
    config: &ModelConfig,
    case: Case,
    prompts: &[Vec<u32>],
    host_layers: usize,
) -> Vec<Vec<u32>> {
    let mut config = config.clone();
    config.tier.choice = match case {
        Case::Stream => TierChoice::Stream,
        Case::Host => TierChoice::Host,
        Case::Auto => TierChoice::Auto,
    };
    let plan = plan_for(&config);
    assert_eq!(
        plan.host_layers(),
        host_layers,
        "{case:?} {:?}: {plan:?}",
        config.offload
    );
    let loaded = load_for_serving_on(&config, &device_config(), &Device::Cpu, &hub())
        .unwrap_or_else(|e| panic!("load {case:?}: {e}"));
    let mut runner = loaded.runner;
    let first = plan.device_layers();
    if case == Case::Auto {
        let cost = one_row_on_host(&layer_work(&config, first));
        let spec = runner.model().spec().clone();
        let tiers = LayerTiers {
            cost: Some(cost),
            forced: None,
        };
        runner
            .store()
            .set_layer_tiers(tiers, spec.moe.as_ref(), spec.hidden_size)
            .expect("tiers");
    }
    let (tokens, after_first) = greedy_batch(&mut runner, prompts);
    let what = format!(
        "{case:?} prefetch {} batch {}",
        config.offload.prefetch,
        prompts.len()
    );
    let acc = runner.accounting();
    assert_eq!(acc.check_within_plan(), Ok(()), "{what}: {acc:?}");
    assert!(acc.device_bytes() <= plan.device_bytes, "{what}");
    let store = runner.store();
    assert_eq!(store.resident_layers(), first, "{what}");
    assert_eq!(store.slots(), plan.slots, "{what}");
    let decisions = store.accounting().tier_decisions();
    let (streamed, hosted) = (decisions.get(Tier::Stream), decisions.get(Tier::Host));
    let passes = NEW_TOKENS as u64 + 1;
    let per_pass = host_layers as u64;
    assert_eq!(
        streamed + hosted,
        passes * per_pass,
        "{what}: one decision a layer-step"
    );
    let bytes_per_pass = plan.streamed_bytes_per_step;
    // Decode steps of one row run on the host in `Auto`; every other step of `Auto` streams.
    let host_decode = case == Case::Host || (case == Case::Auto && prompts.len() == 1);
    match case {
        Case::Host => {
            assert_eq!(hosted, passes * per_pass, "{what}");
            assert_eq!((acc.copies, acc.bytes_copied), (0, 0), "{what}: {acc:?}");
            assert!(store.host_tier_layers().len() == host_layers, "{what}");
        }
        Case::Stream => {
            assert_eq!(streamed, passes * per_pass, "{what}");
            assert!(acc.copies >= passes * per_pass, "{what}: {acc:?}");
            assert!(acc.bytes_copied >= passes * bytes_per_pass, "{what}");
            assert!(store.host_tier_layers().is_empty(), "{what}");
        }
        Case::Auto if host_decode => {
            // The prefill streams; the decode steps copy nothing once the prefill's prefetch
            // for the next step has been dropped.
            assert_eq!(streamed, per_pass, "{what}");
            assert_eq!(hosted, NEW_TOKENS as u64 * per_pass, "{what}");
            assert!(acc.bytes_copied >= bytes_per_pass, "{what}");
            assert_eq!(
                (acc.copies, acc.bytes_copied),
                after_first,
                "{what}: decode steps on the host copied"
            );
            assert_eq!(store.host_tier_layers().len(), host_layers, "{what}");
        }
        Case::Auto => {
            assert_eq!(streamed, passes * per_pass, "{what}");
            assert!(acc.bytes_copied >= passes * bytes_per_pass, "{what}");
        }
    }
    if host_decode {
        // No slot was ever busy beyond the ring.
        assert!(acc.max_slots_busy <= plan.slots as u64, "{what}: {acc:?}");
    }
    tokens
}

/// Every case, prefetch in `prefetches`, batch 1 and `batch` prompts, decodes what mode `none`
/// decodes, for the model of `base` with about half its layers offloaded.
fn check(base: &ModelConfig, prompts: &[Vec<u32>], prefetches: &[usize], slack: u64) {
    for batch in [1, prompts.len()] {
        let prompts = &prompts[..batch];
        let mut none = base.clone();
        none.offload.mode = OffloadMode::None;
        let none_plan = plan_for(&none);
        let loaded = load_for_serving_on(&none, &device_config(), &Device::Cpu, &hub())
            .expect("mode none loads");
        let mut runner = loaded.runner;
        let (reference, _) = greedy_batch(&mut runner, prompts);
        drop(runner);
        let n = none_plan.layers.len();
        for &prefetch in prefetches {
            // Half resident; fewer when the ring would hold the rest anyway (k resident and
            // prefetch p offload anything only when k + p + 1 < n, with equal layers).
            let k = (n / 2).min(n.saturating_sub(prefetch + 2));
            let mut config = base.clone();
            config.offload.mode = OffloadMode::Auto;
            config.offload.prefetch = prefetch;
            config.offload.gpu_memory =
                MemoryBudget::Bytes(budget_for(&none_plan, k, prefetch) + slack);
            for case in [Case::Host, Case::Stream, Case::Auto] {
                let tokens = run(&config, case, prompts, n - k);
                assert_eq!(
                    tokens, reference,
                    "{case:?} prefetch {prefetch} batch {batch}: tokens differ from mode none"
                );
            }
        }
    }
}

#[test]
fn smollm2_host_tier_decodes_like_none() {
    let mut base = offloaded(DtypeChoice::Auto, OffloadMode::None);
    base.max_batch = Some(4);
    base.tier.experts = false;
    let loaded = load_for_serving_on(&base, &device_config(), &Device::Cpu, &hub()).expect("load");
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| loaded.codec.encode(p, true).expect("encode"))
        .collect();
    drop(loaded);
    check(&base, &prompts, &[0, 1, 2], 0);
}

/// The tiny families of tests/suite/offload_modes.rs (3 layers), quantized (the slab's block
/// region viewed in place) and dequantized to f32 (every weight a view of its dense region).
#[test]
fn tiny_families_host_tier_decodes_like_none() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3", "gemma3", "phi3", "qwen3moe"] {
        let path = dir.path().join(format!("{arch}.gguf"));
        crate::tiny::family_gguf(&path, arch, candle_core::quantized::GgmlDType::Q8_0);
        for dtype in [DtypeChoice::Auto, DtypeChoice::F32] {
            let mut base = tiny_base(&path);
            base.dtype = dtype;
            base.tier.experts = false;
            let prompts: Vec<Vec<u32>> = (0..4)
                .map(|i| crate::tiny::PROMPT[..crate::tiny::PROMPT.len() - i].to_vec())
                .collect();
            // A quarter layer of slack: slot padding fits, another layer does not.
            let layer = plan_for(&base).layers[0].bytes;
            println!("{arch} {dtype:?}");
            check(&base, &prompts, &[0, 1], layer / 4);
        }
    }
}

/// Issue 28's families (the llama.cpp-checked fixtures: gpt-oss with MXFP4 experts, Qwen2-MoE
/// with its shared expert, GLM-4.5 with a dense first layer and its ungated shared expert) and
/// issue 29's Qwen3.5-MoE (Gated DeltaNet layers) and DeepSeek-V3's layout (`deepseek2-v3`:
/// latent attention, grouped sigmoid routing) on the host tier, quantized and dequantized.
/// With 2 layers only prefetch 0 offloads anything
/// (a ring of two slots is as big as both layers).
#[test]
fn issue_28_moe_families_host_tier_decodes_like_none() {
    for file in [
        "gpt-oss-mxfp4.gguf",
        "qwen2moe.gguf",
        "glm4moe-q8.gguf",
        "qwen35moe-q8.gguf",
        "deepseek2-v3.gguf",
    ] {
        let path = crate::fixtures::path("arch-llamacpp").join(file);
        for dtype in [DtypeChoice::Auto, DtypeChoice::F32] {
            let mut base = tiny_base(&path);
            base.dtype = dtype;
            base.tier.experts = false;
            let prompts: Vec<Vec<u32>> = (0..4)
                .map(|i| crate::tiny::PROMPT[..crate::tiny::PROMPT.len() - i].to_vec())
                .collect();
            let layer = plan_for(&base).layers[0].bytes;
            println!("{file} {dtype:?}");
            check(&base, &prompts, &[0], layer / 4);
        }
    }
}

/// A tiny model entry for the host-tier checks: context 64, four sequences.
fn tiny_base(path: &Path) -> ModelConfig {
    let mut config = offloaded(DtypeChoice::Auto, OffloadMode::None);
    config.source = path.to_string_lossy().into_owned();
    config.max_context = Some(64);
    config.max_batch = Some(4);
    config
}
