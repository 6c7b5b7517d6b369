use super::*;
use crate::plan::KvLayout;
use ferry_config::OffloadMode;
use ferry_model::kv_format::KvFormat;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// 4 layers of 10 MiB, 5 MiB of fixed parts, 1 KiB of KV per token per layer (4 KiB a token),
/// and a workspace of 64 bytes per (token of context x sequence).
fn model(mode: OffloadMode, budget: u64) -> impl Fn(usize, usize) -> PlanInput {
    move |max_context, max_batch| {
        let mut input = PlanInput::new(mode, vec![10 * MIB; 4], 5 * MIB, budget);
        input.max_context = max_context;
        input.max_batch = max_batch;
        input.kv_bytes_per_token_per_layer = KIB;
        input.workspace_bytes = 64 * (max_context * max_batch) as u64;
        input.prefetch = 1;
        input
    }
}

fn unset(model_context: usize) -> CacheRequest {
    CacheRequest {
        max_context: None,
        max_batch: None,
        model_context,
        kv_dtype: Origin::Default,
        kv_offload: KvOffload::Off,
        host_free_bytes: None,
        device_in_host_memory: false,
    }
}

/// Device bytes with every layer resident: 45 MiB + (4 KiB + 64 B) a token of every sequence.
fn resident(context: usize, batch: usize) -> u64 {
    45 * MIB + (4 * KIB + 64) * (context * batch) as u64
}

#[test]
fn the_defaults_stay_when_they_fit() {
    let fitted = fit(&unset(8192), &model(OffloadMode::Auto, 1024 * MIB)).expect("fits");
    let plan = &fitted.plan;
    assert_eq!(
        (plan.max_context, plan.max_batch),
        (8192, DEFAULT_MAX_BATCH)
    );
    assert_eq!(plan.origins.max_context, Origin::Default);
    assert_eq!(plan.origins.max_batch, Origin::Default);
    assert_eq!(plan.origins.model_context, 8192);
    assert_eq!(plan.host_layers(), 0);
    assert_eq!(fitted.reason, None, "nothing was lowered");
}

#[test]
fn the_context_shrinks_first_keeping_every_layer_on_the_device() {
    let budget = 300 * MIB;
    let fitted = fit(&unset(1 << 20), &model(OffloadMode::Auto, budget)).expect("fits");
    let plan = &fitted.plan;
    assert_eq!(plan.max_batch, DEFAULT_MAX_BATCH, "the batch stays");
    assert_eq!(plan.origins.max_context, Origin::Fitted);
    assert_eq!(plan.origins.max_batch, Origin::Default);
    assert_eq!(plan.host_layers(), 0, "no layer leaves the device");
    assert!(plan.device_bytes <= budget);
    // The largest multiple of 256 that fits: one step more would not.
    let context = plan.max_context;
    assert_eq!(context % CONTEXT_STEP, 0);
    assert!(context >= CONTEXT_FLOOR);
    assert!(resident(context, 8) <= budget);
    assert!(resident(context + CONTEXT_STEP, 8) > budget);
    assert_eq!(plan.device_bytes, resident(context, 8));
    let reason = fitted.reason.expect("a log line");
    assert!(
        reason.contains(&format!(
            "`max_context` {context} (the model's 1048576, lowered)"
        )),
        "{reason}"
    );
    assert!(reason.contains("`max_batch` 8 (the default)"), "{reason}");
    assert!(
        reason.contains("every layer stays on the device"),
        "{reason}"
    );
    // What the full window would have cost: 4 KiB x 2^20 tokens x 8 = 32 GiB of KV.
    assert!(reason.contains("32.0 GiB of KV cache"), "{reason}");
}

#[test]
fn then_the_batch_shrinks_at_the_floor_context() {
    // At the floor (4096 tokens) a sequence takes 16.25 MiB: room for 3 next to the weights.
    let budget = 45 * MIB + 3 * (4 * KIB + 64) * 4096 + MIB;
    let fitted = fit(&unset(32768), &model(OffloadMode::Auto, budget)).expect("fits");
    let plan = &fitted.plan;
    assert_eq!((plan.max_context, plan.max_batch), (CONTEXT_FLOOR, 3));
    assert_eq!(plan.origins.max_batch, Origin::Fitted);
    assert_eq!(plan.origins.max_context, Origin::Fitted);
    assert_eq!(plan.host_layers(), 0);
    let reason = fitted.reason.expect("a log line");
    assert!(
        reason.contains("`max_batch` 3 (the default 8, lowered)"),
        "{reason}"
    );
}

