//! Log probabilities as OpenAI/vLLM report them: a log-softmax over the model's raw logits
//! (before penalties and temperature), the chosen token's value and the top N alternatives.

/// Most alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Log-softmax of one logits row, computed once per step and then queried.
#[derive(Debug, Clone)]
pub struct LogSoftmax {
    logits: Vec<f32>,
    /// max + ln(sum(exp(l - max))): subtracting it from a logit gives its logprob.
    log_norm: f32,
}

impl LogSoftmax {
    /// Takes a copy of the raw logits. NaN entries count as impossible tokens.
    pub fn new(raw: &[f32]) -> Self {
        let logits: Vec<f32> = raw
            .iter()
            .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_norm = if max.is_finite() {
            let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
            max + sum.ln() as f32
        } else {
            max
        };
        Self { logits, log_norm }
    }

    /// The logprob of `id` (negative infinity for an id outside the vocabulary).
    pub fn logprob(&self, id: u32) -> f32 {
        match self.logits.get(id as usize) {
            Some(&l) if self.log_norm.is_finite() => l - self.log_norm,
            _ => f32::NEG_INFINITY,
        }
    }

    /// The `n` most likely ids (at most [`MAX_TOP_LOGPROBS`]) with their logprobs, most likely
    /// first; equal values list the lower id first. One pass over the vocabulary with a small
    /// sorted buffer, no full sort.
    pub fn top(&self, n: usize) -> Vec<(u32, f32)> {
        let n = n.min(MAX_TOP_LOGPROBS).min(self.logits.len());
        if n == 0 {
            return Vec::new();
        }
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        for (i, &l) in self.logits.iter().enumerate() {
            if best.len() == n && best.last().is_some_and(|&(_, worst)| l <= worst) {
                continue;
            }
            // First position whose logit is strictly lower keeps earlier ids ahead on ties.
            let pos = best.partition_point(|&(_, v)| v >= l);
            best.insert(pos, (i as u32, l));
            best.truncate(n);
        }
        best.into_iter()
            .map(|(id, _)| (id, self.logprob(id)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_normalised() {
        let ls = LogSoftmax::new(&[1.0, 2.0, 3.0, 0.5]);
        let total: f32 = (0..4).map(|i| ls.logprob(i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        let expected = 3.0 - (1f32.exp() + 2f32.exp() + 3f32.exp() + 0.5f32.exp()).ln();
        assert!((ls.logprob(2) - expected).abs() < 1e-5);
        assert_eq!(ls.logprob(99), f32::NEG_INFINITY);
    }

    #[test]
    fn top_n_is_sorted_descending_and_matches_a_full_sort() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 7919) % 503) as f32 * 0.01).collect();
        let ls = LogSoftmax::new(&logits);
        let top = ls.top(20);
        let mut all: Vec<u32> = (0..500).collect();
        all.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        let ids: Vec<u32> = top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, all[..20].to_vec());
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(top[0].1, ls.logprob(top[0].0));
    }

    #[test]
    fn ties_list_lower_ids_first_and_n_is_capped() {
        let ls = LogSoftmax::new(&[1.0, 5.0, 5.0, 1.0]);
        let top = ls.top(3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(ls.top(0), vec![]);
        assert_eq!(ls.top(100).len(), 4);
        assert_eq!(LogSoftmax::new(&[0.0; 64]).top(100).len(), MAX_TOP_LOGPROBS);
    }
}
