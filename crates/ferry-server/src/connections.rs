//! The open connections and what each one is doing, so the accept loop can bound them.
//!
//! Every accepted connection is a [`Connection`] in the [`Registry`]: how many of its requests
//! are in flight (a request is in flight from its head being parsed until its response body is
//! dropped), since when it has been idle, and whether a new request head has started arriving
//! while it was idle. From that:
//!
//! - a connection with no request in flight is closed `idle_timeout` after it became idle, or
//!   `header_read_timeout` after the first byte of a request head that never completed;
//! - at `max_connections`, a new connection closes the connection that has been idle (no
//!   request in flight) or receiving request bodies (nothing else in flight) longest: a client
//!   still sending its body has nothing being worked on, so trickled bodies cannot lock
//!   everyone out, and a connection just accepted is the last to go; when every connection has a request in flight whose body has arrived, the
//!   new one is refused (the accept loop answers 503 at once);
//! - at shutdown, connections without a request in flight close at once (a half-sent header
//!   cannot hold the shutdown), the others finish their request and then close.
//!
//! One `std::sync::Mutex` per connection (held for a few field updates, never across an await)
//! and one for the registry's map; a `Notify` per connection wakes its task when its state
//! changes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// What the registry asks a connection's task to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// Go on serving.
    Serve,
    /// Close now (it had no request in flight when asked).
    Close,
    /// Finish the requests in flight, take no new ones, then close.
    Drain,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    idle_since: Instant,
    /// When the first byte of a request head arrived while idle.
    head_started: Option<Instant>,
    /// Requests in flight whose body is still arriving.
    receiving: usize,
    /// Since when the oldest of those bodies has been arriving.
    receiving_since: Option<Instant>,
    command: Command,
}

/// One open connection.
#[derive(Debug)]
pub(crate) struct Connection {
    id: u64,
    state: Mutex<State>,
    /// Wakes the connection's task after a state change.
    changed: Notify,
}

/// The timeouts of connections that have no request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdleTimeouts {
    /// From the first byte of a request head to its end.
    pub header_read: Duration,
    /// From the end of the last response (or the accept) to the next request's first byte.
    pub idle: Duration,
}

impl Connection {
    fn new(id: u64) -> Self {
        Self {
            id,
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: Instant::now(),
                head_started: None,
                receiving: 0,
                receiving_since: None,
                command: Command::Serve,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived from the client (called by the connection's reader).
    pub(crate) fn bytes_arrived(&self) {
        let mut state = self.lock();
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// A request head was parsed; the returned guard ends the request when dropped (with the
    /// response body).
    pub(crate) fn request_started(self: &Arc<Self>) -> RequestGuard {
        {
            let mut state = self.lock();
            state.in_flight += 1;
            state.head_started = None;
        }
        self.changed.notify_one();
        RequestGuard {
            connection: Arc::clone(self),
        }
    }

    /// A request's body started arriving; the returned guard marks it received when dropped
    /// (at its end, or with the request).
    pub(crate) fn body_started(self: &Arc<Self>) -> BodyGuard {
        let mut state = self.lock();
        state.receiving += 1;
        state.receiving_since.get_or_insert_with(Instant::now);
        BodyGuard {
            connection: Arc::clone(self),
        }
    }

    /// Requests in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// What to do now, and when an idle timeout would fire (`None` while a request is in
    /// flight).
    pub(crate) fn status(&self, timeouts: IdleTimeouts) -> (Command, Option<Instant>) {
        let state = self.lock();
        let deadline = (state.in_flight == 0).then(|| match state.head_started {
            Some(started) => started + timeouts.header_read,
            None => state.idle_since + timeouts.idle,
        });
        let command = match state.command {
            Command::Drain if state.in_flight == 0 => Command::Close,
            other => other,
        };
        (command, deadline)
    }

    /// Resolves after the next state change (or at once if one happened since the last wait).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    fn command(&self, command: Command) {
        self.lock().command = command;
        self.changed.notify_one();
    }

    /// Closable to make room (not already leaving, and nothing in flight but requests whose
    /// bodies are still arriving): since when it has been idle or receiving (the oldest goes
    /// first, so a connection just accepted, idle until its head is parsed, is the last to
    /// go), and whether it is receiving.
    fn eviction_rank(&self) -> Option<(Instant, bool)> {
        let state = self.lock();
        if state.command != Command::Serve {
            return None;
        }
        if state.in_flight == 0 {
            return Some((state.idle_since, false));
        }
        (state.in_flight == state.receiving)
            .then_some(state.receiving_since)
            .flatten()
            .map(|since| (since, true))
    }
}

/// Marks one request's body as received on drop.
#[derive(Debug)]
pub(crate) struct BodyGuard {
    connection: Arc<Connection>,
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        let mut state = self.connection.lock();
        state.receiving = state.receiving.saturating_sub(1);
        if state.receiving == 0 {
            state.receiving_since = None;
        }
    }
}

/// Ends one request on drop.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    connection: Arc<Connection>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        {
            let mut state = self.connection.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            if state.in_flight == 0 {
                state.idle_since = Instant::now();
            }
        }
        self.connection.changed.notify_one();
    }
}

/// Every open connection, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    connections: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    /// Fires when a connection leaves.
    left: Notify,
}

/// Removes a connection from its registry on drop (its task ended, the socket is closed).
#[derive(Debug)]
pub(crate) struct Registration {
    registry: Arc<Registry>,
    /// The connection.
    pub connection: Arc<Connection>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.connection.id);
        self.registry.left.notify_waiters();
    }
}