#[test]
fn layers_move_off_the_device_last() {
    // Not even one sequence at the floor context next to every layer: 2 layers stream.
    let budget = 45 * MIB + (4 * KIB + 64) * 4096 - 5 * MIB;
    let fitted = fit(&unset(65536), &model(OffloadMode::Auto, budget)).expect("fits");
    let plan = &fitted.plan;
    assert_eq!((plan.max_context, plan.max_batch), (CONTEXT_FLOOR, 1));
    assert!(plan.host_layers() > 0);
    assert!(plan.device_bytes <= budget);
    let reason = fitted.reason.expect("a log line");
    assert!(reason.contains("stream from the host"), "{reason}");

    // Mode `none` cannot move them: the planner's refusal names the smallest cache.
    let err = fit(&unset(65536), &model(OffloadMode::None, budget)).expect_err("too small");
    let message = err.to_string();
    assert!(
        message.contains("`max_context` 4096 (the model's 65536, lowered)")
            && message.contains("`max_batch` 1 (the default 8, lowered)"),
        "{message}"
    );
    assert!(
        message.contains("the largest that fit: `max_context`"),
        "{message}"
    );
}

#[test]
fn a_window_below_the_floor_is_the_floor() {
    let budget = 45 * MIB + (4 * KIB + 64) * 2048 * 2 + MIB;
    let fitted = fit(&unset(2048), &model(OffloadMode::Auto, budget)).expect("fits");
    assert_eq!((fitted.plan.max_context, fitted.plan.max_batch), (2048, 2));
    assert_eq!(fitted.plan.origins.max_context, Origin::Default);
}

#[test]
fn set_values_are_kept_and_named_when_they_do_not_fit() {
    let budget = 300 * MIB;
    // A set context that streams layers in mode auto is honoured (it fits by streaming).
    let request = CacheRequest {
        max_context: Some(8192),
        ..unset(1 << 20)
    };
    let fitted = fit(&request, &model(OffloadMode::Auto, budget)).expect("fits");
    assert_eq!(fitted.plan.max_context, 8192);
    assert_eq!(fitted.plan.origins.max_context, Origin::Set);
    // Its batch shrank so that every layer stays (8192 x 8 would need 305 MiB in all).
    assert_eq!(fitted.plan.host_layers(), 0);
    assert_eq!(fitted.plan.origins.max_batch, Origin::Fitted);

    // Set both, far too large: even streaming every layer, the cache alone exceeds the budget.
    let request = CacheRequest {
        max_context: Some(1 << 20),
        max_batch: Some(8),
        ..unset(1 << 20)
    };
    let err = fit(&request, &model(OffloadMode::Auto, budget)).expect_err("too large");
    let message = err.to_string();
    assert!(
        message.starts_with(
            "`max_context` 1048576 (set) with `max_batch` 8 (set) need 32.0 GiB of KV cache (f32) and 512.0 MiB of workspace, and offload mode `auto` needs at least"
        ),
        "{message}"
    );
    let PlanError::CacheDoesNotFit(overflow) = &err else {
        panic!("{err:?}");
    };
    let largest = overflow
        .instead
        .strip_prefix("the largest that fit: ")
        .and_then(|rest| rest.split("; the smallest").next())
        .expect("the largest values named");
    // The largest context named fits at that batch, and one token more does not (streaming
    // every layer: 5 MiB fixed + 2 slots of 10 MiB).
    let context: usize = largest
        .strip_prefix("`max_context` ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{largest}"));
    let ring = 25 * MIB;
    assert!(
        ring + (4 * KIB + 64) * (context * 8) as u64 <= budget,
        "{largest}"
    );
    assert!(ring + (4 * KIB + 64) * ((context + 1) * 8) as u64 > budget);
    // No batch fits a million tokens, so the context is the only way out.
    assert_eq!(
        largest,
        format!("`max_context` {context} with `max_batch` 8")
    );

    // A set batch with an unset context: both ways out are named.
    let request = CacheRequest {
        max_batch: Some(64),
        ..unset(1 << 20)
    };
    let err = fit(&request, &model(OffloadMode::None, budget)).expect_err("too large");
    let PlanError::CacheDoesNotFit(overflow) = &err else {
        panic!("{err:?}");
    };
    let asked = &overflow.asked;
    let largest = overflow
        .instead
        .strip_prefix("the largest that fit: ")
        .and_then(|rest| rest.split("; the smallest").next())
        .expect("the largest values named");
    assert_eq!(
        asked,
        "`max_context` 4096 (the model's 1048576, lowered) with `max_batch` 64 (set)"
    );
    // 255 MiB next to the weights at 4160 bytes a token: 4096 x 15 fits, 16 does not; 64 x
    // 1004 fits, 64 x 1005 does not.
    assert_eq!(
        largest,
        "`max_context` 1004 with `max_batch` 64, or `max_batch` 15 with `max_context` 4096"
    );
}

