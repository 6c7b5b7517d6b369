//! The standard rejection scheme for a proposal a draft model drew from its own distribution
//! `q` (a sampled request without a seed, method `draft`): the proposed token `x` is accepted
//! with probability `min(1, p(x) / q(x))`, where `p` is the distribution the request samples
//! from at that position; otherwise the token is drawn from `max(0, p - q)` normalised, and the
//! proposals after it are rejected. Whatever `q` is, the emitted token is distributed as `p`.
//!
//! A proposal that is one token (`q` a point mass: prompt lookup, or a draft's greedy choice)
//! needs no `q` at all: drawing from `p` and accepting when the draw is `x` is the same scheme
//! (see the [module](super) header); this is its generalisation to any `q`.

/// The outcome of verifying one proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// The token emitted at this position: the proposal, or the residual's draw.
    pub token: u32,
    /// Whether it is the proposal.
    pub accepted: bool,
}

/// Verifies proposal `x`, drawn from `q` (a probability for every token id), against `p` (the
/// request's distribution: `(id, probability)` pairs summing to 1, other ids 0), with two
/// uniform draws in `[0, 1)`: `accept` decides acceptance, `residual` draws the replacement.
pub fn verify(p: &[(u32, f64)], x: u32, q: &[f32], accept: f64, residual: f64) -> Verified {
    let p_x = p
        .iter()
        .find(|&&(id, _)| id == x)
        .map_or(0.0, |&(_, prob)| prob);
    let q_x = q.get(x as usize).map_or(0.0, |&prob| f64::from(prob));
    // u < p / q, without dividing (a proposal q gave no mass is taken when p gives it some).
    if accept * q_x < p_x {
        return Verified {
            token: x,
            accepted: true,
        };
    }
    let excess = |id: u32, prob: f64| {
        let q_t = q.get(id as usize).map_or(0.0, |&q| f64::from(q));
        (prob - q_t).max(0.0)
    };
    let mass: f64 = p.iter().map(|&(id, prob)| excess(id, prob)).sum();
    // Rounding can leave no excess where p and q agree; `p` itself is then the residual.
    let weigh: &dyn Fn(u32, f64) -> f64 = if mass > 0.0 { &excess } else { &|_, prob| prob };
    let total = if mass > 0.0 {
        mass
    } else {
        p.iter().map(|&(_, prob)| prob).sum()
    };
    let target = residual * total;
    let mut cum = 0.0;
    let mut last = None;
    for &(id, prob) in p {
        let w = weigh(id, prob);
        if w <= 0.0 {
            continue;
        }
        cum += w;
        last = Some(id);
        if cum > target {
            return Verified {
                token: id,
                accepted: false,
            };
        }
    }
    Verified {
        token: last.unwrap_or(x),
        accepted: last.is_none(),
    }
}

/// Draws a token from `q` (probabilities by token id) with the uniform draw `u`: how a draft
/// samples its proposal. Ids with no mass are never drawn; all-zero `q` gives 0.
pub fn draw(q: &[f32], u: f64) -> u32 {
    let total: f64 = q.iter().map(|&p| f64::from(p.max(0.0))).sum();
    let target = u * total;
    let mut cum = 0.0;
    let mut last = 0;
    for (id, &p) in q.iter().enumerate() {
        if p <= 0.0 {
            continue;
        }
        cum += f64::from(p);
        last = id as u32;
        if cum > target {
            return id as u32;
        }
    }
    last
}

#[cfg(test)]
#[path = "rejection_tests.rs"]
mod tests;
