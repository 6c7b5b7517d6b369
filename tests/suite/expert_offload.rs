//! Expert-level offload (issue 13) on tiny random MoE models on the CPU device: a Qwen3-MoE
//! (8 experts, top 2, Q8_0 GGUF: block-quantized experts) and a Mixtral (8 experts, top 2, f32
//! GGUF: dense experts). Every placement (all experts resident, all streamed through a pool,
//! all computed on the host, mixed with a tiny cache) decodes the greedy tokens of mode `none`
//! at batch 1 and 4; the device accounting stays within the plan and the expert pool is
//! allocated once; the bytes moved equal the routed-expert arithmetic, with the routing
//! recorded independently on the resident model. The same placements on the llama.cpp-checked
//! fixtures of issue 28's families (tests/fixtures/arch-llamacpp: gpt-oss with MXFP4 and with
//! f32 experts, Qwen2-MoE with its shared expert; 4 experts, top 2, 2 layers; GLM-4.5 in f32
//! and Q8_0, 8 experts, top 2, a dense first layer and two MoE layers): their expert biases,
//! correction bias and shared expert stay with the layer (resident whatever the placement: the
//! shared expert runs for every token), the routed experts are the units.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::{gguf_file::Value, GgmlDType};
use candle_core::Device;
use ferry::config::TierChoice;
use ferry::config::{DtypeChoice, OffloadMode};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::decoder::{LayerSource, Model, ResidentLayers, SeqInput};
use ferry::model::loader::{load_model, Holding, LoadOptions};
use ferry::model::source::ModelFiles;
use ferry::model::weights::{ExpertWeights, LayerWeights, RoutedExperts};
use ferry::offload::experts_plan::PREFILL_SCRATCH_SLOTS;
use ferry::offload::plan::{plan, Plan, PlanInput};
use ferry::offload::sizing::ModelSizes;
use ferry::offload::{load_placed, CostModel, ExpertInput, Served, SlotKind, StreamConfig, Tier};

use crate::tiny::{self, Tiny};

pub(crate) const EXPERTS: usize = 8;
pub(crate) const NEW_TOKENS: usize = 6;

/// Four prompts of different lengths (batch 4); the first alone is batch 1.
pub(crate) fn prompts() -> Vec<Vec<u32>> {
    vec![
        tiny::PROMPT.to_vec(),
        vec![3, 9, 27, 81],
        vec![100, 50, 25, 12, 6, 3],
        vec![77],
    ]
}

pub(crate) fn qwen3_moe(dir: &Path) -> PathBuf {
    qwen3_moe_file(dir, false)
}

/// [`qwen3_moe`] with a vocabulary in the file, so `ferry serve` can serve it.
pub(crate) fn qwen3_moe_servable(dir: &Path) -> PathBuf {
    qwen3_moe_file(dir, true)
}

fn qwen3_moe_file(dir: &Path, vocab: bool) -> PathBuf {
    let mut tiny = Tiny::llama();
    tiny.gguf_meta = vec![("general.dtype", Value::U32(0))];
    tiny.gguf_meta.extend(tiny::moe_meta(EXPERTS, 32));
    if vocab {
        tiny.add_spm_vocab();
    }
    let mut weights = tiny.qwen3_weights(true);
    tiny.add_experts(&mut weights, EXPERTS, 32, false);
    let name = if vocab {
        "qwen3moe-q8-vocab.gguf"
    } else {
        "qwen3moe-q8.gguf"
    };
    let path = dir.join(name);
    tiny.write_gguf(&path, "qwen3moe", &weights, GgmlDType::Q8_0, false);
    path
}

/// [`qwen3_moe`] declaring a context window of `context` tokens (for long prompts).
pub(crate) fn qwen3_moe_context(dir: &Path, context: usize) -> PathBuf {
    let mut tiny = Tiny::llama();
    tiny.gguf_meta = vec![("general.dtype", Value::U32(0))];
    tiny.gguf_meta.extend(tiny::moe_meta(EXPERTS, 32));
    let mut weights = tiny.qwen3_weights(true);
    tiny.add_experts(&mut weights, EXPERTS, 32, false);
    let path = dir.join(format!("qwen3moe-q8-{context}.gguf"));
    tiny.write_gguf_context(&path, "qwen3moe", &weights, context);
    path
}

fn mixtral(dir: &Path) -> PathBuf {
    let mut tiny = Tiny::llama();
    tiny.gguf_meta.extend(tiny::moe_meta(EXPERTS, tiny.inter));
    let mut weights = tiny.random_weights(false, true);
    tiny.add_experts(&mut weights, EXPERTS, tiny.inter, true);
    let path = dir.join("mixtral-f32.gguf");
    tiny.write_gguf(&path, "llama", &weights, GgmlDType::F32, true);
    path
}

pub(crate) fn options() -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    }
}

/// The plan of `checkpoint` in `mode` with `budget` bytes and an expert pool of `pool` slots.
pub(crate) fn plan_for(
    checkpoint: &Checkpoint,
    mode: OffloadMode,
    budget: u64,
    pool: usize,
) -> Plan {
    plan_counted(checkpoint, mode, budget, pool, Vec::new())
}

