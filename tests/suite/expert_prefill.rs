//! Prefill streams, decode computes where the weights are (issue 30, item 2), on the tiny
//! Qwen3-MoE of tests/suite/expert_offload.rs (8 experts, top 2, Q8_0; a 1,024-token context)
//! on the CPU device: a
//! 512-token prompt is a prefill step, whose streamed experts pass through the scratch slots
//! and leave the pool's cache of decode-hot experts as it was; with tier `auto` and a cost
//! model whose device outruns the host (a GPU's shape), the prompt's heavily routed experts
//! stream and batch-1 decoding computes its cold experts on the host, as does a forced `host`;
//! tokens equal mode `none`'s, and the per-kind counters reach the Prometheus metrics.

use ferry::config::{OffloadMode, TierChoice};
use ferry::metrics::Metrics;
use ferry::model::checkpoint::Checkpoint;
use ferry::model::decoder::{LayerSource, Model, SeqInput};
use ferry::model::loader::load_model;
use ferry::model::source::ModelFiles;
use ferry::offload::{load_placed, CostModel, Served, StepKind, StreamConfig, Tier};
use ferry::runtime::telemetry::Telemetry;

use crate::expert_offload::{expert_slab_bytes, options, plan_for, qwen3_moe_context, EXPERTS};

/// The context the test model declares: room for the long prompt and its decode steps.
const CONTEXT: usize = 1024;

/// Decode steps after each prompt.
const DECODE_STEPS: usize = 3;

/// A 512-token prompt over the tiny vocabulary (128 tokens).
fn long_prompt() -> Vec<u32> {
    (0..512u32).map(|t| (t * 37 + 11) % 127 + 1).collect()
}

/// Runs `prompt` as one step (a prefill when it is long), then greedy decode steps; returns the
/// tokens and calls `after` after each step with whether it was the prompt's.
fn run(
    model: &Model,
    layers: &mut dyn LayerSource,
    prompt: &[u32],
    after: &mut dyn FnMut(bool),
) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut input = prompt.to_vec();
    let mut out = Vec::new();
    for step in 0..=DECODE_STEPS {
        let mut batch = [SeqInput {
            tokens: &input,
            cache: &mut cache,
        }];
        let logits = model.forward_batch(&mut batch, layers).unwrap();
        after(step == 0);
        let next = logits.argmax(1).unwrap().to_vec1::<u32>().unwrap()[0];
        out.push(next);
        input = vec![next];
    }
    out
}

/// Mode `none`'s tokens for `prompt`.
fn reference(files: &ModelFiles, prompt: &[u32]) -> Vec<u32> {
    let loaded = load_model(files, &options(), &mut |_| {}).unwrap();
    let mut layers = loaded.layers;
    run(&loaded.model, &mut layers, prompt, &mut |_| {})
}

/// With every expert streamed (a forced `stream`) and a pool of 2: a short prompt and its
/// decode steps fill the pool's cache; a 512-token prompt after it copies its experts into the
/// scratch slots, one per routed expert, and the cache holds what it held before; both
/// sequences decode mode `none`'s tokens; the counters split the two kinds.
#[test]
fn a_prefill_streams_through_scratch_and_keeps_the_decode_cache() {
    let dir = tempfile::tempdir().unwrap();
    let files = ModelFiles::Gguf {
        path: qwen3_moe_context(dir.path(), CONTEXT),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let expert = expert_slab_bytes(&checkpoint);
    let n_layers = checkpoint.spec().n_layers;
    let short = crate::tiny::PROMPT.to_vec();
    let long = long_prompt();
    let (want_short, want_long) = (reference(&files, &short), reference(&files, &long));
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, 2);
    let stream = StreamConfig {
        prefetch: 1,
        link_bandwidth: Some(20_000_000_000),
    };
    let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
    let experts = placed.store.experts().unwrap().clone();
    assert_eq!((experts.pool_slots(), experts.scratch_slots()), (2, 2));
    experts.set_tier(TierChoice::Stream);
    let got = run(&placed.model, &mut placed.store, &short, &mut |_| {
        assert_eq!(
            experts.step_kind(),
            StepKind::Decode,
            "a 7-token prompt decodes"
        );
    });
    assert_eq!(got, want_short);
    experts.settle();
    let cached = experts.cached();
    assert_eq!(cached.len(), 2, "{cached:?}");
    let accounting = placed.store.accounting().clone();
    let before = accounting.snapshot();
    let mut prefill_decisions = Vec::new();
    let got = run(&placed.model, &mut placed.store, &long, &mut |prompt| {
        if prompt {
            assert_eq!(experts.step_kind(), StepKind::Prefill);
            experts.settle();
            // Nothing the prompt streamed entered the cache.
            assert_eq!(
                experts.cached(),
                cached,
                "the prefill evicted decode experts"
            );
            for layer in 0..n_layers {
                prefill_decisions.extend(experts.last_decisions(layer));
            }
        }
    });
    assert_eq!(got, want_long);
    // Every expert the prompt routed and the cache did not hold was copied, each into a
    // scratch slot, predicted nothing.
    let copied = prefill_decisions
        .iter()
        .filter(|d| d.served == Served::Copied)
        .count() as u64;
    assert!(copied > 0, "{prefill_decisions:?}");
    assert!(prefill_decisions
        .iter()
        .all(|d| matches!(d.served, Served::Copied | Served::Hit)));
    let prefill = accounting.expert_steps().snapshot(StepKind::Prefill);
    assert_eq!(prefill.steps, 1);
    assert_eq!(prefill.tokens, 512);
    assert_eq!(prefill.get(Served::Copied), copied);
    assert_eq!(prefill.get(Served::Host), 0);
    assert_eq!(prefill.link_bytes, copied * expert);
    experts.settle();
    let after = accounting.snapshot();
    let decode = accounting.expert_steps().snapshot(StepKind::Decode);
    // Every copy is one kind's: the link bytes of both kinds are the bytes copied.
    assert_eq!(
        after.expert_bytes,
        prefill.link_bytes + decode.link_bytes,
        "{after:?}"
    );
    assert!(after.expert_misses - before.expert_misses >= copied);
    assert_eq!(decode.tokens, 7 + 2 * DECODE_STEPS as u64);
    assert_eq!(after.check_within_plan(), Ok(()));
}

