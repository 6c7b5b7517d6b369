//! The step's token budget as a time target: how many tokens the next step may compute so it
//! takes about `step_time` on this device, from the rate the recent steps ran at.
//!
//! A fixed token budget is the wrong unit: 512 tokens are a few milliseconds on a GPU and
//! seconds on a small CPU, where a long prompt beside a stream pushed the stream's gap between
//! tokens to many seconds. The serving loop times every step ([`StepPacer::observe`]) and,
//! when the step is shared (other sequences wait on it for their next token or their first),
//! asks for the budget that keeps it near the target ([`StepPacer::budget`]). The estimate is
//! seconds per token over steps of at least [`MIN_SAMPLE_TOKENS`] tokens (prompt-heavy steps,
//! whose cost grows with the tokens), averaged with weight [`WEIGHT_NEW`] on the newest, so it
//! follows the cost of attention as a long prompt's context grows.
//!
//! Plain state, no clock of its own: the caller passes durations in, so it is unit-tested.

use std::time::Duration;

/// Steps of fewer tokens say little of the per-token cost (a decode step's cost is mostly
/// reading the weights once) and are not sampled.
pub const MIN_SAMPLE_TOKENS: usize = 32;

/// Weight of the newest sample in the running estimate.
pub const WEIGHT_NEW: f64 = 0.5;

/// The per-model step pacer.
#[derive(Debug, Clone)]
pub struct StepPacer {
    target: Option<Duration>,
    /// Seconds per token of recent prompt-heavy steps; `None` before the first one.
    per_token: Option<f64>,
}

impl StepPacer {
    /// A pacer aiming at steps of `target` (`None`: no target, every step may take the whole
    /// token budget).
    pub fn new(target: Option<Duration>) -> Self {
        Self {
            target: target.filter(|t| !t.is_zero()),
            per_token: None,
        }
    }

    /// Records that a step of `tokens` tokens took `took`.
    pub fn observe(&mut self, took: Duration, tokens: usize) {
        if tokens < MIN_SAMPLE_TOKENS {
            return;
        }
        let sample = took.as_secs_f64() / tokens as f64;
        self.per_token = Some(match self.per_token {
            Some(old) => old + WEIGHT_NEW * (sample - old),
            None => sample,
        });
    }

    /// The estimated seconds per token of a prompt-heavy step, once one was seen (for tests).
    #[cfg(test)]
    pub fn seconds_per_token(&self) -> Option<f64> {
        self.per_token
    }

    /// Tokens the next step may compute: `max` when it is not shared, there is no target or
    /// no rate is known yet; else what fits the target at the measured rate, at least `min`
    /// (what keeps every sequence moving) and at most `max`.
    pub fn budget(&self, shared: bool, min: usize, max: usize) -> usize {
        let max = max.max(1);
        let (true, Some(target), Some(per_token)) = (shared, self.target, self.per_token) else {
            return max;
        };
        let fits = (target.as_secs_f64() / per_token.max(1e-9)).floor();
        let fits = if fits >= max as f64 {
            max
        } else {
            fits as usize
        };
        fits.clamp(min.min(max), max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_shared_step_takes_what_fits_the_target() {
        let mut pacer = StepPacer::new(Some(100 * MS));
        assert_eq!(pacer.budget(true, 8, 512), 512, "no rate known yet");
        // 512 tokens in 1,024 ms: 2 ms a token, 50 fit in 100 ms.
        pacer.observe(1024 * MS, 512);
        assert_eq!(pacer.budget(true, 8, 512), 50);
        assert_eq!(pacer.budget(false, 8, 512), 512, "alone: the whole budget");
        assert_eq!(pacer.budget(true, 72, 512), 72, "never below the floor");
        assert_eq!(pacer.budget(true, 900, 512), 512, "nor above the limit");
        // Steps too small to say anything are not sampled.
        pacer.observe(1000 * MS, 4);
        assert_eq!(pacer.budget(true, 8, 512), 50);
        // A fast device: everything fits.
        let mut fast = StepPacer::new(Some(100 * MS));
        fast.observe(MS, 512);
        assert_eq!(fast.budget(true, 8, 512), 512);
    }

    #[test]
    fn the_estimate_follows_a_slower_rate_and_no_target_means_no_pacing() {
        let mut pacer = StepPacer::new(Some(100 * MS));
        pacer.observe(200 * MS, 100);
        assert_eq!(pacer.budget(true, 1, 512), 50);
        // Attention over a growing context: 4 ms a token now; the average moves halfway.
        pacer.observe(400 * MS, 100);
        let per_token = pacer.seconds_per_token().unwrap();
        assert!((per_token - 0.003).abs() < 1e-12, "{per_token}");
        assert_eq!(pacer.budget(true, 1, 512), 33);
        for target in [None, Some(Duration::ZERO)] {
            let mut off = StepPacer::new(target);
            off.observe(400 * MS, 100);
            assert_eq!(off.budget(true, 1, 512), 512);
        }
    }
}
