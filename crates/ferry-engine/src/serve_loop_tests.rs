//! Tests of the serving loop's `n` > 1 path: the prompt is prefilled once and its KV copied to
//! the other choices (or, for a model that cannot copy, prefilled by each), every choice ends
//! with its own events, and the counts (`pending`, gauges, prompt tokens) come back to zero.
//! And of its prefix cache: a later request sharing a prompt prefix computes only the rest,
//! with the same events, within the KV room and the cache's own limit.

use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use tokio::sync::mpsc;

use super::*;
use crate::request::{GenerationEvent, GenerationRequest, PromptTokensDetails, Usage};
use crate::test_support::{greedy_request, serve_job, text_of, ScriptModel, TestCodec};
use crate::worker::{DEFAULT_MAX_STEP_TOKENS, DEFAULT_PREFILL_CHUNK};

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

/// Serves `requests` one at a time (a batch of one, so each starts after the one before ends)
/// with the prefix cache `prefix`; returns each one's events and the loop's metrics.
fn serve_in_turn(
    model: &mut ScriptModel,
    requests: &[GenerationRequest],
    prefix: PrefixCacheOptions,
) -> (Vec<Vec<GenerationEvent>>, Metrics) {
    let metrics = Metrics::new();
    let pending = AtomicUsize::new(requests.len());
    let (jobs, receiver) = std_mpsc::channel();
    let mut receivers = Vec::new();
    for request in requests {
        let (events, rx) = mpsc::channel(4096);
        metrics.request_queued();
        jobs.send(Work::Generate(Box::new(Job {
            request: request.clone(),
            events,
            forks: Vec::new(),
            accepted: Instant::now(),
            context: None,
        })))
        .unwrap();
        receivers.push(rx);
    }
    drop(jobs);
    let context = LoopContext {
        name: "m",
        jobs: &receiver,
        pending: &pending,
        metrics: &metrics,
        limits: StepLimits {
            max_batch: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            max_step_tokens: DEFAULT_MAX_STEP_TOKENS,
            step_time: None,
        },
        prefix,
    };
    serve_requests(model, &TestCodec::new(), &context);
    let events = receivers
        .iter_mut()
        .map(|rx| std::iter::from_fn(|| rx.blocking_recv()).collect())
        .collect();
    (events, metrics)
}

fn blocks_of(block_tokens: usize, max_tokens: Option<usize>) -> PrefixCacheOptions {
    PrefixCacheOptions {
        enabled: true,
        max_tokens,
        block_tokens,
        // The scripted model computes alike in chunks of any length.
        exact_chunk_rows: 1,
    }
}

fn cached(events: &[GenerationEvent]) -> Option<usize> {
    usage_of(events)
        .prompt_tokens_details
        .map(|d: PromptTokensDetails| d.cached_tokens)
}

/// A first turn and a second whose prompt starts with the first's.
fn two_turns() -> [GenerationRequest; 2] {
    let codec = TestCodec::new();
    let first = codec
        .encode("he said: a long prompt with a shared part", false)
        .unwrap();
    let mut second = first.clone();
    second.extend(codec.encode(" and more", false).unwrap());
    [
        greedy_request("m", first, 6),
        greedy_request("m", second, 6),
    ]
}

#[test]
fn a_shared_prefix_is_computed_once_and_changes_nothing_else() {
    let requests = two_turns();
    let first_len = requests[0].prompt.len();
    let mut plain = ScriptModel::saying("he wo");
    let (expected, _) = serve_in_turn(&mut plain, &requests, PrefixCacheOptions::default());
    assert_eq!(
        cached(&expected[1]),
        None,
        "a model without blocks has no cache"
    );

    let mut model = ScriptModel::saying("he wo");
    model.blocks = true;
    let (events, metrics) = serve_in_turn(&mut model, &requests, blocks_of(4, None));
    let hits = first_len / 4 * 4;
    assert!(hits >= 8, "{first_len}");
    for (got, want) in events.iter().zip(&expected) {
        assert_eq!(text_of(got), text_of(want));
        assert_eq!(usage_of(got).prompt_tokens, usage_of(want).prompt_tokens);
    }
    assert_eq!(
        (cached(&events[0]), cached(&events[1])),
        (Some(0), Some(hits))
    );
    assert_eq!(
        plain.tokens_fed - model.tokens_fed,
        hits,
        "the shared blocks were not fed"
    );
    let queried = (requests[0].prompt.len() + requests[1].prompt.len()) as u64;
    assert_eq!(metrics.prefix_cache_counts("m"), (queried, hits as u64));
    assert_eq!(
        metrics.prompt_tokens(),
        queried,
        "the usage counts every prompt token"
    );
    assert!(metrics
        .render()
        .contains(&format!("ferry_prefix_cache_tokens{{model=\"m\"}} {}", {
            let second = requests[1].prompt.len();
            second / 4 * 4
        })));
}

#[test]
fn the_same_prompt_again_computes_only_its_last_block() {
    let codec = TestCodec::new();
    let prompt = codec.encode("he said: twelve", false).unwrap();
    let request = greedy_request("m", prompt.clone(), 3);
    let mut model = ScriptModel::saying("wo");
    model.blocks = true;
    let (events, _) = serve_in_turn(&mut model, &[request.clone(), request], blocks_of(4, None));
    assert_eq!(text_of(&events[0]), text_of(&events[1]));
    // At least the last token is computed, so a whole last block is not reused.
    let expected = (prompt.len() - 1) / 4 * 4;
    assert_eq!(cached(&events[1]), Some(expected));
}

