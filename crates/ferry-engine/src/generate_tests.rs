//! Tests for [`Generation`]: usage, EOS, stop strings, logprobs, validation, cancellation and
//! seeded sampling. Each request runs through the engine's serving loop, as on a model's engine
//! thread, with a scripted model and a real byte-level BPE tokenizer.

use std::time::Instant;

use super::*;
use crate::{
    queue::Job,
    request::SamplingParams,
    test_support::{serve_job, serve_job_with, text_of, ScriptModel, TestCodec, EOS},
    worker::DEFAULT_MAX_BATCH,
};
use ferry_metrics::Metrics;

fn request(prompt: Vec<u32>, params: GenerationParams) -> GenerationRequest {
    GenerationRequest {
        cache_partition: None,
        model: "m".into(),
        prompt,
        params,
    }
}

fn greedy(max_tokens: usize) -> GenerationParams {
    GenerationParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        ..GenerationParams::default()
    }
}

/// Serves `request` through the serving loop on this thread until it has ended, its events
/// going to `events`.
fn serve(
    model: &mut ScriptModel,
    request: GenerationRequest,
    events: mpsc::Sender<GenerationEvent>,
) {
    let job = Job {
        request,
        events,
        forks: Vec::new(),
        accepted: Instant::now(),
        context: None,
    };
    serve_job(model, job, DEFAULT_MAX_BATCH, &Metrics::new());
}

/// Serves `request` to `model`, whose text codec is `codec`, and returns every event it sent.
fn events_of_with(
    model: &mut ScriptModel,
    request: GenerationRequest,
    codec: &TestCodec,
) -> Vec<GenerationEvent> {
    let (tx, mut rx) = mpsc::channel(4096);
    let job = Job {
        request,
        events: tx,
        forks: Vec::new(),
        accepted: Instant::now(),
        context: None,
    };
    serve_job_with(model, job, DEFAULT_MAX_BATCH, &Metrics::new(), codec);
    let mut events = Vec::new();
    while let Some(e) = rx.blocking_recv() {
        events.push(e);
    }
    events
}

/// Serves `request` to `model` and returns every event it sent.
fn events_of(model: &mut ScriptModel, request: GenerationRequest) -> Vec<GenerationEvent> {
    let (tx, mut rx) = mpsc::channel(4096);
    serve(model, request, tx);
    let mut events = Vec::new();
    while let Some(e) = rx.blocking_recv() {
        events.push(e);
    }
    events
}

/// Runs a script model producing `text` then `after`; returns the events and the model.
fn run_script(
    text: &str,
    after: u32,
    params: GenerationParams,
) -> (Vec<GenerationEvent>, ScriptModel) {
    let codec = TestCodec::new();
    let script = codec.encode(text, false).unwrap();
    let mut model = ScriptModel::new(script, after, codec.vocab_size());
    let prompt = codec.encode("he said:", false).unwrap();
    let events = events_of(&mut model, request(prompt, params));
    (events, model)
}

fn tokens(events: &[GenerationEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, GenerationEvent::Token(_)))
        .count()
}

/// The reason and usage of the final `Finished` event.
fn finished(events: &[GenerationEvent]) -> (FinishReason, Usage) {
    match events.last() {
        Some(GenerationEvent::Finished { reason, usage, .. }) => (*reason, *usage),
        other => panic!("the last event is not Finished: {other:?}"),
    }
}

#[test]
fn runs_to_max_tokens_with_usage() {
    let codec = TestCodec::new();
    let n = codec.encode("he wo café 😀", false).unwrap().len();
    let p = codec.encode("he said:", false).unwrap().len();
    let (events, model) = run_script("he wo café 😀", EOS, greedy(n));
    assert_eq!(text_of(&events), "he wo café 😀");
    assert_eq!(tokens(&events), n);
    let usage = Usage {
        prompt_tokens: p,
        completion_tokens: n,
        total_tokens: p + n,
        prompt_tokens_details: None,
        completion_tokens_details: None,
    };
    assert_eq!(finished(&events), (FinishReason::Length, usage));
    assert_eq!(model.sequence_steps, n);
}

#[test]
fn eos_stops_and_counts_but_is_not_emitted() {
    let (events, _) = run_script("he wo", EOS, greedy(50));
    assert_eq!(text_of(&events), "he wo");
    // "he", " wo", then EOS.
    assert_eq!(tokens(&events), 2);
    let (reason, usage) = finished(&events);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.completion_tokens, 3);
}

#[test]
fn ignore_eos_runs_to_length() {
    let params = GenerationParams {
        ignore_eos: true,
        ..greedy(6)
    };
    let (events, _) = run_script("he wo", EOS, params);
    assert_eq!(tokens(&events), 6);
    assert_eq!(finished(&events).0, FinishReason::Length);
}

#[test]
fn stop_string_across_tokens_is_not_emitted() {
    let params = GenerationParams {
        stop: vec!["STOP".into(), "never".into()],
        ..greedy(100)
    };
    let (events, _) = run_script("he wo STOP more text", EOS, params);
    assert_eq!(text_of(&events), "he wo ");
    // "he", " wo", " ", "S", "T", "O", "P": the token completing the stop is counted.
    let (reason, usage) = finished(&events);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.completion_tokens, 7);
    assert_eq!(tokens(&events), 7);
}

