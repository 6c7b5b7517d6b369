//! Next-token selection for one sequence: `logit_bias`, penalties, then greedy argmax
//! (temperature 0) or temperature -> top-k -> top-p -> min-p -> a draw from a per-request seeded
//! RNG. A speculative proposal drawn from a draft model's distribution is verified against the
//! distribution a draw would come from ([`Sampler::sample_against`],
//! [`crate::speculative::rejection`]).

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::{penalties::Penalties, request::SamplingParams, speculative::rejection};

/// Picks tokens for one sequence. The same seed and the same sequence of logits always give the
/// same tokens.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    logit_bias: Vec<(u32, f32)>,
    penalties: Penalties,
    rng: StdRng,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt` (the repetition penalty looks at it).
    /// `params.seed == None` seeds from OS entropy.
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Self {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            logit_bias: params.logit_bias.clone(),
            penalties: Penalties::new(params, prompt),
            rng,
        }
    }

    /// Chooses the next token from `logits` (which it modifies: penalties and scaling are
    /// applied in place) and records it as generated for later penalties.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.adjust(logits);
        let token = if self.temperature <= 0.0 {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        self.penalties.record(token);
        token
    }

    /// Whether tokens are drawn (temperature above 0) rather than the argmax.
    pub fn draws(&self) -> bool {
        self.temperature > 0.0
    }

    /// The temperature draws use.
    pub fn temperature(&self) -> f32 {
        self.temperature
    }

    /// `n` uniform draws in `[0, 1)` from this sequence's generator (a draft model's draws of
    /// its proposals).
    pub fn uniforms(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.rng.random::<f64>()).collect()
    }

    /// [`sample`](Self::sample) for a position where a draft proposed `x`, drawn from its
    /// distribution `q`: the rejection scheme ([`rejection::verify`]) against the distribution
    /// a draw would come from. Returns the token (recorded as generated) and whether it is `x`.
    pub fn sample_against(&mut self, logits: &mut [f32], x: u32, q: &[f32]) -> (u32, bool) {
        self.adjust(logits);
        let drawn = if self.temperature > 0.0 {
            self.candidates(logits)
        } else {
            None
        };
        let verified = match drawn {
            Some(Candidates { cands, probs, mass }) => {
                let p: Vec<(u32, f64)> = cands
                    .iter()
                    .zip(&probs)
                    .filter(|(_, &p)| p > 0.0)
                    .map(|(&(id, _), &p)| (id, p / mass))
                    .collect();
                let (accept, residual) = (self.rng.random(), self.rng.random());
                rejection::verify(&p, x, q, accept, residual)
            }
            None => point(argmax(logits), x),
        };
        self.penalties.record(verified.token);
        (verified.token, verified.accepted)
    }

    /// `logit_bias` and penalties, applied in place (NaN logits become -inf first).
    fn adjust(&mut self, logits: &mut [f32]) {
        for l in logits.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        for &(id, bias) in &self.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if self.penalties.is_active() {
            self.penalties.apply(logits);
        }
    }

    fn draw(&mut self, logits: &mut [f32]) -> u32 {
        let Some(Candidates { cands, probs, mass }) = self.candidates(logits) else {
            return argmax(logits);
        };
        let target = self.rng.random::<f64>() * mass;
        let mut cum = 0.0;
        let mut last = None;
        for (&(id, _), &p) in cands.iter().zip(&probs) {
            if p <= 0.0 {
                continue;
            }
            cum += p;
            last = Some(id);
            if cum > target {
                return id;
            }
        }
        // Rounding left `target` at the very end: the last candidate with mass wins.
        last.unwrap_or_else(|| argmax(logits))
    }

    /// What a draw at this temperature comes from: the candidates left by top-k and top-p,
    /// their weights (0 where min-p drops them) and the weights' sum; `None` when no logit is
    /// finite (the argmax then). Scales `logits` by the temperature in place.
    fn candidates(&self, logits: &mut [f32]) -> Option<Candidates> {
        let inv_t = 1.0 / self.temperature;
        for l in logits.iter_mut() {
            *l *= inv_t;
        }
        let vocab = logits.len();
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let mut sorted = false;
        if self.top_k > 0 && self.top_k < vocab {
            cands.select_nth_unstable_by(self.top_k - 1, by_logit_desc);
            cands.truncate(self.top_k);
        }
        if self.top_p < 1.0 || (self.top_k > 0 && self.top_k < vocab) {
            cands.sort_unstable_by(by_logit_desc);
            sorted = true;
        }
        let max = cands
            .iter()
            .map(|&(_, l)| l)
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return None;
        }
        let mut probs: Vec<f64> = cands
            .iter()
            .map(|&(_, l)| ((l - max) as f64).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return None;
        }
        for p in &mut probs {
            *p /= total;
        }
        let mut keep = probs.len();
        if sorted && self.top_p < 1.0 {
            // A little slack so a set whose mass is top_p up to rounding counts as reaching it.
            let target = self.top_p as f64 - 1e-6;
            let mut cum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
        }
        cands.truncate(keep);
        probs.truncate(keep);
        if self.min_p > 0.0 {
            // `max` belongs to the top candidate, whose probability is exp(0) / total.
            let threshold = self.min_p as f64 / total;
            for p in probs.iter_mut() {
                if *p < threshold {
                    *p = 0.0;
                }
            }
        }
        let mass: f64 = probs.iter().sum();
        Some(Candidates { cands, probs, mass })
    }
}

/// What a draw comes from ([`Sampler::candidates`]).
struct Candidates {
    /// Token ids and their scaled logits, most likely first where sorted.
    cands: Vec<(u32, f32)>,
    /// Their weights (0 where min-p drops them).
    probs: Vec<f64>,
    /// The weights' sum.
    mass: f64,
}

/// Greedy verification: the argmax `token`, accepted when it is the proposal `x`.
fn point(token: u32, x: u32) -> rejection::Verified {
    rejection::Verified {
        token,
        accepted: token == x,
    }
}

/// Most likely first; equal logits keep the lower id first.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Index of the largest logit; ties go to the lowest id. Empty input gives 0.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > best_val {
            best = i;
            best_val = l;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(seed),
            ..SamplingParams::default()
        }
    }

    fn run(p: &SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p, &[]);
        (0..n).map(|_| s.sample(&mut logits.to_vec())).collect()
    }

    #[test]
    fn greedy_takes_argmax_with_lowest_id_on_ties() {
        assert_eq!(
            run(&params(0.0, 1), &[1.0, 3.0, 3.0, 2.0], 3),
            vec![1, 1, 1]
        );
        assert_eq!(argmax(&[f32::NEG_INFINITY, -5.0]), 1);
    }

    #[test]
    fn top_k_one_always_picks_the_max_whatever_the_temperature() {
        let p = SamplingParams {
            top_k: 1,
            ..params(100.0, 7)
        };
        let logits = [0.1, 0.3, 0.2, 0.29];
        assert!(run(&p, &logits, 200).iter().all(|&t| t == 1));
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let p = SamplingParams {
            top_p: 1e-6,
            ..params(5.0, 3)
        };
        let logits = [0.0, 0.5, 0.4, 0.1];
        assert!(run(&p, &logits, 200).iter().all(|&t| t == 1));
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // probs ~ [0.5, 0.3, 0.2] (logits are their logs): top_p 0.8 keeps ids 0 and 1 only.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let p = SamplingParams {
            top_p: 0.8,
            ..params(1.0, 11)
        };
        let out = run(&p, &logits, 2000);
        assert!(!out.contains(&2));
        assert!(out.contains(&0) && out.contains(&1));
    }

    #[test]
    fn min_p_filters_tokens_below_the_relative_threshold() {
        // probs [0.6, 0.3, 0.1]: min_p 0.4 -> threshold 0.24 drops id 2 only.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let p = SamplingParams {
            min_p: 0.4,
            ..params(1.0, 5)
        };
        let out = run(&p, &logits, 2000);
        assert!(!out.contains(&2));
        assert!(out.contains(&1));
    }

    #[test]
    fn penalties_move_the_argmax() {
        let logits = [2.0, 1.9, 0.0];
        // Repetition: id 0 is in the prompt, 2.0 / 1.5 < 1.9.
        let p = SamplingParams {
            repetition_penalty: 1.5,
            ..params(0.0, 0)
        };
        let mut s = Sampler::new(&p, &[0]);
        assert_eq!(s.sample(&mut logits.to_vec()), 1);
        // Presence: the first pick (0) is penalised, so the second pick switches to 1.
        let p = SamplingParams {
            presence_penalty: 0.5,
            ..params(0.0, 0)
        };
        assert_eq!(run(&p, &logits, 2), vec![0, 1]);
        // Frequency grows with the count: 0, then 1 (0 at 1.5 < 1.9), then 1 at 1.4 < 1.5 -> 0.
        let p = SamplingParams {
            frequency_penalty: 0.5,
            ..params(0.0, 0)
        };
        assert_eq!(run(&p, &logits, 3), vec![0, 1, 0]);
    }

    #[test]
    fn logit_bias_moves_and_bans_tokens() {
        let logits = [2.0, 1.0, 0.0];
        // +5 on id 2 makes it the argmax; -100 on id 0 bans it even when sampling hot.
        let p = SamplingParams {
            logit_bias: vec![(2, 5.0)],
            ..params(0.0, 0)
        };
        assert_eq!(run(&p, &logits, 3), vec![2, 2, 2]);
        let p = SamplingParams {
            logit_bias: vec![(0, -100.0), (7, 100.0)],
            ..params(1.0, 3)
        };
        let out = run(&p, &logits, 500);
        assert!(!out.contains(&0), "a -100 bias bans the token");
        assert!(out.contains(&1) && out.contains(&2));
    }

    #[test]
    fn same_seed_reproduces_and_different_seeds_diverge() {
        let flat = vec![0.0f32; 1000];
        let a = run(&params(1.0, 42), &flat, 50);
        let b = run(&params(1.0, 42), &flat, 50);
        let c = run(&params(1.0, 43), &flat, 50);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn two_token_distribution_matches_its_probabilities() {
        // p(1) = 0.8 exactly under softmax.
        let logits = [0.0, 4.0f32.ln()];
        let out = run(&params(1.0, 1234), &logits, 2000);
        let ones = out.iter().filter(|&&t| t == 1).count() as f64 / 2000.0;
        assert!((ones - 0.8).abs() < 0.03, "frequency of id 1 was {ones}");
    }

    #[test]
    fn temperature_sharpens_the_distribution() {
        let logits = [0.0, 4.0f32.ln()];
        // T = 0.5 squares the odds: p(1) = 16 / 17.
        let out = run(&params(0.5, 99), &logits, 2000);
        let ones = out.iter().filter(|&&t| t == 1).count() as f64 / 2000.0;
        assert!(
            (ones - 16.0 / 17.0).abs() < 0.03,
            "frequency of id 1 was {ones}"
        );
    }

    #[test]
    fn nan_and_infinite_logits_do_not_panic() {
        let mut s = Sampler::new(&params(1.0, 1), &[]);
        assert_eq!(s.sample(&mut [f32::NAN, f32::NEG_INFINITY, 1.0]), 2);
        assert_eq!(s.sample(&mut [f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }
}
