//! Runtime glue: turns a resolved [`crate::config::Config`] into running engine threads.
//!
//! - [`device`]: the configured device choice -> a candle `Device`.
//! - [`adapters`]: the real model and tokenizer behind the engine's `LanguageModel` and
//!   `TextCodec` traits.
//! - [`load`]: source -> files -> weights + tokenizer, with a progress bar or log lines.
//! - [`planning`]: `ferry plan`: file headers + budget -> placement plan, no weights read.

pub mod adapters;
pub mod device;
pub mod error;
pub mod load;
pub mod planning;

pub use error::RuntimeError;
