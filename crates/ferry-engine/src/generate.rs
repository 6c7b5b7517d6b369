//! One request's generation on the engine thread: prefill, sampling, logprobs, incremental
//! detokenisation and stop strings, streaming [`GenerationEvent`]s as it goes.
//!
//! [`Generation`] is the per-sequence state machine the serving loop drives one step at a time.
//! It never calls the model itself: the loop feeds [`Generation::input`] through the model,
//! batched with the other running sequences, and hands the logits back to
//! [`Generation::advance`], which samples, emits and decides when the request ends.
//!
//! The EOS token (unless `ignore_eos`) ends a generation with reason `Stop`; it counts in
//! `completion_tokens` but gets no `Token` event (its text is empty). A token that completes a
//! stop string does get an event, carrying the text before the stop. Events go out with
//! `blocking_send`, so drive a generation from a plain thread, never from inside a tokio
//! runtime; once the receiver is dropped, the generation ends without a final event.
//!
//! With tools offered ([`GenerationParams::tool_calls`]) or a reasoning template
//! ([`GenerationParams::reasoning`]) the emitted text also goes through a [`ReplyReader`],
//! only to count the reply's calls for the request's log line and its reasoning tokens for
//! `usage` (the HTTP layer reads the reply itself from the same text). A harmony reply is
//! decoded with special tokens kept: its channel markers are special tokens.

use tokio::sync::mpsc;

use ferry_metrics::RequestTracker;

