use super::*;
use crate::error::PlanError;
use crate::layout::TensorEntry;
use crate::plan::{plan, PlanInput};
use ferry_config::{HostExpertLayers, OffloadMode};
use ferry_model::header::GgufType;
use ferry_model::loader::TensorKind;
use ferry_model::tensors::Part;

/// Bytes of 256 Q8_0 blocks: a multiple of the slab alignment, so slots hold exactly it.
const PIECE: usize = 34 * 256;

/// A Q8_0 layer whose attention/router parts take `base` bytes and whose `n` experts take
/// `expert` bytes each (a third per gate/up/down).
fn moe_layout(index: usize, base: usize, n: usize, expert: usize) -> LayerLayout {
    let kind = TensorKind::Blocks(GgufType::Q8_0);
    let mut entries = vec![TensorEntry {
        name: "attn".into(),
        part: Part::Q,
        unit: 0,
        kind,
        shape: vec![base / 34 * 32],
        offset: 0,
        len: base,
    }];
    let mut offset = base;
    for e in 0..n {
        for part in [Part::ExpGate, Part::ExpUp, Part::ExpDown] {
            entries.push(TensorEntry {
                name: format!("exp{e}"),
                part,
                unit: e,
                kind,
                shape: vec![expert / 3 / 34 * 32],
                offset,
                len: expert / 3,
            });
            offset += expert / 3;
        }
    }
    LayerLayout {
        index,
        entries,
        blocks_len: offset,
        dense_len: 0,
    }
}

fn layouts(layers: usize, base: usize, n: usize, expert: usize) -> Vec<LayerLayout> {
    (0..layers)
        .map(|i| moe_layout(i, base, n, expert))
        .collect()
}

fn input(mode: OffloadMode, layouts: Vec<LayerLayout>, budget: u64, n_used: usize) -> PlanInput {
    let bytes = layouts.iter().map(|l| l.weight_bytes()).collect();
    let mut input = PlanInput::new(mode, bytes, 0, budget);
    input.layer_layouts = layouts;
    input.experts = Some(ExpertInput {
        n_used,
        pool_slots: None,
        host_layers: Default::default(),
        route_counts: Vec::new(),
    });
    input
}

#[test]
fn the_first_moe_layers_keep_their_experts_on_the_host_by_setting() {
    // Four layers of 4 experts; the budget holds all of them.
    let all = layouts(4, PIECE, 4, 3 * PIECE);
    let mut inp = input(OffloadMode::Auto, all, 1 << 30, 2);
    assert_eq!(plan(&inp).expect("fits").experts, None, "all resident");
    inp.experts = inp.experts.map(|e| ExpertInput {
        host_layers: HostExpertLayers::First(2),
        ..e
    });
    let p = plan(&inp).expect("fits");
    let experts = p.experts.expect("placed by expert");
    let resident: Vec<usize> = experts.layers.iter().map(|l| l.device_experts).collect();
    assert_eq!(resident, [0, 0, 4, 4]);
    assert_eq!(p.host_bytes, 2 * 4 * 3 * PIECE as u64);
    assert!(p.device_bytes <= p.budget_bytes);
    // A budget too small for the rest spreads what fits over the other layers only.
    let tight = layouts(4, PIECE, 4, 3 * PIECE);
    let pool = (2 + PREFILL_SCRATCH_SLOTS) as u64;
    let device_for =
        |experts: u64| 4 * PIECE as u64 + pool * 3 * PIECE as u64 + experts * 3 * PIECE as u64;
    let mut inp = input(OffloadMode::Auto, tight, device_for(3), 2);
    inp.experts = inp.experts.map(|e| ExpertInput {
        host_layers: HostExpertLayers::First(1),
        ..e
    });
    let experts = plan(&inp).expect("fits").experts.expect("placed by expert");
    let resident: Vec<usize> = experts.layers.iter().map(|l| l.device_experts).collect();
    assert_eq!(resident, [0, 1, 1, 1]);
}

