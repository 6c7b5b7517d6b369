//! Tests of the serving loop's `n` > 1 path: the prompt is prefilled once and its KV copied to
//! the other choices (or, for a model that cannot copy, prefilled by each), every choice ends
//! with its own events, and the counts (`pending`, gauges, prompt tokens) come back to zero.

use std::time::Instant;

use tokio::sync::mpsc;

use super::*;
use crate::engine::request::{GenerationEvent, GenerationRequest, Usage};
use crate::engine::test_support::{greedy_request, serve_job, text_of, ScriptModel, TestCodec};

/// Serves one request of `n` choices; returns each choice's events and the loop's metrics.
fn serve_choices(
    model: &mut ScriptModel,
    request: GenerationRequest,
    n: usize,
    max_batch: usize,
) -> (Vec<Vec<GenerationEvent>>, Metrics) {
    let (senders, mut receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::channel(4096)).unzip();
    let mut senders = senders.into_iter();
    let metrics = Metrics::new();
    for _ in 0..n {
        metrics.request_queued();
    }
    let job = Job {
        request,
        events: senders.next().unwrap(),
        forks: senders.collect(),
        accepted: Instant::now(),
        context: None,
    };
    serve_job(model, job, max_batch, &metrics);
    assert_eq!(
        (metrics.waiting(), metrics.running()),
        (0, 0),
        "the gauges come back to zero"
    );
    let events = receivers
        .iter_mut()
        .map(|rx| std::iter::from_fn(|| rx.blocking_recv()).collect())
        .collect();
    (events, metrics)
}

fn usage_of(events: &[GenerationEvent]) -> Usage {
    match events.last() {
        Some(GenerationEvent::Finished { usage, .. }) => *usage,
        other => panic!("not finished: {other:?}"),
    }
}

fn setup(text: &str, max_tokens: usize) -> (ScriptModel, GenerationRequest) {
    let prompt = TestCodec::new()
        .encode("he said: a long prompt", false)
        .unwrap();
    (
        ScriptModel::saying(text),
        greedy_request("m", prompt, max_tokens),
    )
}

#[test]
fn the_prompt_is_prefilled_once_for_every_choice() {
    let (mut model, request) = setup("he wo café", 20);
    let prompt = request.prompt.len();
    let (choices, metrics) = serve_choices(&mut model, request, 3, 8);
    assert_eq!(choices.len(), 3);
    for events in &choices {
        assert_eq!(text_of(events), "he wo café");
        assert_eq!(usage_of(events).prompt_tokens, prompt);
    }
    let generated: usize = choices.iter().map(|e| usage_of(e).completion_tokens).sum();
    // The prompt once, then each choice feeds back every token it sampled but its last.
    assert_eq!(model.tokens_fed, prompt + generated - 3);
    assert_eq!(metrics.prompt_tokens(), prompt as u64, "counted once");
}

#[test]
fn a_model_that_cannot_copy_prefills_each_choice() {
    let (mut model, request) = setup("he wo", 20);
    model.forks = false;
    let prompt = request.prompt.len();
    let (choices, _) = serve_choices(&mut model, request, 2, 8);
    for events in &choices {
        assert_eq!(text_of(events), "he wo");
    }
    let generated: usize = choices.iter().map(|e| usage_of(e).completion_tokens).sum();
    // Choice 0 sampled from its prefill; choice 1 prefilled again and sampled from its own.
    assert_eq!(model.tokens_fed, 2 * prompt + generated - 2);
}

#[test]
fn choices_that_end_at_their_first_token_and_wide_requests_queue() {
    let (mut model, request) = setup("he", 1);
    let (choices, _) = serve_choices(&mut model, request.clone(), 4, 4);
    assert!(choices.iter().all(|e| usage_of(e).completion_tokens == 1));
    // More choices than the batch holds still run (alone) and end.
    let (choices, _) = serve_choices(&mut model, request, 3, 2);
    assert_eq!(choices.len(), 3);
}

#[test]
fn a_failed_prefill_fails_every_choice() {
    let (mut model, request) = setup("he", 4);
    model.poison = Some(request.prompt[0]);
    let (choices, _) = serve_choices(&mut model, request, 3, 8);
    for events in &choices {
        assert!(
            matches!(events.last(), Some(GenerationEvent::Failed(_))),
            "{events:?}"
        );
    }
}
