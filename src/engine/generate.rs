//! Runs one request to completion on the engine thread: prefill, decode loop, sampling, logprobs,
//! incremental detokenisation and stop strings, streaming [`GenerationEvent`]s as it goes.

use tokio::sync::mpsc;

use crate::metrics::RequestTracker;

use super::{
    detokenize::IncrementalDecoder,
    logprobs::LogSoftmax,
    request::{
        FinishReason, GenerationEvent, GenerationParams, GenerationRequest, PromptInput,
        TokenLogprob, TokenOutput, Usage,
    },
    sampling::Sampler,
    stop::StopMatcher,
    traits::{LanguageModel, TextCodec},
    EngineError, EngineResult,
};

/// How a generation ended, as seen by the engine thread.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `Finished` was sent.
    Finished(FinishReason, Usage),
    /// `Failed` was sent (or could not be, the receiver being gone).
    Failed(EngineError),
    /// The receiver was dropped; generation stopped early.
    Cancelled,
}

/// Why the loop stopped early.
enum Abort {
    /// Sending failed: the client went away.
    Cancelled,
    /// The model, tokenizer or request failed.
    Failed(EngineError),
}

impl From<EngineError> for Abort {
    fn from(e: EngineError) -> Self {
        Abort::Failed(e)
    }
}

/// Checks that a prompt can be served by a model with `max_context` tokens of context and
/// `vocab_size` token ids.
pub fn validate_prompt(
    prompt: &[u32],
    params: &GenerationParams,
    max_context: usize,
    vocab_size: usize,
) -> EngineResult<()> {
    if prompt.is_empty() {
        return Err(EngineError::InvalidRequest {
            message: "the prompt must contain at least one token".into(),
            param: Some("prompt".into()),
        });
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(EngineError::InvalidRequest {
            message: format!("token id {bad} is out of range (vocabulary size {vocab_size})"),
            param: Some("prompt".into()),
        });
    }
    let requested = prompt.len().saturating_add(params.max_tokens);
    if requested > max_context {
        return Err(EngineError::ContextLengthExceeded {
            max_context,
            requested,
            prompt_tokens: prompt.len(),
            max_tokens: params.max_tokens,
        });
    }
    Ok(())
}

/// Runs `request` against `model` and sends its events on `events`: zero or more `Token`s, then
/// one `Finished` or `Failed`. Uses `blocking_send`, so call it from a plain thread, never from
/// inside a tokio runtime. Returns early, without a final event, once the receiver is dropped.
///
/// The EOS token (unless `ignore_eos`) ends the generation with reason `Stop`; it counts in
/// `completion_tokens` but gets no `Token` event (its text is empty). A token that completes a
/// stop string does get an event, carrying the text before the stop.
///
/// `tracker` is told about the prefill and every sampled token (metrics).
pub fn generate<M: LanguageModel>(
    model: &mut M,
    codec: &dyn TextCodec,
    request: &GenerationRequest,
    events: &mpsc::Sender<GenerationEvent>,
    tracker: &mut RequestTracker,
) -> Outcome {
    match run(model, codec, request, events, tracker) {
        Ok((reason, usage)) => Outcome::Finished(reason, usage),
        Err(Abort::Failed(err)) => {
            // The client may be gone too; the failure is reported either way.
            let _ = events.blocking_send(GenerationEvent::Failed(err.clone()));
            Outcome::Failed(err)
        }
        Err(Abort::Cancelled) => Outcome::Cancelled,
    }
}

fn run<M: LanguageModel>(
    model: &mut M,
    codec: &dyn TextCodec,
    request: &GenerationRequest,
    events: &mpsc::Sender<GenerationEvent>,
    tracker: &mut RequestTracker,
) -> Result<(FinishReason, Usage), Abort> {
    let PromptInput::Tokens(prompt) = &request.prompt;
    let params = &request.params;
    validate_prompt(prompt, params, model.max_context(), model.vocab_size())?;
    if events.is_closed() {
        return Err(Abort::Cancelled);
    }
    let send = |event: GenerationEvent| events.blocking_send(event).map_err(|_| Abort::Cancelled);
    let finish = |reason: FinishReason, generated: usize, trailing_text: String| {
        let usage = Usage {
            prompt_tokens: prompt.len(),
            completion_tokens: generated,
            total_tokens: prompt.len() + generated,
        };
        send(GenerationEvent::Finished {
            reason,
            usage,
            trailing_text,
        })
        .map(|()| (reason, usage))
    };

    if params.max_tokens == 0 {
        // Nothing to generate, but the prompt counts as served (usage reports it).
        tracker.prefilled(prompt.len());
        return finish(FinishReason::Length, 0, String::new());
    }
    let mut sampler = Sampler::new(&params.sampling, prompt);
    let mut detok = IncrementalDecoder::new(prompt, true);
    let mut stops = StopMatcher::new(&params.stop);
    let eos = codec.eos_token_ids();
    let mut seq = model.new_sequence();
    let mut logits = model.forward(&mut seq, prompt)?;
    tracker.prefilled(prompt.len());

    let mut generated = 0;
    loop {
        if events.is_closed() {
            return Err(Abort::Cancelled);
        }
        let raw = params.logprobs.map(|_| LogSoftmax::new(&logits));
        let token = sampler.sample(&mut logits);
        generated += 1;
        tracker.token();
        if !params.ignore_eos && eos.contains(&token) {
            let (tail, _) = release_all(codec, &mut detok, &mut stops)?;
            return finish(FinishReason::Stop, generated, tail);
        }
        let step = stops.push(&detok.push(codec, token)?);
        let (logprob, top_logprobs) = match (&raw, params.logprobs) {
            (Some(ls), Some(n)) => {
                let chosen = token_logprob(codec, token, ls.logprob(token));
                let top = ls
                    .top(n)
                    .into_iter()
                    .map(|(id, lp)| token_logprob(codec, id, lp))
                    .collect();
                (Some(chosen), top)
            }
            _ => (None, Vec::new()),
        };
        send(GenerationEvent::Token(TokenOutput {
            text: step.text,
            token_id: token,
            logprob,
            top_logprobs,
        }))?;
        if step.stopped {
            return finish(FinishReason::Stop, generated, String::new());
        }
        if generated >= params.max_tokens {
            let (tail, stopped) = release_all(codec, &mut detok, &mut stops)?;
            let reason = if stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            return finish(reason, generated, tail);
        }
        logits = model.forward(&mut seq, &[token])?;
    }
}

/// Flushes the decoder's held-back bytes through the stop matcher, then the matcher itself.
/// Returns the final text and whether a stop string matched in it.
fn release_all(
    codec: &dyn TextCodec,
    detok: &mut IncrementalDecoder,
    stops: &mut StopMatcher,
) -> EngineResult<(String, bool)> {
    let rest = detok.finish(codec)?;
    let step = stops.push(&rest);
    if step.stopped {
        return Ok((step.text, true));
    }
    Ok((step.text + &stops.finish(), false))
}

fn token_logprob(codec: &dyn TextCodec, id: u32, logprob: f32) -> TokenLogprob {
    TokenLogprob {
        id,
        // A token that is part of a multi-byte character decodes to U+FFFD, as in vLLM.
        token: codec.decode(&[id], false).unwrap_or_default(),
        logprob,
        bytes: codec.token_bytes(id),
    }
}

#[cfg(test)]
mod tests {
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
            &mut RequestTracker::detached(),
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
            &mut RequestTracker::detached(),
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
            &mut RequestTracker::detached(),
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
            &mut RequestTracker::detached(),
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
                &mut RequestTracker::detached(),
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
                &mut RequestTracker::detached(),
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
}
