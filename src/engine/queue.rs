//! A request on its way from [`super::EngineHandle::submit`] to a model's engine thread.

use std::time::Instant;

use tokio::sync::mpsc;

use super::request::{GenerationEvent, GenerationRequest};

/// One queued generation: the request and where its events go.
pub struct Job {
    /// The validated request.
    pub request: GenerationRequest,
    /// The client's event channel; closed when the client went away.
    pub events: mpsc::Sender<GenerationEvent>,
    /// When `submit` accepted it (the start of its time to first token).
    pub accepted: Instant,
}
