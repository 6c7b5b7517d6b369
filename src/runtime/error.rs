//! The runtime layer's error type: what can stop a model from being brought up.

use thiserror::Error;

/// Failures while choosing a device or loading a configured model.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The requested device is not available in this build or on this machine.
    #[error("device: {0}")]
    Device(String),
    /// Finding or loading the model failed.
    #[error("model `{name}`: {source}")]
    Model {
        /// The served model name.
        name: String,
        /// What went wrong.
        source: crate::model::ModelError,
    },
    /// Sizing or placing the model failed (including "does not fit" with advice).
    #[error(transparent)]
    Plan(#[from] crate::offload::PlanError),
    /// Loading the model as placed, or starting its streaming, failed.
    #[error("model `{name}`: {source}")]
    Offload {
        /// The served model name.
        name: String,
        /// What went wrong.
        source: crate::offload::OffloadError,
    },
}
