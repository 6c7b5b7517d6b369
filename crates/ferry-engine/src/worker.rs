//! The engine threads and the [`EngineHandle`] the HTTP layer talks to.
//!
//! Each served model gets one dedicated OS thread that owns its [`LanguageModel`] (loaded on that
//! thread) and serves its requests with continuous batching ([`super::serve_loop`]): up to
//! `max_batch` sequences share each forward step, the rest wait in arrival order.
//! The handle is a cheap `Clone` over shared, mostly immutable state:
//!
//! 1. `EngineHandle::new(names)` registers every configured model as `Loading`, so `/health` and
//!    `/v1/models` can answer (503) before any weights are read.
//! 2. `handle.load(name, loader)` starts the model's thread, which runs `loader` there; the model
//!    becomes `Ready` when it returns `Ok`, `Failed` when it errors or panics.
//!    `handle.model_ready(name, model, codec)` does the same for a model loaded elsewhere.
//! 3. When the last handle is dropped, the job channels close and each thread exits after its
//!    current request (which stops early anyway once its receiver is gone).

use std::{
    any::Any,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc as std_mpsc, Arc, Mutex, OnceLock, PoisonError, RwLock,
    },
    thread::JoinHandle,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use tokio::sync::{mpsc, oneshot};

use ferry_metrics::{Metrics, RequestContext};

use super::{
    backend::{no_embeddings, Backend, ModelCard, ModelStatus, Residency},
    embed::{EmbedJob, EmbeddingReply, EmbeddingRequest},
    generate::validate_prompt,
    grammar::{Grammar, GrammarSpec},
    placement::ModelPlacement,
    prefix_cache::PrefixCacheOptions,
    queue::{Job, Work},
    request::{ChatMessage, GenerationEvent, GenerationRequest, SamplingParams},
    scheduler::StepLimits,
    serve_loop::{serve_requests, LoopContext},
    traits::{LanguageModel, TextCodec},
    EngineError, EngineResult,
};

/// Most events buffered per request. Sized so the engine practically never waits on a slow
/// client (tokio allocates channel blocks lazily, so a large bound costs nothing up front).
const MAX_EVENT_BUFFER: usize = 1 << 20;

/// Default [`EngineOptions::max_batch`].
pub const DEFAULT_MAX_BATCH: usize = 8;

/// Default [`EngineOptions::prefill_chunk`] (the setting `models[].prefill_chunk` has the same
/// default; a test in `runtime::serve` keeps them equal).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Default [`EngineOptions::max_step_tokens`] (as the setting `models[].max_step_tokens`): the
/// step's token count bounds the gap between a stream's tokens while a long prompt is
/// prefilled beside it.
pub const DEFAULT_MAX_STEP_TOKENS: usize = 512;

/// Default [`EngineOptions::step_time`] (as the setting `models[].step_time`): a stream's gap
/// between tokens stays near it beside a long prompt, where the device allows.
pub const DEFAULT_STEP_TIME: std::time::Duration = std::time::Duration::from_millis(100);

