//! Table tests for the placement planner: modes, edge cases and budget invariants.

use super::*;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

fn input(mode: OffloadMode, layers: Vec<u64>, fixed: u64, budget: u64) -> PlanInput {
    PlanInput::new(mode, layers, fixed, budget)
}

fn homes(plan: &Plan) -> String {
    plan.layers
        .iter()
        .map(|l| match l.home {
            Home::Device => 'D',
            Home::Host => 'H',
        })
        .collect()
}

/// Checks every invariant a successful plan must satisfy.
fn check_invariants(input: &PlanInput, plan: &Plan) {
    assert!(
        plan.device_bytes <= input.budget_bytes,
        "device {} > budget {}",
        plan.device_bytes,
        input.budget_bytes
    );
    // Device prefix, host suffix.
    let split = plan.device_layers();
    assert!(plan.layers[..split].iter().all(|l| l.home == Home::Device));
    assert!(plan.layers[split..].iter().all(|l| l.home == Home::Host));
    // Indices and bytes carried through in order.
    for (i, layer) in plan.layers.iter().enumerate() {
        assert_eq!(layer.index, i);
        assert_eq!(layer.bytes, input.layer_bytes[i]);
    }
    // Bytes add up exactly.
    let resident: u64 = input.layer_bytes[..split].iter().sum();
    let streamed: u64 = input.layer_bytes[split..].iter().sum();
    assert_eq!(plan.resident_layer_bytes, resident);
    assert_eq!(plan.streamed_bytes_per_step, streamed);
    assert_eq!(
        plan.device_bytes,
        input.fixed_bytes
            + resident
            + plan.slots as u64 * plan.slot_bytes
            + input.kv_bytes()
            + input.workspace_bytes
            + input.reserve_bytes
    );
    if input.mode == OffloadMode::Model {
        assert_eq!(plan.host_bytes, input.fixed_bytes + resident + streamed);
    } else {
        assert_eq!(plan.host_bytes, streamed);
    }
    // Slots: prefetch + 1 (capped by the streamed count) of the largest streamed layer.
    let n_streamed = plan.host_layers();
    if input.mode == OffloadMode::Model || n_streamed == 0 {
        assert_eq!((plan.slots, plan.slot_bytes), (0, 0));
        assert_eq!(plan.estimated_decode_tokens_per_s, None);
    } else {
        assert_eq!(plan.slots, (input.prefetch + 1).min(n_streamed));
        let largest = input.layer_bytes[split..].iter().max().copied();
        assert_eq!(Some(plan.slot_bytes), largest);
    }
}

#[test]
fn modes_place_layers_as_documented() {
    struct Case {
        name: &'static str,
        mode: OffloadMode,
        layers: Vec<u64>,
        fixed: u64,
        budget: u64,
        prefetch: usize,
        homes: &'static str,
        slots: usize,
        device: u64,
    }
    let ten = vec![10 * MIB; 4];
    let cases = [
        Case {
            name: "none fits",
            mode: OffloadMode::None,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 45 * MIB,
            prefetch: 2,
            homes: "DDDD",
            slots: 0,
            device: 45 * MIB,
        },
        Case {
            name: "model sized like none",
            mode: OffloadMode::Model,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 100 * MIB,
            prefetch: 2,
            homes: "DDDD",
            slots: 0,
            device: 45 * MIB,
        },
        Case {
            name: "auto with a big budget is none",
            mode: OffloadMode::Auto,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 10 * GIB,
            prefetch: 2,
            homes: "DDDD",
            slots: 0,
            device: 45 * MIB,
        },
        Case {
            // 5 + 2 x 10 + 10 + 10 = 45 > 44; 5 + 10 + 2 x 10 = 35 fits (one on device).
            name: "auto splits",
            mode: OffloadMode::Auto,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 44 * MIB,
            prefetch: 1,
            homes: "DHHH",
            slots: 2,
            device: 35 * MIB,
        },
        Case {
            name: "auto with a tiny budget streams everything",
            mode: OffloadMode::Auto,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 25 * MIB,
            prefetch: 1,
            homes: "HHHH",
            slots: 2,
            device: 25 * MIB,
        },
        Case {
            name: "sequential with a big budget still streams",
            mode: OffloadMode::Sequential,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 10 * GIB,
            prefetch: 2,
            homes: "HHHH",
            slots: 3,
            device: 35 * MIB,
        },
        Case {
            name: "prefetch 0 has one slot",
            mode: OffloadMode::Sequential,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 15 * MIB,
            prefetch: 0,
            homes: "HHHH",
            slots: 1,
            device: 15 * MIB,
        },
        Case {
            name: "slots never exceed the streamed layers",
            mode: OffloadMode::Sequential,
            layers: ten.clone(),
            fixed: 5 * MIB,
            budget: 100 * MIB,
            prefetch: 8,
            homes: "HHHH",
            slots: 4,
            device: 45 * MIB,
        },
        Case {
            // Slots are sized by the largest *streamed* layer: streaming the big first layer
            // would need 2 x 40 MiB, so auto keeps it and streams the small tail (40 + 2 x 4).
            name: "slot size follows the streamed suffix",
            mode: OffloadMode::Auto,
            layers: vec![40 * MIB, 4 * MIB, 4 * MIB, 4 * MIB],
            fixed: 0,
            budget: 50 * MIB,
            prefetch: 1,
            homes: "DHHH",
            slots: 2,
            device: 48 * MIB,
        },
        Case {
            name: "no layers",
            mode: OffloadMode::Sequential,
            layers: vec![],
            fixed: 5 * MIB,
            budget: 5 * MIB,
            prefetch: 2,
            homes: "",
            slots: 0,
            device: 5 * MIB,
        },
    ];
    for case in cases {
        let mut input = input(case.mode, case.layers, case.fixed, case.budget);
        input.prefetch = case.prefetch;
        let plan = plan(&input).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(homes(&plan), case.homes, "{}", case.name);
        assert_eq!(plan.slots, case.slots, "{}", case.name);
        assert_eq!(plan.device_bytes, case.device, "{}", case.name);
        check_invariants(&input, &plan);
    }
}

