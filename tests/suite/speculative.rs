//! Speculative decoding on the real SmolLM2 GGUF, on the CPU device: a verification pass
//! computes the logits after every proposed token exactly as decoding them one at a time does
//! (quantized, dequantized to f32 and streamed), forgetting rejected positions leaves the
//! sequence as if they were never fed, and greedy replies with prompt lookup or a draft model
//! are the replies without it, resident and streamed (`offload sequential`), with the proposals
//! counted. The draft is the default model itself (Q4_1) beside the model served in f32: the
//! same vocabulary, different logits. A draft with another vocabulary is refused at load, the
//! draft's caches are freed when a request is cancelled, and `ferry plan` places it first.

use crate::offload_modes::{device_config, hub};
use crate::real_model;
use crate::tiny::Tiny;
use real_model::{model_path, MODEL};

use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use ferry::config::{DtypeChoice, OffloadMode, SpeculativeMethod};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::engine::worker::{EngineHandle, EngineOptions};
use ferry::engine::{Backend, GenerationEvent, GenerationParams, GenerationRequest};
use ferry::metrics::Metrics;
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::{load_for_serving_on, LoadedForServing};
use ferry::runtime::telemetry::Telemetry;

fn load(dtype: DtypeChoice, mode: OffloadMode, method: SpeculativeMethod) -> LoadedForServing {
    let mut config = real_model::offloaded(dtype, mode);
    config.max_context = Some(512);
    config.max_batch = Some(4);
    config.speculative.method = method;
    config.speculative.tokens = 6;
    if method == SpeculativeMethod::Draft {
        config.speculative.draft = Some(model_path().to_string_lossy().into_owned());
    }
    load_for_serving_on(&config, &device_config(), &Device::Cpu, &hub()).expect("loads")
}

/// Feeds `prompt`, then `tokens` one step each; returns the logits after each of `tokens`.
fn one_at_a_time(runner: &mut ModelRunner, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut seq = runner.new_sequence();
    runner.forward(&mut seq, prompt).expect("prefill");
    tokens
        .iter()
        .map(|&t| runner.forward(&mut seq, &[t]).expect("decode"))
        .collect()
}

#[test]
fn a_verification_pass_gives_the_logits_of_decoding_one_token_at_a_time() {
    for (dtype, mode) in [
        (DtypeChoice::Auto, OffloadMode::None),
        (DtypeChoice::F32, OffloadMode::None),
        (DtypeChoice::Auto, OffloadMode::Sequential),
    ] {
        let loaded = load(dtype, mode, SpeculativeMethod::None);
        let mut runner = loaded.runner;
        let prompt = loaded
            .codec
            .encode("def add(a, b):\n    return", true)
            .unwrap();
        let tokens = loaded
            .codec
            .encode(" a + b\n\ndef sub(a, b", false)
            .unwrap();
        assert!(tokens.len() >= 8, "{tokens:?}");
        let expected = one_at_a_time(&mut runner, &prompt, &tokens);
        // The prompt, then the first token and its proposals in one step with a row each,
        // beside another sequence's plain decode step.
        let mut seq = runner.new_sequence();
        let mut other = runner.new_sequence();
        runner.forward(&mut seq, &prompt).unwrap();
        runner.forward(&mut other, &prompt).unwrap();
        let rows = runner
            .forward_rows(
                &mut [(&mut seq, &tokens[..6]), (&mut other, &tokens[..1])],
                &[6, 1],
            )
            .unwrap();
        assert_eq!(rows.len(), 7);
        for (i, row) in rows[..6].iter().enumerate() {
            assert!(row == &expected[i], "{dtype:?} {mode:?}: row {i} differs");
        }
        assert!(
            rows[6] == expected[0],
            "{dtype:?} {mode:?}: the plain decode"
        );
        // Reject all but two: the sequence goes on as if the others were never fed.
        runner
            .truncate_sequence(&mut seq, prompt.len() + 3)
            .unwrap();
        let next = runner
            .forward_rows(&mut [(&mut seq, &tokens[3..8])], &[5])
            .unwrap();
        for (i, row) in next.iter().enumerate() {
            assert!(
                row == &expected[3 + i],
                "{dtype:?} {mode:?}: row {} after",
                3 + i
            );
        }
        let err = runner.truncate_sequence(&mut seq, 10_000).unwrap_err();
        assert!(err.to_string().contains("cannot keep"), "{err}");
    }
}