#[test]
fn held_back_text_is_released_at_length() {
    let params = GenerationParams {
        stop: vec!["wonder".into()],
        ..greedy(2)
    };
    let (events, _) = run_script("he wo", EOS, params);
    assert_eq!(text_of(&events), "he wo");
    assert!(
        matches!(events.last(), Some(GenerationEvent::Finished { trailing_text, .. }) if trailing_text == "wo")
    );
}

#[test]
fn logprobs_report_the_chosen_token_and_alternatives() {
    let params = GenerationParams {
        logprobs: Some(3),
        ..greedy(3)
    };
    let (events, _) = run_script("he wo", EOS, params);
    let GenerationEvent::Token(first) = &events[0] else {
        panic!("expected a token, got {:?}", events[0]);
    };
    let chosen = first.logprob.as_ref().unwrap();
    assert_eq!(chosen.id, first.token_id);
    assert_eq!(chosen.token, "he");
    assert_eq!(chosen.bytes, b"he".to_vec());
    assert!(chosen.logprob <= 0.0 && chosen.logprob > -1e-6);
    assert_eq!(first.top_logprobs.len(), 3);
    assert_eq!(first.top_logprobs[0], *chosen);
    assert!(first.top_logprobs[1].logprob < -29.0);
    let (events, _) = run_script("he", EOS, greedy(1));
    assert!(
        matches!(&events[0], GenerationEvent::Token(t) if t.logprob.is_none() && t.top_logprobs.is_empty())
    );
}

#[test]
fn context_overflow_fails_cleanly_without_running_the_model() {
    let codec = TestCodec::new();
    let mut model = ScriptModel::new(vec![1], EOS, codec.vocab_size());
    model.max_context = 10;
    let err = EngineError::ContextLengthExceeded {
        max_context: 10,
        requested: 11,
        prompt_tokens: 6,
        max_tokens: 5,
    };
    let events = events_of(&mut model, request(vec![1; 6], greedy(5)));
    assert_eq!(events, vec![GenerationEvent::Failed(err)]);
    for prompt in [vec![], vec![9999]] {
        let events = events_of(&mut model, request(prompt, greedy(1)));
        assert!(
            matches!(
                events.as_slice(),
                [GenerationEvent::Failed(EngineError::InvalidRequest { .. })]
            ),
            "{events:?}"
        );
    }
    assert_eq!(model.sequence_steps, 0);
}

#[test]
fn dropping_the_receiver_cancels_at_once() {
    let codec = TestCodec::new();
    let model = ScriptModel::new(vec![], b'a' as u32, codec.vocab_size());
    let (tx, mut rx) = mpsc::channel(1);
    let worker = std::thread::spawn(move || {
        let mut model = model;
        serve(&mut model, request(vec![1], greedy(1000)), tx);
        model.sequence_steps
    });
    for _ in 0..3 {
        assert!(matches!(
            rx.blocking_recv(),
            Some(GenerationEvent::Token(_))
        ));
    }
    drop(rx);
    let steps = worker.join().unwrap();
    assert!(steps <= 6, "model ran {steps} steps after cancellation");
}

#[test]
fn seeded_sampling_is_reproducible_end_to_end() {
    let codec = TestCodec::new();
    let params = GenerationParams {
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerationParams::default()
    };
    let run = || {
        // A flat model: every token equally likely, so only the RNG decides.
        let mut model = ScriptModel::new(vec![], u32::MAX, codec.vocab_size());
        events_of(&mut model, request(vec![1], params.clone()))
            .into_iter()
            .filter_map(|e| match e {
                GenerationEvent::Token(t) => Some(t.token_id),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let a = run();
    assert_eq!(a.len(), 16);
    assert_eq!(a, run());
}

/// A harmony reply keeps its markers in the text (they are special tokens, which other
/// replies drop), counts the tokens of its analysis as reasoning, and ends at `<|call|>`.
#[test]
fn harmony_replies_keep_their_markers_and_count_reasoning() {
    use crate::reasoning::{ReasoningFormat, ReasoningParsing};
    let codec = TestCodec::harmony();
    let reply =
        "<|channel|>analysis<|message|>he wo<|end|><|start|>assistant<|channel|>final<|message|>he";
    let mut script = codec.encode(reply, false).unwrap();
    let call = codec.encode("<|call|>", false).unwrap()[0];
    script.push(call);
    let analysis = codec
        .encode("<|message|>he wo<|end|>", false)
        .unwrap()
        .len();
    let prompt = codec.encode("he said:", false).unwrap();
    let run = |reasoning: Option<ReasoningParsing>| {
        let mut model = ScriptModel::new(script.clone(), EOS, codec.vocab_size());
        let params = GenerationParams {
            reasoning,
            ..greedy(50)
        };
        events_of_with(&mut model, request(prompt.clone(), params), &codec)
    };
    let events = run(Some(ReasoningParsing::for_prompt(
        ReasoningFormat::Harmony,
        "",
    )));
    assert_eq!(text_of(&events), reply);
    let (reason, usage) = finished(&events);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(usage.completion_tokens, script.len());
    // The analysis body with the markers around it (`<|message|>`, `<|end|>`).
    let counted = usage
        .completion_tokens_details
        .expect("details")
        .reasoning_tokens;
    assert_eq!(counted, analysis, "{usage:?}");
    // Without harmony parsing the special tokens are dropped, as for every other reply.
    let plain = run(None);
    assert_eq!(text_of(&plain), "analysishe woassistantfinalhe");
    assert_eq!(finished(&plain).1.completion_tokens_details, None);
}
