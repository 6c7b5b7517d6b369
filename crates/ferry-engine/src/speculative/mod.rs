//! Speculative decoding: a sequence's decode step feeds, after its last sampled token, a few
//! tokens proposed for what follows ([`ngram`]: copied from earlier in its context; or a draft
//! model's, [`crate::traits::LanguageModel::propose`]), and the model returns the logits after
//! every one of them from that one pass ([`crate::traits::LanguageModel::forward_rows`]). The
//! generation samples from those rows in order exactly as it samples a decode step's, and stops
//! at the first sampled token that differs from the proposal ([`crate::generate`]); the positions
//! after it are forgotten ([`crate::traits::LanguageModel::truncate_sequence`]). So one pass over
//! the weights (one stream of an offloaded model) can yield several tokens, and the output is
//! the one decoding token by token gives: greedy output is identical, and with sampling each
//! token is the draw the request's seeded generator makes at that position anyway.
//!
//! That is the standard rejection scheme for a proposal that is a point mass `q` on token `x`:
//! accept `x` with probability `min(1, p(x) / q(x)) = p(x)`, else draw from `max(0, p - q)`
//! normalised, which is `p` without `x`. Drawing `y ~ p` and accepting when `y == x` does both
//! with one draw: `y == x` has probability `p(x)`, and a `y != x` is distributed as `p`
//! restricted to the other tokens. Prompt lookup always proposes point masses, and so does a
//! draft model for greedy and seeded requests (its greedy choice): their output is then the
//! output without speculation, token for token. For a sampled request without a seed, a draft
//! model draws each proposal from its own distribution `q` at the request's temperature, and
//! the position is verified with the general scheme ([`rejection`]: accept with
//! `min(1, p / q)`, else draw from `max(0, p - q)`), which accepts more often where the two
//! models spread their mass alike; the output is distributed as the model's.
//!
//! [`length`] picks each sequence's number of proposals from its measured acceptance and the
//! measured cost of a step, down to none when proposing does not pay.

pub mod length;
pub mod ngram;
pub mod rejection;

/// Most tokens proposed per sequence and step: a step's verification of up to this many
/// proposals plus the last token computes each position exactly as decoding it would (the
/// model's CPU attention runs chunks of up to 16 rows row by row).
pub const MAX_PROPOSAL: usize = 15;

/// Who proposes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeculationMethod {
    /// Nobody: one token per sequence and step.
    #[default]
    Off,
    /// A draft model next to the served one ([`crate::traits::LanguageModel::propose`]).
    Draft,
    /// Prompt lookup over the sequence's own context ([`ngram::propose`]).
    Ngram,
}

/// How a model's decode steps speculate ([`crate::traits::LanguageModel::speculation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Speculation {
    /// Who proposes.
    pub method: SpeculationMethod,
    /// Most tokens proposed per sequence and step (capped at [`MAX_PROPOSAL`]).
    pub max_tokens: usize,
}

impl Speculation {
    /// The most proposals per sequence and step: 0 when off.
    pub fn max_proposals(&self) -> usize {
        match self.method {
            SpeculationMethod::Off => 0,
            _ => self.max_tokens.min(MAX_PROPOSAL),
        }
    }
}

/// What one sequence asks a draft model for ([`crate::traits::LanguageModel::propose`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftAsk<'a> {
    /// Every token of the sequence so far, the last one not yet fed to the served model.
    pub context: &'a [u32],
    /// Most tokens to propose.
    pub max: usize,
    /// `None`: propose greedily. `Some`: draw each proposal from the draft's distribution.
    pub draws: Option<DraftDraws>,
}

/// How a draft draws its proposals for a sampled request.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftDraws {
    /// The request's temperature: the draft's logits are divided by it.
    pub temperature: f32,
    /// One uniform draw in `[0, 1)` per proposal, from the request's generator
    /// ([`rejection::draw`] with each).
    pub uniforms: Vec<f64>,
}

/// A draft's proposals for one sequence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    /// The proposed tokens, in order.
    pub tokens: Vec<u32>,
    /// For drawn proposals, the distribution each was drawn from (a probability per token id,
    /// one row per token); empty for greedy ones (point masses).
    pub q: Vec<Vec<f32>>,
    /// Tokens of the context the draft fed before its first proposal (what it had not seen:
    /// 1 or 2 when it proposed the step before, the whole prompt the first time).
    pub caught_up: usize,
}

/// Most tokens a draft may catch up on in a proposal round whose time counts as the draft's
/// cost per proposed token ([`length::StepCost::observe_draft`]): after a step that proposed,
/// a draft feeds its last proposal and the step's new token, or after a rejection the new
/// token. A longer catch-up (a prompt, or the steps a sequence did not propose) is a one-off,
/// not what a further proposal costs.
pub const STEADY_CATCH_UP: usize = 2;

#[cfg(test)]
mod sampling_tests;
