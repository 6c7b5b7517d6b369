//! How many tokens a sequence proposes: the count that maximises its expected tokens per
//! second, from its measured acceptance ([`Acceptance`]) and the measured cost of a step
//! ([`StepCost`]), down to none when proposing does not pay.
//!
//! With acceptance rate `a` per proposed token (each accepted independently, the first
//! rejection ending the run), `k` proposals yield `1 + a + ... + a^k` tokens per step. A step
//! of `n` tokens costs about `base + per_token * n` seconds: `base` is what a step costs
//! whatever its tokens (reading or streaming every weight once, the dispatch), `per_token` what
//! each token adds. A sequence of a batch of `b` pays `base / b` of it; its `k` proposals add
//! `k * (per_token + draft)` (`draft`: the draft model's cost per proposed token, 0 for prompt
//! lookup). A streamed model's `base` (the link) dwarfs `per_token`, so long proposals pay even
//! at low acceptance; a resident fast model at a large batch has little `base` per sequence,
//! and proposals stop paying there.
//!
//! Plain state, no clock: durations are passed in, so it is unit-tested.

use std::time::Duration;

/// Weight of the newest step in the running sums (both estimates follow drift).
pub const WEIGHT_NEW: f64 = 0.1;

/// A sequence that proposes nothing still proposes one token every this many steps, so its
/// acceptance keeps being measured.
pub const PROBE_EVERY: u32 = 16;

/// A sequence's measured acceptance: accepted proposals against rejections (at most one per
/// step), decayed sums, starting from one of each.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    accepted: f64,
    rejected: f64,
    /// Steps since it last proposed anything.
    idle: u32,
}

impl Default for Acceptance {
    fn default() -> Self {
        Self {
            accepted: 1.0,
            rejected: 1.0,
            idle: 0,
        }
    }
}

impl Acceptance {
    /// The estimated chance that a proposed token is accepted.
    pub fn rate(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Records a step that proposed `proposed` tokens of which the first `accepted` were taken.
    pub fn observe(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            self.idle = self.idle.saturating_add(1);
            return;
        }
        self.idle = 0;
        let keep = 1.0 - WEIGHT_NEW;
        let rejected = usize::from(accepted < proposed);
        self.accepted = self.accepted * keep + accepted as f64;
        self.rejected = self.rejected * keep + rejected as f64;
    }

    /// The proposals for the next step: [`best_length`] at this sequence's rate, or one as a
    /// probe after [`PROBE_EVERY`] steps of none, at most `max`.
    pub fn length(&self, cost: &StepCost, batch: usize, max: usize) -> usize {
        let best = best_length(self.rate(), cost.estimate(), batch, max);
        if best == 0 && self.idle >= PROBE_EVERY {
            return max.min(1);
        }
        best
    }
}

/// What a step's cost estimate says, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostEstimate {
    /// Cost of a step whatever its tokens.
    pub base: f64,
    /// Cost each token of a step adds.
    pub per_token: f64,
    /// The draft's cost per proposed token.
    pub draft: f64,
}

/// The number of proposals, 0 to `max`, that maximises expected tokens per second of a
/// sequence in a batch of `batch` accepting each proposal with chance `rate`. Without an
/// estimate yet, `max`.
pub fn best_length(rate: f64, cost: Option<CostEstimate>, batch: usize, max: usize) -> usize {
    let Some(cost) = cost else {
        return max;
    };
    let rate = rate.clamp(0.0, 1.0);
    let share = cost.base / batch.max(1) as f64 + cost.per_token;
    let mut best = (0, 0.0);
    let mut tokens = 0.0;
    let mut term = 1.0;
    for k in 0..=max {
        tokens += term;
        term *= rate;
        let seconds = share + k as f64 * (cost.per_token + cost.draft);
        let speed = tokens / seconds.max(1e-12);
        // Strictly faster by a margin: a tie keeps the shorter, cheaper proposal.
        if k == 0 || speed > best.1 * 1.01 {
            best = (k, speed);
        }
    }
    best.0
}

/// A model's step cost as `base + per_token * tokens`, fitted by least squares over the steps
/// seen (decayed sums), and the draft's cost per proposed token.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepCost {
    /// Decayed sums over steps: count, tokens, tokens², seconds, tokens x seconds.
    n: f64,
    x: f64,
    xx: f64,
    y: f64,
    xy: f64,
    /// Seconds per proposed token of the draft, once measured.
    draft: Option<f64>,
}

