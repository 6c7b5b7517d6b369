//! Per-second rates of the registry's counters for `GET /v1/ferry/status`: the counters are
//! sampled on each request, and a rate is the change since the previous sample over the time
//! between them. Samples closer than [`MIN_WINDOW`] keep the rates of the last window (so
//! several pages polling at once do not shrink the window to noise).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The shortest window a rate is measured over.
pub const MIN_WINDOW: Duration = Duration::from_millis(500);

/// Named counter values at one instant.
pub type Counters = BTreeMap<String, u64>;

#[derive(Default)]
struct Window {
    last: Option<(Instant, Counters)>,
    rates: BTreeMap<String, f64>,
}

/// The shared rate state (one per router). Cheap to clone.
#[derive(Clone, Default)]
pub struct RateMeter {
    window: Arc<Mutex<Window>>,
}

impl RateMeter {
    /// Records `counters` taken at `now` and returns each counter's rate per second over the
    /// last window: 0 for the first sample and for a counter that went backwards or is new.
    pub fn sample(&self, now: Instant, counters: Counters) -> BTreeMap<String, f64> {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = match &window.last {
            Some((at, _)) => now.saturating_duration_since(*at),
            None => {
                window.rates = counters.keys().map(|k| (k.clone(), 0.0)).collect();
                window.last = Some((now, counters));
                return window.rates.clone();
            }
        };
        if elapsed >= MIN_WINDOW {
            let seconds = elapsed.as_secs_f64();
            let before = window.last.as_ref().map(|(_, c)| c);
            let rates = counters
                .iter()
                .map(|(name, &value)| {
                    let old = before.and_then(|c| c.get(name)).copied().unwrap_or(value);
                    (name.clone(), value.saturating_sub(old) as f64 / seconds)
                })
                .collect();
            window.rates = rates;
            window.last = Some((now, counters));
        }
        window.rates.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(pairs: &[(&str, u64)]) -> Counters {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn rates_are_changes_over_the_window() {
        let meter = RateMeter::default();
        let t0 = Instant::now();
        let first = meter.sample(t0, counters(&[("a", 10), ("b", 5)]));
        assert_eq!(first["a"], 0.0);
        let second = meter.sample(
            t0 + Duration::from_secs(2),
            counters(&[("a", 30), ("b", 5)]),
        );
        assert_eq!(second["a"], 10.0);
        assert_eq!(second["b"], 0.0);
        // Too soon: the last window's rates, and the sample is not taken.
        let soon = meter.sample(
            t0 + Duration::from_millis(2100),
            counters(&[("a", 1000), ("b", 5)]),
        );
        assert_eq!(soon["a"], 10.0);
        let third = meter.sample(
            t0 + Duration::from_secs(4),
            counters(&[("a", 40), ("b", 1)]),
        );
        assert_eq!(third["a"], 5.0, "measured from the sample at 2 s");
        assert_eq!(
            third["b"], 0.0,
            "a counter that went backwards is 0, not negative"
        );
    }
}