/// Engine-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Most requests per model that may wait for a place in its batch; with the batch full and
    /// `max_queue` requests waiting, more are refused at once with
    /// [`EngineError::Overloaded`] (HTTP 503 + `Retry-After`). Default: unbounded.
    pub max_queue: usize,
    /// Most sequences one model generates together (one batched forward step serves them
    /// all). Default [`DEFAULT_MAX_BATCH`].
    pub max_batch: usize,
    /// Most prompt tokens one sequence feeds in a step (a long prompt is prefilled in chunks
    /// of this size). Default [`DEFAULT_PREFILL_CHUNK`].
    pub prefill_chunk: usize,
    /// Most tokens one step computes, decodes and prompt chunks together; decodes go first,
    /// so a stream's gap between tokens is bounded by one step of this many tokens (raised to
    /// at least `max_batch`). Default [`DEFAULT_MAX_STEP_TOKENS`].
    pub max_step_tokens: usize,
    /// The time a step shared by several sequences aims at: its tokens are lowered (to no
    /// fewer than the decodes and one prompt share) to what the device computes in that time,
    /// measured on the steps before. `None`: every step may take `max_step_tokens`. Default
    /// [`DEFAULT_STEP_TIME`].
    pub step_time: Option<std::time::Duration>,
    /// Each model's prefix cache (requests sharing a prompt prefix reuse its KV state). Default
    /// on, bounded by the KV room the running requests leave.
    pub prefix_cache: PrefixCacheOptions,
    /// Where the engine reports queue depth, tokens and latencies. Default: a fresh registry
    /// (pass the server's to have them on `/metrics`).
    pub metrics: Metrics,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            max_queue: usize::MAX,
            max_batch: DEFAULT_MAX_BATCH,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            max_step_tokens: DEFAULT_MAX_STEP_TOKENS,
            step_time: Some(DEFAULT_STEP_TIME),
            prefix_cache: PrefixCacheOptions::default(),
            metrics: Metrics::new(),
        }
    }
}

/// What callers need from a loaded model (the model itself stays on its thread).
#[derive(Clone)]
struct Loaded {
    codec: Arc<dyn TextCodec>,
    max_context: usize,
    vocab_size: usize,
    /// The width of its embeddings, if it gives any.
    embedding_size: Option<usize>,
}

enum LoadState {
    Loading,
    Ready(Loaded),
    /// Why loading failed (reported to every request for the model).
    Failed(String),
    /// The engine thread ended after loading (why is in the log).
    Stopped,
}

/// One served model as the handles see it.
struct ModelEntry {
    name: String,
    created: u64,
    /// Written once by the model's thread (load finished), read by every request: an RwLock.
    state: Arc<RwLock<LoadState>>,
    /// Jobs for the model's thread. A std channel: the receiving side is a plain thread that
    /// blocks on it, and senders never block.
    jobs: std_mpsc::Sender<Work>,
    /// The receiving end, until `load` hands it to the thread.
    receiver: Mutex<Option<std_mpsc::Receiver<Work>>>,
    /// Requests accepted and not finished (for `max_queue`), shared with the thread.
    pending: Arc<AtomicUsize>,
    /// Where its parts live, set by the runtime ([`EngineHandle::set_placement`]).
    placement: RwLock<Option<ModelPlacement>>,
}

struct Shared {
    options: EngineOptions,
    /// Fixed at construction, in configuration order.
    models: Vec<ModelEntry>,
    /// Where swapped models are (offload mode `model`), set once by the runtime.
    residency: OnceLock<Arc<dyn Residency>>,
}

/// The engine as the HTTP layer sees it: implements [`Backend`]. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
}