impl StepCost {
    /// Records a step of `tokens` tokens that took `took`.
    pub fn observe(&mut self, took: Duration, tokens: usize) {
        let (x, y) = (tokens as f64, took.as_secs_f64());
        let keep = 1.0 - WEIGHT_NEW;
        self.n = self.n * keep + 1.0;
        self.x = self.x * keep + x;
        self.xx = self.xx * keep + x * x;
        self.y = self.y * keep + y;
        self.xy = self.xy * keep + x * y;
    }

    /// Records that the draft proposed `tokens` tokens in `took` (a round that did not first
    /// catch up on a long stretch of context: the serve loop leaves those out).
    pub fn observe_draft(&mut self, took: Duration, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let sample = took.as_secs_f64() / tokens as f64;
        self.draft = Some(match self.draft {
            Some(old) => old + WEIGHT_NEW * (sample - old),
            None => sample,
        });
    }

    /// The fitted cost, once steps of different sizes were seen (before that, `None`). A fit
    /// with a negative slope or base is clamped to 0 there.
    pub fn estimate(&self) -> Option<CostEstimate> {
        if self.n < 2.0 {
            return None;
        }
        let mean_x = self.x / self.n;
        let mean_y = self.y / self.n;
        let var = self.xx / self.n - mean_x * mean_x;
        if var < 0.25 {
            // Every step had (nearly) the same tokens: the slope is unknown.
            return None;
        }
        let per_token = ((self.xy / self.n - mean_x * mean_y) / var).max(0.0);
        let base = (mean_y - per_token * mean_x).max(0.0);
        Some(CostEstimate {
            base,
            per_token,
            draft: self.draft.unwrap_or(0.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn cost(base: f64, per_token: f64, draft: f64) -> Option<CostEstimate> {
        Some(CostEstimate {
            base,
            per_token,
            draft,
        })
    }

    #[test]
    fn a_streamed_step_proposes_long_and_a_cheap_resident_batch_proposes_nothing() {
        // Streaming: 1 s a step whatever its tokens, 1 ms a token. Even 30% acceptance pays.
        assert_eq!(best_length(0.8, cost(1.0, 0.001, 0.0), 1, 8), 8);
        assert!(best_length(0.3, cost(1.0, 0.001, 0.0), 1, 8) >= 2);
        // Resident and fast at batch 32: the base per sequence is small beside a token's cost.
        assert_eq!(best_length(0.5, cost(0.010, 0.002, 0.0), 32, 8), 0);
        // A draft as costly per token as the target's step proposes nothing at low acceptance.
        assert_eq!(best_length(0.2, cost(0.010, 0.0, 0.010), 1, 8), 0);
        // No estimate yet: the most.
        assert_eq!(best_length(0.1, None, 1, 5), 5);
        assert_eq!(best_length(1.0, cost(1.0, 0.0, 0.0), 1, 0), 0);
    }

    #[test]
    fn the_step_cost_is_fitted_from_steps_of_different_sizes() {
        let mut cost = StepCost::default();
        assert_eq!(cost.estimate(), None);
        for _ in 0..5 {
            cost.observe(12 * MS, 1);
        }
        assert_eq!(cost.estimate(), None, "one size says nothing of the slope");
        // 10 ms + 2 ms a token.
        for tokens in [1, 5, 3, 9, 2] {
            cost.observe(MS * (10 + 2 * tokens), tokens as usize);
        }
        let fit = cost.estimate().expect("a fit");
        assert!((fit.base - 0.010).abs() < 1e-6, "{fit:?}");
        assert!((fit.per_token - 0.002).abs() < 1e-6, "{fit:?}");
        assert_eq!(fit.draft, 0.0);
        cost.observe_draft(6 * MS, 3);
        assert!((cost.estimate().unwrap().draft - 0.002).abs() < 1e-9);
    }

    #[test]
    fn acceptance_follows_the_steps_and_an_idle_sequence_probes() {
        let mut seen = Acceptance::default();
        assert_eq!(seen.rate(), 0.5);
        for _ in 0..40 {
            seen.observe(4, 4);
        }
        assert!(seen.rate() > 0.95, "{}", seen.rate());
        for _ in 0..40 {
            seen.observe(4, 0);
        }
        assert!(seen.rate() < 0.1, "{}", seen.rate());
        let resident = StepCost {
            n: 10.0,
            x: 100.0,
            xx: 1500.0,
            y: 0.1,
            xy: 1.5,
            draft: None,
        };
        // That fit: base 0 s, 1 ms a token: proposals never pay at this rate.
        assert_eq!(seen.length(&resident, 1, 4), 0);
        for _ in 0..PROBE_EVERY {
            seen.observe(0, 0);
        }
        assert_eq!(seen.length(&resident, 1, 4), 1, "a probe after a while");
        seen.observe(1, 0);
        assert_eq!(seen.length(&resident, 1, 4), 0);
    }
}
