//! Qwen3.5-MoE (issue 29), a model whose Gated DeltaNet layers keep a recurrent state, served by
//! the real engine from its llama.cpp fixture (tests/fixtures/arch-llamacpp/qwen35moe.gguf):
//! the prefix cache is off for it (a state cannot be split into blocks), so a server with the
//! cache enabled answers exactly as one without; `n = 3` seeded choices, which start from copies
//! of choice 0's state, equal three single requests with their seeds; a cancelled request frees
//! its sequence (the KV gauge back to 0); and `ferry plan` says the states do not grow with
//! the context.

use std::time::{Duration, Instant};

use candle_core::Device;

use ferry::config::{DtypeChoice, OffloadMode};
use ferry::engine::traits::TextCodec;
use ferry::engine::worker::{EngineHandle, EngineOptions};
use ferry::engine::{
    Backend, GenerationEvent, GenerationParams, GenerationRequest, PrefixCacheOptions,
};
use ferry::metrics::Metrics;
use ferry::runtime::load::load_for_serving_on;

use crate::offload_modes::{device_config, hub};
use crate::real_model;

const MODEL: &str = "qwen35moe";

fn fixture() -> std::path::PathBuf {
    crate::fixtures::path("arch-llamacpp").join("qwen35moe.gguf")
}

/// An engine serving the fixture with `prefix_cache` and `metrics`.
fn engine(prefix_cache: PrefixCacheOptions, metrics: &Metrics) -> EngineHandle {
    let mut config = real_model::offloaded(DtypeChoice::F32, OffloadMode::None);
    config.name = MODEL.into();
    config.source = fixture().to_string_lossy().into_owned();
    config.max_context = Some(64);
    config.max_batch = Some(4);
    let loaded = load_for_serving_on(&config, &device_config(), &Device::Cpu, &hub())
        .expect("the fixture loads");
    let engine = EngineHandle::with_options(
        [MODEL],
        EngineOptions {
            prefix_cache,
            metrics: metrics.clone(),
            ..EngineOptions::default()
        },
    );
    engine
        .model_ready(
            MODEL,
            loaded.runner,
            loaded.codec as std::sync::Arc<dyn TextCodec>,
        )
        .expect("engine starts");
    engine
}

/// A request for `max_tokens` tokens after `prompt` (token ids), at `temperature` with `seed`.
fn request(
    prompt: &[u32],
    max_tokens: usize,
    temperature: f32,
    seed: Option<u64>,
) -> GenerationRequest {
    let mut params = GenerationParams {
        max_tokens,
        ..GenerationParams::default()
    };
    params.sampling.temperature = temperature;
    params.sampling.seed = seed;
    params.ignore_eos = true;
    GenerationRequest {
        cache_partition: None,
        model: MODEL.into(),
        prompt: prompt.to_vec(),
        params,
    }
}

/// The token ids a receiver yields until the request finishes.
fn collect(mut events: tokio::sync::mpsc::Receiver<GenerationEvent>) -> Vec<u32> {
    let mut tokens = Vec::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Token(t) => tokens.push(t.token_id),
            GenerationEvent::Finished { .. } => return tokens,
            GenerationEvent::Failed(e) => panic!("failed: {e}"),
        }
    }
    panic!("the request ended without finishing")
}

/// A prompt of 40 tokens (several prefix-cache blocks' worth at a small block size).
fn prompt() -> Vec<u32> {
    (0..40).map(|i| 3 + (i * 37 % 380) as u32).collect()
}

#[test]
fn the_prefix_cache_is_off_and_greedy_answers_are_the_same() {
    let metrics = Metrics::new();
    let small_blocks = PrefixCacheOptions {
        block_tokens: 8,
        exact_chunk_rows: 1,
        ..PrefixCacheOptions::default()
    };
    let on = engine(small_blocks, &metrics);
    let off = engine(
        PrefixCacheOptions {
            enabled: false,
            ..PrefixCacheOptions::default()
        },
        &Metrics::new(),
    );
    let prompt = prompt();
    let reference = collect(off.submit(request(&prompt, 12, 0.0, None)).unwrap());
    assert_eq!(reference.len(), 12);
    // Twice on the server with the cache: the second would reuse the first's prefix if the
    // model let it.
    for turn in 0..2 {
        let tokens = collect(on.submit(request(&prompt, 12, 0.0, None)).unwrap());
        assert_eq!(tokens, reference, "turn {turn}");
    }
    // A longer prompt that starts with the first: still the same as without the cache.
    let mut longer = prompt.clone();
    longer.extend_from_slice(&reference);
    let expected = collect(off.submit(request(&longer, 6, 0.0, None)).unwrap());
    assert_eq!(
        collect(on.submit(request(&longer, 6, 0.0, None)).unwrap()),
        expected
    );
}

#[test]
fn seeded_choices_from_a_forked_state_equal_single_requests() {
    let engine = engine(PrefixCacheOptions::default(), &Metrics::new());
    let prompt = prompt();
    let base = request(&prompt, 10, 1.0, Some(11));
    let choices: Vec<Vec<u32>> = engine
        .submit_choices(base.clone(), 3)
        .unwrap()
        .into_iter()
        .map(collect)
        .collect();
    for (i, choice) in choices.iter().enumerate() {
        let alone = collect(engine.submit(base.for_choice(i)).unwrap());
        assert_eq!(
            choice,
            &alone,
            "choice {i} = a request with seed {}",
            11 + i
        );
    }
    assert!(
        choices.iter().any(|c| c != &choices[0]),
        "sampled choices differ: {choices:?}"
    );
}

#[test]
fn a_cancelled_request_frees_its_state() {
    let metrics = Metrics::new();
    let engine = engine(PrefixCacheOptions::default(), &metrics);
    let mut events = engine.submit(request(&prompt(), 20, 0.0, None)).unwrap();
    for _ in 0..3 {
        match events.blocking_recv() {
            Some(GenerationEvent::Token(_)) => {}
            other => panic!("ended early: {other:?}"),
        }
    }
    assert!(metrics.model_kv_usage(MODEL).0 > 0, "the sequence is held");
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(20);
    while metrics.model_kv_usage(MODEL).0 != 0 {
        assert!(Instant::now() < deadline, "the sequence was not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The engine serves on after the cancellation.
    assert_eq!(
        collect(engine.submit(request(&prompt(), 4, 0.0, None)).unwrap()).len(),
        4
    );
}

#[test]
fn ferry_plan_counts_the_recurrent_states_per_sequence() {
    let (ok, stdout, stderr) = crate::fit::ferry_plan(&fixture(), &["--max-context", "64"]);
    assert!(ok, "{stderr}");
    // 3 of 4 layers: (3 taps x 128 channels + 4 heads x 16 x 16) f32 = 5632 B each.
    assert!(
        stdout.contains("3 of 4 layers keep a recurrent state instead, 16.5 KiB per sequence, which does not grow with the context"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the prefix cache and speculation are off for this model"),
        "{stdout}"
    );
}
