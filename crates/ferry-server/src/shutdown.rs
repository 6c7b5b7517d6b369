//! How a running server is asked to stop, and what handlers see while it stops.
//!
//! [`shutdown_channel`] gives a [`ShutdownTrigger`] (kept by whoever turns OS signals into stop
//! requests: `main`, or a test) and a [`ShutdownSignal`] (given to [`super::run`]). The first
//! [`ShutdownTrigger::stop`] starts a drain: no new connections, connections without a request
//! in flight close at once, requests in flight get the grace period. A second `stop` ends the
//! server at once.
//!
//! [`Lifecycle`] is the server's side of it, shared with the handlers through `AppState`: when
//! the grace period is over it moves to [`Phase::Deadline`], and every generation still running
//! ends with an error (an SSE error event and `[DONE]` for streams, a 503 otherwise), so no
//! client is left with a body cut in the middle. A `watch` channel: many readers, one writer, and
//! readers that arrive late still see the current phase.

use tokio::sync::watch;

/// Asks a server to stop (cheap to clone). Dropping every trigger asks nothing.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger {
    requests: watch::Sender<u32>,
}

/// What a server watches for stop requests.
#[derive(Debug, Clone)]
pub struct ShutdownSignal {
    requests: watch::Receiver<u32>,
}

/// A connected trigger and signal.
pub fn shutdown_channel() -> (ShutdownTrigger, ShutdownSignal) {
    let (requests, receiver) = watch::channel(0);
    (
        ShutdownTrigger { requests },
        ShutdownSignal { requests: receiver },
    )
}

impl ShutdownTrigger {
    /// One stop request: the first drains, the second stops at once.
    pub fn stop(&self) {
        self.requests.send_modify(|n| *n = n.saturating_add(1));
    }
}

impl ShutdownSignal {
    /// A signal that never fires (for servers stopped only by dropping them).
    pub fn never() -> Self {
        // With its trigger gone the channel is closed, which `reached` reads as "never".
        shutdown_channel().1
    }

    /// Stop requests so far.
    pub fn count(&self) -> u32 {
        *self.requests.borrow()
    }

    /// Resolves once at least `n` stop requests arrived (never if every trigger is dropped
    /// before that).
    pub async fn reached(&mut self, n: u32) {
        if self.requests.wait_for(|&count| count >= n).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Where a server is in its life, as handlers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Accepting and serving.
    Serving,
    /// A stop was requested: in-flight requests are finishing within the grace period.
    Draining,
    /// The grace period is over: running generations end now with an error.
    Deadline,
}

/// The server's phase, shared with every handler (cheap to clone).
#[derive(Debug, Clone)]
pub struct Lifecycle {
    phase: watch::Sender<Phase>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    /// A server that is serving.
    pub fn new() -> Self {
        Self {
            phase: watch::Sender::new(Phase::Serving),
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Moves to `phase` (phases only move forward).
    pub fn enter(&self, phase: Phase) {
        self.phase.send_if_modified(|now| {
            let later = rank(phase) > rank(*now);
            if later {
                *now = phase;
            }
            later
        });
    }

    /// Resolves when the grace period is over (at once if it already is).
    pub async fn deadline(&self) {
        let mut phase = self.phase.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = phase.wait_for(|&p| p == Phase::Deadline).await;
    }
}

fn rank(phase: Phase) -> u8 {
    match phase {
        Phase::Serving => 0,
        Phase::Draining => 1,
        Phase::Deadline => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_trigger_counts_stop_requests() {
        let (trigger, mut signal) = shutdown_channel();
        assert_eq!(signal.count(), 0);
        trigger.stop();
        signal.reached(1).await;
        trigger.stop();
        signal.reached(2).await;
        assert_eq!(signal.count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_trigger_never_fires() {
        let mut signal = ShutdownSignal::never();
        let waited =
            tokio::time::timeout(std::time::Duration::from_secs(60), signal.reached(1)).await;
        assert!(waited.is_err());
    }

    #[tokio::test]
    async fn phases_only_move_forward() {
        let life = Lifecycle::new();
        life.enter(Phase::Deadline);
        life.enter(Phase::Draining);
        assert_eq!(life.phase(), Phase::Deadline);
        life.deadline().await;
    }
}
