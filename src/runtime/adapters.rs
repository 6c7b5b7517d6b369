//! The real model and tokenizer behind the engine's traits: [`ModelRunner`] implements
//! `LanguageModel` (one KV cache per sequence, weights from the offload engine's `WeightStore`,
//! resident or streamed, or in mode `model` from a [`Lease`] on the swap manager's resident copy),
//! [`TokenizerCodec`] implements `TextCodec`.
//!
//! Embeddings ([`LanguageModel::embed`]) run the same forward path on a sequence of their own,
//! stopping before the output head ([`ModelRunner::hidden_states`]), in chunks of
//! [`EMBED_CHUNK`] tokens whose rows the model's [`Pooling`] folds into one L2-normalised vector.
//!
//! With speculative method `draft` the runner holds a [`DraftModel`]: each sequence keeps the
//! draft's cache next to its own, forgotten, copied and dropped with it.
//!
//! In mode `model` a sequence takes its lease at its first forward step and holds it until the
//! engine drops the sequence, so the model stays on the device for the whole request and the
//! keep_alive clock starts when the request ends.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};

use candle_core::Tensor;
use ferry_engine::reasoning::ReasoningFormat;
use ferry_engine::speculative::{DraftAsk, Proposal};
use ferry_engine::tool_calls::ToolSupport;
use ferry_engine::traits::{LanguageModel, TextCodec};
use ferry_engine::{
    ChatMessage, EngineError, EngineResult, GrammarCompiler, SamplingParams, Speculation,
};
use ferry_model::decoder::{Model, ResidentLayers, SeqInput};
use ferry_model::kv_cache::{HostKvRates, KvCache, KvSpan};
use ferry_model::pooling::{Pooler, Pooling};
use ferry_model::tokenizer::TextTokenizer;
use ferry_model::weights::LayerWeights;
use ferry_model::ModelError;
use ferry_offload::{
    Accounting, AccountingSnapshot, Lease, OffloadError, SwapClient, SwapManager, WeightStore,
};

use super::draft_model::{DraftCache, DraftModel};

fn internal(err: ModelError) -> EngineError {
    match err {
        ModelError::ContextOverflow { needed, max } => EngineError::InvalidRequest {
            message: format!("the sequence needs {needed} positions but the context holds {max}"),
            param: None,
        },
        other => EngineError::Internal(other.to_string()),
    }
}

fn swap_error(err: OffloadError) -> EngineError {
    match err {
        OffloadError::Busy(message) => EngineError::Overloaded(message),
        other => EngineError::Internal(other.to_string()),
    }
}

/// A model in mode `model`: its handle on the swap manager.
struct Swapped {
    client: SwapClient,
    /// Held, never read: a manager made for this model alone lives (and runs its keep-alive
    /// thread) as long as the runner.
    _manager: Arc<SwapManager>,
}

/// A loaded model with its decoder layers (resident, streamed, or swapped as a whole), served
/// one forward step at a time.
pub struct ModelRunner {
    model: Model,
    layers: WeightStore,
    swapped: Option<Swapped>,
    max_context: usize,
    /// How embeddings pool the hidden states, or why this model gives none.
    pooling: Result<Pooling, String>,
    /// How decode steps speculate (`models[].speculative`).
    speculation: Speculation,
    /// The draft model of method `draft`.
    draft: Option<DraftModel>,
}

/// Most tokens of one embedding input computed in one forward pass (longer inputs run in
/// chunks against their own cache, so activations stay bounded as a prompt's do).
pub const EMBED_CHUNK: usize = 512;

/// One request's state: its KV cache and, in mode `model`, the lease that keeps the model
/// resident while the request runs.
#[derive(Debug)]
pub struct RunnerSequence {
    cache: KvCache,
    lease: Option<Lease>,
    /// The draft model's state for this sequence (method `draft`, from its first proposal).
    draft: Option<DraftCache>,
}

impl RunnerSequence {
    /// Whether this sequence holds the model resident (mode `model`, after its first step).
    pub fn holds_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// Bytes this sequence's KV cache has allocated so far.
    pub fn kv_bytes(&self) -> usize {
        self.cache.allocated_bytes()
    }