/// [`plan_for`] with the experts' route counts (per layer and expert) the planner orders the
/// resident experts by.
pub(crate) fn plan_counted(
    checkpoint: &Checkpoint,
    mode: OffloadMode,
    budget: u64,
    pool: usize,
    route_counts: Vec<Vec<u64>>,
) -> Plan {
    let holding = Holding::new(checkpoint, &options()).unwrap();
    let sizes = ModelSizes::of(checkpoint, &holding, SlotKind::Cpu).unwrap();
    let mut input = PlanInput::new(mode, sizes.layers, sizes.fixed, budget);
    input.layer_layouts = sizes.layouts;
    input.experts = Some(ExpertInput {
        n_used: 2,
        pool_slots: Some(pool),
        host_layers: Default::default(),
        route_counts,
    });
    plan(&input).unwrap()
}

/// Bytes of one expert's host slab (every expert of these models has the same shapes; the
/// first MoE layer's, as GLM-4.5's first layer is dense).
pub(crate) fn expert_slab_bytes(checkpoint: &Checkpoint) -> u64 {
    let holding = Holding::new(checkpoint, &options()).unwrap();
    let sizes = ModelSizes::of(checkpoint, &holding, SlotKind::Cpu).unwrap();
    sizes
        .layouts
        .iter()
        .map(|l| l.expert(0))
        .find(|e| !e.entries.is_empty())
        .expect("a layer with experts")
        .slab_bytes()
}

/// Greedy tokens of every prompt, decoded together, `NEW_TOKENS` each.
pub(crate) fn greedy(
    model: &Model,
    layers: &mut dyn LayerSource,
    prompts: &[Vec<u32>],
) -> Vec<Vec<u32>> {
    greedy_watching(model, layers, prompts, &mut || {})
}

/// [`greedy`], calling `after_step` after every step.
fn greedy_watching(
    model: &Model,
    layers: &mut dyn LayerSource,
    prompts: &[Vec<u32>],
    after_step: &mut dyn FnMut(),
) -> Vec<Vec<u32>> {
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut inputs = prompts.to_vec();
    let mut out = vec![Vec::new(); prompts.len()];
    for _ in 0..NEW_TOKENS {
        let mut batch: Vec<SeqInput<'_>> = inputs
            .iter()
            .zip(caches.iter_mut())
            .map(|(tokens, cache)| SeqInput { tokens, cache })
            .collect();
        let logits = model.forward_batch(&mut batch, layers).unwrap();
        after_step();
        let next = logits.argmax(1).unwrap().to_vec1::<u32>().unwrap();
        for (o, &t) in out.iter_mut().zip(&next) {
            o.push(t);
        }
        inputs = next.iter().map(|&t| vec![t]).collect();
    }
    out
}

/// One MoE forward's request: `(step, layer, wanted)`.
pub(crate) type Route = (usize, usize, Vec<usize>);
/// The experts each MoE forward asked for, in call order.
type RouteLog = Arc<Mutex<Vec<Route>>>;

/// The resident model's layers, each asking a recorder for its experts: the routing of a run,
/// observed from outside the offload engine.
struct Recording {
    layers: ResidentLayers,
    log: RouteLog,
    step: usize,
}

#[derive(Debug)]
struct Recorder {
    own: LayerWeights,
    layer: usize,
    step: usize,
    log: RouteLog,
}

impl RoutedExperts for Recorder {
    fn experts(
        &self,
        wanted: &[usize],
        rows: &[usize],
    ) -> ferry::model::Result<Vec<ExpertWeights>> {
        let log = (self.step, self.layer, wanted.to_vec());
        self.log.lock().unwrap().push(log);
        self.own.routed_experts(wanted, rows)
    }
}

impl LayerSource for Recording {
    fn layer(&mut self, index: usize) -> ferry::model::Result<LayerWeights> {
        if index == 0 {
            self.step += 1;
        }
        let own = self.layers.layer(index)?;
        let recorder = Recorder {
            own: own.clone(),
            layer: index,
            step: self.step,
            log: self.log.clone(),
        };
        Ok(own.with_routed(Arc::new(recorder)))
    }
}

/// Mode `none`'s tokens and the routing of every step.
pub(crate) fn reference(files: &ModelFiles, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, Vec<Route>) {
    let loaded = load_model(files, &options(), &mut |_| {}).unwrap();
    let log = RouteLog::default();
    let mut recording = Recording {
        layers: loaded.layers,
        log: log.clone(),
        step: 0,
    };
    let tokens = greedy(&loaded.model, &mut recording, prompts);
    let log = log.lock().unwrap().clone();
    (tokens, log)
}

/// One placement of a test: its plan, tier and prefetch depth.
struct Placement {
    name: &'static str,
    plan: Plan,
    tier: TierChoice,
    prefetch: usize,
}

fn placements(checkpoint: &Checkpoint) -> Vec<Placement> {
    let big = 1 << 32;
    let all = plan_for(checkpoint, OffloadMode::Sequential, big, 2);
    let resident = plan_for(checkpoint, OffloadMode::Auto, big, 2);
    assert!(resident.experts.is_none(), "everything fits");
    assert!(all
        .experts
        .as_ref()
        .unwrap()
        .layers
        .iter()
        .all(|l| l.device_experts == 0));
    // Room for the other parts, a pool of 3 and about a third of the experts.
    let ex = all.experts.as_ref().unwrap();
    let expert = ex
        .layers
        .iter()
        .find_map(|l| l.expert_bytes.first().copied())
        .expect("a layer with experts");
    let n_experts: u64 = ex.layers.iter().map(|l| l.expert_bytes.len() as u64).sum();
    let mixed_budget = all.device_bytes + expert + n_experts / 3 * expert;
    let mixed = plan_for(checkpoint, OffloadMode::Auto, mixed_budget, 3);
    let m = mixed.experts.as_ref().expect("mixed placement");
    assert!(m.host_experts() > 0 && m.layers.iter().any(|l| l.device_experts > 0));
    let mut out = vec![Placement {
        name: "resident",
        plan: resident,
        tier: TierChoice::Stream,
        prefetch: 0,
    }];
    for tier in [TierChoice::Stream, TierChoice::Host, TierChoice::Auto] {
        for prefetch in 0..=2 {
            out.push(Placement {
                name: "all offloaded",
                plan: all.clone(),
                tier,
                prefetch,
            });
            out.push(Placement {
                name: "mixed, tiny cache",
                plan: mixed.clone(),
                tier,
                prefetch,
            });
        }
    }
    out
}