impl EngineHandle {
    /// Registers `names` as `Loading` with default options. Duplicate names are registered once.
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_options(names, EngineOptions::default())
    }

    /// Registers `names` as `Loading` with `options`.
    pub fn with_options<I, S>(names: I, options: EngineOptions) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut models: Vec<ModelEntry> = Vec::new();
        for name in names {
            let name = name.into();
            if models.iter().any(|m| m.name == name) {
                continue;
            }
            let (jobs, receiver) = std_mpsc::channel();
            options.metrics.register_model(&name);
            models.push(ModelEntry {
                name,
                created,
                state: Arc::new(RwLock::new(LoadState::Loading)),
                jobs,
                receiver: Mutex::new(Some(receiver)),
                pending: Arc::new(AtomicUsize::new(0)),
                placement: RwLock::new(None),
            });
        }
        Self {
            shared: Arc::new(Shared {
                options,
                models,
                residency: OnceLock::new(),
            }),
        }
    }

    /// Starts the engine thread of model `name`; it runs `loader`, then serves requests. The
    /// model is `Ready` once `loader` returns `Ok`, `Failed` if it errors or panics. The returned
    /// handle finishes when every `EngineHandle` is dropped (joining it is optional).
    ///
    /// Errors: `ModelNotFound` for an unregistered name, `Internal` if this model's thread was
    /// already started or the OS refuses a thread.
    pub fn load<M, F>(&self, name: &str, loader: F) -> EngineResult<JoinHandle<()>>
    where
        M: LanguageModel + 'static,
        F: FnOnce() -> EngineResult<(M, Arc<dyn TextCodec>)> + Send + 'static,
    {
        let entry = self.entry(name)?;
        let receiver = entry
            .receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| EngineError::Internal(format!("model `{name}` was already loaded")))?;
        let state = Arc::clone(&entry.state);
        let pending = Arc::clone(&entry.pending);
        let metrics = self.shared.options.metrics.clone();
        let options = &self.shared.options;
        let limits = StepLimits {
            max_batch: options.max_batch,
            prefill_chunk: options.prefill_chunk,
            max_step_tokens: options.max_step_tokens,
            step_time: options.step_time,
        };
        let prefix = options.prefix_cache;
        let thread_name = format!("ferry-engine-{name}");
        let name = name.to_owned();
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let shared = ThreadShared {
                    state: &state,
                    jobs: &receiver,
                    pending: &pending,
                    metrics: &metrics,
                    limits,
                    prefix,
                };
                engine_thread(&name, loader, &shared)
            })
            .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))
    }

    /// [`load`](Self::load) for a model that is already loaded: it is `Ready` when this returns,
    /// so requests can be submitted at once.
    pub fn model_ready<M>(
        &self,
        name: &str,
        model: M,
        codec: Arc<dyn TextCodec>,
    ) -> EngineResult<JoinHandle<()>>
    where
        M: LanguageModel + 'static,
    {
        let ready = LoadState::Ready(Loaded {
            codec: Arc::clone(&codec),
            max_context: model.max_context(),
            vocab_size: model.vocab_size(),
            embedding_size: model.embedding_size(),
        });
        let thread = self.load(name, move || Ok((model, codec)))?;
        // The thread writes the same state once it starts; writing it here too closes the window
        // in which a caller that already holds the model would see `Loading`.
        *self
            .entry(name)?
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner) = ready;
        Ok(thread)
    }

    /// Sets where `GET /v1/models` learns each model's residency (offload mode `model`). Only
    /// the first call has an effect.
    pub fn set_residency(&self, probe: Arc<dyn Residency>) {
        let _ = self.shared.residency.set(probe);
    }

    /// Records where `name`'s parts live (`GET /v1/ferry/status` reads it back through
    /// [`Backend::placement`]); a later call replaces it. An unknown name is an error.
    pub fn set_placement(&self, name: &str, placement: ModelPlacement) -> EngineResult<()> {
        *self
            .entry(name)?
            .placement
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(placement);
        Ok(())
    }

    fn entry(&self, name: &str) -> EngineResult<&ModelEntry> {
        self.shared
            .models
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| EngineError::ModelNotFound(name.to_owned()))
    }

    /// Requests a model may hold: `max_batch` running plus `max_queue` waiting.
    fn capacity(&self) -> usize {
        let options = &self.shared.options;
        options.max_queue.saturating_add(options.max_batch.max(1))
    }

    fn overloaded(&self, entry: &ModelEntry) -> EngineError {
        EngineError::Overloaded(format!(
            "{} requests are already waiting for model `{}` (the limit `server.max_queue`); \
             retry later",
            self.shared.options.max_queue, entry.name
        ))
    }

    /// The entry and its loaded parts, or why it cannot serve.
    fn ready(&self, name: &str) -> EngineResult<(&ModelEntry, Loaded)> {
        let entry = self.entry(name)?;
        let state = entry.state.read().unwrap_or_else(PoisonError::into_inner);
        match &*state {
            LoadState::Ready(loaded) => Ok((entry, loaded.clone())),
            LoadState::Loading => Err(EngineError::NotReady(name.to_owned())),
            LoadState::Failed(reason) => Err(EngineError::LoadFailed(format!(
                "the model `{name}` failed to load: {reason}"
            ))),
            LoadState::Stopped => Err(EngineError::Unavailable),
        }
    }
}

