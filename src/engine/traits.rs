//! The two seams the generation loop is written against: a language model that turns tokens into
//! next-token logits, and a text codec (tokenizer + chat template). The model layer implements
//! them with small adapters, so the engine never depends on a concrete architecture or tokenizer.

use super::{request::ChatMessage, EngineResult};

/// One loaded model instance that keeps its own KV state per sequence.
///
/// It lives on exactly one engine thread, hence `Send` but not `Sync`. It is used generically
/// (never as a trait object), so the associated `Sequence` type costs nothing.
pub trait LanguageModel: Send {
    /// Per-request state (the KV cache and position).
    type Sequence;

    /// A fresh, empty sequence.
    fn new_sequence(&self) -> Self::Sequence;

    /// Feeds `tokens` (the whole prompt for prefill, or one token per decode step) and returns
    /// the logits of the last position, one `f32` per vocabulary entry.
    fn forward(&mut self, seq: &mut Self::Sequence, tokens: &[u32]) -> EngineResult<Vec<f32>>;

    /// One step for several sequences at once: each `(sequence, tokens)` pair as in
    /// [`forward`](Self::forward), returning each one's last-position logits in order. A model
    /// that can batch runs every layer once for all of them (one pass over the weights per
    /// step, which is what makes offloaded serving pay off); the default runs them one by one.
    /// On error, no sequence may have advanced past a consistent state the caller can drop.
    fn forward_batch(
        &mut self,
        batch: &mut [(&mut Self::Sequence, &[u32])],
    ) -> EngineResult<Vec<Vec<f32>>> {
        batch
            .iter_mut()
            .map(|(seq, tokens)| self.forward(seq, tokens))
            .collect()
    }

    /// The context window in tokens (prompt plus completion).
    fn max_context(&self) -> usize;

    /// Number of token ids the model accepts (its embedding rows); prompt ids must be below it.
    fn vocab_size(&self) -> usize;
}

/// Text to tokens and back, plus the chat template. Shared between the engine thread and the
/// HTTP handlers (tokenize/detokenize/render_chat run on the caller's thread), hence `Sync`, and
/// used as `Arc<dyn TextCodec>`.
pub trait TextCodec: Send + Sync {
    /// Text to token ids, adding BOS etc. when `add_special_tokens`.
    fn encode(&self, text: &str, add_special_tokens: bool) -> EngineResult<Vec<u32>>;

    /// Token ids to text. Incomplete UTF-8 at the end decodes to U+FFFD (the incremental
    /// detokenizer relies on that to hold such bytes back).
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> EngineResult<String>;

    /// The raw bytes one token stands for (for the `bytes` field of logprobs); empty if unknown.
    fn token_bytes(&self, id: u32) -> Vec<u8>;

    /// Token ids that end a generation (EOS, `<|im_end|>`, `<|eot_id|>`, ...).
    fn eos_token_ids(&self) -> &[u32];

    /// Renders chat messages through the chat template into one prompt string.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String>;
}
