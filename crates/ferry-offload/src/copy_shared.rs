//! What a copy thread shares with its owner: one mutex-guarded state and the condition variable
//! that says it changed (a poisoned lock is taken as it is: the state is consistent between
//! statements), and stopping the thread (mark its state shut down, wake it, join it).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A copy thread's state that can be told to stop.
pub(super) trait ShutDown {
    /// Marks the state so that the thread returns at its next look.
    fn shut_down(&mut self);
}

/// Why a mutex and a condition variable: the owner and the copy thread wait on each other's
/// progress (copy issued / copy done), which is exactly a condition on shared state.
#[derive(Debug)]
pub(super) struct Shared<S> {
    state: Mutex<S>,
    pub(super) changed: Condvar,
}

impl<S> Shared<S> {
    pub(super) fn new(state: S) -> Self {
        Self {
            state: Mutex::new(state),
            changed: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn wait<'a>(&self, guard: MutexGuard<'a, S>) -> MutexGuard<'a, S> {
        self.changed.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
}

impl<S: ShutDown> Shared<S> {
    /// The owner's drop: tells the thread to stop, wakes it and waits for it to return.
    pub(super) fn stop(&self, thread: &mut Option<JoinHandle<()>>) {
        self.lock().shut_down();
        self.changed.notify_all();
        if let Some(thread) = thread.take() {
            let _ = thread.join();
        }
    }
}