#[test]
fn weights_that_cannot_fit_get_the_planners_own_error() {
    // Mode none, 45 MiB of weights, 40 MiB of budget: no cache is small enough.
    let err = fit(&unset(8192), &model(OffloadMode::None, 40 * MIB)).expect_err("too small");
    assert!(matches!(err, PlanError::DoesNotFit { .. }), "{err:?}");
}

#[test]
fn sequential_keeps_the_defaults_when_the_ring_fits() {
    let fitted = fit(&unset(8192), &model(OffloadMode::Sequential, 400 * MIB)).expect("fits");
    assert_eq!(
        (fitted.plan.max_context, fitted.plan.max_batch),
        (8192, DEFAULT_MAX_BATCH)
    );
    assert_eq!(fitted.plan.host_layers(), 4);
    assert_eq!(fitted.reason, None);
}

/// A Gemma-3-1B-like shape: 26 layers of 1 MiB, 22 of them sliding-window layers that keep at
/// most 1280 positions (a 512 window, the slack and a 512-token step), 1 KiB of KV per token
/// and layer; one sequence, no workspace.
fn windowed(window_layers: usize, budget: u64) -> impl Fn(usize, usize) -> PlanInput {
    move |max_context, max_batch| {
        let mut input = PlanInput::new(OffloadMode::Auto, vec![MIB; 26], MIB, budget);
        input.max_context = max_context;
        input.max_batch = max_batch;
        input.kv_bytes_per_token_per_layer = KIB;
        input.kv_layout = KvLayout {
            window_layers,
            window_positions: 1280,
            per_token_by_format: Vec::new(),
            ..KvLayout::default()
        };
        input
    }
}

#[test]
fn window_layers_let_the_context_grow_about_five_fold() {
    let one = CacheRequest {
        max_context: None,
        max_batch: Some(1),
        model_context: 1 << 17,
        kv_dtype: Origin::Default,
        kv_offload: KvOffload::Off,
        host_free_bytes: None,
        device_in_host_memory: false,
    };
    // The KV cache gets 26 layers x 8192 positions of 1 KiB when every layer holds them all.
    let budget = 27 * MIB + 26 * 8192 * KIB;
    let full = fit(&one, &windowed(0, budget)).expect("fits").plan;
    let with_windows = fit(&one, &windowed(22, budget)).expect("fits").plan;
    assert_eq!(full.max_context, 8192);
    assert!(
        with_windows.max_context >= 5 * full.max_context,
        "{} with window layers, {} without",
        with_windows.max_context,
        full.max_context
    );
    // The bytes: 4 global layers at the context, 22 at their 1280 positions.
    let expected = (4 * with_windows.max_context as u64 + 22 * 1280) * KIB;
    assert_eq!(with_windows.kv_bytes, expected);
    assert!(with_windows.device_bytes <= budget);
}

#[test]
fn kv_offload_auto_keeps_the_window_in_host_memory_when_the_device_cannot() {
    let budget = 300 * MIB;
    let auto = CacheRequest {
        kv_offload: KvOffload::Auto,
        host_free_bytes: Some(64 * 1024 * MIB),
        ..unset(1 << 16)
    };
    let fitted = fit(&auto, &model(OffloadMode::Auto, budget)).expect("fits");
    let plan = &fitted.plan;
    // The whole window and the default batch, every layer on the device, the cache on the host.
    assert_eq!(
        (plan.max_context, plan.max_batch),
        (1 << 16, DEFAULT_MAX_BATCH)
    );
    assert!(plan.kv_host);
    assert_eq!(plan.host_layers(), 0);
    assert_eq!(plan.kv_bytes, 4 * KIB * (1 << 16) * 8);
    assert_eq!(plan.device_bytes, resident(1 << 16, 8) - plan.kv_bytes);
    assert!(plan.host_bytes >= plan.kv_bytes);
    let reason = fitted.reason.expect("said why");
    assert!(reason.contains("host memory"), "{reason}");

    // When the device holds it, auto keeps it there.
    let fitted = fit(&auto, &model(OffloadMode::Auto, 1 << 40)).expect("fits");
    assert!(!fitted.plan.kv_host);
    assert_eq!(fitted.reason, None);

    // When the host does not hold it either, auto shortens the context as `off` does.
    let small_host = CacheRequest {
        host_free_bytes: Some(MIB),
        ..auto
    };
    let fitted = fit(&small_host, &model(OffloadMode::Auto, budget)).expect("fits");
    let off = fit(&unset(1 << 16), &model(OffloadMode::Auto, budget)).expect("fits");
    assert!(!fitted.plan.kv_host);
    assert_eq!(fitted.plan.max_context, off.plan.max_context);
    assert!(fitted.plan.max_context < 1 << 16);
}

