//! A request on its way from [`super::EngineHandle::submit`] (or `embed`) to a model's engine
//! thread: [`Work`] is what the model's channel carries.

use std::time::Instant;

use tokio::sync::mpsc;

use super::embed::EmbedJob;
use super::request::{GenerationEvent, GenerationRequest};
use ferry_metrics::RequestContext;

/// One queued generation: the request and where its events go.
pub struct Job {
    /// The validated request.
    pub request: GenerationRequest,
    /// The client's event channel; closed when the client went away.
    pub events: mpsc::Sender<GenerationEvent>,
    /// The channels of the request's other choices (`n` > 1: choices 1..n, in order), which
    /// sample from [`GenerationRequest::for_choice`] and share the prompt's prefill.
    pub forks: Vec<mpsc::Sender<GenerationEvent>>,
    /// When `submit` accepted it (the start of its time to first token).
    pub accepted: Instant,
    /// The HTTP request it came from (its id, for the request's log line), if any.
    pub context: Option<RequestContext>,
}

/// What a model's engine thread is sent.
pub enum Work {
    /// A generation (its choices).
    Generate(Box<Job>),
    /// An embedding request.
    Embed(EmbedJob),
}