    /// Positions the draft model holds for this sequence (0 before its first proposal).
    pub fn draft_len(&self) -> usize {
        self.draft.as_ref().map_or(0, DraftCache::len)
    }

    /// Bytes of the positions this sequence's KV cache holds (at most [`Self::kv_bytes`]).
    pub fn kv_stored_bytes(&self) -> usize {
        self.cache.stored_bytes()
    }
}

impl ModelRunner {
    /// Serves `model` with the layers of `store`, capping the context at `max_context` (and the
    /// model's own).
    pub fn new(model: Model, store: WeightStore, max_context: Option<usize>) -> Self {
        let native = model.spec().max_context;
        let max_context = max_context.map_or(native, |cap| cap.min(native));
        Self {
            model,
            layers: store,
            swapped: None,
            max_context,
            pooling: Ok(Pooling::DEFAULT),
            speculation: Speculation::default(),
            draft: None,
        }
    }

    /// Proposes with `draft` (speculative method `draft`).
    pub fn with_draft(mut self, draft: DraftModel) -> Self {
        self.draft = Some(draft);
        self
    }

    /// The draft model, when the method is `draft`.
    pub fn draft(&self) -> Option<&DraftModel> {
        self.draft.as_ref()
    }

    /// The bytes the draft's caches hold right now, all sequences together (`None` without a
    /// draft): a handle that stays valid after the runner moves to its engine thread.
    pub fn draft_live_kv(&self) -> Option<Arc<AtomicUsize>> {
        self.draft.as_ref().map(DraftModel::live_kv)
    }

    /// Speculates as `speculation` says (`models[].speculative`).
    pub fn with_speculation(mut self, speculation: Speculation) -> Self {
        self.speculation = speculation;
        self
    }

    /// Pools embeddings with `pooling`; an `Err` (a pooling ferry cannot compute) says why the
    /// model gives no embeddings.
    pub fn with_pooling(mut self, pooling: Result<Pooling, String>) -> Self {
        self.pooling = pooling;
        self
    }

    /// Takes `seq`'s lease on the resident copy in mode `model` (at its first step).
    fn take_lease(&self, seq: &mut RunnerSequence) -> EngineResult<()> {
        if let (Some(swapped), None) = (&self.swapped, &seq.lease) {
            seq.lease = Some(swapped.client.acquire().map_err(swap_error)?);
        }
        Ok(())
    }

    /// Feeds `tokens` to `seq` through the one forward path and returns their final hidden
    /// states (after the final norm, before the head) as f32 `[tokens.len(), hidden]`.
    pub fn hidden_states(
        &mut self,
        seq: &mut RunnerSequence,
        tokens: &[u32],
    ) -> EngineResult<Tensor> {
        self.take_lease(seq)?;
        let RunnerSequence { cache, lease, .. } = seq;
        let hidden = match lease.as_ref().map(Lease::layers) {
            None => self.model.forward_hidden(tokens, cache, &mut self.layers),
            Some(layers) => self
                .model
                .forward_hidden(tokens, cache, &mut ResidentLayers(layers)),
        }
        .map_err(|e| self.step_error(e))?;
        self.layers
            .accounting()
            .observe_kv(cache.device_allocated_bytes() as u64);
        Ok(hidden)
    }

    /// Serves `model` in mode `model`: decoder layers come from `client`'s resident copy, made
    /// resident by `manager` when a sequence first steps. `accounting` counts the fixed parts and,
    /// while resident, the layers.
    pub fn swapped(
        model: Model,
        accounting: Arc<Accounting>,
        manager: Arc<SwapManager>,
        client: SwapClient,
        max_context: Option<usize>,
    ) -> Self {
        let mut runner = Self::new(
            model,
            WeightStore::resident(Vec::new(), accounting),
            max_context,
        );
        runner.swapped = Some(Swapped {
            client,
            _manager: manager,
        });
        runner
    }

    /// The weight store (resident prefix, slot ring).
    pub fn store(&self) -> &WeightStore {
        &self.layers
    }