#[test]
fn dense_layers_have_no_expert_plan() {
    let dense = vec![moe_layout(0, PIECE, 0, 0)];
    assert_eq!(layer_experts(&dense, SlotKind::Cpu), None);
    let p = plan(&input(OffloadMode::Sequential, dense, 1 << 20, 2)).expect("fits");
    assert_eq!(p.experts, None);
}

/// Top-2 of 8 experts, every expert on the host: a decode token moves 2 experts per layer,
/// whole-layer streaming all 8 and the attention: a ratio of 2 / (8 + 1) here (about 0.22; the experts alone: 1/4).
#[test]
fn top_2_of_8_moves_a_quarter_of_the_experts() {
    let (layers, base, expert) = (4, PIECE * 3, PIECE * 3);
    let p = plan(&input(
        OffloadMode::Sequential,
        layouts(layers, base, 8, expert),
        1 << 30,
        2,
    ))
    .expect("fits");
    let ex = p.experts.as_ref().expect("experts placed");
    assert_eq!(ex.host_experts(), layers * 8);
    assert_eq!(ex.bytes_per_token, (layers * 2 * expert) as u64);
    assert_eq!(
        ex.whole_layer_bytes_per_token,
        (layers * (base + 8 * expert)) as u64
    );
    let ratio = ex.bytes_per_token as f64 / ex.whole_layer_bytes_per_token as f64;
    assert!((ratio - 2.0 / 9.0).abs() < 1e-9, "{ratio}");
    // The pool holds one token's experts of one layer, beside it the prefill scratch slots;
    // the device the other parts and them.
    assert_eq!(p.slots, 2 + PREFILL_SCRATCH_SLOTS);
    assert_eq!(p.slot_bytes, expert as u64);
    assert_eq!(
        p.device_bytes,
        (layers * base + (2 + PREFILL_SCRATCH_SLOTS) * expert) as u64
    );
    assert_eq!(p.host_bytes, (layers * 8 * expert) as u64);
    assert_eq!(p.streamed_bytes_per_step, ex.bytes_per_token);
    assert!(p.layers.iter().all(|l| l.home == crate::Home::Device));
}

/// Top-8 of 128 (Qwen3-30B-A3B's routing): 8 / 128 of the experts, 1/16 of whole-layer
/// streaming's expert bytes.
#[test]
fn top_8_of_128_moves_a_sixteenth_of_the_experts() {
    let (layers, expert) = (3, PIECE * 3);
    let p = plan(&input(
        OffloadMode::Sequential,
        layouts(layers, PIECE, 128, expert),
        1 << 30,
        8,
    ))
    .expect("fits");
    let ex = p.experts.as_ref().expect("experts placed");
    assert_eq!(ex.bytes_per_token, (layers * 8 * expert) as u64);
    let experts_only = ex.whole_layer_bytes_per_token - (layers * PIECE) as u64;
    assert_eq!(ex.bytes_per_token * 16, experts_only);
}

#[test]
fn auto_spreads_resident_experts_evenly_within_the_budget() {
    let (layers, base, expert) = (4, PIECE * 3, PIECE * 3);
    let all = layouts(layers, base, 8, expert);
    // Room for the other parts, the pool of 2 and 10 experts: 3 layers keep 3, one keeps 2..
    let scratch = PREFILL_SCRATCH_SLOTS * expert;
    let budget = (layers * base + 2 * expert + scratch + 10 * expert + expert / 2) as u64;
    let p = plan(&input(OffloadMode::Auto, all.clone(), budget, 2)).expect("fits");
    let ex = p.experts.as_ref().expect("experts placed");
    let resident: Vec<usize> = ex.layers.iter().map(|l| l.device_experts).collect();
    assert_eq!(resident, vec![3, 3, 2, 2]);
    assert!(p.device_bytes <= budget, "{} > {budget}", p.device_bytes);
    assert_eq!(p.resident_layer_bytes, (layers * base + 10 * expert) as u64);
    // Fewer experts on the host, fewer bytes per token: 2 x (5 + 5 + 6 + 6) / 8 experts.
    assert_eq!(ex.bytes_per_token, (2 * 22 * expert / 8) as u64);

    // Room for everything: the plan of mode `none`.
    let whole: u64 = all.iter().map(|l| l.weight_bytes()).sum();
    let p = plan(&input(OffloadMode::Auto, all.clone(), whole, 2)).expect("fits");
    assert_eq!((p.experts, p.slots), (None, 0));

    // No room for the other parts and the pool: whole layers stream instead.
    let p = plan(&input(
        OffloadMode::Auto,
        all,
        (layers * base + expert) as u64,
        2,
    ));
    assert!(p.map_or(true, |p| p.experts.is_none()));
}

