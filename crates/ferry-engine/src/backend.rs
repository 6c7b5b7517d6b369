//! The seam between HTTP and inference. The server holds an `Arc<dyn Backend>`; the real engine
//! implements it, and HTTP tests can implement it without a model.

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use ferry_metrics::Metrics;

use super::{
    embed::{EmbeddingReply, EmbeddingRequest},
    grammar::{Grammar, GrammarSpec},
    placement::ModelPlacement,
    reasoning::ReasoningFormat,
    request::{ChatMessage, SamplingParams},
    tool_calls::ToolSupport,
    EngineError, EngineResult, GenerationEvent, GenerationRequest,
};

/// Where a served model currently is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStatus {
    /// Weights are being read.
    Loading,
    /// Ready to serve.
    Ready,
    /// Loading failed; requests for it fail.
    Failed,
    /// Its engine stopped after loading (a panic in a forward pass); requests for it fail
    /// until the server is restarted.
    Stopped,
}

/// A served model as `GET /v1/models` and `/health` describe it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelCard {
    /// The id clients send as `model`.
    pub id: String,
    /// Unix seconds when the server registered it.
    pub created: u64,
    /// Where it is.
    pub status: ModelStatus,
    /// Context window in tokens (known once loaded).
    pub max_context: Option<usize>,
    /// Offload mode `model`: where the weights are now (`"device"`, `"host"` or `"moving"`);
    /// `None` for models that do not swap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residency: Option<String>,
}

/// Tells where a model's weights are (offload mode `model`), for [`ModelCard::residency`].
pub trait Residency: Send + Sync {
    /// `"device"`, `"host"`, ... for a model that swaps; `None` otherwise.
    fn location(&self, model: &str) -> Option<String>;
}