/// An engine serving the default model as `load` makes it, reporting into `metrics`.
fn engine(
    dtype: DtypeChoice,
    mode: OffloadMode,
    method: SpeculativeMethod,
    metrics: &Metrics,
) -> EngineHandle {
    serve(load(dtype, mode, method), metrics)
}

/// An engine serving `loaded`, reporting into `metrics`.
fn serve(loaded: LoadedForServing, metrics: &Metrics) -> EngineHandle {
    let engine = EngineHandle::with_options(
        [MODEL],
        EngineOptions {
            metrics: metrics.clone(),
            ..EngineOptions::default()
        },
    );
    engine
        .model_ready(MODEL, loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .unwrap();
    engine
}

/// The greedy reply's token ids to each prompt (as chat turns), all submitted at once.
fn replies(engine: &EngineHandle, prompts: &[&str], max_tokens: usize) -> Vec<Vec<u32>> {
    sampled_replies(engine, prompts, max_tokens, 0.0, None)
}

/// [`replies`] sampled at `temperature` with `seed` (`None`: no seed).
fn sampled_replies(
    engine: &EngineHandle,
    prompts: &[&str],
    max_tokens: usize,
    temperature: f32,
    seed: Option<u64>,
) -> Vec<Vec<u32>> {
    let receivers: Vec<_> = prompts
        .iter()
        .map(|text| {
            let messages = vec![ferry::engine::ChatMessage {
                role: "user".into(),
                content: (*text).into(),
                ..Default::default()
            }];
            let prompt = engine.encode_chat(MODEL, &messages, true, false).unwrap();
            let mut params = GenerationParams {
                max_tokens,
                ..GenerationParams::default()
            };
            params.sampling.temperature = temperature;
            params.sampling.seed = seed;
            engine
                .submit(GenerationRequest {
                    cache_partition: None,
                    model: MODEL.into(),
                    prompt,
                    params,
                })
                .unwrap()
        })
        .collect();
    receivers
        .into_iter()
        .map(|mut events| {
            let mut tokens = Vec::new();
            while let Some(event) = events.blocking_recv() {
                match event {
                    GenerationEvent::Token(t) => tokens.push(t.token_id),
                    GenerationEvent::Finished { .. } => break,
                    GenerationEvent::Failed(err) => panic!("{err}"),
                }
            }
            tokens
        })
        .collect()
}

const PROMPTS: [&str; 3] = [
    "Repeat this code exactly, but rename `total` to `sum`:\n\ndef add_all(items):\n    total = 0\n    for item in items:\n        total += item\n    return total\n",
    "Write the numbers from one to twelve in words, separated by commas.",
    "What is the capital of France?",
];

#[test]
fn greedy_replies_with_prompt_lookup_are_the_replies_without_it() {
    for mode in [OffloadMode::None, OffloadMode::Sequential] {
        let plain = replies(
            &engine(
                DtypeChoice::Auto,
                mode,
                SpeculativeMethod::None,
                &Metrics::new(),
            ),
            &PROMPTS,
            64,
        );
        let metrics = Metrics::new();
        let fast = replies(
            &engine(DtypeChoice::Auto, mode, SpeculativeMethod::Ngram, &metrics),
            &PROMPTS,
            64,
        );
        assert_eq!(fast, plain, "{mode:?}");
        let (drafted, accepted) = metrics.speculation_counts(MODEL);
        assert!(
            accepted > 0 && drafted >= accepted,
            "{mode:?}: {accepted} of {drafted}"
        );
    }
}

#[test]
fn greedy_replies_with_a_draft_model_are_the_replies_without_it() {
    for mode in [OffloadMode::None, OffloadMode::Sequential] {
        let plain = replies(
            &engine(
                DtypeChoice::F32,
                mode,
                SpeculativeMethod::None,
                &Metrics::new(),
            ),
            &PROMPTS,
            48,
        );
        let metrics = Metrics::new();
        let fast = replies(
            &engine(DtypeChoice::F32, mode, SpeculativeMethod::Draft, &metrics),
            &PROMPTS,
            48,
        );
        assert_eq!(fast, plain, "{mode:?}");
        let (drafted, accepted) = metrics.speculation_counts(MODEL);
        assert!(
            accepted > 0 && drafted >= accepted,
            "{mode:?}: {accepted} of {drafted}"
        );
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_at_load_naming_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut tiny = Tiny::llama();
    tiny.add_spm_vocab();
    let weights = tiny.random_weights(false, false);
    let path = dir.path().join("other-vocab.gguf");
    tiny.write_gguf(&path, "llama", &weights, GgmlDType::Q8_0, true);
    let mut config = real_model::offloaded(DtypeChoice::Auto, OffloadMode::None);
    config.speculative.method = SpeculativeMethod::Draft;
    config.speculative.draft = Some(path.to_string_lossy().into_owned());
    let err = load_for_serving_on(&config, &device_config(), &Device::Cpu, &hub())
        .err()
        .expect("a draft with another vocabulary is refused")
        .to_string();
    assert!(
        err.contains("vocabulary differs") && err.contains("at token 0"),
        "{err}"
    );
    assert!(
        err.contains("\"<unk>\" in the draft") && err.contains("\"<|endoftext|>\" in the model"),
        "{err}"
    );
}

#[test]
fn cancelling_a_request_frees_the_draft_models_caches() {
    let loaded = load(
        DtypeChoice::Auto,
        OffloadMode::None,
        SpeculativeMethod::Draft,
    );
    let draft = loaded.runner.draft().expect("a draft model");
    let live = draft.live_kv();
    let metrics = Metrics::new();
    let telemetry = Telemetry::new(metrics.clone(), None);
    telemetry.add_draft(MODEL, Arc::clone(draft.store().accounting()), live.clone());
    let engine = serve(loaded, &metrics);
    let messages = vec![ferry::engine::ChatMessage {
        role: "user".into(),
        content: PROMPTS[1].into(),
        ..Default::default()
    }];
    let prompt = engine.encode_chat(MODEL, &messages, true, false).unwrap();
    let mut params = GenerationParams {
        max_tokens: 400,
        ..GenerationParams::default()
    };
    params.sampling.temperature = 0.0;
    params.ignore_eos = true;
    let mut events = engine
        .submit(GenerationRequest {
            cache_partition: None,
            model: MODEL.into(),
            prompt,
            params,
        })
        .unwrap();
    let mut tokens = 0;
    while tokens < 12 {
        match events.blocking_recv() {
            Some(GenerationEvent::Token(_)) => tokens += 1,
            other => panic!("ended early: {other:?}"),
        }
    }
    telemetry.publish();
    let held = metrics.draft_kv_bytes(MODEL);
    assert!(
        held > 0 && held as usize == live.load(Ordering::Relaxed),
        "the draft holds the running sequence's positions: {held}"
    );
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(20);
    while live.load(Ordering::Relaxed) != 0 {
        assert!(
            Instant::now() < deadline,
            "the draft's caches were not freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    telemetry.publish();
    assert_eq!(metrics.draft_kv_bytes(MODEL), 0);
    let (drafted, _) = metrics.speculation_counts(MODEL);
    assert!(drafted > 0, "the draft proposed");
}

#[test]
fn ferry_plan_places_the_draft_first_and_counts_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_path().to_string_lossy().into_owned();
    let toml = |method: &str| {
        let text = format!(
            "[device]\nkind = \"cpu\"\n[[models]]\nsource = {model:?}\ndtype = \"f32\"\nmax_context = 512\nmax_batch = 2\n[models.offload]\ngpu_memory = \"4GiB\"\n[models.speculative]\nmethod = \"{method}\"\ndraft = {model:?}\n"
        );
        let path = dir.path().join(format!("{method}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    };
    let plan = |method: &str| {
        let (ok, stdout, stderr) = crate::fit::run_plan(
            Command::new(env!("CARGO_BIN_EXE_ferry"))
                .args(["plan", "--json", "--config"])
                .arg(toml(method)),
        );
        assert!(ok, "{stderr}");
        serde_json::from_str::<serde_json::Value>(&stdout).expect("JSON")
    };
    let (with, without) = (plan("draft"), plan("none"));
    let spec = &with["models"][0]["speculative"];
    assert_eq!(spec["method"], "draft", "{spec}");
    let draft_bytes = spec["draft_device_bytes"]
        .as_u64()
        .expect("the draft's bytes");
    let draft_plan = &spec["draft_plan"];
    assert_eq!(
        draft_plan["mode"], "none",
        "every layer of the draft resident: {draft_plan}"
    );
    assert_eq!(draft_plan["max_context"], 512, "{draft_plan}");
    assert_eq!(draft_plan["max_batch"], 2, "{draft_plan}");
    assert!(draft_plan["kv_bytes"].as_u64().unwrap() > 0, "{draft_plan}");
    let device = |doc: &serde_json::Value| doc["device_bytes"].as_u64().unwrap();
    assert_eq!(
        device(&with),
        device(&without) + draft_bytes,
        "the draft's bytes count on the device"
    );
    let budget =
        |doc: &serde_json::Value| doc["models"][0]["plan"]["budget_bytes"].as_u64().unwrap();
    assert_eq!(
        budget(&with) + draft_bytes,
        budget(&without),
        "the model gets what the draft leaves"
    );
    let (ok, text, stderr) = crate::fit::run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["plan", "--config"])
            .arg(toml("draft")),
    );
    assert!(ok, "{stderr}");
    assert!(text.contains("draft on the device first"), "{text}");
}

#[test]
fn seeded_sampled_replies_with_a_draft_model_are_reproducible_and_unseeded_ones_draw_from_it() {
    let plain_engine = engine(
        DtypeChoice::F32,
        OffloadMode::None,
        SpeculativeMethod::None,
        &Metrics::new(),
    );
    let metrics = Metrics::new();
    let fast_engine = engine(
        DtypeChoice::F32,
        OffloadMode::None,
        SpeculativeMethod::Draft,
        &metrics,
    );
    // Seeded: the draft's greedy proposals, so the reply without speculation, every time.
    let plain = sampled_replies(&plain_engine, &PROMPTS, 32, 0.8, Some(11));
    let fast = sampled_replies(&fast_engine, &PROMPTS, 32, 0.8, Some(11));
    let again = sampled_replies(&fast_engine, &PROMPTS, 32, 0.8, Some(11));
    assert_eq!(fast, plain);
    assert_eq!(again, plain);
    let (_, seeded_accepted) = metrics.speculation_counts(MODEL);
    assert!(seeded_accepted > 0, "seeded requests speculate too");
    // Unseeded: proposals drawn from the draft's distribution and verified with it.
    let drawn = sampled_replies(&fast_engine, &PROMPTS, 32, 0.8, None);
    assert!(drawn.iter().all(|reply| !reply.is_empty()), "{drawn:?}");
    let (drafted, accepted) = metrics.speculation_counts(MODEL);
    assert!(
        accepted > seeded_accepted && drafted > accepted,
        "drawn proposals were taken and refused: {accepted} of {drafted}"
    );
}