    /// Device bytes held per kind and streaming counters, right now.
    pub fn accounting(&self) -> AccountingSnapshot {
        self.layers.accounting().snapshot()
    }

    /// The engine's error for a failed forward step. A device out-of-memory error becomes
    /// [`EngineError::OutOfMemory`] (HTTP 503) and is logged with what ferry holds against the
    /// plan and what the driver reports, so the operator can resize `gpu_memory` or `max_batch`;
    /// the runner stays usable (the streamer resynchronises on the next step).
    fn step_error(&self, err: ModelError) -> EngineError {
        let text = err.to_string();
        if !ferry_gpu::is_out_of_memory(&text) {
            return internal(err);
        }
        let held = self.layers.accounting().snapshot();
        let driver = ferry_gpu::memory_info(self.model.device()).ok();
        tracing::error!(
            error = %text,
            device = %ferry_gpu::describe(self.model.device()),
            held_weights_mib = held.weights >> 20,
            held_slots_mib = held.slots >> 20,
            kv_peak_mib = held.kv_peak >> 20,
            planned_total_mib = held.planned.total >> 20,
            planned_kv_mib = held.planned.kv >> 20,
            planned_workspace_mib = held.planned.workspace >> 20,
            driver_free_mib = driver.map(|m| m.free >> 20),
            driver_total_mib = driver.map(|m| m.total >> 20),
            "out of device memory during a forward step; failing the request with 503"
        );
        EngineError::OutOfMemory(text)
    }

    /// The model (spec, fixed weights, device).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The rates by which attention against a host KV cache runs on the host or on the device,
    /// per layer and step (`kv_offload`; `None`: always on the host). For sequences started
    /// after the call.
    pub fn set_host_kv_rates(&mut self, rates: Option<HostKvRates>) {
        self.model.set_host_kv_rates(rates);
    }
}

/// Steps of at least this many tokens (prompts) hand the memory they freed back to the OS (so
/// do steps that grew a KV cache).
const RELEASE_AFTER_TOKENS: usize = 256;

impl LanguageModel for ModelRunner {
    type Sequence = RunnerSequence;
    type Block = KvSpan;

    fn new_sequence(&self) -> RunnerSequence {
        RunnerSequence {
            cache: self.model.new_cache_with_limit(self.max_context),
            lease: None,
            draft: None,
        }
    }

    fn forward_rows(
        &mut self,
        batch: &mut [(&mut RunnerSequence, &[u32])],
        outputs: &[usize],
    ) -> EngineResult<Vec<Vec<f32>>> {
        // Mode `model`: every sequence holds a lease; all leases name the same resident copy.
        for (seq, _) in batch.iter_mut() {
            self.take_lease(seq)?;
        }
        // Split each sequence into its cache (written) and its lease (read), so the first lease's
        // layers are borrowed in place rather than copied every step.
        let mut leased: Option<&[LayerWeights]> = None;
        let mut inputs: Vec<SeqInput> = Vec::with_capacity(batch.len());
        for (seq, tokens) in batch.iter_mut() {
            let RunnerSequence { cache, lease, .. } = &mut **seq;
            if leased.is_none() {
                leased = lease.as_ref().map(Lease::layers);
            }
            inputs.push(SeqInput { tokens, cache });
        }
        let step_tokens: usize = inputs.iter().map(|input| input.tokens.len()).sum();
        let kv_before: usize = inputs
            .iter()
            .map(|input| input.cache.allocated_bytes())
            .sum();
        let logits = match leased {
            None => self
                .model
                .forward_rows(&mut inputs, outputs, &mut self.layers),
            Some(layers) => {
                self.model
                    .forward_rows(&mut inputs, outputs, &mut ResidentLayers(layers))
            }
        }
        .map_err(|e| self.step_error(e))?;
        drop(inputs);
        let mut kv_after = 0;
        for (seq, _) in batch.iter() {
            kv_after += seq.cache.allocated_bytes();
            self.layers
                .accounting()
                .observe_kv(seq.cache.device_allocated_bytes() as u64);
        }
        let logits = logits
            .to_vec2::<f32>()
            .map_err(|e| self.step_error(e.into()));
        if step_tokens >= RELEASE_AFTER_TOKENS || kv_after > kv_before {
            // A prompt's step frees tens of megabytes of activations and kernel scratch, and a
            // step that grew a KV cache frees its old buffers, in the allocator's heaps, which
            // glibc keeps; give them back (a few ms, on steps that are rare or long) so the
            // resident set stays the model plus its KV caches.
            ferry_server::limits::release_freed_memory();
        }
        logits
    }