#[test]
fn errors_name_bytes_and_alternatives() {
    struct Case {
        name: &'static str,
        mode: OffloadMode,
        layers: Vec<u64>,
        fixed: u64,
        budget: u64,
        expect: &'static str,
    }
    let cases = [
        Case {
            name: "none suggests auto and sequential",
            mode: OffloadMode::None,
            layers: vec![10 * MIB; 8],
            fixed: 5 * MIB,
            budget: 80 * MIB,
            expect: "the model needs 85.0 MiB on the device, budget 80.0 MiB: use --offload auto (fits with 4 of 8 layers on the device) or --offload sequential (needs 35.0 MiB)",
        },
        Case {
            name: "model says it cannot be resident",
            mode: OffloadMode::Model,
            layers: vec![10 * MIB; 8],
            fixed: 5 * MIB,
            budget: 80 * MIB,
            expect: "offload mode `model` cannot make the model resident: it needs 85.0 MiB on the device, budget 80.0 MiB: use --offload auto (fits with 4 of 8 layers",
        },
        Case {
            name: "budget smaller than the fixed parts",
            mode: OffloadMode::Auto,
            layers: vec![10 * MIB; 4],
            fixed: 50 * MIB,
            budget: 40 * MIB,
            expect: "offload mode `auto` needs at least 80.0 MiB on the device (fixed parts, KV cache, workspace, reserve and 3 slot(s) of 10.0 MiB), budget 40.0 MiB",
        },
        Case {
            name: "one layer larger than the budget",
            mode: OffloadMode::Sequential,
            layers: vec![MIB, 100 * MIB, MIB],
            fixed: 0,
            budget: 99 * MIB,
            expect: "offload mode `sequential` needs at least 300.0 MiB on the device (fixed parts, KV cache, workspace, reserve and 3 slot(s) of 100.0 MiB), budget 99.0 MiB",
        },
        Case {
            name: "nothing fits at all",
            mode: OffloadMode::None,
            layers: vec![10 * MIB; 4],
            fixed: 50 * MIB,
            budget: 40 * MIB,
            expect: "no offload mode fits: streaming every layer it can still needs 80.0 MiB",
        },
    ];
    for case in cases {
        let input = input(case.mode, case.layers, case.fixed, case.budget);
        let error = plan(&input).expect_err(case.name).to_string();
        assert!(
            error.contains(case.expect),
            "{}: `{error}` lacks `{}`",
            case.name,
            case.expect
        );
    }
}

#[test]
fn a_layer_too_big_for_the_ring_is_kept_resident_by_auto_when_possible() {
    // Everything resident needs 105 MiB. Streaming the 100 MiB layer needs a 100 MiB slot;
    // keeping layers 0-1 resident and streaming the 1 MiB tail through one slot needs 102 MiB.
    let mut input = input(
        OffloadMode::Auto,
        vec![MIB, 100 * MIB, MIB, MIB, MIB, MIB],
        0,
        102 * MIB,
    );
    input.prefetch = 0;
    let plan = plan(&input).expect("fits");
    assert_eq!(homes(&plan), "DDHHHH");
    assert_eq!((plan.slots, plan.slot_bytes), (1, MIB));
    assert_eq!(plan.device_bytes, 102 * MIB);
    check_invariants(&input, &plan);
}

#[test]
fn none_error_mentions_a_dtype_that_fits() {
    let mut input = input(OffloadMode::None, vec![40 * MIB; 4], 20 * MIB, 100 * MIB);
    input.dtype_alternatives = vec![DtypeAlternative {
        label: "--dtype bf16".into(),
        layer_bytes: vec![20 * MIB; 4],
        fixed_bytes: 10 * MIB,
    }];
    let error = plan(&input).expect_err("180 MiB > 100 MiB").to_string();
    assert!(error.contains("--dtype bf16 (needs 90.0 MiB)"), "{error}");
}