#[test]
fn kv_offload_on_keeps_the_cache_off_the_device_budget() {
    let on = CacheRequest {
        max_context: Some(1 << 16),
        max_batch: Some(8),
        kv_offload: KvOffload::On,
        ..unset(1 << 16)
    };
    // 45 MiB of weights and 32 MiB of workspace fit; 2 GiB of KV cache would not.
    let budget = 100 * MIB;
    let plan = fit(&on, &model(OffloadMode::None, budget))
        .expect("fits")
        .plan;
    assert!(plan.kv_host);
    assert_eq!(plan.device_bytes, 45 * MIB + 64 * (1 << 16) * 8);
    assert!(plan.device_bytes <= budget);
    assert_eq!(plan.host_bytes, plan.kv_bytes);
    let off = CacheRequest {
        kv_offload: KvOffload::Off,
        ..on
    };
    assert!(fit(&off, &model(OffloadMode::None, budget)).is_err());
}

/// A Qwen2.5-0.5B Q4_K_M on CUDA with `--max-batch 1 --gpu-memory 1GiB`: 24 layers of about
/// 13.2 MB and 145 MB of Q8_0 embedding (the file's bytes), 2 key/value heads of 64, the CUDA
/// reserve and the key-blocked workspace.
fn half_billion(kv: KvFormat, kv_host: bool) -> impl Fn(usize, usize) -> PlanInput {
    use crate::plan::DEFAULT_CUDA_RESERVE_BYTES;
    use crate::sizing::{kv_bytes_per_token_per_layer, workspace_bytes, WorkspaceInput};
    move |max_context, max_batch| {
        let mut input = PlanInput::new(
            OffloadMode::Auto,
            vec![13_200_000; 24],
            145_000_000,
            1 << 30,
        );
        input.max_context = max_context;
        input.max_batch = max_batch;
        input.kv_bytes_per_token_per_layer =
            kv_bytes_per_token_per_layer(ferry_model::kv_cache::KvShape::gqa(2, 64), kv);
        input.kv_dtype = kv;
        input.kv_host = kv_host;
        input.reserve_bytes = DEFAULT_CUDA_RESERVE_BYTES;
        input.workspace_bytes = workspace_bytes(&WorkspaceInput {
            hidden_size: 896,
            vocab_size: 151_936,
            n_heads: 14,
            max_batch,
            prefill_chunk: 512,
            score_block: ferry_model::decoder::attention::KEY_BLOCK.min(max_context),
        });
        input
    }
}

#[test]
fn a_half_billion_model_keeps_its_32k_window_at_1_gib_with_the_cache_on_the_host() {
    use candle_core::DType;
    let request = CacheRequest {
        max_batch: Some(1),
        ..unset(32768)
    };
    // f16 on the device: the window does not fit beside the weights, the fit shortens it.
    let f16 = KvFormat::Dense(DType::F16);
    let on_device = fit(&request, &half_billion(f16, false)).expect("fits").plan;
    assert!(on_device.max_context < 32768, "{}", on_device.max_context);
    assert!(!on_device.kv_host);
    // q8_0, which CUDA keeps in host memory: the whole window, every layer on the device.
    let q8 = CacheRequest {
        kv_offload: KvOffload::On,
        ..request
    };
    let plan = fit(&q8, &half_billion(KvFormat::Q8_0, false))
        .expect("fits")
        .plan;
    assert_eq!(plan.max_context, 32768);
    assert!(plan.kv_host && plan.host_layers() == 0);
    assert_eq!(plan.kv_bytes, 24 * 32768 * 272);
    // f16 with `auto` and a host that holds it: the same.
    let auto = CacheRequest {
        kv_offload: KvOffload::Auto,
        host_free_bytes: Some(8 << 30),
        ..request
    };
    let plan = fit(&auto, &half_billion(f16, false)).expect("fits").plan;
    assert_eq!(plan.max_context, 32768);
    assert!(plan.kv_host && plan.host_layers() == 0);
}

