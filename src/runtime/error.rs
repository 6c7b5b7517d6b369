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
        source: ferry_model::ModelError,
    },
    /// Sizing or placing the model failed (including "does not fit" with advice).
    #[error(transparent)]
    Plan(#[from] ferry_offload::PlanError),
    /// Loading the model as placed, or starting its streaming, failed.
    #[error("model `{name}`: {source}")]
    Offload {
        /// The served model name.
        name: String,
        /// What went wrong.
        source: ferry_offload::OffloadError,
    },
    /// The configured models cannot be placed on the device: one does not fit its budget, or
    /// they do not fit together (the message names the model and says what to change).
    #[error("{0}")]
    Placement(String),
    /// The configured address cannot be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// `host:port`.
        address: String,
        /// The bind error.
        source: std::io::Error,
    },
    /// A model's engine thread could not be started.
    #[error("model `{name}`: {source}")]
    Engine {
        /// The served model name.
        name: String,
        /// What went wrong.
        source: ferry_engine::EngineError,
    },
    /// Every configured model failed to load, so nothing can be served.
    #[error("no model could be loaded: {0}")]
    NoModelLoaded(String),
    /// The API keys file cannot be read.
    #[error("api_keys_file {path}: {source}")]
    KeysFile {
        /// The configured path.
        path: String,
        /// The read error.
        source: std::io::Error,
    },
    /// Serving on the listener failed.
    #[error("serving failed: {0}")]
    Serve(std::io::Error),
}