#[test]
fn kv_workspace_and_reserve_count_against_the_budget() {
    let mut input = input(OffloadMode::Auto, vec![10 * MIB; 4], 0, 100 * MIB);
    input.max_batch = 2;
    input.max_context = 1024;
    input.kv_bytes_per_token_per_layer = 1024; // 2 x 1024 x 4 x 1 KiB = 8 MiB
    input.workspace_bytes = 7 * MIB;
    input.reserve_bytes = 20 * MIB;
    input.link_bandwidth = Some(100 * MIB);
    let plan = plan(&input).expect("fits");
    assert_eq!(plan.kv_bytes, 8 * MIB);
    // base 35 MiB; all resident needs 75 MiB.
    assert_eq!(homes(&plan), "DDDD");
    assert_eq!(plan.device_bytes, 75 * MIB);
    check_invariants(&input, &plan);

    input.budget_bytes = 74 * MIB;
    let plan = super::plan(&input).expect("fits");
    // k=3 -> 35 + 30 + 10 = 75 > 74; k=2 -> 35 + 20 + 2 x 10 = 75 > 74; k=1 -> 35 + 10 + 3 x 10 = 75; k=0 -> 35 + 30 = 65.
    assert_eq!(homes(&plan), "HHHH");
    assert_eq!(plan.streamed_bytes_per_step, 40 * MIB);
    assert_eq!(plan.estimated_decode_tokens_per_s, Some(2.5));
    check_invariants(&input, &plan);
}

#[test]
fn device_total_never_exceeds_any_budget() {
    let shapes: [(Vec<u64>, u64); 3] = [
        (vec![10 * MIB; 12], 7 * MIB),
        (
            (0..9).map(|i| (i % 4 + 1) * 3 * MIB + i * 1000).collect(),
            MIB + 17,
        ),
        (vec![33 * MIB, MIB, 2 * MIB, 40 * MIB, 5 * MIB], 0),
    ];
    let mut successes = 0;
    for (layers, fixed) in shapes {
        let total: u64 = layers.iter().sum::<u64>() + fixed;
        for mode in [
            OffloadMode::None,
            OffloadMode::Auto,
            OffloadMode::Sequential,
            OffloadMode::Model,
        ] {
            for prefetch in [0, 1, 2, 5] {
                let mut last_device_layers = 0;
                // Budgets from far too small to more than enough, in uneven steps.
                for step in 0..400u64 {
                    let budget = step * (total + 4 * MIB) / 300 + step % 7;
                    let mut input = input(mode, layers.clone(), fixed, budget);
                    input.prefetch = prefetch;
                    input.reserve_bytes = MIB / 2;
                    input.max_context = 64;
                    input.kv_bytes_per_token_per_layer = 512;
                    if let Ok(plan) = plan(&input) {
                        successes += 1;
                        check_invariants(&input, &plan);
                        if mode == OffloadMode::Auto {
                            // A bigger budget never keeps fewer layers resident.
                            assert!(plan.device_layers() >= last_device_layers);
                            last_device_layers = plan.device_layers();
                        }
                    }
                }
            }
        }
    }
    assert!(successes > 1000, "only {successes} plans succeeded");
}

#[test]
fn auto_with_room_for_everything_equals_none() {
    let mut base = input(OffloadMode::None, vec![7 * MIB; 6], 3 * MIB, GIB);
    base.kv_bytes_per_token_per_layer = 256;
    base.max_context = 100;
    let none = plan(&base).expect("fits");
    let auto = plan(&PlanInput {
        mode: OffloadMode::Auto,
        ..base.clone()
    })
    .expect("fits");
    assert_eq!(auto.layers, none.layers);
    assert_eq!(auto.device_bytes, none.device_bytes);
    assert_eq!((auto.slots, auto.host_bytes), (0, 0));
}

#[test]
fn budgets_resolve_against_free_memory() {
    assert_eq!(resolve_budget(MemoryBudget::Bytes(123), 0).ok(), Some(123));
    assert_eq!(
        resolve_budget(MemoryBudget::FractionOfFree(0.75), 4 * GIB).ok(),
        Some(3 * GIB)
    );
    assert_eq!(
        resolve_budget(MemoryBudget::FractionOfFree(0.5), 1001).ok(),
        Some(500)
    );
    assert_eq!(
        resolve_budget(MemoryBudget::FractionOfFree(1.0), 80 * GIB).ok(),
        Some(80 * GIB)
    );
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        assert!(
            resolve_budget(MemoryBudget::FractionOfFree(bad), GIB).is_err(),
            "{bad}"
        );
    }
}