#[test]
fn a_fitted_plan_says_why_in_its_notes() {
    let fitted = fit(&unset(1 << 20), &model(OffloadMode::Auto, 300 * MIB)).expect("fits");
    let reason = fitted.reason.as_deref().expect("lowered");
    assert_eq!(fitted.plan.notes.first().map(String::as_str), Some(reason));
    assert!(reason.starts_with("fitted"), "{reason}");
}

#[test]
fn a_refusal_names_the_smallest_budget_that_fits() {
    // Set values, far too large for 100 MiB: the error names the budget that holds them.
    let request = CacheRequest {
        max_context: Some(8192),
        max_batch: Some(8),
        ..unset(8192)
    };
    let error = fit(&request, &model(OffloadMode::Auto, 100 * MIB)).expect_err("too small");
    let text = error.to_string();
    let kib: u64 = text
        .split("the smallest budget that fits them: ")
        .nth(1)
        .and_then(|rest| rest.split("KiB ").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no smallest budget in: {text}"));
    assert!(text.contains(&format!("`--gpu-memory {kib}KiB`")), "{text}");
    // That budget plans the same values; one KiB less does not.
    assert!(
        fit(&request, &model(OffloadMode::Auto, kib * KIB)).is_ok(),
        "{text}"
    );
    assert!(fit(&request, &model(OffloadMode::Auto, (kib - 1) * KIB)).is_err());
}

#[test]
fn a_plan_whose_host_bytes_exceed_the_hosts_free_memory_is_refused() {
    // Budget for one resident layer: three stream from the host (30 MiB there).
    let request = CacheRequest {
        max_context: Some(256),
        max_batch: Some(1),
        host_free_bytes: Some(20 * MIB),
        ..unset(256)
    };
    let budget = resident(256, 1) - 20 * MIB;
    match fit(&request, &model(OffloadMode::Auto, budget)) {
        Err(PlanError::HostMemory { needed, free, .. }) => {
            assert_eq!(free, 20 * MIB);
            assert!(needed > free, "{needed}");
        }
        other => panic!("expected HostMemory, got {other:?}"),
    }
    let roomy = CacheRequest {
        host_free_bytes: Some(64 * MIB),
        ..request
    };
    let plan = fit(&roomy, &model(OffloadMode::Auto, budget))
        .expect("host holds it")
        .plan;
    assert!(plan.host_bytes > 20 * MIB && plan.host_bytes <= 64 * MIB);
}

#[test]
fn on_the_cpu_device_the_device_bytes_count_as_host_memory_too() {
    // Three layers stream from the host; the resident one, cache and workspace are "device"
    // bytes, which the CPU device also keeps in host memory.
    let request = CacheRequest {
        max_context: Some(256),
        max_batch: Some(1),
        host_free_bytes: Some(64 * MIB),
        ..unset(256)
    };
    let budget = resident(256, 1) - 20 * MIB;
    let plan = fit(&request, &model(OffloadMode::Auto, budget))
        .expect("host bytes alone fit")
        .plan;
    let both = plan.host_bytes + plan.device_bytes;
    assert!(plan.host_bytes <= 64 * MIB && both > 64 * MIB, "{both}");
    let cpu = CacheRequest {
        device_in_host_memory: true,
        ..request
    };
    match fit(&cpu, &model(OffloadMode::Auto, budget)) {
        Err(e @ PlanError::HostMemory { .. }) => {
            let PlanError::HostMemory {
                needed,
                free,
                device,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(
                (*needed, *free, *device),
                (both, 64 * MIB, plan.device_bytes)
            );
            assert!(e.to_string().contains("and the CPU device's"), "{e}");
        }
        other => panic!("expected HostMemory, got {other:?}"),
    }
    let roomy = CacheRequest {
        host_free_bytes: Some(both),
        ..cpu
    };
    assert!(fit(&roomy, &model(OffloadMode::Auto, budget)).is_ok());
}
