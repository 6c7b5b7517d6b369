//! Speculative decoding on the real SmolLM2 GGUF, on the CPU device: a verification pass
//! computes the logits after every proposed token exactly as decoding them one at a time does
//! (quantized, dequantized to f32 and streamed), forgetting rejected positions leaves the
//! sequence as if they were never fed, and greedy replies with prompt lookup are the replies
//! without it, resident and streamed (`offload sequential`), with the proposals counted.

use crate::offload_modes::{device_config, hub};
use crate::real_model;
use real_model::MODEL;

use std::sync::Arc;

use candle_core::Device;
use ferry::config::{DtypeChoice, OffloadMode, SpeculativeMethod};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::engine::worker::{EngineHandle, EngineOptions};
use ferry::engine::{Backend, GenerationEvent, GenerationParams, GenerationRequest};
use ferry::metrics::Metrics;
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::{load_for_serving_on, LoadedForServing};

fn load(dtype: DtypeChoice, mode: OffloadMode, method: SpeculativeMethod) -> LoadedForServing {
    let mut config = real_model::offloaded(dtype, mode);
    config.max_context = Some(512);
    config.max_batch = Some(4);
    config.speculative.method = method;
    config.speculative.tokens = 6;
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
    let loaded = load(dtype, mode, method);
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
            params.sampling.temperature = 0.0;
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
