//! Speculative decoding keeps a sampled request's output distribution the model's: a Markov
//! chain over five tokens stands in for the model (every row a full distribution, so proposals
//! are often right and often wrong), many seeded requests run through the serving loop with
//! prompt lookup, and the third generated token's counts pass a chi-square test against the
//! chain's exact three-step distribution. Each seeded reply is also the reply without
//! speculation, token for token. With a draft model (another chain, [`DRAFT`]) the same holds:
//! seeded requests get its greedy proposals and the replies without speculation; requests
//! without a seed get proposals drawn from its distribution, verified by the rejection scheme,
//! and their third tokens pass the same test (their draws come from OS entropy, so this one can
//! fail by chance: at the 0.01% point, once in ten thousand runs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use ferry_metrics::Metrics;
use tokio::sync::mpsc;

use crate::prefix_cache::PrefixCacheOptions;
use crate::queue::{Job, Work};
use crate::request::{GenerationEvent, GenerationParams, GenerationRequest, SamplingParams};
use crate::scheduler::StepLimits;
use crate::serve_loop::{serve_requests, LoopContext};
use crate::speculative::{rejection, DraftAsk, Proposal, Speculation, SpeculationMethod};
use crate::test_support::TestCodec;
use crate::traits::LanguageModel;
use crate::EngineResult;

/// The chain's tokens (ids of the test codec's vocabulary).
const TOKENS: [u32; 5] = [10, 11, 12, 13, 14];

/// Row `i`: the chance of each of [`TOKENS`] after `TOKENS[i]` (any other token acts as the
/// first).
const CHAIN: [[f64; 5]; 5] = [
    [0.50, 0.20, 0.15, 0.10, 0.05],
    [0.10, 0.60, 0.10, 0.10, 0.10],
    [0.30, 0.05, 0.05, 0.30, 0.30],
    [0.05, 0.05, 0.80, 0.05, 0.05],
    [0.25, 0.25, 0.20, 0.15, 0.15],
];

/// The draft's chain: close to [`CHAIN`] in places, far in others, never a point mass.
const DRAFT: [[f64; 5]; 5] = [
    [0.30, 0.30, 0.20, 0.10, 0.10],
    [0.10, 0.50, 0.20, 0.10, 0.10],
    [0.10, 0.10, 0.10, 0.40, 0.30],
    [0.10, 0.10, 0.60, 0.10, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.20],
];

/// The chain as a model: the logits after each position are the logs of its row.
struct Chain {
    vocab: usize,
    speculation: Speculation,
    /// What each step costs beyond its arithmetic: a draft model's proposals pay only where a
    /// step costs more than the draft (as a streamed model's does), so the draft runs get one.
    step_cost: Duration,
}

impl Chain {
    fn row(&self, after: u32) -> Vec<f32> {
        let from = TOKENS.iter().position(|&t| t == after).unwrap_or(0);
        let mut logits = vec![f32::NEG_INFINITY; self.vocab];
        for (&t, &p) in TOKENS.iter().zip(&CHAIN[from]) {
            logits[t as usize] = p.ln() as f32;
        }
        logits
    }
}

impl LanguageModel for Chain {
    /// The tokens fed.
    type Sequence = Vec<u32>;
    type Block = ();

    fn new_sequence(&self) -> Vec<u32> {
        Vec::new()
    }

    fn forward_rows(
        &mut self,
        batch: &mut [(&mut Vec<u32>, &[u32])],
        outputs: &[usize],
    ) -> EngineResult<Vec<Vec<f32>>> {
        std::thread::sleep(self.step_cost);
        let mut rows = Vec::new();
        for ((seq, tokens), &n) in batch.iter_mut().zip(outputs) {
            seq.extend_from_slice(tokens);
            for &t in &tokens[tokens.len() - n..] {
                rows.push(self.row(t));
            }
        }
        Ok(rows)
    }

    fn truncate_sequence(&self, seq: &mut Vec<u32>, len: usize) -> EngineResult<()> {
        seq.truncate(len);
        Ok(())
    }

    fn supports_truncate(&self) -> bool {
        true
    }

    fn speculation(&self) -> Speculation {
        self.speculation
    }