    /// Copies the KV cache (device to device), and the draft's; the copy takes its own lease
    /// in mode `model`.
    fn fork_sequence(&self, seq: &RunnerSequence) -> EngineResult<Option<RunnerSequence>> {
        let cache = seq.cache.fork().map_err(|e| self.step_error(e))?;
        let draft = seq
            .draft
            .as_ref()
            .map(DraftCache::fork)
            .transpose()
            .map_err(|e| self.step_error(e))?;
        Ok(Some(RunnerSequence {
            cache,
            lease: None,
            draft,
        }))
    }

    /// Off for a model with recurrent layers: their state is not a sum of positions, so the
    /// prefix cache is off for such a model (no state snapshots are kept).
    fn supports_blocks(&self) -> bool {
        !self.model.spec().has_recurrent_layers()
    }

    fn truncate_sequence(&self, seq: &mut RunnerSequence, len: usize) -> EngineResult<()> {
        if len > seq.cache.len() {
            return Err(EngineError::Internal(format!(
                "cannot keep {len} positions of a sequence holding {}",
                seq.cache.len()
            )));
        }
        seq.cache.truncate(len).map_err(|e| self.step_error(e))?;
        if let Some(draft) = &mut seq.draft {
            draft.truncate(len).map_err(|e| self.step_error(e))?;
        }
        Ok(())
    }

    /// Off for a model with recurrent layers (Qwen3.5's DeltaNet): their state cannot go back
    /// to an earlier position, so such a model does not speculate.
    fn supports_truncate(&self) -> bool {
        !self.model.spec().has_recurrent_layers()
    }

    fn speculation(&self) -> Speculation {
        self.speculation
    }