/// What the HTTP layer needs from the engine.
///
/// Calls are cheap and non-blocking except `tokenize`/`detokenize`/`render_chat`, which do CPU
/// work proportional to the text (the server runs them where blocking is fine).
pub trait Backend: Send + Sync + 'static {
    /// The metrics registry the backend reports into; the HTTP layer adds request counts to it
    /// and renders it on `GET /metrics`. Every call returns a handle to the same registry.
    fn metrics(&self) -> Metrics;

    /// Every configured model, loaded or not.
    fn models(&self) -> Vec<ModelCard>;

    /// Where `model`'s parts live, as planned at load (`GET /v1/ferry/status`); `None` when
    /// the backend does not know (default) or the model is unknown.
    fn placement(&self, _model: &str) -> Option<ModelPlacement> {
        None
    }

    /// The context window of a ready model.
    fn max_context(&self, model: &str) -> EngineResult<usize>;

    /// The sampling values a request to this ready model gets for the fields it does not send
    /// ([`crate::traits::TextCodec::sampling_defaults`]).
    fn sampling_defaults(&self, model: &str) -> EngineResult<SamplingParams>;

    /// Text to token ids; special-token text (`<|im_start|>`) becomes its control token.
    /// `add_special_tokens` adds BOS etc. when the model wants them (and nothing else: as in
    /// llama.cpp and vLLM, it does not decide whether special-token text is parsed).
    fn tokenize(&self, model: &str, text: &str, add_special_tokens: bool)
        -> EngineResult<Vec<u32>>;

    /// [`tokenize`](Self::tokenize) with special-token text kept as text (`<|im_start|>` is
    /// those characters). Default: `tokenize`, right for backends without special tokens.
    fn tokenize_literal(
        &self,
        model: &str,
        text: &str,
        add_special_tokens: bool,
    ) -> EngineResult<Vec<u32>> {
        self.tokenize(model, text, add_special_tokens)
    }

    /// The raw bytes each of `tokens` stands for (a special token: its text); an id outside
    /// the vocabulary is an invalid request naming `tokens`.
    fn token_bytes(&self, model: &str, tokens: &[u32]) -> EngineResult<Vec<Vec<u8>>>;

    /// `messages` rendered with the model's chat template and tokenised: the template's own
    /// markup becomes control tokens, special-token text inside the messages stays text unless
    /// `parse_special_in_content`.
    fn encode_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>>;

    /// [`encode_chat`](Self::encode_chat) with the template's `tools` variable set to `tools`
    /// and the extra template `variables` (a request's `chat_template_kwargs`) set.
    /// Default: without either (the server folds tools into the messages unless
    /// [`tool_support`](Self::tool_support) says the template renders them).
    fn encode_chat_with_tools(
        &self,
        model: &str,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        variables: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        if !tools.is_empty() || !variables.is_empty() {
            return Err(EngineError::Internal(
                "this backend's chat templates do not render tools or template variables".into(),
            ));
        }
        self.encode_chat(
            model,
            messages,
            add_generation_prompt,
            parse_special_in_content,
        )
    }

    /// What `model`'s chat template does with tools: the format calls are parsed from and
    /// whether it renders tool definitions itself. Default: Hermes, folded into the messages.
    fn tool_support(&self, _model: &str) -> EngineResult<ToolSupport> {
        Ok(ToolSupport::default())
    }

    /// The reasoning markup `model`'s chat replies are read for (`None`: not a reasoning
    /// template, or `reasoning_format = "none"`). Default: none.
    fn reasoning_format(&self, _model: &str) -> EngineResult<Option<ReasoningFormat>> {
        Ok(None)
    }

    /// Fails with `Overloaded` when [`submit`](Self::submit) would refuse a request for
    /// `model` right now, so the server can refuse it before tokenising. Default: never.
    fn check_capacity(&self, _model: &str) -> EngineResult<()> {
        Ok(())
    }

    /// Compiles a `response_format` grammar for `model` (its tokenizer's trie is built on the
    /// first one). An invalid or unsupported schema is an invalid request naming
    /// `response_format`. Default: grammars are not supported.
    fn compile_grammar(&self, _model: &str, _spec: &GrammarSpec) -> EngineResult<Grammar> {
        Err(EngineError::InvalidRequest {
            message: "this backend does not support `response_format` grammars".into(),
            param: Some(super::grammar::GRAMMAR_PARAM.into()),
        })
    }

    /// Token ids to text (special tokens kept).
    fn detokenize(&self, model: &str, tokens: &[u32]) -> EngineResult<String>;

    /// Renders chat messages through the model's chat template into a prompt string (which
    /// already carries any BOS the template adds, so tokenise it without special tokens).
    fn render_chat(
        &self,
        model: &str,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String>;

    /// Queues a request. Events arrive on the returned receiver; dropping it cancels the request.
    fn submit(&self, request: GenerationRequest) -> EngineResult<mpsc::Receiver<GenerationEvent>>;

    /// Queues `n` (at least 1) choices of one request: one receiver per choice, in index order,
    /// choice `i` sampling as [`GenerationRequest::for_choice`]`(i)`. Default: `n` independent
    /// submissions; the engine prefills the prompt once and copies its KV to the other choices.
    fn submit_choices(
        &self,
        request: GenerationRequest,
        n: usize,
    ) -> EngineResult<Vec<mpsc::Receiver<GenerationEvent>>> {
        (0..n.max(1))
            .map(|i| self.submit(request.for_choice(i)))
            .collect()
    }

    /// The width of `model`'s embedding vectors. A model that gives none is an invalid request
    /// naming `model`. Default: no model gives embeddings.
    fn embedding_size(&self, model: &str) -> EngineResult<usize> {
        Err(no_embeddings(model))
    }

    /// Queues an embedding request (inputs non-empty, each within the context): the vectors
    /// arrive on the returned receiver, in input order; dropping it cancels the request.
    /// Default: no model gives embeddings.
    fn embed(&self, request: EmbeddingRequest) -> EngineResult<oneshot::Receiver<EmbeddingReply>> {
        Err(no_embeddings(&request.model))
    }
}

/// The invalid request for embeddings from a model that gives none.
pub fn no_embeddings(model: &str) -> EngineError {
    EngineError::InvalidRequest {
        message: format!("the model `{model}` does not give embeddings"),
        param: Some("model".into()),
    }
}