impl Registry {
    /// Registers a new connection if there is room for it under `max_connections`, closing
    /// the connection idle or receiving request bodies longest when that makes room; `None`
    /// when every connection is busy.
    pub(crate) fn admit(self: &Arc<Self>, max_connections: usize) -> Option<Registration> {
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let leaving = connections
            .values()
            .filter(|c| c.lock().command != Command::Serve)
            .count();
        if connections.len() - leaving >= max_connections.max(1) {
            let (receiving, victim) = connections
                .values()
                .filter_map(|c| c.eviction_rank().map(|rank| (rank, c)))
                .min_by_key(|(rank, _)| *rank)
                .map(|((_, receiving), c)| (receiving, Arc::clone(c)))?;
            tracing::debug!(
                connection = victim.id,
                receiving_a_body = receiving,
                "connection limit reached: closing the connection idle or receiving a body longest"
            );
            victim.command(Command::Close);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection::new(id));
        connections.insert(id, Arc::clone(&connection));
        Some(Registration {
            registry: Arc::clone(self),
            connection,
        })
    }

    /// Open connections (including ones told to close whose task has not ended yet).
    pub(crate) fn len(&self) -> usize {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Requests in flight over every connection.
    pub(crate) fn in_flight(&self) -> usize {
        self.snapshot().iter().map(|c| c.in_flight()).sum()
    }

    /// Tells every connection to finish what it is doing and close (idle ones close at once).
    pub(crate) fn drain_all(&self) {
        for connection in self.snapshot() {
            connection.command(Command::Drain);
        }
    }

    /// Resolves when no connection is open.
    pub(crate) async fn emptied(&self) {
        loop {
            let left = self.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if self.len() == 0 {
                return;
            }
            left.await;
        }
    }

    fn snapshot(&self) -> Vec<Arc<Connection>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: IdleTimeouts = IdleTimeouts {
        header_read: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_what_the_connection_is_doing() {
        let registry = Arc::new(Registry::default());
        let reg = registry.admit(4).expect("room");
        let c = &reg.connection;
        let accepted = Instant::now();
        assert_eq!(
            c.status(TIMEOUTS),
            (Command::Serve, Some(accepted + TIMEOUTS.idle))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        c.bytes_arrived();
        let head = Instant::now();
        assert_eq!(c.status(TIMEOUTS).1, Some(head + TIMEOUTS.header_read));
        let guard = c.request_started();
        assert_eq!(
            c.status(TIMEOUTS).1,
            None,
            "no timeout while a request runs"
        );
        c.bytes_arrived();
        assert_eq!(c.status(TIMEOUTS).1, None);
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(guard);
        let idle = Instant::now();
        assert_eq!(c.status(TIMEOUTS).1, Some(idle + TIMEOUTS.idle));
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let registry = Arc::new(Registry::default());
        let first = registry.admit(2).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = registry.admit(2).unwrap();
        let third = registry.admit(2).expect("an idle connection makes room");
        assert_eq!(first.connection.status(TIMEOUTS).0, Command::Close);
        assert_eq!(second.connection.status(TIMEOUTS).0, Command::Serve);
        drop(first);
        // Both left are busy: nothing can make room.
        let _a = second.connection.request_started();
        let _b = third.connection.request_started();
        assert!(registry.admit(2).is_none());
        assert_eq!(registry.len(), 2);
        assert_eq!(registry.in_flight(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn connections_idle_or_receiving_a_body_longest_make_room() {
        let registry = Arc::new(Registry::default());
        let slow = registry.admit(3).unwrap();
        let _slow_request = slow.connection.request_started();
        let slow_body = slow.connection.body_started();
        tokio::time::advance(Duration::from_secs(1)).await;
        let idle = registry.admit(3).unwrap();
        let working = registry.admit(3).unwrap();
        let _working_request = working.connection.request_started();
        drop(working.connection.body_started()); // its body arrived: not evictable
        tokio::time::advance(Duration::from_secs(1)).await;
        let fourth = registry.admit(3).expect("room");
        assert_eq!(
            slow.connection.status(TIMEOUTS).0,
            Command::Close,
            "oldest first"
        );
        assert_eq!(idle.connection.status(TIMEOUTS).0, Command::Serve);
        drop((slow, slow_body));
        // The idle one is older than the one just accepted (idle until its head is parsed).
        let fifth = registry.admit(3).expect("the idle one makes room");
        assert_eq!(idle.connection.status(TIMEOUTS).0, Command::Close);
        assert_eq!(fourth.connection.status(TIMEOUTS).0, Command::Serve);
        assert_eq!(working.connection.status(TIMEOUTS).0, Command::Serve);
        drop(idle);
        // Everything left has a request whose body arrived: none to close.
        let _busy = fifth.connection.request_started();
        let _busy_too = fourth.connection.request_started();
        assert!(registry.admit(3).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn draining_closes_idle_connections_and_waits_for_busy_ones() {
        let registry = Arc::new(Registry::default());
        let idle = registry.admit(8).unwrap();
        let busy = registry.admit(8).unwrap();
        idle.connection.bytes_arrived(); // half a header: still no request in flight
        let guard = busy.connection.request_started();
        registry.drain_all();
        assert_eq!(idle.connection.status(TIMEOUTS).0, Command::Close);
        assert_eq!(busy.connection.status(TIMEOUTS).0, Command::Drain);
        drop(guard);
        assert_eq!(busy.connection.status(TIMEOUTS).0, Command::Close);
        drop((idle, busy));
        registry.emptied().await;
    }
}
