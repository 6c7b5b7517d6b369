//! Logit penalties applied before sampling: the HF/vLLM repetition penalty (prompt and generated
//! tokens) and OpenAI's presence and frequency penalties (generated tokens only).

use std::collections::{HashMap, HashSet};

use super::request::SamplingParams;

/// Penalty state for one sequence: which tokens the prompt holds and how often each generated
/// token occurred so far.
#[derive(Debug, Clone)]
pub struct Penalties {
    repetition: f32,
    presence: f32,
    frequency: f32,
    /// Distinct prompt tokens (only kept when the repetition penalty is active).
    prompt: HashSet<u32>,
    /// Occurrences of each generated token.
    generated: HashMap<u32, u32>,
}

impl Penalties {
    /// Penalty state for a sequence that starts with `prompt`.
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> Self {
        let repetition = params.repetition_penalty;
        let prompt = if repetition_active(repetition) {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Self {
            repetition,
            presence: params.presence_penalty,
            frequency: params.frequency_penalty,
            prompt,
            generated: HashMap::new(),
        }
    }

    /// Whether any penalty would change logits.
    pub fn is_active(&self) -> bool {
        repetition_active(self.repetition) || self.presence != 0.0 || self.frequency != 0.0
    }

    /// Notes a generated token.
    pub fn record(&mut self, token: u32) {
        *self.generated.entry(token).or_insert(0) += 1;
    }

    /// Applies every penalty to `logits` in place. Ids outside `logits` are ignored.
    pub fn apply(&self, logits: &mut [f32]) {
        if repetition_active(self.repetition) {
            let seen = self
                .prompt
                .iter()
                .chain(self.generated.keys().filter(|t| !self.prompt.contains(*t)));
            for &token in seen {
                if let Some(l) = logits.get_mut(token as usize) {
                    // HF semantics: push the logit towards "less likely" whatever its sign.
                    *l = if *l > 0.0 {
                        *l / self.repetition
                    } else {
                        *l * self.repetition
                    };
                }
            }
        }
        if self.presence != 0.0 || self.frequency != 0.0 {
            for (&token, &count) in &self.generated {
                if let Some(l) = logits.get_mut(token as usize) {
                    *l -= self.presence + self.frequency * count as f32;
                }
            }
        }
    }
}

fn repetition_active(penalty: f32) -> bool {
    penalty > 0.0 && penalty != 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rep: f32, pres: f32, freq: f32) -> SamplingParams {
        SamplingParams {
            repetition_penalty: rep,
            presence_penalty: pres,
            frequency_penalty: freq,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn repetition_divides_positive_and_multiplies_negative_once_per_token() {
        let mut p = Penalties::new(&params(2.0, 0.0, 0.0), &[0, 1, 1]);
        p.record(1);
        p.record(3);
        let mut logits = vec![4.0, -1.0, 5.0, 6.0];
        p.apply(&mut logits);
        assert_eq!(logits, vec![2.0, -2.0, 5.0, 3.0]);
    }

    #[test]
    fn presence_and_frequency_use_generated_counts_only() {
        let mut p = Penalties::new(&params(1.0, 0.5, 0.25), &[2]);
        p.record(0);
        p.record(0);
        p.record(1);
        let mut logits = vec![1.0, 1.0, 1.0];
        p.apply(&mut logits);
        assert_eq!(logits, vec![1.0 - 0.5 - 0.5, 1.0 - 0.5 - 0.25, 1.0]);
    }

    #[test]
    fn disabled_penalties_leave_logits_alone() {
        let mut p = Penalties::new(&params(1.0, 0.0, 0.0), &[0, 1]);
        p.record(0);
        assert!(!p.is_active());
        let mut logits = vec![1.0, -1.0];
        p.apply(&mut logits);
        assert_eq!(logits, vec![1.0, -1.0]);
    }

    #[test]
    fn out_of_range_ids_are_ignored() {
        let mut p = Penalties::new(&params(2.0, 1.0, 1.0), &[7]);
        p.record(9);
        let mut logits = vec![1.0];
        p.apply(&mut logits);
        assert_eq!(logits, vec![1.0]);
    }
}