#[test]
fn a_larger_pool_is_counted_on_the_device() {
    let all = layouts(2, PIECE, 4, 3 * PIECE);
    let mut inp = input(OffloadMode::Sequential, all, 1 << 30, 2);
    inp.experts = Some(ExpertInput {
        n_used: 2,
        pool_slots: Some(5),
        host_layers: Default::default(),
        route_counts: Vec::new(),
    });
    let p = plan(&inp).expect("fits");
    // The pool's 5 slots and the prefill scratch slots beside it.
    assert_eq!(p.slots, 5 + PREFILL_SCRATCH_SLOTS);
    let ex = p.experts.as_ref().expect("placed by expert");
    assert_eq!(
        (ex.pool_slots, ex.scratch_slots),
        (5, PREFILL_SCRATCH_SLOTS)
    );
    assert_eq!(
        p.device_bytes,
        (2 * PIECE + (5 + PREFILL_SCRATCH_SLOTS) * 3 * PIECE) as u64
    );
}

#[test]
fn ferry_plan_shows_the_expert_tiers_and_the_bytes_per_token() {
    use crate::render::{plan_json, render_text};
    let (layers, base, expert) = (4, PIECE * 3, PIECE * 3);
    let scratch = PREFILL_SCRATCH_SLOTS * expert;
    let budget = (layers * base + 2 * expert + scratch + 10 * expert + expert / 2) as u64;
    let mut inp = input(
        OffloadMode::Auto,
        layouts(layers, base, 8, expert),
        budget,
        2,
    );
    inp.link_bandwidth = Some(16_000_000_000);
    let p = plan(&inp).expect("fits");
    let text = render_text(&p);
    for line in [
        "experts top 2 of 8 per token",
        "  layer 0       experts: 3 device, 5 host (25.5 KiB each; pool 2 + 2 scratch)",
        "  layer 1       experts: 3 device, 5 host (25.5 KiB each; pool 2 + 2 scratch)",
        "  layer 2       experts: 2 device, 6 host (25.5 KiB each; pool 2 + 2 scratch)",
        "  layer 3       experts: 2 device, 6 host (25.5 KiB each; pool 2 + 2 scratch)",
        "routed experts ~140.2 KiB moved per token (whole-layer streaming 918.0 KiB: 0.15x)",
        "  expert pool  2 + 2 prefill scratch x 25.5 KiB = 102.0 KiB",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    let json = plan_json(&p);
    let ex = &json["experts"];
    assert_eq!(ex["n_used"], 2);
    assert_eq!(ex["pool_slots"], 2);
    assert_eq!(ex["scratch_slots"], PREFILL_SCRATCH_SLOTS);
    assert_eq!(ex["bytes_per_token"], p.streamed_bytes_per_step);
    assert_eq!(ex["layers"].as_array().map(Vec::len), Some(4));
    assert_eq!(ex["layers"][3]["host_experts"], 6);
    assert!(
        plan_json(&plan(&PlanInput::new(OffloadMode::None, vec![1], 0, 10)).unwrap())["experts"]
            .is_null()
    );
}

#[test]
fn a_budget_without_room_for_the_scratch_slots_drops_them_and_says_why() {
    // Two layers of 4 experts; the budget holds the other parts and a pool of 2 slots, not
    // the 2 scratch slots beside it.
    let expert = 3 * PIECE;
    let budget = (2 * PIECE + 2 * expert + expert) as u64;
    let p = plan(&input(
        OffloadMode::Auto,
        layouts(2, PIECE, 4, expert),
        budget,
        2,
    ))
    .expect("degrades instead of refusing");
    let ex = p.experts.as_ref().expect("placed by expert");
    assert_eq!((ex.pool_slots, ex.scratch_slots), (2, 0));
    assert_eq!(p.slots, 2);
    assert!(p.device_bytes <= budget);
    let note = p
        .notes
        .iter()
        .find(|n| n.starts_with("fitted: no prefill scratch slots"));
    assert!(
        note.is_some_and(|n| n.contains("because the budget")),
        "{:?}",
        p.notes
    );
    // With room for them, they stay and nothing is noted.
    let roomy = budget + 2 * expert as u64;
    let p = plan(&input(
        OffloadMode::Auto,
        layouts(2, PIECE, 4, expert),
        roomy,
        2,
    ))
    .expect("fits");
    assert_eq!(
        p.experts.expect("by expert").scratch_slots,
        PREFILL_SCRATCH_SLOTS
    );
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

#[test]
fn a_refusal_names_the_expert_plans_least_footprint() {
    let expert = 3 * PIECE;
    // The other parts and a 2-slot pool, one byte short.
    let least = (2 * PIECE + 2 * expert) as u64;
    let inp = input(
        OffloadMode::Auto,
        layouts(2, PIECE, 4, expert),
        least - 1,
        2,
    );
    match plan(&inp) {
        Err(PlanError::ExpertsDoNotFit {
            needed,
            slots,
            slot_bytes,
            ..
        }) => {
            assert_eq!(needed, least);
            assert_eq!((slots, slot_bytes), (2, expert as u64));
        }
        other => panic!("expected ExpertsDoNotFit, got {other:?}"),
    }
    // At exactly that footprint it plans.
    let inp = input(OffloadMode::Auto, layouts(2, PIECE, 4, expert), least, 2);
    assert!(plan(&inp).is_ok());
}

#[test]
fn a_list_of_layers_keeps_their_experts_on_the_host() {
    let all = layouts(4, PIECE, 4, 3 * PIECE);
    let mut inp = input(OffloadMode::Auto, all, 1 << 30, 2);
    inp.experts = inp.experts.map(|e| ExpertInput {
        host_layers: HostExpertLayers::List(vec![0, 2]),
        ..e
    });
    let p = plan(&inp).expect("fits");
    let resident: Vec<usize> = p
        .experts
        .expect("placed by expert")
        .layers
        .iter()
        .map(|l| l.device_experts)
        .collect();
    assert_eq!(resident, [0, 4, 0, 4]);
    // A layer beyond the model is named.
    inp.experts = inp.experts.map(|e| ExpertInput {
        host_layers: HostExpertLayers::List(vec![1, 9]),
        ..e
    });
    match plan(&inp) {
        Err(PlanError::InvalidInput(message)) => {
            assert!(
                message.contains("layer 9") && message.contains("4 layers"),
                "{message}"
            )
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn a_fitted_expert_plan_says_its_experts_are_on_the_host() {
    use crate::fit::{fit, CacheRequest};
    use crate::plan::Origin;
    let expert = 3 * PIECE;
    // Room for the other parts, a pool with its scratch slots and one sequence's cache of 64
    // tokens at 1 KiB, not eight.
    let budget = (2 * PIECE + 4 * expert) as u64 + 64 * 1024 * 2;
    let input_for = |context: usize, batch: usize| {
        let mut inp = input(OffloadMode::Auto, layouts(2, PIECE, 4, expert), budget, 2);
        inp.max_context = context;
        inp.max_batch = batch;
        inp.kv_bytes_per_token_per_layer = 1024;
        inp
    };
    let request = CacheRequest {
        max_context: None,
        max_batch: None,
        model_context: 64,
        kv_dtype: Origin::Default,
        kv_offload: ferry_config::KvOffload::Off,
        host_free_bytes: None,
        device_in_host_memory: false,
    };
    let fitted = fit(&request, &input_for).expect("fits at batch 1");
    assert_eq!(fitted.plan.max_batch, 1);
    let note = &fitted.plan.notes[0];
    assert!(note.starts_with("fitted the KV cache"), "{note}");
    assert!(
        note.contains("8 of 8 routed experts live on the host"),
        "{note}"
    );
}

#[test]
fn route_counts_make_the_most_routed_experts_resident() {
    let (layers, base, expert) = (4, PIECE * 3, PIECE * 3);
    let scratch = PREFILL_SCRATCH_SLOTS * expert;
    // Room for the other parts, the pool of 2 and 10 experts: 3, 3, 2, 2 per layer.
    let budget = (layers * base + 2 * expert + scratch + 10 * expert + expert / 2) as u64;
    let without = plan(&input(
        OffloadMode::Auto,
        layouts(layers, base, 8, expert),
        budget,
        2,
    ))
    .expect("fits");
    // No counts: the first experts of every layer, as before counts existed.
    let ex = without.experts.as_ref().expect("experts placed");
    let resident: Vec<Vec<usize>> = ex.layers.iter().map(|l| l.resident_experts()).collect();
    assert_eq!(
        resident,
        [vec![0, 1, 2], vec![0, 1, 2], vec![0, 1], vec![0, 1]]
    );
    // Empty counts, or all zero, place exactly the same plan.
    let mut inp = input(
        OffloadMode::Auto,
        layouts(layers, base, 8, expert),
        budget,
        2,
    );
    inp.experts = inp.experts.map(|e| ExpertInput {
        route_counts: vec![vec![0; 8]; layers],
        ..e
    });
    assert_eq!(plan(&inp).expect("fits"), without);

    // Layer 0 routed most to 7, then 5 and 3 tied (index order); layer 2 to 6 and 1; layer 1
    // has counts for two experts only (the rest unknown: index order); layer 3 none.
    inp.experts = inp.experts.map(|e| ExpertInput {
        route_counts: vec![
            vec![0, 1, 0, 4, 0, 4, 0, 9],
            vec![0, 0, 0, 5],
            vec![0, 2, 0, 0, 0, 0, 8],
        ],
        ..e
    });
    let with = plan(&inp).expect("fits");
    let ex = with.experts.as_ref().expect("experts placed");
    let resident: Vec<Vec<usize>> = ex.layers.iter().map(|l| l.resident_experts()).collect();
    assert_eq!(
        resident,
        [vec![3, 5, 7], vec![0, 1, 3], vec![1, 6], vec![0, 1]]
    );
    for l in &ex.layers {
        for e in 0..l.n_experts() {
            assert_eq!(l.is_resident(e), resident[l.index].contains(&e));
        }
        assert_eq!(
            l.offloaded_experts().len() + l.resident_experts().len(),
            l.n_experts()
        );
    }
    // The same bytes and counts as the plan without counts: only which experts moved.
    assert_eq!(with.device_bytes, without.device_bytes);
    assert_eq!(with.host_bytes, without.host_bytes);
    // `ferry plan` lists the residents where they are not the first experts.
    let text = crate::render::render_text(&with);
    assert!(text.contains(" + 2 scratch; resident 3,5,7)\n"), "{text}");
    assert!(text.contains(" + 2 scratch; resident 1,6)\n"), "{text}");
    assert_eq!(text.matches("; resident").count(), 3, "{text}");
    assert!(!crate::render::render_text(&without).contains("resident "));
    let json = crate::render::plan_json(&with);
    assert_eq!(
        json["experts"]["layers"][0]["resident_experts"],
        serde_json::json!([3, 5, 7])
    );
    assert_eq!(residency_order(4, Some(&[1, 3, 3])), [1, 2, 0, 3]);
    assert_eq!(residency_order(3, None), [0, 1, 2]);
}
