//! Tests for [`generate`] and [`Generation`] with a scripted model and a real byte-level BPE
//! tokenizer.

use super::*;
use crate::engine::{
    request::SamplingParams,
    test_support::{ScriptModel, TestCodec, EOS},
};

fn request(prompt: Vec<u32>, params: GenerationParams) -> GenerationRequest {
    GenerationRequest {
        model: "m".into(),
        prompt: PromptInput::Tokens(prompt),
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

/// Runs a script model producing `text` then `after`; returns outcome, events, model.
fn run_script(
    text: &str,
    after: u32,
    params: GenerationParams,
) -> (Outcome, Vec<GenerationEvent>, ScriptModel) {
    let codec = TestCodec::new();
    let script = codec.encode(text, false).unwrap();
    let mut model = ScriptModel::new(script, after, codec.vocab_size());
    let (tx, mut rx) = mpsc::channel(4096);
    let prompt = codec.encode("he said:", false).unwrap();
    let outcome = generate(
        &mut model,
        &codec,
        &request(prompt, params),
        &tx,
        RequestTracker::detached(),
    );
    drop(tx);
    let mut events = Vec::new();
    while let Some(e) = rx.blocking_recv() {
        events.push(e);
    }
    (outcome, events, model)
}

/// Concatenated token texts plus trailing text, and the final event.
fn text_of(events: &[GenerationEvent]) -> String {
    events
        .iter()
        .map(|e| match e {
            GenerationEvent::Token(t) => t.text.clone(),
            GenerationEvent::Finished { trailing_text, .. } => trailing_text.clone(),
            GenerationEvent::Failed(_) => String::new(),
        })
        .collect()
}

fn tokens(events: &[GenerationEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, GenerationEvent::Token(_)))
        .count()
}

#[test]
fn runs_to_max_tokens_with_usage() {
    let codec = TestCodec::new();
    let n = codec.encode("he wo café 😀", false).unwrap().len();
    let p = codec.encode("he said:", false).unwrap().len();
    let (outcome, events, model) = run_script("he wo café 😀", EOS, greedy(n));
    assert_eq!(text_of(&events), "he wo café 😀");
    assert_eq!(tokens(&events), n);
    let usage = Usage {
        prompt_tokens: p,
        completion_tokens: n,
        total_tokens: p + n,
    };
    assert_eq!(outcome, Outcome::Finished(FinishReason::Length, usage));
    assert!(
        matches!(events.last(), Some(GenerationEvent::Finished { reason: FinishReason::Length, usage: u, .. }) if *u == usage)
    );
    assert_eq!(model.forward_calls, n);
}

#[test]
fn eos_stops_and_counts_but_is_not_emitted() {
    let (outcome, events, _) = run_script("he wo", EOS, greedy(50));
    assert_eq!(text_of(&events), "he wo");
    // "he", " wo", then EOS.
    assert_eq!(tokens(&events), 2);
    match outcome {
        Outcome::Finished(FinishReason::Stop, usage) => assert_eq!(usage.completion_tokens, 3),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn ignore_eos_runs_to_length() {
    let params = GenerationParams {
        ignore_eos: true,
        ..greedy(6)
    };
    let (outcome, events, _) = run_script("he wo", EOS, params);
    assert_eq!(tokens(&events), 6);
    assert!(matches!(
        outcome,
        Outcome::Finished(FinishReason::Length, _)
    ));
}

#[test]
fn stop_string_across_tokens_is_not_emitted() {
    let params = GenerationParams {
        stop: vec!["STOP".into(), "never".into()],
        ..greedy(100)
    };
    let (outcome, events, _) = run_script("he wo STOP more text", EOS, params);
    assert_eq!(text_of(&events), "he wo ");
    // "he", " wo", " ", "S", "T", "O", "P": the token completing the stop is counted.
    match outcome {
        Outcome::Finished(FinishReason::Stop, usage) => assert_eq!(usage.completion_tokens, 7),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(tokens(&events), 7);
}

#[test]
fn held_back_text_is_released_at_length() {
    let params = GenerationParams {
        stop: vec!["wonder".into()],
        ..greedy(2)
    };
    let (_, events, _) = run_script("he wo", EOS, params);
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
    let (_, events, _) = run_script("he wo", EOS, params);
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
    let (_, events, _) = run_script("he", EOS, greedy(1));
    assert!(
        matches!(&events[0], GenerationEvent::Token(t) if t.logprob.is_none() && t.top_logprobs.is_empty())
    );
}

#[test]
fn context_overflow_fails_cleanly_without_running_the_model() {
    let codec = TestCodec::new();
    let mut model = ScriptModel::new(vec![1], EOS, codec.vocab_size());
    model.max_context = 10;
    let (tx, mut rx) = mpsc::channel(8);
    let outcome = generate(
        &mut model,
        &codec,
        &request(vec![1; 6], greedy(5)),
        &tx,
        RequestTracker::detached(),
    );
    let err = EngineError::ContextLengthExceeded {
        max_context: 10,
        requested: 11,
        prompt_tokens: 6,
        max_tokens: 5,
    };
    assert_eq!(outcome, Outcome::Failed(err.clone()));
    assert_eq!(rx.blocking_recv(), Some(GenerationEvent::Failed(err)));
    assert_eq!(model.forward_calls, 0);
    let out = generate(
        &mut model,
        &codec,
        &request(vec![], greedy(1)),
        &tx,
        RequestTracker::detached(),
    );
    assert!(matches!(
        out,
        Outcome::Failed(EngineError::InvalidRequest { .. })
    ));
    let out = generate(
        &mut model,
        &codec,
        &request(vec![9999], greedy(1)),
        &tx,
        RequestTracker::detached(),
    );
    assert!(matches!(
        out,
        Outcome::Failed(EngineError::InvalidRequest { .. })
    ));
}

#[test]
fn dropping_the_receiver_cancels_at_once() {
    let codec = TestCodec::new();
    let model = ScriptModel::new(vec![], b'a' as u32, codec.vocab_size());
    let (tx, mut rx) = mpsc::channel(1);
    let worker = std::thread::spawn(move || {
        let mut model = model;
        let codec = TestCodec::new();
        let out = generate(
            &mut model,
            &codec,
            &request(vec![1], greedy(1000)),
            &tx,
            RequestTracker::detached(),
        );
        (out, model.forward_calls)
    });
    for _ in 0..3 {
        assert!(matches!(
            rx.blocking_recv(),
            Some(GenerationEvent::Token(_))
        ));
    }
    drop(rx);
    let (outcome, calls) = worker.join().unwrap();
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(calls <= 6, "model ran {calls} steps after cancellation");
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
        let (tx, mut rx) = mpsc::channel(64);
        generate(
            &mut model,
            &codec,
            &request(vec![1], params.clone()),
            &tx,
            RequestTracker::detached(),
        );
        drop(tx);
        let mut ids = Vec::new();
        while let Some(GenerationEvent::Token(t)) = rx.blocking_recv() {
            ids.push(t.token_id);
        }
        ids
    };
    let a = run();
    assert_eq!(a.len(), 16);
    assert_eq!(a, run());
}
