//! ferry-testkit: helpers that several of ferry's crates share in their tests and benches, and
//! nothing else. It is only ever a dev-dependency (scripts/check-layering.sh refuses it as a
//! normal one), so what is public here is public for tests, and no layer's own public surface
//! grows for a test's sake.
//!
//! - [`random_bytes`]: raw bytes of every bit pattern from a seed (the CPU kernels' tests and
//!   `benches/qmatmul_kernels.rs` write quantized blocks over them).
//! - [`capture_logs`]: what code logs through `tracing` while a closure runs, as text (the
//!   metrics' and the runtime's log-line tests).
//! - [`repo_root`]: the repository's folder, where fixtures, the default model, the README and
//!   the shipped configuration are.
//!
//! It depends on no ferry crate, so any layer may use it.

mod log_capture;
mod paths;
mod random;

pub use log_capture::capture_logs;
pub use paths::repo_root;
pub use random::random_bytes;