impl Backend for EngineHandle {
    fn models(&self) -> Vec<ModelCard> {
        self.shared
            .models
            .iter()
            .map(|m| {
                let state = m.state.read().unwrap_or_else(PoisonError::into_inner);
                let (status, max_context) = match &*state {
                    LoadState::Loading => (ModelStatus::Loading, None),
                    LoadState::Ready(l) => (ModelStatus::Ready, Some(l.max_context)),
                    LoadState::Failed(_) => (ModelStatus::Failed, None),
                    LoadState::Stopped => (ModelStatus::Stopped, None),
                };
                ModelCard {
                    id: m.name.clone(),
                    created: m.created,
                    status,
                    max_context,
                    residency: self
                        .shared
                        .residency
                        .get()
                        .and_then(|probe| probe.location(&m.name)),
                }
            })
            .collect()
    }

    fn metrics(&self) -> Metrics {
        self.shared.options.metrics.clone()
    }

    fn placement(&self, model: &str) -> Option<ModelPlacement> {
        self.entry(model)
            .ok()?
            .placement
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn max_context(&self, model: &str) -> EngineResult<usize> {
        Ok(self.ready(model)?.1.max_context)
    }

    fn sampling_defaults(&self, model: &str) -> EngineResult<SamplingParams> {
        Ok(self.ready(model)?.1.codec.sampling_defaults())
    }

    fn tokenize(
        &self,
        model: &str,
        text: &str,
        add_special_tokens: bool,
    ) -> EngineResult<Vec<u32>> {
        self.ready(model)?.1.codec.encode(text, add_special_tokens)
    }

    fn tokenize_literal(
        &self,
        model: &str,
        text: &str,
        add_special_tokens: bool,
    ) -> EngineResult<Vec<u32>> {
        self.ready(model)?
            .1
            .codec
            .encode_literal(text, add_special_tokens)
    }

    fn token_bytes(&self, model: &str, tokens: &[u32]) -> EngineResult<Vec<Vec<u8>>> {
        let (_, loaded) = self.ready(model)?;
        check_token_ids(tokens, loaded.vocab_size)?;
        Ok(tokens
            .iter()
            .map(|&t| loaded.codec.token_bytes(t))
            .collect())
    }

    fn encode_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        self.ready(model)?.1.codec.encode_chat(
            messages,
            add_generation_prompt,
            parse_special_in_content,
        )
    }

    fn encode_chat_with_tools(
        &self,
        model: &str,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        variables: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        self.ready(model)?.1.codec.encode_chat_with_tools(
            messages,
            tools,
            variables,
            add_generation_prompt,
            parse_special_in_content,
        )
    }

    fn tool_support(&self, model: &str) -> EngineResult<crate::tool_calls::ToolSupport> {
        Ok(self.ready(model)?.1.codec.tool_support())
    }

    fn reasoning_format(
        &self,
        model: &str,
    ) -> EngineResult<Option<crate::reasoning::ReasoningFormat>> {
        Ok(self.ready(model)?.1.codec.reasoning_format())
    }

    fn check_capacity(&self, model: &str) -> EngineResult<()> {
        let entry = self.entry(model)?;
        if entry.pending.load(Ordering::SeqCst) >= self.capacity() {
            return Err(self.overloaded(entry));
        }
        Ok(())
    }

    fn compile_grammar(&self, model: &str, spec: &GrammarSpec) -> EngineResult<Grammar> {
        self.ready(model)?.1.codec.grammar_compiler()?.compile(spec)
    }

    fn detokenize(&self, model: &str, tokens: &[u32]) -> EngineResult<String> {
        let (_, loaded) = self.ready(model)?;
        check_token_ids(tokens, loaded.vocab_size)?;
        loaded.codec.decode(tokens, false)
    }

    fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String> {
        self.ready(model)?
            .1
            .codec
            .render_chat(messages, add_generation_prompt)
    }

    fn submit(&self, request: GenerationRequest) -> EngineResult<mpsc::Receiver<GenerationEvent>> {
        let mut receivers = self.submit_choices(request, 1)?;
        receivers
            .pop()
            .ok_or_else(|| EngineError::Internal("no receiver for one choice".into()))
    }

    /// One job for all `n` choices: the serving loop prefills the prompt once and starts the
    /// other choices from copies of its KV cache. The choices run side by side, so `n` may not
    /// exceed `max_batch`; each counts as a request for `max_queue` and the gauges.
    fn submit_choices(
        &self,
        request: GenerationRequest,
        n: usize,
    ) -> EngineResult<Vec<mpsc::Receiver<GenerationEvent>>> {
        let (entry, loaded) = self.ready(&request.model)?;
        validate_prompt(
            &request.prompt,
            &request.params,
            loaded.max_context,
            loaded.vocab_size,
        )?;
        let n = n.max(1);
        let max_batch = self.shared.options.max_batch.max(1);
        if n > max_batch {
            return Err(EngineError::InvalidRequest {
                message: format!(
                    "`n` = {n} is more than this server generates side by side for one request \
                     ({max_batch}, the model's `max_batch`)"
                ),
                param: Some("n".into()),
            });
        }
        if entry
            .pending
            .fetch_add(n, Ordering::SeqCst)
            .saturating_add(n)
            > self.capacity()
        {
            entry.pending.fetch_sub(n, Ordering::SeqCst);
            return Err(self.overloaded(entry));
        }
        let buffer = request
            .params
            .max_tokens
            .saturating_add(2)
            .min(MAX_EVENT_BUFFER);
        let (mut senders, receivers): (Vec<_>, Vec<_>) =
            (0..n).map(|_| mpsc::channel(buffer)).unzip();
        let metrics = &self.shared.options.metrics;
        for _ in 0..n {
            metrics.request_queued();
        }
        let events = senders.remove(0);
        let job = Job {
            request,
            events,
            forks: senders,
            accepted: Instant::now(),
            context: RequestContext::current(),
        };
        if entry.jobs.send(Work::Generate(Box::new(job))).is_err() {
            entry.pending.fetch_sub(n, Ordering::SeqCst);
            for _ in 0..n {
                metrics.request_dequeued();
            }
            return Err(EngineError::Unavailable);
        }
        Ok(receivers)
    }

    fn embedding_size(&self, model: &str) -> EngineResult<usize> {
        self.ready(model)?
            .1
            .embedding_size
            .ok_or_else(|| no_embeddings(model))
    }

    /// One job for all the inputs; the serving loop embeds them one at a time between its
    /// generation steps. Counts as one request for `max_queue` and the gauges.
    fn embed(&self, request: EmbeddingRequest) -> EngineResult<oneshot::Receiver<EmbeddingReply>> {
        let (entry, loaded) = self.ready(&request.model)?;
        if loaded.embedding_size.is_none() {
            return Err(no_embeddings(&request.model));
        }
        check_embedding_inputs(&request.inputs, loaded.max_context, loaded.vocab_size)?;
        if entry.pending.fetch_add(1, Ordering::SeqCst) + 1 > self.capacity() {
            entry.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(self.overloaded(entry));
        }
        let (reply, receiver) = oneshot::channel();
        let metrics = &self.shared.options.metrics;
        metrics.request_queued();
        let job = EmbedJob {
            request,
            reply,
            accepted: Instant::now(),
            context: RequestContext::current(),
        };
        if entry.jobs.send(Work::Embed(job)).is_err() {
            entry.pending.fetch_sub(1, Ordering::SeqCst);
            metrics.request_dequeued();
            return Err(EngineError::Unavailable);
        }
        Ok(receiver)
    }
}

