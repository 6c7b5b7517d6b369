//! The offload engine: where every decoder layer lives (device or host) and how offloaded layers are
//! streamed onto the compute device (DESIGN.md section 4).
//!
//! This module owns, so far, the pure side of that engine, which needs no device:
//!
//! - [`sizing`]: bytes per decoder layer and of the fixed parts, read from a GGUF file's tensor
//!   infos or from safetensors JSON headers, without loading any weights; KV-cache and activation
//!   workspace estimates.
//! - [`plan`]: the placement planner, a pure function from sizes, budget and mode to a [`Plan`]
//!   (which layers stay on the device, the slot ring, bytes per tier, PCIe-bound decode estimate).
//! - [`render`]: the human table and the JSON document that `ferry plan` prints.
//!
//! All of them report failures through one error type, [`PlanError`].

pub mod error;
pub mod plan;
pub mod render;
pub mod sizing;

pub use error::{PlanError, Result};
pub use plan::{plan, Home, LayerPlacement, Plan, PlanInput};