/// Every placement of the model at `path` decodes mode `none`'s tokens at batch 1 and 4,
/// within its plan, with its pool allocated once and every routed expert accounted for.
fn every_placement_matches_none(path: &Path) {
    let files = ModelFiles::Gguf {
        path: path.to_path_buf(),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    for batch in [1, 4] {
        let prompts = &prompts()[..batch];
        let (expected, routes) = reference(&files, prompts);
        let routed: u64 = routes.iter().map(|(_, _, w)| w.len() as u64).sum();
        for p in placements(&checkpoint) {
            let what = format!(
                "{} ({:?}, prefetch {}, batch {batch})",
                p.name, p.tier, p.prefetch
            );
            let stream = StreamConfig {
                prefetch: p.prefetch,
                link_bandwidth: None,
            };
            let mut placed = load_placed(&checkpoint, &options(), &p.plan, stream, &mut |_| {})
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            if let Some(experts) = placed.store.experts() {
                experts.set_tier(p.tier);
            }
            let before = placed.store.accounting().snapshot();
            let tokens = greedy(&placed.model, &mut placed.store, prompts);
            assert_eq!(tokens, expected, "{what}");
            if let Some(experts) = placed.store.experts() {
                experts.settle();
            }
            let after = placed.store.accounting().snapshot();
            after
                .check_within_plan()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(after.slots, before.slots, "{what}: the pool grew");
            assert_eq!(after.slots, p.plan.slot_ring_bytes(), "{what}");
            if p.plan.experts.is_none() {
                assert_eq!(after.expert_hits + after.expert_misses, 0, "{what}");
                continue;
            }
            let served = after.expert_hits + after.expert_misses + after.expert_host;
            assert_eq!(served, routed, "{what}: every routed expert, once");
            // One tier decision per routed expert not found on the device.
            let decisions = placed.store.accounting().tier_decisions();
            assert_eq!(
                decisions.get(Tier::Stream) + decisions.get(Tier::Host),
                after.expert_misses + after.expert_host,
                "{what}"
            );
            if p.tier == TierChoice::Host {
                assert_eq!(decisions.get(Tier::Stream), 0, "{what}");
            }
            // Routed misses and predictions are the only copies.
            assert_eq!(
                after.expert_bytes,
                (after.expert_misses + after.expert_prefetched) * expert_slab_bytes(&checkpoint),
                "{what}"
            );
            assert!(after.expert_prefetch_hits <= after.expert_hits, "{what}");
            assert!(
                after.expert_prefetch_hits <= after.expert_prefetched,
                "{what}"
            );
            if p.prefetch == 0 {
                assert_eq!(after.expert_prefetched, 0, "{what}");
            }
            match p.tier {
                TierChoice::Host => {
                    assert_eq!(after.expert_misses, 0, "{what}");
                    assert_eq!(after.expert_prefetched, 0, "{what}: nothing to stream");
                }
                TierChoice::Stream => {
                    assert!(
                        after.expert_misses + after.expert_prefetch_hits > 0,
                        "{what}"
                    );
                    if p.prefetch > 0 {
                        assert!(after.expert_prefetched > 0, "{what}");
                    }
                }
                TierChoice::Auto => {}
            }
        }
    }
}

#[test]
fn qwen3_moe_placements_decode_the_tokens_of_none() {
    let dir = tempfile::tempdir().unwrap();
    every_placement_matches_none(&qwen3_moe(dir.path()));
}

#[test]
fn gpt_oss_and_qwen2_moe_placements_decode_the_tokens_of_none() {
    for file in ["gpt-oss-mxfp4.gguf", "gpt-oss.gguf", "qwen2moe.gguf"] {
        println!("{file}");
        every_placement_matches_none(&crate::fixtures::path("arch-llamacpp").join(file));
    }
}

#[test]
fn glm4_moe_and_deepseek2_placements_decode_the_tokens_of_none() {
    for file in [
        "glm4moe.gguf",
        "glm4moe-q8.gguf",
        "deepseek2.gguf",
        "deepseek2-v3.gguf",
    ] {
        println!("{file}");
        every_placement_matches_none(&crate::fixtures::path("arch-llamacpp").join(file));
    }
}

/// Issue 29: Qwen3.5-MoE's experts placed one by one (its Gated DeltaNet layers and their
/// recurrent states stay as they are) decode what mode `none` decodes.
#[test]
fn qwen35_moe_placements_decode_the_tokens_of_none() {
    for file in ["qwen35moe.gguf", "qwen35moe-q8.gguf"] {
        println!("{file}");
        every_placement_matches_none(&crate::fixtures::path("arch-llamacpp").join(file));
    }
}

/// GLM-4.5's shared expert is part of its layer, not a unit: with every routed expert
/// offloaded it stays on the device with the attention, the router and the correction bias
/// (the layer's base bytes); the dense first layer has no units at all.
#[test]
fn glm4_moe_shared_expert_stays_resident_with_its_layer() {
    use ferry::model::tensors::Part;

    for file in ["glm4moe.gguf", "glm4moe-q8.gguf"] {
        let files = ModelFiles::Gguf {
            path: crate::fixtures::path("arch-llamacpp").join(file),
        };
        let checkpoint = Checkpoint::open(&files).unwrap();
        let holding = Holding::new(&checkpoint, &options()).unwrap();
        let sizes = ModelSizes::of(&checkpoint, &holding, SlotKind::Cpu).unwrap();
        let all = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, 2);
        let ex = all.experts.as_ref().expect("experts placed");
        assert_eq!(ex.layers.len(), 3, "{file}: the layers that run");
        assert_eq!(ex.layers[0].n_experts(), 0, "{file}: dense first layer");
        for (l, layout) in ex.layers.iter().zip(&sizes.layouts).skip(1) {
            assert_eq!(l.n_experts(), 8, "{file}: routed experts only");
            assert_eq!(l.device_experts, 0, "{file}");
            let base = layout.without_experts();
            for part in [
                Part::ShexpGate,
                Part::ShexpUp,
                Part::ShexpDown,
                Part::ExpProbsBias,
            ] {
                assert!(
                    base.entries.iter().any(|e| e.part == part),
                    "{file}: {part:?} is not with layer {}'s resident parts",
                    l.index
                );
            }
            assert_eq!(
                l.base_bytes,
                base.resident_bytes(SlotKind::Cpu),
                "{file}: the shared expert is in the layer's base"
            );
        }
    }
}