    /// The [`DRAFT`] chain proposes: its most likely token, or one drawn from its row.
    fn propose(
        &mut self,
        batch: &mut [(&mut Vec<u32>, DraftAsk<'_>)],
    ) -> EngineResult<Vec<Proposal>> {
        let proposals = batch
            .iter()
            .map(|(_, ask)| {
                let mut proposal = Proposal::default();
                let mut last = *ask.context.last().unwrap();
                for i in 0..ask.max {
                    let from = TOKENS.iter().position(|&t| t == last).unwrap_or(0);
                    let mut q = vec![0.0f32; self.vocab];
                    for (&t, &p) in TOKENS.iter().zip(&DRAFT[from]) {
                        q[t as usize] = p as f32;
                    }
                    last = match &ask.draws {
                        Some(draws) => rejection::draw(&q, draws.uniforms[i]),
                        None => crate::sampling::argmax(&q),
                    };
                    proposal.tokens.push(last);
                    if ask.draws.is_some() {
                        proposal.q.push(q);
                    }
                }
                proposal
            })
            .collect();
        Ok(proposals)
    }

    fn max_context(&self) -> usize {
        4096
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }
}

/// Each seed's reply (token ids) to a prompt ending in token 10, `tokens` long, served all in
/// one loop (a batch of 8) with `method` proposing up to 4 tokens; and the metrics.
fn replies(
    seeds: std::ops::Range<u64>,
    tokens: usize,
    method: SpeculationMethod,
) -> (Vec<Vec<u32>>, Metrics) {
    serve(seeds.map(Some).collect(), tokens, method)
}

/// [`replies`] for one request per entry of `seeds` (`None`: no seed).
fn serve(
    seeds: Vec<Option<u64>>,
    tokens: usize,
    method: SpeculationMethod,
) -> (Vec<Vec<u32>>, Metrics) {
    let mut model = Chain {
        vocab: TestCodec::new().vocab_size(),
        speculation: Speculation {
            method,
            max_tokens: 4,
        },
        step_cost: match method {
            SpeculationMethod::Draft => Duration::from_millis(1),
            _ => Duration::ZERO,
        },
    };
    let (jobs, receiver) = std_mpsc::channel();
    let mut streams = Vec::new();
    for seed in seeds {
        let (events, stream) = mpsc::channel(4096);
        streams.push(stream);
        let request = GenerationRequest {
            cache_partition: None,
            model: "m".into(),
            prompt: vec![12, 13, 10, 11, 11, 10],
            params: GenerationParams {
                max_tokens: tokens,
                ignore_eos: true,
                sampling: SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    seed,
                    ..SamplingParams::default()
                },
                ..GenerationParams::default()
            },
        };
        let job = Job {
            request,
            events,
            forks: Vec::new(),
            accepted: Instant::now(),
            context: None,
        };
        jobs.send(Work::Generate(Box::new(job))).unwrap();
    }
    drop(jobs);
    let metrics = Metrics::new();
    let pending = AtomicUsize::new(streams.len());
    let context = LoopContext {
        name: "m",
        jobs: &receiver,
        pending: &pending,
        metrics: &metrics,
        limits: StepLimits {
            max_batch: 8,
            prefill_chunk: 512,
            max_step_tokens: 512,
            step_time: None,
        },
        prefix: PrefixCacheOptions::default(),
    };
    serve_requests(&mut model, &TestCodec::new(), &context);
    assert_eq!(pending.load(Ordering::SeqCst), 0);
    let replies = streams
        .iter_mut()
        .map(|stream| {
            std::iter::from_fn(|| stream.blocking_recv())
                .filter_map(|event| match event {
                    GenerationEvent::Token(t) => Some(t.token_id),
                    _ => None,
                })
                .collect()
        })
        .collect();
    (replies, metrics)
}

/// The chain's distribution `steps` tokens after token `TOKENS[from]`.
fn after(from: usize, steps: usize) -> [f64; 5] {
    let mut p = [0.0; 5];
    p[from] = 1.0;
    for _ in 0..steps {
        let mut next = [0.0; 5];
        for (i, pi) in p.iter().enumerate() {
            for (j, pij) in CHAIN[i].iter().enumerate() {
                next[j] += pi * pij;
            }
        }
        p = next;
    }
    p
}

/// Chi-square of the replies' third tokens (after the prompt's last, token 10 = TOKENS[0])
/// against the chain's distribution three steps on.
fn third_token_chi_square(replies: &[Vec<u32>]) -> f64 {
    let n = replies.len() as f64;
    let mut counts = [0f64; 5];
    for reply in replies {
        assert_eq!(reply.len(), 3);
        let at = TOKENS
            .iter()
            .position(|&t| t == reply[2])
            .expect("a chain token");
        counts[at] += 1.0;
    }
    let expected = after(0, 3);
    counts
        .iter()
        .zip(expected)
        .map(|(&seen, p)| {
            let e = p * n;
            (seen - e) * (seen - e) / e
        })
        .sum()
}

#[test]
fn sampled_replies_keep_the_models_distribution_and_their_seeds() {
    const N: u64 = 3000;
    let (fast, metrics) = replies(0..N, 3, SpeculationMethod::Ngram);
    let (drafted, accepted) = metrics.speculation_counts("m");
    assert!(
        accepted > 300 && accepted < drafted,
        "proposals were both taken and refused: {accepted} of {drafted}"
    );
    let chi2 = third_token_chi_square(&fast);
    // 4 degrees of freedom: 18.47 is the 0.1% point.
    assert!(chi2 < 18.47, "chi-square {chi2}");
    // Seeded: the replies are the ones without speculation, token for token.
    let (plain, _) = replies(0..200, 12, SpeculationMethod::Off);
    let (fast, _) = replies(0..200, 12, SpeculationMethod::Ngram);
    assert_eq!(fast, plain);
}

#[test]
fn a_draft_models_drawn_proposals_keep_the_distribution_and_seeds_keep_their_replies() {
    const N: usize = 3000;
    let (fast, metrics) = serve(vec![None; N], 3, SpeculationMethod::Draft);
    let (drafted, accepted) = metrics.speculation_counts("m");
    assert!(
        accepted > 300 && accepted < drafted,
        "proposals were both taken and refused: {accepted} of {drafted}"
    );
    let chi2 = third_token_chi_square(&fast);
    // 4 degrees of freedom: 23.51 is the 0.01% point.
    assert!(chi2 < 23.51, "chi-square {chi2}");
    // Seeded: greedy proposals, and the replies without speculation, token for token.
    let (plain, _) = replies(0..200, 12, SpeculationMethod::Off);
    let (fast, metrics) = replies(0..200, 12, SpeculationMethod::Draft);
    assert_eq!(fast, plain);
    assert!(
        metrics.speculation_counts("m").1 > 0,
        "some proposals taken"
    );
}