/// Tier `auto` with a cost model shaped like a GPU's (a fast device, a slower host, a copy
/// costing as much as a few host rows with their activations): the 512-token prompt streams the experts many rows
/// were routed to (each decision the cost model's for that expert's rows) and batch-1 decoding
/// computes its experts on the host (cold: the prompt's copies did not enter the cache), with
/// no bytes over the link; a forced `host` computes everything on the host. Tokens equal mode
/// `none`'s; the per-kind counters reach the Prometheus metrics.
#[test]
fn a_prompt_streams_and_batch_1_decode_runs_cold_experts_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let files = ModelFiles::Gguf {
        path: qwen3_moe_context(dir.path(), CONTEXT),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let n_layers = checkpoint.spec().n_layers;
    let long = long_prompt();
    let want = reference(&files, &long);
    let plan = plan_for(&checkpoint, OffloadMode::Sequential, 1 << 32, EXPERTS);
    for tier in [TierChoice::Auto, TierChoice::Host] {
        let stream = StreamConfig {
            prefetch: 1,
            link_bandwidth: None,
        };
        let mut placed = load_placed(&checkpoint, &options(), &plan, stream, &mut |_| {}).unwrap();
        let experts = placed.store.experts().unwrap().clone();
        let work = experts.expert_work(0, 0).unwrap();
        let cost = CostModel {
            link_bytes_per_s: work.weight_bytes as f64 * 1e3,
            host_flops_per_s: work.flops_per_row * 24e3,
            host_read_bytes_per_s: 1e15,
            device_flops_per_s: 1e15,
            forced: None,
            activation_bytes_per_s: None,
        };
        let crossover = cost.crossover(&work).unwrap();
        // Streams from a few rows (the prompt routes about 128 to each expert), never at 1.
        assert!((2..=32).contains(&crossover), "{crossover}");
        experts.set_tier(tier);
        experts.set_cost_model(Some(cost));
        let metrics = Metrics::new();
        let telemetry = Telemetry::new(metrics.clone(), None);
        telemetry.add_model("tiny-moe", placed.store.accounting().clone());
        let mut decisions = (Vec::new(), Vec::new());
        let got = run(&placed.model, &mut placed.store, &long, &mut |prompt| {
            let into = if prompt {
                &mut decisions.0
            } else {
                &mut decisions.1
            };
            for layer in 0..n_layers {
                into.extend(experts.last_decisions(layer));
            }
        });
        assert_eq!(got, want, "{tier:?}");
        experts.settle();
        let (prefill, decode) = decisions;
        // Nothing is resident and the pool starts empty: every routed expert gets a decision.
        assert!(prefill.iter().chain(&decode).all(|d| d.tier.is_some()));
        let accounting = placed.store.accounting();
        let steps = accounting.expert_steps();
        let (p, d) = (
            steps.snapshot(StepKind::Prefill),
            steps.snapshot(StepKind::Decode),
        );
        // Batch-1 decode: one row per expert, on the host, nothing over the link.
        assert!(decode
            .iter()
            .all(|d| d.rows == 1 && d.served == Served::Host));
        assert_eq!(d.get(Served::Host), decode.len() as u64);
        assert_eq!((d.get(Served::Copied), d.link_bytes), (0, 0));
        assert_eq!(d.tokens, DECODE_STEPS as u64);
        telemetry.publish();
        assert_eq!(
            metrics.expert_decisions("host", "decode"),
            decode.len() as u64
        );
        assert_eq!(metrics.expert_decisions("streamed", "decode"), 0);
        assert_eq!(metrics.expert_step_rates("decode"), (0.0, 0.0));
        if tier == TierChoice::Host {
            assert!(prefill.iter().all(|d| d.served == Served::Host));
            assert_eq!((p.get(Served::Copied), p.link_bytes), (0, 0));
            assert_eq!(metrics.expert_decisions("streamed", "prefill"), 0);
            continue;
        }
        // The prompt: each expert by its own rows, the heavily routed ones streamed.
        for dec in &prefill {
            let tier = cost.choose(&work, dec.rows);
            assert_eq!(dec.tier, Some(tier), "{dec:?}");
            let served = match tier {
                Tier::Stream => Served::Copied,
                Tier::Host => Served::Host,
            };
            assert_eq!(dec.served, served, "{dec:?}");
        }
        let streamed = p.get(Served::Copied);
        assert!(streamed > 0, "{prefill:?}");
        assert_eq!(streamed, metrics.expert_decisions("streamed", "prefill"));
        assert_eq!(p.link_bytes, streamed * work.weight_bytes);
        let (hit_rate, per_token) = metrics.expert_step_rates("prefill");
        assert_eq!(hit_rate, 0.0);
        assert!((per_token - p.link_bytes as f64 / 512.0).abs() < 1e-9);
        // The prompt's copies did not warm the cache: decode found nothing there.
        assert!(experts.cached().is_empty(), "{:?}", experts.cached());
    }
}
