//! What code logs through `tracing` while a closure runs, captured in memory by a
//! thread-local subscriber (plain text, no colours), for tests of log lines.

use std::sync::{Arc, Mutex, PoisonError};

/// The captured bytes, shared by the subscriber's writers.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with a subscriber writing to memory; returns its result and the text logged.
pub fn capture_logs<R>(f: impl FnOnce() -> R) -> (R, String) {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let bytes = buffer
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    (result, String::from_utf8(bytes).expect("utf-8 log"))
}