/// Refuses embedding inputs the model cannot run: none, an empty one, one longer than the
/// context, an id outside the vocabulary (each an invalid request naming `input`).
fn check_embedding_inputs(
    inputs: &[Vec<u32>],
    max_context: usize,
    vocab_size: usize,
) -> EngineResult<()> {
    let invalid = |message: String| EngineError::InvalidRequest {
        message,
        param: Some("input".into()),
    };
    if inputs.is_empty() {
        return Err(invalid("`input` must not be empty".into()));
    }
    for (i, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(invalid(format!("input {i} is empty")));
        }
        if input.len() > max_context {
            return Err(invalid(format!(
                "input {i} is {} tokens long; this model's maximum context length is \
                 {max_context} tokens",
                input.len()
            )));
        }
        check_token_ids(input, vocab_size).map_err(|e| invalid(format!("input {i}: {e}")))?;
    }
    Ok(())
}

/// Fails with an invalid request naming `tokens` when an id is outside the vocabulary.
fn check_token_ids(tokens: &[u32], vocab_size: usize) -> EngineResult<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab_size) {
        Some(&bad) => Err(EngineError::InvalidRequest {
            message: format!("token id {bad} is out of range (vocabulary size {vocab_size})"),
            param: Some("tokens".into()),
        }),
        None => Ok(()),
    }
}

/// What a model's engine thread shares with the handles.
struct ThreadShared<'a> {
    state: &'a RwLock<LoadState>,
    jobs: &'a std_mpsc::Receiver<Work>,
    pending: &'a AtomicUsize,
    metrics: &'a Metrics,
    limits: StepLimits,
    prefix: PrefixCacheOptions,
}

/// Body of a model's engine thread: load, publish the result, then serve jobs until every
/// handle is gone.
fn engine_thread<M, F>(name: &str, loader: F, shared: &ThreadShared<'_>)
where
    M: LanguageModel,
    F: FnOnce() -> EngineResult<(M, Arc<dyn TextCodec>)>,
{
    let loaded = catch_unwind(AssertUnwindSafe(loader)).unwrap_or_else(|panic| {
        Err(EngineError::LoadFailed(format!(
            "the loader panicked: {}",
            panic_message(&*panic)
        )))
    });
    let (mut model, codec) = match loaded {
        Ok(parts) => parts,
        Err(e) => {
            // Whoever started the load reports it (runtime::serve logs it or stops with it), so
            // a start-up failure is printed once.
            tracing::debug!(model = name, error = %e, "model failed to load");
            *shared.state.write().unwrap_or_else(PoisonError::into_inner) =
                LoadState::Failed(e.to_string());
            return;
        }
    };
    let max_context = model.max_context();
    *shared.state.write().unwrap_or_else(PoisonError::into_inner) = LoadState::Ready(Loaded {
        codec: Arc::clone(&codec),
        max_context,
        vocab_size: model.vocab_size(),
        embedding_size: model.embedding_size(),
    });
    tracing::info!(model = name, max_context, "model ready");
    // Ready means resident; in offload mode `model` the swap manager's location replaces this
    // (published by `runtime::telemetry`).
    shared.metrics.set_model_resident(name, true);
    let context = LoopContext {
        name,
        jobs: shared.jobs,
        pending: shared.pending,
        metrics: shared.metrics,
        limits: shared.limits,
        prefix: shared.prefix,
    };
    let served = catch_unwind(AssertUnwindSafe(|| {
        serve_requests(&mut model, codec.as_ref(), &context);
    }));
    match served {
        Ok(()) => tracing::debug!(model = name, "engine thread stopped"),
        Err(panic) => {
            let reason = panic_message(&*panic);
            tracing::error!(
                model = name,
                reason = %reason,
                "the engine stopped: requests for this model fail and /health answers 503 \
                 until the server is restarted"
            );
            *shared.state.write().unwrap_or_else(PoisonError::into_inner) = LoadState::Stopped;
            shared.metrics.set_model_resident(name, false);
        }
    }
}

/// The text of a caught panic.
pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_owned()
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
