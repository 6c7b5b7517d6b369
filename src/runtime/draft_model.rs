//! The draft model of speculative method `draft` as it runs: a second, smaller model with the
//! served model's vocabulary, every layer resident on the compute device, and one KV cache per
//! sequence ([`DraftCache`], kept in the sequence next to the served model's). It proposes
//! ([`DraftModel::propose`]) greedily, or for a sampled request by drawing from its own
//! distribution at the request's temperature (returned with the tokens, for the rejection
//! scheme): it first catches up on what it has not seen of the sequence (after a rejection,
//! the positions it was wrong about are forgotten first, so its cache always holds a prefix of
//! the sequence), then feeds its own proposals one step at a time, every proposing sequence in
//! the same step.
//!
//! Its KV bytes are counted live ([`DraftModel::live_kv`]): each cache adds what it allocates
//! and takes it back when the sequence is dropped (finished or cancelled).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::D;
use ferry_engine::speculative::{rejection, DraftAsk, DraftDraws, Proposal};
use ferry_model::decoder::{Model, SeqInput};
use ferry_model::kv_cache::KvCache;
use ferry_model::ModelError;
use ferry_offload::WeightStore;

/// Most tokens of one sequence the draft catches up on in one forward pass (a long prompt is
/// fed in chunks of this size, as a served prompt is in steps).
pub const CATCH_UP_CHUNK: usize = 512;

/// The loaded draft: its model, its resident layers, its context and the live count of the
/// bytes its sequences' caches hold.
pub struct DraftModel {
    model: Model,
    layers: WeightStore,
    max_context: usize,
    /// Token ids the served model accepts: a proposal outside them ends that sequence's
    /// proposals (a draft with a padded embedding table).
    target_vocab: usize,
    live_kv: Arc<AtomicUsize>,
}

/// One sequence's draft state: its KV cache and the tokens it holds (compared with the
/// sequence's context before each proposal).
#[derive(Debug)]
pub struct DraftCache {
    cache: KvCache,
    fed: Vec<u32>,
    /// Bytes of `cache` counted in `live`.
    counted: usize,
    live: Arc<AtomicUsize>,
}

impl DraftCache {
    /// Forgets every position at or after `len`.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        self.cache.truncate(len)?;
        self.fed.truncate(len);
        Ok(())
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.fed.len()
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.fed.is_empty()
    }

    /// An independent copy (its own buffers), counted as well.
    pub fn fork(&self) -> Result<Self, ModelError> {
        let mut copy = Self {
            cache: self.cache.fork()?,
            fed: self.fed.clone(),
            counted: 0,
            live: Arc::clone(&self.live),
        };
        copy.recount();
        Ok(copy)
    }

    /// Brings the live count in line with what the cache has allocated now.
    fn recount(&mut self) {
        let now = self.cache.allocated_bytes();
        if now >= self.counted {
            self.live.fetch_add(now - self.counted, Ordering::Relaxed);
        } else {
            self.live.fetch_sub(self.counted - now, Ordering::Relaxed);
        }
        self.counted = now;
    }
}

impl Drop for DraftCache {
    fn drop(&mut self) {
        self.live.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

/// A draft's next token and, when it was drawn, the distribution it was drawn from.
type Drafted = (u32, Option<Vec<f32>>);

/// One sequence's part of a proposal step.
struct Proposing<'a> {
    cache: &'a mut DraftCache,
    /// Tokens of the context the draft has not seen yet (at least one).
    unfed: &'a [u32],
    /// How many tokens to propose.
    k: usize,
    /// How to draw them (`None`: greedily).
    draws: Option<&'a DraftDraws>,
    proposal: Proposal,
}

impl Proposing<'_> {
    /// How the next proposal is chosen: `None` greedily, else the temperature and its uniform.
    fn how(&self) -> Option<(f32, f64)> {
        let draws = self.draws?;
        let u = draws
            .uniforms
            .get(self.proposal.tokens.len())
            .copied()
            .unwrap_or(0.5);
        Some((draws.temperature, u))
    }
}