#[test]
fn mixtral_placements_decode_the_tokens_of_none() {
    let dir = tempfile::tempdir().unwrap();
    every_placement_matches_none(&mixtral(dir.path()));
}

/// Bytes moved are the routed-expert arithmetic: with a pool too small to keep anything across
/// layers, each decode token of batch 1 copies its 2 routed experts in every layer; with a
/// pool that holds every expert, each distinct `(layer, expert)` the run routed to is copied
/// exactly once.
#[test]
fn bytes_moved_are_the_routed_expert_arithmetic() {
    let dir = tempfile::tempdir().unwrap();
    let path = qwen3_moe(dir.path());
    let files = ModelFiles::Gguf { path: path.clone() };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let expert = expert_slab_bytes(&checkpoint);
    let n_layers = checkpoint.spec().n_layers;
    // No predictions: only routed experts move (predicted copies: the next test).
    let stream = StreamConfig {
        prefetch: 0,
        link_bandwidth: None,
    };

    // Batch 1, pool of 2: one decode token (after the prompt) moves 2 x n_layers experts.
    let one = &prompts()[..1];
    let (_, routes) = reference(&files, one);
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, 2);
    let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
    placed.store.experts().unwrap().set_tier(TierChoice::Stream);
    let model = &placed.model;
    let mut cache = model.new_cache();
    model
        .forward(&one[0], &mut cache, &mut placed.store)
        .unwrap();
    let mut token = 5;
    for _ in 1..NEW_TOKENS {
        let before = placed.store.accounting().snapshot();
        let logits = model
            .forward(&[token], &mut cache, &mut placed.store)
            .unwrap();
        token = logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        let after = placed.store.accounting().snapshot();
        let moved = after.expert_bytes - before.expert_bytes;
        assert_eq!(moved, 2 * n_layers as u64 * expert);
        assert_eq!(after.expert_hits, before.expert_hits);
    }
    assert!(
        routes.iter().all(|(s, _, w)| *s == 1 || w.len() == 2),
        "{routes:?}"
    );

    // Batch 4, a pool of every expert: each distinct routed (layer, expert) moves once.
    let prompts = prompts();
    let (_, routes) = reference(&files, &prompts);
    let distinct: BTreeSet<(usize, usize)> = routes
        .iter()
        .flat_map(|(_, l, w)| w.iter().map(move |&e| (*l, e)))
        .collect();
    let plan = plan_for(
        &checkpoint,
        OffloadMode::Sequential,
        1 << 32,
        EXPERTS * n_layers,
    );
    let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
    placed.store.experts().unwrap().set_tier(TierChoice::Stream);
    greedy(&placed.model, &mut placed.store, &prompts);
    let s = placed.store.accounting().snapshot();
    assert_eq!(s.expert_misses, distinct.len() as u64);
    assert_eq!(s.expert_bytes, distinct.len() as u64 * expert);
    let routed: u64 = routes.iter().map(|(_, _, w)| w.len() as u64).sum();
    assert_eq!(s.expert_hits, routed - distinct.len() as u64);
    assert_eq!(s.expert_host, 0);

    // What whole-layer streaming moves per decode token, against the routed experts: the
    // plan's estimate for top 2 of 8 with every expert on the host.
    let ex = plan.experts.as_ref().unwrap();
    let ratio = ex.bytes_per_token as f64 / ex.whole_layer_bytes_per_token as f64;
    assert!(ratio < 0.3, "{ratio}");
}

