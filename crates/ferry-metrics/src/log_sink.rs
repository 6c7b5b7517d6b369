//! The process log's writer: stderr, with every write error swallowed and counted. A log line
//! that cannot be written (stderr on a full disk, a closed pipe, `/dev/full`) is lost, never a
//! panic: tracing's formatter would otherwise report the failure with `eprintln!`, which panics
//! when stderr fails and so took down whichever thread logged, the engine's among them.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// Log writes that failed since the process started.
static FAILED_WRITES: AtomicU64 = AtomicU64::new(0);

/// Log writes that failed since the process started (the lines lost).
pub fn failed_log_writes() -> u64 {
    FAILED_WRITES.load(Ordering::Relaxed)
}

/// Makes a [`LossyStderr`] per log line (a `tracing_subscriber` `MakeWriter`).
pub fn lossy_stderr() -> LossyStderr {
    LossyStderr(io::stderr())
}

/// Standard error that reports success whatever happens to the bytes.
pub struct LossyStderr(io::Stderr);

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.write_all(buf).is_err() {
            FAILED_WRITES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.0.flush().is_err() {
            FAILED_WRITES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_always_succeed() {
        let mut sink = lossy_stderr();
        assert_eq!(sink.write(b"").unwrap(), 0);
        assert!(sink.flush().is_ok());
    }
}