impl DraftModel {
    /// Serves `model` with its resident `layers` as a draft for a model of `target_vocab` token
    /// ids, its sequences holding at most `max_context` positions.
    pub fn new(model: Model, layers: WeightStore, max_context: usize, target_vocab: usize) -> Self {
        let max_context = max_context.min(model.spec().max_context);
        Self {
            model,
            layers,
            max_context,
            target_vocab,
            live_kv: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The bytes the draft's caches hold right now, all sequences together (0 once every
    /// sequence is dropped).
    pub fn live_kv(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.live_kv)
    }

    /// The draft's weight store (its accounting: weights on the device, KV peak).
    pub fn store(&self) -> &WeightStore {
        &self.layers
    }

    /// The draft model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// A fresh, empty draft state.
    pub fn new_cache(&self) -> DraftCache {
        DraftCache {
            cache: self.model.new_cache_with_limit(self.max_context),
            fed: Vec::new(),
            counted: 0,
            live: Arc::clone(&self.live_kv),
        }
    }

    /// For each `(state, ask)`: up to `ask.max` tokens the draft proposes after `ask.context`
    /// (the sequence so far, its last token not yet fed to the served model), greedily or
    /// drawn as `ask.draws` says, the state created on first use. Fewer where the draft's
    /// context runs out.
    pub fn propose(
        &mut self,
        batch: &mut [(&mut Option<DraftCache>, &DraftAsk)],
    ) -> Result<Vec<Proposal>, ModelError> {
        let mut out = vec![Proposal::default(); batch.len()];
        let mut proposing: Vec<(usize, Proposing)> = Vec::with_capacity(batch.len());
        for (i, (state, ask)) in batch.iter_mut().enumerate() {
            let ask: &DraftAsk = ask;
            let (context, k) = (ask.context, ask.max);
            if k == 0 || context.is_empty() || context.len() > self.max_context {
                continue;
            }
            let cache = state.get_or_insert_with(|| self.new_cache());
            // Keep the positions the draft holds that are still the sequence's, and at least
            // the last token to feed (its logits give the first proposal).
            let same = cache
                .fed
                .iter()
                .zip(context.iter())
                .take_while(|(a, b)| a == b)
                .count()
                .min(context.len() - 1);
            cache.truncate(same)?;
            // The context, then k - 1 proposals fed after it, must fit.
            let k = k.min(self.max_context + 1 - context.len());
            proposing.push((
                i,
                Proposing {
                    cache,
                    unfed: &context[same..],
                    k,
                    draws: ask.draws.as_ref(),
                    proposal: Proposal {
                        caught_up: context.len() - same,
                        ..Proposal::default()
                    },
                },
            ));
        }
        let result = self.run(&mut proposing);
        for (_, p) in proposing.iter_mut() {
            p.cache.recount();
        }
        result?;
        for (i, p) in proposing {
            out[i] = p.proposal;
        }
        Ok(out)
    }

    /// Catches every sequence up and proposes until each has its `k` tokens.
    fn run(&mut self, proposing: &mut [(usize, Proposing)]) -> Result<(), ModelError> {
        // Long catch-ups first, a chunk at a time per sequence, leaving the last chunk for the
        // step every sequence shares.
        for (_, p) in proposing.iter_mut() {
            while p.unfed.len() > CATCH_UP_CHUNK {
                let (chunk, rest) = p.unfed.split_at(CATCH_UP_CHUNK);
                self.step(&mut [(&mut *p.cache, chunk)], &[None])?;
                p.unfed = rest;
            }
        }
        let first: Vec<&[u32]> = proposing.iter().map(|(_, p)| p.unfed).collect();
        let how: Vec<_> = proposing.iter().map(|(_, p)| p.how()).collect();
        let mut inputs: Vec<(&mut DraftCache, &[u32])> = proposing
            .iter_mut()
            .zip(&first)
            .map(|((_, p), tokens)| (&mut *p.cache, *tokens))
            .collect();
        let tokens = self.step(&mut inputs, &how)?;
        drop(inputs);
        let mut going: Vec<bool> = Vec::with_capacity(proposing.len());
        for ((_, p), token) in proposing.iter_mut().zip(tokens) {
            going.push(self.take(p, token));
        }
        loop {
            let last: Vec<[u32; 1]> = proposing
                .iter()
                .zip(&going)
                .filter(|(_, &go)| go)
                .map(|((_, p), _)| [*p.proposal.tokens.last().unwrap_or(&0)])
                .collect();
            if last.is_empty() {
                return Ok(());
            }
            let how: Vec<_> = proposing
                .iter()
                .zip(&going)
                .filter(|(_, &go)| go)
                .map(|((_, p), _)| p.how())
                .collect();
            let mut inputs: Vec<(&mut DraftCache, &[u32])> = proposing
                .iter_mut()
                .zip(&going)
                .filter(|(_, &go)| go)
                .zip(&last)
                .map(|(((_, p), _), token)| (&mut *p.cache, token.as_slice()))
                .collect();
            let tokens = self.step(&mut inputs, &how)?;
            drop(inputs);
            let mut tokens = tokens.into_iter();
            for ((_, p), go) in proposing.iter_mut().zip(going.iter_mut()) {
                if *go {
                    let token = tokens.next().ok_or_else(|| {
                        ModelError::Source("the draft returned too few rows".into())
                    })?;
                    *go = self.take(p, token);
                }
            }
        }
    }

    /// Records `token` (and the distribution it was drawn from) as `p`'s next proposal;
    /// whether it proposes another after it.
    fn take(&self, p: &mut Proposing, (token, q): Drafted) -> bool {
        if token as usize >= self.target_vocab {
            return false;
        }
        p.proposal.tokens.push(token);
        if let Some(q) = q {
            p.proposal.q.push(q);
        }
        p.proposal.tokens.len() < p.k
    }

    /// One forward pass of the draft over `inputs`; the token after each one's last: greedy
    /// where `how` is `None`, else drawn at `how`'s temperature with its uniform, with the
    /// distribution it was drawn from.
    fn step(
        &mut self,
        inputs: &mut [(&mut DraftCache, &[u32])],
        how: &[Option<(f32, f64)>],
    ) -> Result<Vec<Drafted>, ModelError> {
        let outputs = vec![1; inputs.len()];
        let mut seqs: Vec<SeqInput> = inputs
            .iter_mut()
            .map(|(state, tokens)| SeqInput {
                tokens,
                cache: &mut state.cache,
            })
            .collect();
        let logits = self
            .model
            .forward_rows(&mut seqs, &outputs, &mut self.layers)?;
        drop(seqs);
        for (state, tokens) in inputs.iter_mut() {
            state.fed.extend_from_slice(tokens);
        }
        if how.iter().all(Option::is_none) {
            let greedy = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            return Ok(greedy.into_iter().map(|t| (t, None)).collect());
        }
        let rows = logits.to_vec2::<f32>()?;
        Ok(rows
            .iter()
            .zip(how)
            .map(|(row, how)| match *how {
                None => (ferry_engine::sampling::argmax(row), None),
                Some((temperature, u)) => {
                    let q = softmax(row, temperature);
                    (rejection::draw(&q, u), Some(q))
                }
            })
            .collect())
    }
}

/// `logits / temperature` normalised into probabilities (f32, by token id).
fn softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    let inv_t = 1.0 / temperature.max(f32::MIN_POSITIVE);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return vec![1.0 / logits.len().max(1) as f32; logits.len()];
    }
    let exps: Vec<f64> = logits
        .iter()
        .map(|&l| f64::from((l - max) * inv_t).exp())
        .collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|&e| (e / total) as f32).collect()
}