/// Tier `Auto` follows the cost model per expert and step: a fast link and a slow host stream
/// the routed experts, a slow link and a fast host compute them on the host; tokens equal
/// mode `none`'s either way. The decisions are checked, not only what served them: a stream
/// decision that finds no free slot (both taken by predictions still copying, which depends on
/// the copy thread's timing) is computed on the host, so under load a run may copy no routed
/// expert at all (seen: 2 of 25 runs beside two busy loops, all its streamed experts prefetch hits).
#[test]
fn auto_tier_follows_the_cost_model() {
    let dir = tempfile::tempdir().unwrap();
    let files = ModelFiles::Gguf {
        path: qwen3_moe(dir.path()),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let prompts = &prompts()[..1];
    let (expected, _) = reference(&files, prompts);
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, 2);
    let stream = StreamConfig {
        prefetch: 1,
        link_bandwidth: None,
    };
    let rates = |link: f64, host: f64| CostModel {
        link_bytes_per_s: link,
        host_flops_per_s: host,
        host_read_bytes_per_s: host,
        device_flops_per_s: 1e12,
        forced: None,
        activation_bytes_per_s: None,
    };
    for (model, streams) in [(rates(1e12, 1.0), true), (rates(1.0, 1e12), false)] {
        let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
        let experts = placed.store.experts().unwrap();
        experts.set_tier(TierChoice::Auto);
        experts.set_cost_model(Some(model));
        let tokens = greedy(&placed.model, &mut placed.store, prompts);
        assert_eq!(tokens, expected);
        let accounting = placed.store.accounting();
        let s = accounting.snapshot();
        let decided = |tier| accounting.tier_decisions().get(tier);
        let (stream, host) = (decided(Tier::Stream), decided(Tier::Host));
        if streams {
            assert!(
                stream > 0 && host == 0,
                "{stream} stream / {host} host: {s:?}"
            );
            // Streamed experts were copied, by their own miss or ahead of time by a prediction.
            assert!(s.expert_misses + s.expert_prefetch_hits > 0, "{s:?}");
        } else {
            assert!(
                host > 0 && stream == 0,
                "{stream} stream / {host} host: {s:?}"
            );
            // A host decision is computed on the host and never copied.
            assert_eq!(s.expert_misses, 0, "{s:?}");
            assert_eq!(s.expert_host, host, "{s:?}");
        }
    }
}

/// Each routed expert's tier is decided by the rows routed to *it*: with a cost model that
/// computes on the host below a few rows and streams from there, a batch of 4 (prompts and
/// decode) sends its lightly routed experts to the host and its heavily routed ones through
/// the pool in the same step, every decision the cost model's for that expert's rows; tokens
/// equal mode `none`'s.
#[test]
fn each_routed_expert_gets_the_tier_of_its_own_rows() {
    let dir = tempfile::tempdir().unwrap();
    let files = ModelFiles::Gguf {
        path: qwen3_moe(dir.path()),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let n_layers = checkpoint.spec().n_layers;
    let prompts = prompts();
    let (expected, _) = reference(&files, &prompts);
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, EXPERTS);
    let stream = StreamConfig {
        prefetch: 0,
        link_bandwidth: None,
    };
    let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
    let experts = placed.store.experts().unwrap().clone();
    let work = experts.expert_work(0, 0).unwrap();
    // A copy costs 1 ms, a row on the host 0.4 ms (plus its activations): streaming from 3.
    let cost = CostModel {
        link_bytes_per_s: work.weight_bytes as f64 * 1e3,
        host_flops_per_s: work.flops_per_row / 4e-4,
        host_read_bytes_per_s: 1e15,
        device_flops_per_s: 1e15,
        forced: None,
        activation_bytes_per_s: None,
    };
    let crossover = cost.crossover(&work).unwrap();
    assert!((2..=4).contains(&crossover), "{crossover}");
    experts.set_tier(TierChoice::Auto);
    experts.set_cost_model(Some(cost));
    // Per step and layer, its routed experts.
    let mut steps = Vec::new();
    let tokens = greedy_watching(&placed.model, &mut placed.store, &prompts, &mut || {
        for layer in 0..n_layers {
            steps.push(experts.last_decisions(layer));
        }
    });
    assert_eq!(tokens, expected);
    let decided: Vec<_> = steps.iter().flatten().copied().collect();
    let mut mixed_steps = 0;
    for d in &decided {
        let Some(tier) = d.tier else {
            assert!(matches!(d.served, Served::Resident | Served::Hit), "{d:?}");
            continue;
        };
        assert_eq!(tier, cost.choose(&work, d.rows), "{d:?}");
        let want = if d.rows >= crossover {
            Tier::Stream
        } else {
            Tier::Host
        };
        assert_eq!(tier, want, "{d:?}");
        // The pool holds a whole layer's experts: a stream decision is a copy.
        let served = if tier == Tier::Stream {
            Served::Copied
        } else {
            Served::Host
        };
        assert_eq!(d.served, served, "{d:?}");
    }
    for step in &steps {
        let tiers: BTreeSet<_> = step.iter().filter_map(|d| d.tier.map(Tier::name)).collect();
        mixed_steps += usize::from(tiers.len() == 2);
    }
    let of = |tier| decided.iter().filter(|d| d.tier == Some(tier)).count();
    assert!(of(Tier::Host) > 0 && of(Tier::Stream) > 0, "{decided:?}");
    assert!(
        mixed_steps > 0,
        "no layer step used both tiers: {decided:?}"
    );
    let s = experts_snapshot(&placed.store);
    assert_eq!(s.0 as usize, of(Tier::Stream));
    assert_eq!(s.1 as usize, of(Tier::Host));
}