#[test]
fn the_cache_keeps_within_its_limit_and_the_kv_room() {
    let requests = two_turns();
    // At most one block.
    let mut model = ScriptModel::saying("he wo");
    model.blocks = true;
    let (events, _) = serve_in_turn(&mut model, &requests, blocks_of(4, Some(4)));
    assert_eq!(cached(&events[1]), Some(4));
    // Requests that may each fill the context leave no room: nothing is cached.
    let mut requests = requests;
    let extra = requests[1].prompt.len() - requests[0].prompt.len();
    requests[0].params.max_tokens += extra;
    let mut model = ScriptModel::saying("he wo");
    model.blocks = true;
    model.max_context = requests[1].prompt.len() + 6;
    let (events, metrics) = serve_in_turn(&mut model, &requests, blocks_of(4, None));
    assert_eq!(cached(&events[1]), Some(0));
    assert_eq!(text_of(&events[1]), "he wo");
    assert!(metrics
        .render()
        .contains("ferry_prefix_cache_tokens{model=\"m\"} 0"));
}

/// Serves `request` to a model saying `text`, with speculation `method` (up to 4 tokens) or
/// without; returns its events, the model's sequence steps and the metrics.
fn serve_speculating(
    text: &str,
    request: &GenerationRequest,
    method: SpeculationMethod,
    truncate: bool,
) -> (Vec<GenerationEvent>, ScriptModel, Metrics) {
    let mut model = ScriptModel::saying(text);
    model.truncate = truncate;
    model.speculation = Speculation {
        method,
        max_tokens: 4,
    };
    let (mut choices, metrics) = serve_choices(&mut model, request.clone(), 1, 4);
    (choices.remove(0), model, metrics)
}

#[test]
fn prompt_lookup_gives_the_same_events_in_fewer_steps() {
    // The reply repeats the prompt's text, then goes its own way: the proposals copied from
    // the prompt are right for a while, then wrong.
    let prompt = TestCodec::new()
        .encode("copy: the cat sat on the mat.", false)
        .unwrap();
    let text = "the cat sat on the mat. the cat ran off the mat.";
    let mut request = greedy_request("m", prompt, 60);
    request.params.logprobs = Some(2);
    let (plain, plain_model, plain_metrics) =
        serve_speculating(text, &request, SpeculationMethod::Off, true);
    let (fast, fast_model, metrics) =
        serve_speculating(text, &request, SpeculationMethod::Ngram, true);
    assert_eq!(text_of(&plain), text);
    assert_eq!(fast, plain, "the same tokens, logprobs and end");
    assert_eq!(plain_metrics.speculation_counts("m"), (0, 0));
    let (drafted, accepted) = metrics.speculation_counts("m");
    assert!(accepted > 10, "{accepted} of {drafted} accepted");
    assert!(accepted < drafted, "some proposals were rejected");
    assert!(
        fast_model.sequence_steps < plain_model.sequence_steps * 2 / 3,
        "{} steps against {}",
        fast_model.sequence_steps,
        plain_model.sequence_steps
    );
}

#[test]
fn speculation_keeps_max_tokens_stop_strings_and_models_that_cannot_forget() {
    let prompt = TestCodec::new().encode("abcabcabc", false).unwrap();
    let text = "abcabcabcabcabcabcabc";
    for max_tokens in [1, 2, 5, 7, 12] {
        let request = greedy_request("m", prompt.clone(), max_tokens);
        let (plain, ..) = serve_speculating(text, &request, SpeculationMethod::Off, true);
        let (fast, ..) = serve_speculating(text, &request, SpeculationMethod::Ngram, true);
        assert_eq!(fast, plain, "max_tokens {max_tokens}");
        assert_eq!(usage_of(&fast).completion_tokens, max_tokens);
    }
    let mut request = greedy_request("m", prompt.clone(), 30);
    request.params.stop = vec!["cab".into()];
    let (plain, ..) = serve_speculating(text, &request, SpeculationMethod::Off, true);
    let (fast, _, metrics) = serve_speculating(text, &request, SpeculationMethod::Ngram, true);
    assert_eq!(fast, plain);
    assert_eq!(text_of(&fast), "ab");
    assert!(metrics.speculation_counts("m").0 > 0);
    // A model that cannot forget positions does not speculate.
    let request = greedy_request("m", prompt, 12);
    let (fast, model, metrics) = serve_speculating(text, &request, SpeculationMethod::Ngram, false);
    assert_eq!(text_of(&fast), &text[..12]);
    assert_eq!(metrics.speculation_counts("m"), (0, 0));
    assert_eq!(model.tokens_fed, 9 + 11, "one token a step");
}

#[test]
fn speculating_choices_of_one_request_end_alike() {
    let prompt = TestCodec::new().encode("xyzxyz", false).unwrap();
    let mut model = ScriptModel::saying("xyzxyzxyzxyz");
    model.speculation = Speculation {
        method: SpeculationMethod::Ngram,
        max_tokens: 3,
    };
    let (choices, metrics) = serve_choices(&mut model, greedy_request("m", prompt, 10), 3, 4);
    for events in &choices {
        assert_eq!(text_of(events), "xyzxyzxyzx");
    }
    assert!(metrics.speculation_counts("m").1 > 0);
}