    /// The draft model's proposals, its state kept in each sequence.
    fn propose(
        &mut self,
        batch: &mut [(&mut RunnerSequence, DraftAsk<'_>)],
    ) -> EngineResult<Vec<Proposal>> {
        let Some(draft) = &mut self.draft else {
            return Ok(vec![Proposal::default(); batch.len()]);
        };
        let mut states: Vec<(&mut Option<DraftCache>, &DraftAsk)> = batch
            .iter_mut()
            .map(|(seq, ask)| (&mut seq.draft, &*ask))
            .collect();
        draft.propose(&mut states).map_err(internal)
    }

    /// Copies the positions' keys and values out of the cache (device to device).
    fn copy_block(
        &self,
        seq: &RunnerSequence,
        start: usize,
        len: usize,
    ) -> EngineResult<Option<KvSpan>> {
        let span = seq
            .cache
            .copy_span(start, len)
            .map_err(|e| self.step_error(e))?;
        Ok(Some(span))
    }

    fn extend_sequence(&self, seq: &mut RunnerSequence, blocks: &[&KvSpan]) -> EngineResult<()> {
        seq.cache
            .extend_from_spans(blocks)
            .map_err(|e| self.step_error(e))
    }

    fn embedding_size(&self) -> Option<usize> {
        self.pooling
            .is_ok()
            .then_some(self.model.spec().hidden_size)
    }

    /// A fresh sequence sized to the input, fed in chunks of [`EMBED_CHUNK`]; each chunk's rows
    /// go into the pooler, and the sequence (with its lease in mode `model`) is dropped at the end.
    fn embed(&mut self, tokens: &[u32]) -> EngineResult<Vec<f32>> {
        let pooling = self
            .pooling
            .clone()
            .map_err(|reason| EngineError::InvalidRequest {
                message: format!("this model gives no embeddings: {reason}"),
                param: Some("model".into()),
            })?;
        let mut seq = RunnerSequence {
            cache: self.model.new_cache_with_limit(tokens.len()),
            lease: None,
            draft: None,
        };
        let mut pooler = Pooler::new(pooling, self.model.spec().hidden_size);
        for chunk in tokens.chunks(EMBED_CHUNK) {
            let hidden = self.hidden_states(&mut seq, chunk)?;
            let rows = hidden
                .flatten_all()
                .and_then(|rows| rows.to_vec1::<f32>())
                .map_err(|e| self.step_error(e.into()))?;
            pooler.add(&rows).map_err(internal)?;
        }
        drop(seq);
        if tokens.len() >= RELEASE_AFTER_TOKENS {
            ferry_server::limits::release_freed_memory();
        }
        pooler.finish().map_err(internal)
    }

    fn kv_reserve(&self, len: usize) -> usize {
        ferry_model::kv_cache::capacity_bound(len, self.max_context)
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn vocab_size(&self) -> usize {
        self.model.spec().vocab_size
    }
}

/// The tokenizer and chat template of a model, shared by the engine thread and request handlers.
pub struct TokenizerCodec {
    tokenizer: TextTokenizer,
    /// What requests that send no sampling values get (settled at load).
    sampling: SamplingParams,
    /// The reasoning markup chat replies are read for (settled at load).
    reasoning: Option<ReasoningFormat>,
    /// Built on the first `response_format` grammar (the token trie takes a moment).
    grammar: OnceLock<Result<Arc<GrammarCompiler>, EngineError>>,
}

impl TokenizerCodec {
    /// Wraps a tokenizer for the engine, with the model's sampling defaults; `split_think` is
    /// the `reasoning_format` setting's `auto` ([`ReasoningFormat::settle`]).
    pub fn new(tokenizer: TextTokenizer, sampling: SamplingParams, split_think: bool) -> Arc<Self> {
        let reasoning = ReasoningFormat::settle(tokenizer.chat_template_source(), split_think);
        Arc::new(Self {
            tokenizer,
            sampling,
            reasoning,
            grammar: OnceLock::new(),
        })
    }
}

impl TextCodec for TokenizerCodec {
    fn sampling_defaults(&self) -> SamplingParams {
        self.sampling.clone()
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> EngineResult<Vec<u32>> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map_err(internal)
    }

    fn encode_literal(&self, text: &str, add_special_tokens: bool) -> EngineResult<Vec<u32>> {
        self.tokenizer
            .encode_literal(text, add_special_tokens)
            .map_err(internal)
    }

    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        self.tokenizer
            .encode_chat(messages, add_generation_prompt, parse_special_in_content)
            .map_err(template_error)
    }

    fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        variables: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        let tools = (!tools.is_empty()).then_some(tools);
        let variables = (!variables.is_empty()).then_some(variables);
        self.tokenizer
            .encode_chat_with_tools(
                messages,
                tools,
                variables,
                add_generation_prompt,
                parse_special_in_content,
            )
            .map_err(template_error)
    }

    fn tool_support(&self) -> ToolSupport {
        ToolSupport::from_template(self.tokenizer.chat_template_source())
    }

    fn reasoning_format(&self) -> Option<ReasoningFormat> {
        self.reasoning
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> EngineResult<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(internal)
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_bytes(id)
    }

    fn eos_token_ids(&self) -> &[u32] {
        self.tokenizer.eos_token_ids()
    }

    fn is_special_token(&self, id: u32) -> bool {
        self.tokenizer.is_special(id)
    }

    fn grammar_compiler(&self) -> EngineResult<Arc<GrammarCompiler>> {
        self.grammar
            .get_or_init(|| GrammarCompiler::new(self, self.tokenizer.vocab_size()).map(Arc::new))
            .clone()
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String> {
        self.tokenizer
            .apply_chat_template(messages, add_generation_prompt)
            .map_err(template_error)
    }
}

/// A template's own error (`raise_exception`, no template) is the request's fault.
fn template_error(err: ModelError) -> EngineError {
    match err {
        ModelError::Template(message) => EngineError::InvalidRequest {
            message,
            param: Some("messages".to_string()),
        },
        other => internal(other),
    }
}