/// The store names the experts it computes on the host (`on_host`) once per layer step,
/// before it hands out any expert (so the MoE forward can move their rows to the host before
/// any expert kernel is queued on a GPU), and exactly those its decisions served on the host.
#[test]
fn the_store_names_its_host_experts_before_handing_any_out() {
    let dir = tempfile::tempdir().unwrap();
    let files = ModelFiles::Gguf {
        path: qwen3_moe(dir.path()),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, EXPERTS);
    let stream = StreamConfig {
        prefetch: 0,
        link_bandwidth: None,
    };
    let placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
    let experts = placed.store.experts().unwrap().clone();
    let work = experts.expert_work(0, 0).unwrap();
    // Streaming wins from a few rows (as in the test above): 1 row computes on the host.
    let cost = CostModel {
        link_bytes_per_s: work.weight_bytes as f64 * 1e3,
        host_flops_per_s: work.flops_per_row / 4e-4,
        host_read_bytes_per_s: 1e15,
        device_flops_per_s: 1e15,
        forced: None,
        activation_bytes_per_s: None,
    };
    experts.set_tier(TierChoice::Auto);
    experts.set_cost_model(Some(cost));
    let wanted: Vec<usize> = (0..EXPERTS).collect();
    let rows: Vec<usize> = (0..EXPERTS)
        .map(|e| if e % 2 == 0 { 1 } else { 8 })
        .collect();
    #[derive(Debug, PartialEq)]
    enum Event {
        OnHost(Vec<usize>),
        Each(usize),
    }
    for (tier, layer) in [
        (TierChoice::Auto, 0),
        (TierChoice::Host, 1),
        (TierChoice::Stream, 0),
    ] {
        experts.set_tier(tier);
        let events = Mutex::new(Vec::new());
        experts
            .layer(layer)
            .each_expert(
                &wanted,
                &rows,
                &mut |is| {
                    events.lock().unwrap().push(Event::OnHost(is.to_vec()));
                    Ok(())
                },
                &mut |i, _| {
                    events.lock().unwrap().push(Event::Each(i));
                    Ok(())
                },
            )
            .unwrap();
        experts.release(layer);
        let events = events.into_inner().unwrap();
        let served_on_host: Vec<usize> = experts
            .last_decisions(layer)
            .iter()
            .enumerate()
            .filter(|(_, d)| d.served == Served::Host)
            .map(|(i, _)| i)
            .collect();
        let what = format!("{tier:?} layer {layer}: {events:?}");
        assert_eq!(events[0], Event::OnHost(served_on_host.clone()), "{what}");
        let mut handed: Vec<usize> = events[1..]
            .iter()
            .map(|e| match e {
                Event::Each(i) => *i,
                Event::OnHost(_) => panic!("told twice: {what}"),
            })
            .collect();
        handed.sort_unstable();
        assert_eq!(handed, wanted, "{what}");
        let expected_host: Vec<usize> = match tier {
            // The first step of this layer finds nothing cached: 1 row computes on the host.
            TierChoice::Auto => (0..EXPERTS).step_by(2).collect(),
            TierChoice::Host => (0..EXPERTS).collect(),
            TierChoice::Stream => Vec::new(),
        };
        assert_eq!(served_on_host, expected_host, "{what}");
    }
}

/// (misses, host-computed) so far.
fn experts_snapshot(store: &ferry::offload::WeightStore) -> (u64, u64) {
    let s = store.accounting().snapshot();
    (s.expert_misses, s.expert_host)
}

/// With prefetch depth 1 and 2 each layer's experts are predicted from the state entering it
/// and copied while its attention runs: tokens equal mode `none`'s at batch 1 and 4, the
/// prefetch hit counter moves, and the bytes moved are exactly the routed misses' and the
/// predictions' copies, within the plan; with depth 0 nothing is predicted.
#[test]
fn predicted_experts_are_copied_ahead_and_hit() {
    let dir = tempfile::tempdir().unwrap();
    let files = ModelFiles::Gguf {
        path: qwen3_moe(dir.path()),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let expert = expert_slab_bytes(&checkpoint);
    for batch in [1, 4] {
        let prompts = &prompts()[..batch];
        let (expected, routes) = reference(&files, prompts);
        let routed: u64 = routes.iter().map(|(_, _, w)| w.len() as u64).sum();
        for (pool, prefetch) in [(EXPERTS, 0), (EXPERTS, 1), (2 * EXPERTS, 2), (4, 1)] {
            let what = format!("pool {pool}, prefetch {prefetch}, batch {batch}");
            let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, pool);
            let stream = StreamConfig {
                prefetch,
                link_bandwidth: Some(20_000_000_000),
            };
            let mut placed =
                load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
            let experts = placed.store.experts().unwrap().clone();
            experts.set_tier(TierChoice::Stream);
            assert_eq!(experts.predicts(), prefetch > 0, "{what}");
            experts.set_tier(TierChoice::Host);
            assert!(!experts.predicts(), "{what}: the host tier copies nothing");
            experts.set_tier(TierChoice::Stream);
            let tokens = greedy(&placed.model, &mut placed.store, prompts);
            assert_eq!(tokens, expected, "{what}");
            experts.settle();
            let s = placed.store.accounting().snapshot();
            s.check_within_plan()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(s.slots, plan.slot_ring_bytes(), "{what}");
            assert_eq!(
                s.expert_hits + s.expert_misses + s.expert_host,
                routed,
                "{what}"
            );
            assert_eq!(
                s.expert_bytes,
                (s.expert_misses + s.expert_prefetched) * expert,
                "{what}"
            );
            assert_eq!(s.bytes_copied, s.expert_bytes, "{what}: only experts move");
            if prefetch == 0 {
                assert_eq!(
                    (s.expert_prefetched, s.expert_prefetch_hits),
                    (0, 0),
                    "{what}"
                );
            } else {
                assert!(s.expert_prefetch_hits > 0, "{what}: {s:?}");
                assert!(
                    s.expert_prefetch_hits <= s.expert_prefetched,
                    "{what}: {s:?}"
                );
            }
        }
    }
}

