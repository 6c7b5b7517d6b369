//! The rejection scheme keeps the request's distribution for a draft distribution that is not a
//! point mass: many proposals drawn from `q` with a fixed seed, verified against `p`, and the
//! emitted tokens' counts pass a chi-square test against `p`; the acceptance rate is
//! `sum(min(p, q))`. A planted bias (on rejection, drawing from `p` instead of `max(0, p - q)`)
//! fails the same test.

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::{draw, verify, Verified};

/// The request's distribution over token ids 0..5.
const P: [f64; 5] = [0.40, 0.25, 0.15, 0.15, 0.05];
/// The draft's: every token possible, mass in other places.
const Q: [f32; 5] = [0.10, 0.45, 0.05, 0.10, 0.30];
const N: usize = 40_000;
/// Chi-square's 0.1% point at 4 degrees of freedom.
const CHI2_0_1_PERCENT: f64 = 18.47;

fn p_pairs() -> Vec<(u32, f64)> {
    P.iter().enumerate().map(|(i, &p)| (i as u32, p)).collect()
}

/// Counts of the emitted tokens and the number accepted over [`N`] proposals, each drawn from
/// [`Q`] and verified by `scheme`, with a fixed seed.
/// A verification scheme: [`verify`]'s arguments and result.
type Scheme = dyn Fn(&[(u32, f64)], u32, &[f32], f64, f64) -> Verified;

fn run(scheme: &Scheme) -> ([f64; 5], usize) {
    let mut rng = StdRng::seed_from_u64(7);
    let p = p_pairs();
    let mut counts = [0.0; 5];
    let mut accepted = 0;
    for _ in 0..N {
        let x = draw(&Q, rng.random());
        let v = scheme(&p, x, &Q, rng.random(), rng.random());
        counts[v.token as usize] += 1.0;
        accepted += usize::from(v.accepted);
        if v.accepted {
            assert_eq!(v.token, x, "an accepted proposal is emitted");
        }
    }
    (counts, accepted)
}

fn chi_square(counts: &[f64; 5]) -> f64 {
    counts
        .iter()
        .zip(P)
        .map(|(&seen, p)| {
            let e = p * N as f64;
            (seen - e) * (seen - e) / e
        })
        .sum()
}

#[test]
fn verified_tokens_follow_the_requests_distribution() {
    let (counts, accepted) = run(&verify);
    let chi2 = chi_square(&counts);
    assert!(chi2 < CHI2_0_1_PERCENT, "chi-square {chi2}: {counts:?}");
    let expected: f64 = P.iter().zip(Q).map(|(&p, q)| p.min(f64::from(q))).sum();
    let rate = accepted as f64 / N as f64;
    assert!(
        (rate - expected).abs() < 0.01,
        "acceptance {rate} against sum(min(p, q)) = {expected}"
    );
}

#[test]
fn a_planted_bias_fails_the_test() {
    // The bug: on rejection, draw from p itself rather than from max(0, p - q).
    let biased = |p: &[(u32, f64)], x: u32, q: &[f32], a: f64, r: f64| {
        let v = verify(p, x, q, a, r);
        if v.accepted {
            return v;
        }
        verify(p, x, &[0.0; 5], 1.0, r)
    };
    let (counts, _) = run(&biased);
    let chi2 = chi_square(&counts);
    assert!(chi2 > CHI2_0_1_PERCENT, "chi-square {chi2}: {counts:?}");
}

#[test]
fn draws_follow_their_distribution_and_skip_tokens_without_mass() {
    let mut rng = StdRng::seed_from_u64(3);
    let q = [0.0, 0.5, 0.0, 0.5];
    let mut counts = [0; 4];
    for _ in 0..10_000 {
        counts[draw(&q, rng.random()) as usize] += 1;
    }
    assert_eq!((counts[0], counts[2]), (0, 0));
    assert!((4_700..5_300).contains(&counts[1]), "{counts:?}");
    // A proposal q gave no mass is taken where p gives it some; p without mass rejects it.
    let p = [(0, 0.5), (1, 0.5)];
    assert!(verify(&p, 0, &[0.0, 1.0], 0.99, 0.0).accepted);
    let v = verify(&[(1, 1.0)], 0, &[0.5, 0.5], 0.0, 0.3);
    assert_eq!(
        v,
        Verified {
            token: 1,
            accepted: false
        }
    );
}
