//! Plain data exchanged between the HTTP layer and the engine: a validated generation request and
//! the events the engine streams back for it. No behaviour lives here.

use serde::Serialize;

use super::grammar::Grammar;
use super::reasoning::ReasoningParsing;
use super::tool_calls::ToolParsing;

/// The chat message type lives with the chat template that renders it.
pub use ferry_chat::{ChatMessage, RESERVED_TEMPLATE_VARIABLES};

/// How to pick each next token. Defaults match OpenAI's: temperature 1, nucleus off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` times the top token's; 0 disables it.
    pub min_p: f32,
    /// Seed for the sampler's RNG; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// OpenAI presence penalty in [-2, 2], applied to tokens generated so far.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2], applied per occurrence in the generated tokens.
    pub frequency_penalty: f32,
    /// vLLM/HF repetition penalty (> 0, 1 disables it), applied to prompt and generated tokens.
    pub repetition_penalty: f32,
    /// OpenAI `logit_bias`: `(token id, bias)` pairs added to the logits before every draw
    /// (ids below the vocabulary size, biases in [-100, 100]; both checked before the engine).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

/// Everything about a generation except the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    /// Upper bound on generated tokens (already checked against the context).
    pub max_tokens: usize,
    /// Token selection.
    pub sampling: SamplingParams,
    /// Stop strings: generation ends before the first occurrence, which is never emitted.
    pub stop: Vec<String>,
    /// vLLM extension: keep generating past EOS (benchmarks need fixed-length outputs).
    pub ignore_eos: bool,
    /// Number of top alternatives to report per generated token (0..=20); `None` reports no
    /// logprobs at all, `Some(0)` only the chosen token's.
    pub logprobs: Option<usize>,
    /// `response_format`'s compiled grammar: every token is drawn from what it allows, and EOS
    /// only once it accepts (EOS then ends the generation even with `ignore_eos`).
    pub grammar: Option<Grammar>,
    /// With tools offered, how the reply's calls are read: the engine counts them for the
    /// request's log line (`finish_reason=tool_calls`, `tool_calls=N`), as the chat API
    /// answers; the HTTP layer reads the calls themselves.
    pub tool_calls: Option<ToolParsing>,
    /// A chat reply of a reasoning template: how its reasoning is read. The engine counts
    /// the reasoning's tokens (`usage.completion_tokens_details`) and, for harmony, decodes
    /// with special tokens kept (its markers are special tokens); the HTTP layer splits the
    /// text.
    pub reasoning: Option<ReasoningParsing>,
}

impl Default for GenerationParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            grammar: None,
            tool_calls: None,
            reasoning: None,
        }
    }
}

/// A request the engine can run as is: validated, tokenised and within the context.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The served model id (as in `GET /v1/models`).
    pub model: String,
    /// Prompt token ids, ready to prefill. The server tokenises text prompts itself, so a
    /// prompt that does not fit the context is refused before any stream starts.
    pub prompt: Vec<u32>,
    /// Sampling, limits and stop conditions.
    pub params: GenerationParams,
    /// The prefix-cache partition the prompt's blocks are looked up and kept in: `None` is the
    /// partition every request without a salt shares; the server derives `Some` from the
    /// request's `cache_salt` and, when several API keys are configured, the caller's key, so
    /// one client cannot learn from cache hits what another sent.
    pub cache_partition: Option<u64>,
}

impl GenerationRequest {
    /// The request for choice `index` of `n`: the same, but a given seed moves by `index` so
    /// seeded choices differ from one another and stay reproducible (choice 0 keeps the seed).
    pub fn for_choice(&self, index: usize) -> GenerationRequest {
        let mut request = self.clone();
        let seed = &mut request.params.sampling.seed;
        *seed = seed.map(|s| s.wrapping_add(index as u64));
        request
    }
}

/// The log probability of one token, with its text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// Token id.
    pub id: u32,
    /// The token's text (its own decoding, which may be part of a multi-byte character).
    pub token: String,
    /// Natural-log probability under the model's raw distribution (before sampling filters).
    pub logprob: f32,
    /// The token's UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// One step of output: new text (possibly empty while a stop string or a multi-byte character is
/// pending) and, if asked, the chosen token's logprob with its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    /// Text that became final with this token.
    pub text: String,
    /// The sampled token id.
    pub token_id: u32,
    /// The chosen token's logprob (present when `logprobs` was asked).
    pub logprob: Option<TokenLogprob>,
    /// The top alternatives, most likely first (present when `logprobs` was asked).
    pub top_logprobs: Vec<TokenLogprob>,
}

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    /// OpenAI's `finish_reason` for it: `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts for the `usage` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (including any stop-string tokens that were not emitted).
    pub completion_tokens: usize,
    /// Sum of both.
    pub total_tokens: usize,
    /// How many of the prompt tokens came from the prefix cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`); `None` when the model's prefix cache is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// How many of the completion tokens were reasoning (OpenAI's
    /// `completion_tokens_details.reasoning_tokens`); `None` when the reply was not read for
    /// reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// The breakdown of `Usage::completion_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompletionTokensDetails {
    /// Generated tokens that were part of the reasoning (counted as each token's text reached
    /// the reasoning reader: a token that opens, continues or closes the reasoning).
    pub reasoning_tokens: usize,
}

/// The breakdown of `Usage::prompt_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV state was reused from the prefix cache, not computed.
    pub cached_tokens: usize,
}

/// What the engine sends back for a request, in order: zero or more `Token`, then exactly one of
/// `Finished` or `Failed`. Dropping the receiver cancels the request.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A generated token.
    Token(TokenOutput),
    /// Generation ended normally.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Any text that was held back (a stop-string prefix that did not become a stop) and
        /// is now final.
        trailing_text: String,
    },
    /// Generation failed after it started.
    Failed(crate::EngineError),
}