/// A plan for a CUDA device (its slot kind, planned here without one): experts are placement
/// units there too. The pool's slots hold one device buffer per (part, type, shape) of an
/// offloaded expert, as candle pads them, counted once per slot; the placement and the routed
/// bytes per token are the CPU plan's, and `ferry plan` shows the expert tiers.
#[test]
fn a_cuda_plan_places_experts_and_counts_the_pool() {
    use ferry::offload::render::{plan_json, render_text};
    let dir = tempfile::tempdir().unwrap();
    let path = qwen3_moe(dir.path());
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf { path }).unwrap();
    let holding = Holding::new(&checkpoint, &options()).unwrap();
    let plan_of = |kind: SlotKind, budget: u64| {
        let sizes = ModelSizes::of(&checkpoint, &holding, kind).unwrap();
        let mut input = PlanInput::new(OffloadMode::Auto, sizes.layers, sizes.fixed, budget);
        input.layer_layouts = sizes.layouts;
        input.slot_kind = kind;
        input.experts = Some(ExpertInput {
            n_used: 2,
            pool_slots: Some(3),
            host_layers: Default::default(),
            route_counts: Vec::new(),
        });
        plan(&input).unwrap()
    };
    // Whole, then with room for about half the experts.
    let whole = plan_of(SlotKind::Cuda, 1 << 40);
    assert!(whole.experts.is_none(), "everything fits: no expert plan");
    let all_experts: u64 = {
        let sizes = ModelSizes::of(&checkpoint, &holding, SlotKind::Cuda).unwrap();
        sizes
            .layouts
            .iter()
            .map(|l| {
                (0..EXPERTS)
                    .map(|e| l.expert(e).resident_bytes(SlotKind::Cuda))
                    .sum::<u64>()
            })
            .sum()
    };
    let budget = whole.device_bytes - all_experts / 2;
    let cuda = plan_of(SlotKind::Cuda, budget);
    let experts = cuda.experts.as_ref().expect("a CUDA plan places experts");
    assert!(cuda.device_bytes <= cuda.budget_bytes, "{cuda:?}");
    assert_eq!(experts.pool_slots, 3);
    assert_eq!(experts.slot.kind, SlotKind::Cuda);
    // Q8_0 experts: block matrices in buffers of their own (gate, up, down).
    assert_eq!(experts.slot.matrices.len(), 3, "{:?}", experts.slot);
    // The pool's 3 slots and the prefill scratch slots beside it.
    assert_eq!(experts.scratch_slots, PREFILL_SCRATCH_SLOTS);
    assert_eq!(cuda.slots, 3 + PREFILL_SCRATCH_SLOTS);
    assert_eq!(cuda.slot_bytes, experts.slot.total_bytes());
    assert_eq!(cuda.slot_layout.as_ref(), Some(&experts.slot));
    assert_eq!(
        experts.pool_bytes(),
        (3 + PREFILL_SCRATCH_SLOTS) as u64 * experts.slot.total_bytes()
    );
    // The device holds the fixed parts, KV cache, workspace and reserve (as in the whole
    // plan), every layer's other parts and resident experts, and the pool.
    assert_eq!(
        cuda.device_bytes - experts.resident_bytes() - experts.pool_bytes(),
        whole.device_bytes - whole.resident_layer_bytes,
        "{cuda:?}"
    );
    let resident: u64 = experts.layers.iter().map(|l| l.device_bytes()).sum();
    assert_eq!(experts.resident_bytes(), resident);
    let host: usize = experts.layers.iter().map(|l| l.host_experts()).sum();
    assert!(
        host > 0 && host < EXPERTS * experts.layers.len(),
        "some experts resident, some on the host: {host}"
    );
    assert!(experts.bytes_per_token > 0);
    assert!(experts.bytes_per_token < experts.whole_layer_bytes_per_token);
    let text = render_text(&cuda);
    for line in [
        "experts top 2 of 8 per token",
        "expert pool  3 + 2 prefill scratch x",
        "routed experts",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    assert_eq!(plan_json(&cuda)["experts"]["pool_slots"], 3);
    // A CUDA plan loaded on the CPU device says so (the pool's slots differ).
    let stream = StreamConfig {
        prefetch: 0,
        link_bandwidth: None,
    };
    let err = load_placed(&checkpoint, &options(), &cuda, stream, &mut |_| {})
        .expect_err("a CUDA plan on the CPU device");
    assert!(err.to_string().contains("cpu slot layout"), "{err}");
}