use super::{
    detokenize::IncrementalDecoder,
    grammar::GrammarState,
    logprobs::LogSoftmax,
    reasoning::ReplyReader,
    request::{
        CompletionTokensDetails, FinishReason, GenerationEvent, GenerationParams,
        GenerationRequest, PromptTokensDetails, TokenLogprob, TokenOutput, Usage,
    },
    sampling::Sampler,
    speculative::DraftDraws,
    stop::StopMatcher,
    traits::TextCodec,
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
/// `vocab_size` token ids (the prompt's ids and `logit_bias`'s).
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
    let mut bias_ids = params.sampling.logit_bias.iter().map(|&(id, _)| id);
    if let Some(bad) = bias_ids.find(|&t| t as usize >= vocab_size) {
        return Err(EngineError::InvalidRequest {
            message: format!(
                "`logit_bias` names token id {bad}, which is out of range (vocabulary size \
                 {vocab_size})"
            ),
            param: Some("logit_bias".into()),
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

/// How [`Generation::start`] went.
pub enum Started {
    /// The sequence needs the model: drive it with `input` / `fed` / `advance`.
    Running(Box<Generation>),
    /// It ended before any model work (invalid, cancelled, or `max_tokens` 0).
    Ended(Outcome),
}

/// What one [`Generation::advance`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A token was emitted; feed [`Generation::input`] next step.
    Continue,
    /// The generation ended (its final event, if any, was sent).
    Done(Outcome),
}

/// The state of one running request: everything except its model-side sequence (KV cache).
pub struct Generation {
    prompt: Vec<u32>,
    /// [`GenerationRequest::cache_partition`].
    cache_partition: Option<u64>,
    params: GenerationParams,
    sampler: Sampler,
    grammar: Option<GrammarState>,
    detok: IncrementalDecoder,
    stops: StopMatcher,
    /// With tools offered or a reasoning template: the reply read for its calls (counted for
    /// the log line) and its reasoning.
    reply: Option<ReplyReader>,
    /// Generated tokens that were reasoning ([`CompletionTokensDetails`]).
    reasoning_tokens: usize,
    events: mpsc::Sender<GenerationEvent>,
    tracker: RequestTracker,
    /// Prompt tokens already through the model.
    fed: usize,
    /// The next decode input: the last sampled token, then the tokens proposed after it for
    /// this step (speculation, [`Generation::propose`]).
    pending: Vec<u32>,
    /// For proposals a draft drew from its distribution, that distribution per proposed token
    /// ([`Generation::propose_drawn`]); empty for point masses.
    proposal_q: Vec<Vec<f32>>,
    /// The tokens generated so far (what prompt lookup searches, with the prompt).
    output: Vec<u32>,
    generated: usize,
    /// Prompt tokens restored from the prefix cache, when the model's cache is on (reported
    /// in `usage.prompt_tokens_details`).
    cached: Option<usize>,
}

impl Generation {
    /// Validates `request` against the model's limits and prepares its state. Uses
    /// `blocking_send` for the events, so drive it from a plain thread.
    pub fn start(
        request: &GenerationRequest,
        max_context: usize,
        vocab_size: usize,
        events: mpsc::Sender<GenerationEvent>,
        tracker: RequestTracker,
    ) -> Started {
        let prompt = &request.prompt;
        let params = &request.params;
        if let Err(e) = validate_prompt(prompt, params, max_context, vocab_size) {
            let _ = events.blocking_send(GenerationEvent::Failed(e.clone()));
            return Started::Ended(Outcome::Failed(e));
        }
        if events.is_closed() {
            return Started::Ended(Outcome::Cancelled);
        }
        let mut g = Generation {
            sampler: Sampler::new(&params.sampling, prompt),
            grammar: params.grammar.as_ref().map(GrammarState::new),
            detok: IncrementalDecoder::new(
                prompt,
                !params.reasoning.is_some_and(|r| r.keeps_special_tokens()),
            ),
            stops: StopMatcher::new(&params.stop),
            reply: (params.tool_calls.is_some() || params.reasoning.is_some())
                .then(|| ReplyReader::new(params.reasoning, params.tool_calls.as_ref())),
            reasoning_tokens: 0,
            prompt: prompt.clone(),
            cache_partition: request.cache_partition,
            params: params.clone(),
            events,
            tracker,
            fed: 0,
            pending: vec![0],
            proposal_q: Vec::new(),
            output: Vec::new(),
            generated: 0,
            cached: None,
        };
        if params.max_tokens == 0 {
            // Nothing to generate, but the prompt counts as served (usage reports it).
            g.tracker.prefilled(g.prompt.len());
            let finished = g.finish(FinishReason::Length, String::new());
            return Started::Ended(g.end(finished));
        }
        Started::Running(Box::new(g))
    }

    /// The client went away.
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed()
    }

    /// Prompt tokens not yet through the model.
    pub fn prefill_remaining(&self) -> usize {
        self.prompt.len() - self.fed
    }

    /// The tokens to run next: up to `budget` (at least 1) prompt tokens while prefilling,
    /// else the last sampled token and the tokens proposed after it.
    pub fn input(&self, budget: usize) -> &[u32] {
        if self.fed < self.prompt.len() {
            let end = self.prompt.len().min(self.fed + budget.max(1));
            &self.prompt[self.fed..end]
        } else {
            &self.pending
        }
    }

    /// Tokens proposed for the next decode step (0 while prefilling or not speculating).
    pub fn proposed(&self) -> usize {
        self.pending.len() - 1
    }

    /// Most tokens worth proposing for the next step: what can still be emitted after the
    /// token the step samples anyway (`max_tokens`); 0 while prefilling, and for a
    /// grammar-constrained request (its rows would each need the grammar's mask after the
    /// proposals before them: not done, so it does not speculate).
    pub fn proposal_room(&self) -> usize {
        if self.prefill_remaining() > 0 || self.grammar.is_some() {
            return 0;
        }
        self.params
            .max_tokens
            .saturating_sub(self.generated)
            .saturating_sub(1)
    }

    /// Every token of the sequence so far: the prompt, then the generated tokens (the last one
    /// not yet fed to the model).
    pub fn context(&self) -> Vec<u32> {
        let mut all = Vec::with_capacity(self.prompt.len() + self.output.len());
        all.extend_from_slice(&self.prompt);
        all.extend_from_slice(&self.output);
        all
    }

    /// Positions the model holds for this sequence once the last sampled token's step is done
    /// and before the next: the prompt and every generated token but the last.
    pub fn positions(&self) -> usize {
        self.prompt.len() + self.generated.saturating_sub(1)
    }

    /// Sets the tokens proposed after the last sampled one for the next decode step (at most
    /// [`Self::proposal_room`] of them are kept).
    pub fn propose(&mut self, tokens: &[u32]) {
        let keep = tokens.len().min(self.proposal_room());
        self.pending.truncate(1);
        self.pending.extend_from_slice(&tokens[..keep]);
        self.proposal_q.clear();
    }

    /// [`Self::propose`] for tokens a draft drew from the distributions `q` (one per token,
    /// as [`Self::draft_draws`] asked): each position is verified with the rejection scheme
    /// ([`crate::speculative::rejection`]). Without one distribution per token, the tokens count
    /// as point masses.
    pub fn propose_drawn(&mut self, tokens: &[u32], mut q: Vec<Vec<f32>>) {
        self.propose(tokens);
        if q.len() >= self.proposed() {
            q.truncate(self.proposed());
            self.proposal_q = q;
        }
    }

    /// How a draft model should draw up to `k` proposals for this sequence: `None` (greedily)
    /// for greedy and seeded requests, whose replies stay the ones without speculation; else
    /// the temperature and `k` uniform draws from the request's generator.
    pub fn draft_draws(&mut self, k: usize) -> Option<DraftDraws> {
        if !self.sampler.draws() || self.params.sampling.seed.is_some() {
            return None;
        }
        Some(DraftDraws {
            temperature: self.sampler.temperature(),
            uniforms: self.sampler.uniforms(k),
        })
    }

    /// Records that `input(..)` (of length `n`) went through the model. Returns whether the
    /// logits of that step are to be sampled (the prompt is complete).
    pub fn fed(&mut self, n: usize) -> bool {
        if self.fed < self.prompt.len() {
            self.fed = (self.fed + n).min(self.prompt.len());
            if self.fed < self.prompt.len() {
                return false;
            }
            self.tracker.prefilled(self.prompt.len());
        }
        true
    }

    /// The sequence starts from a copy of another's KV cache that already holds this prompt
    /// (another choice of the same request, of which `cached` tokens came from the prefix
    /// cache): the prompt counts as fed. Its tokens were counted once, by the sequence that
    /// computed them.
    pub fn skip_prefill(&mut self, cached: Option<usize>) {
        self.fed = self.prompt.len();
        self.cached = cached;
    }

    /// Prompt tokens restored from the prefix cache (`None` when the model's cache is off).
    pub fn cached(&self) -> Option<usize> {
        self.cached
    }

    /// Prompt tokens.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// The prompt's token ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The prefix-cache partition of the prompt ([`GenerationRequest::cache_partition`]).
    pub fn cache_partition(&self) -> Option<u64> {
        self.cache_partition
    }

    /// The most positions the sequence may come to hold: the prompt and `max_tokens`.
    pub fn max_len(&self) -> usize {
        self.prompt.len().saturating_add(self.params.max_tokens)
    }

    /// The model's prefix cache is on and the sequence starts with its first `cached` prompt
    /// positions restored from it (0 on a miss): they count as fed, and `usage` reports them as
    /// `prompt_tokens_details.cached_tokens`. At least the prompt's last token is left to
    /// compute.
    pub fn start_cached(&mut self, cached: usize) {
        let cached = cached.min(self.prompt.len().saturating_sub(1));
        self.fed = cached;
        self.cached = Some(cached);
    }

    /// Samples the next token from the logits of the step's last position and emits it; after
    /// a speculating decode step, `rows` are the logits after the last sampled token and after
    /// each token proposed for this step ([`Self::input`]; one row when none was), sampled in
    /// order, each token emitted, until a sampled token
    /// differs from the proposal at its place (it is emitted, the rest are rejected), the rows
    /// run out, or the generation ends. Returns the progress and how many proposals were
    /// accepted; the proposals are cleared.
    pub fn advance(&mut self, rows: Vec<Vec<f32>>, codec: &dyn TextCodec) -> (Progress, usize) {
        let proposals = self.pending.split_off(1.min(self.pending.len()));
        let drawn = std::mem::take(&mut self.proposal_q);
        let mut accepted = 0;
        let mut progress = Progress::Continue;
        for (i, mut logits) in rows.into_iter().enumerate() {
            // A drawn proposal is accepted or replaced by the rejection scheme; a point mass
            // by the plain draw. Either way it is accepted exactly when the token is it.
            let against = proposals
                .get(i)
                .zip(drawn.get(i))
                .map(|(&x, q)| (x, q.as_slice()));
            match self.step(&mut logits, against, codec) {
                Ok(None) => {}
                Ok(Some(done)) => {
                    progress = Progress::Done(self.end(Ok(done)));
                    break;
                }
                Err(abort) => {
                    progress = Progress::Done(self.end(Err(abort)));
                    break;
                }
            }
            match proposals.get(i) {
                Some(&proposed) if proposed == self.pending[0] => accepted += 1,
                _ => break,
            }
        }
        if !proposals.is_empty() {
            self.tracker.speculated(proposals.len(), accepted);
        }
        (progress, accepted)
    }

    /// Ends the generation with a model failure (reported to the client).
    pub fn fail(&self, err: EngineError) -> Outcome {
        self.end(Err(Abort::Failed(err)))
    }

    fn end(&self, result: Result<(FinishReason, Usage), Abort>) -> Outcome {
        match result {
            Ok((reason, usage)) => Outcome::Finished(reason, usage),
            Err(Abort::Failed(err)) => {
                // The client may be gone too; the failure is reported either way.
                let _ = self
                    .events
                    .blocking_send(GenerationEvent::Failed(err.clone()));
                Outcome::Failed(err)
            }
            Err(Abort::Cancelled) => Outcome::Cancelled,
        }
    }

    fn send(&self, event: GenerationEvent) -> Result<(), Abort> {
        self.events
            .blocking_send(event)
            .map_err(|_| Abort::Cancelled)
    }

    fn finish(
        &mut self,
        reason: FinishReason,
        trailing_text: String,
    ) -> Result<(FinishReason, Usage), Abort> {
        if let Some(reader) = &mut self.reply {
            reader.push(&trailing_text);
            reader.finish();
            // Harmony names calls even when no tools were offered; the API answers them.
            if self.params.tool_calls.is_some() || reader.calls() > 0 {
                self.tracker.tool_calls(reader.calls());
            }
        }
        if let Some(grammar) = &self.grammar {
            let (masks, average, engine) = grammar.mask_stats();
            let (average_us, engine_us) = (average.as_micros(), engine.as_micros());
            tracing::debug!(masks, average_us, engine_us, "grammar mask cost");
        }
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.generated,
            total_tokens: self.prompt.len() + self.generated,
            prompt_tokens_details: self
                .cached
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
            completion_tokens_details: self.params.reasoning.map(|_| CompletionTokensDetails {
                reasoning_tokens: self.reasoning_tokens,
            }),
        };
        self.send(GenerationEvent::Finished {
            reason,
            usage,
            trailing_text,
        })
        .map(|()| (reason, usage))
    }

    /// One sampling step (verifying `against`, a proposal and the distribution it was drawn
    /// from): `Ok(None)` to continue, `Ok(Some(..))` once finished.
    fn step(
        &mut self,
        logits: &mut [f32],
        against: Option<(u32, &[f32])>,
        codec: &dyn TextCodec,
    ) -> Result<Option<(FinishReason, Usage)>, Abort> {
        if self.is_cancelled() {
            return Err(Abort::Cancelled);
        }
        let raw = self.params.logprobs.map(|_| LogSoftmax::new(logits));
        if let Some(grammar) = &mut self.grammar {
            grammar.mask(logits)?;
        }
        let token = match against {
            Some((x, q)) => self.sampler.sample_against(logits, x, q).0,
            None => self.sampler.sample(logits),
        };
        self.generated += 1;
        self.tracker.token();
        self.pending = vec![token];
        self.output.push(token);
        let eos = codec.eos_token_ids().contains(&token);
        if eos && (!self.params.ignore_eos || self.grammar.is_some()) {
            let (tail, _) = release_all(codec, &mut self.detok, &mut self.stops)?;
            return self.finish(FinishReason::Stop, tail).map(Some);
        }
        if let Some(grammar) = &mut self.grammar {
            grammar.commit(token)?;
        }
        let step = self.stops.push(&self.detok.push(codec, token)?);
        let (logprob, top_logprobs) = match (&raw, self.params.logprobs) {
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
        if let Some(reader) = &mut self.reply {
            let before = reader.in_reasoning();
            reader.push(&step.text);
            if before || reader.in_reasoning() {
                self.reasoning_tokens += 1;
            }
        }
        self.send(GenerationEvent::Token(TokenOutput {
            text: step.text,
            token_id: token,
            logprob,
            top_logprobs,
        }))?;
        if step.stopped {
            return self.finish(FinishReason::Stop, String::new()).map(Some);
        }
        if self.generated >= self.params.max_tokens {
            let (tail, stopped) = release_all(codec, &mut self.detok, &mut self.stops)?;
            let reason = if stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            return self.finish(reason, tail).map(Some);
        }
        Ok(None)
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
#[path = "generate_tests.rs"]
mod tests;