/// The CUDA pool's way with a layer whose streamed experts outnumber the free slots (refill the
/// pool in rounds rather than computing a stream decision on the host), checked on the CPU: a pool of 1 streams every routed expert,
/// round after round, and decodes the tokens of `none` at batch 1 and 4, prefetch 0 and 1,
/// with nothing computed on the host and one miss or hit per routed expert.
#[test]
fn a_pool_refilled_in_rounds_decodes_the_tokens_of_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = qwen3_moe(dir.path());
    let files = ModelFiles::Gguf { path };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, 1);
    for batch in [1, 4] {
        let prompts = &prompts()[..batch];
        let (expected, routes) = reference(&files, prompts);
        let routed: u64 = routes.iter().map(|(_, _, w)| w.len() as u64).sum();
        for prefetch in [0, 1] {
            let what = format!("batch {batch}, prefetch {prefetch}");
            let stream = StreamConfig {
                prefetch,
                link_bandwidth: None,
            };
            let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {})
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let experts = placed.store.experts().unwrap().clone();
            experts.set_tier(TierChoice::Stream);
            experts.set_rounds(true);
            assert!(experts.computes_on_host());
            assert_eq!(experts.pool_slots(), 1);
            let tokens = greedy(&placed.model, &mut placed.store, prompts);
            assert_eq!(tokens, expected, "{what}");
            experts.settle();
            let after = placed.store.accounting().snapshot();
            after
                .check_within_plan()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(after.expert_host, 0, "{what}: nothing on the host");
            assert_eq!(
                after.expert_hits + after.expert_misses,
                routed,
                "{what}: every routed expert, once"
            );
            // The prompt routes more experts per layer than the pool holds: rounds happened.
            assert!(after.expert_misses > routes.len() as u64, "{what}");
        }
    }
}

/// `offload.host_expert_layers` (llama.cpp's `--n-cpu-moe`): `ferry plan` keeps every expert of
/// the first MoE layers on the host though the budget holds them, and places the rest as before.
#[test]
fn the_first_layers_experts_stay_on_the_host_by_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = qwen3_moe(dir.path());
    let plan = |extra: &[&str]| {
        let (ok, stdout, stderr) = crate::fit::run_plan(
            std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
                .args([
                    "plan",
                    "--json",
                    "--device",
                    "cpu",
                    "--gpu-memory",
                    "1GiB",
                    "--model",
                ])
                .arg(&path)
                .args(extra),
        );
        assert!(ok, "{stderr}");
        let document: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
        document["models"][0]["plan"].clone()
    };
    assert!(
        plan(&[])["experts"].is_null(),
        "the budget holds every expert"
    );
    let pinned = plan(&["--host-expert-layers", "1"]);
    let layers = pinned["experts"]["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("placed by expert: {pinned}"))
        .clone();
    let resident: Vec<u64> = layers
        .iter()
        .map(|l| l["device_experts"].as_u64().expect("device_experts"))
        .collect();
    let all = layers[1]["device_experts"].as_u64().expect("count")
        + layers[1]["host_experts"].as_u64().expect("count");
    assert_eq!(resident[0], 0, "{pinned}");
    assert!(resident[1..].iter().all(|&n| n == all), "{pinned}");
    assert!(pinned["host_bytes"].as_u64() > Some(0), "{pinned}");
}

/// Issue 30 item 3: a budget that holds the expert pool but not its prefill scratch slots
/// used to be refused; it now plans with no scratch slots, a `fitted:` note saying why, and
/// `ferry plan` shows one line per MoE layer. A list of layers pins their experts to the host.
#[test]
fn a_tight_budget_degrades_with_its_reason_and_a_line_per_layer() {
    let model = crate::fixtures::path("arch-llamacpp").join("qwen3moe.gguf");
    let plan = |budget: &str, extra: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["plan", "--device", "cpu", "--gpu-memory", budget, "--model"])
            .arg(&model)
            .args(extra)
            .output()
            .expect("ferry plan runs");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, text, stderr) = plan("4000KiB", &[]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains("note: fitted: no prefill scratch slots"),
        "{text}"
    );
    for layer in 0..2 {
        assert!(
            text.contains(&format!(
                "\n  layer {layer}       experts: 0 device, 4 host (48.0 KiB each; pool 2 + 0 scratch)\n"
            )),
            "{text}"
        );
    }
    // Far too small even with fewer tokens per step (an unset `max_step_tokens` is lowered
    // before a refusal: set it, so the smallest budget named is the one at 512).
    let (ok, text, stderr) = plan("3MiB", &[]);
    assert!(ok, "{stderr}");
    assert!(text.contains("note: fitted `max_step_tokens`"), "{text}");
    let plan = |budget: &str, extra: &[&str]| {
        let set = [&["--max-step-tokens", "512"], extra].concat();
        plan(budget, &set)
    };
    let (ok, _, stderr) = plan("3MiB", &[]);
    assert!(!ok);
    let named = stderr
        .split("`--gpu-memory ")
        .nth(1)
        .and_then(|rest| rest.split("KiB`").next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no smallest budget in: {stderr}"));
    let (ok, _, stderr) = plan(&format!("{named}KiB"), &[]);
    assert!(ok, "the budget named plans: {stderr}");
    let (ok, _, _) = plan(&format!("{}KiB", named - 1), &[]);
    assert!(!ok, "one KiB less does not");
    // The list form: layer 1 only; a layer beyond the model is named.
    let (ok, text, stderr) = plan("1GiB", &["--host-expert-layers", "1,"]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains("\n  layer 0       experts: 4 device, 0 host"),
        "{text}"
    );
    assert!(
        text.contains("\n  layer 1       experts: 0 device, 4 host"),
        "{text}"
    );
    let (ok, _, stderr) = plan("1GiB", &["--host-expert-layers", "0,5"]);
    assert!(!ok && stderr.contains("names layer 5"), "{stderr}");
}
