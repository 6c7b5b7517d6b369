//! The two seams the generation loop is written against: a language model that turns tokens into
//! next-token logits (and, where it can, into embeddings), and a text codec (tokenizer + chat
//! template + the model's sampling defaults). The model layer implements
//! them with small adapters, so the engine never depends on a concrete architecture or tokenizer.

use std::sync::Arc;

use super::{
    grammar::GrammarCompiler,
    reasoning::ReasoningFormat,
    request::{ChatMessage, SamplingParams},
    speculative::{DraftAsk, Proposal, Speculation},
    tool_calls::ToolSupport,
    EngineError, EngineResult,
};

/// One loaded model instance that keeps its own KV state per sequence.
///
/// It lives on exactly one engine thread, hence `Send` but not `Sync`. It is used generically
/// (never as a trait object), so the associated `Sequence` type costs nothing.
pub trait LanguageModel: Send {
    /// Per-request state (the KV cache and position).
    type Sequence;

    /// A copy of some consecutive positions of a sequence's state, as the prefix cache keeps
    /// it ([`copy_block`](Self::copy_block)).
    type Block;

    /// A fresh, empty sequence.
    fn new_sequence(&self) -> Self::Sequence;

    /// One step for several sequences at once: each `(sequence, tokens)` pair feeds `tokens`
    /// (a prompt chunk, the one token of a decode step, or that token and the tokens proposed
    /// after it by speculation) to its sequence, and the result holds the logits (one `f32` per
    /// vocabulary entry) of each one's last `outputs[i]` positions (1 to its token count):
    /// `outputs[0]` rows for the first sequence, its positions in order, then the next one's.
    /// The model runs every layer once for all of them (one pass over the weights per step,
    /// which is what makes offloaded serving pay off), and every position's logits are the ones
    /// feeding its tokens one step at a time would give. On error, no sequence may have
    /// advanced past a consistent state the caller can drop.
    fn forward_rows(
        &mut self,
        batch: &mut [(&mut Self::Sequence, &[u32])],
        outputs: &[usize],
    ) -> EngineResult<Vec<Vec<f32>>>;

    /// [`forward_rows`](Self::forward_rows) with each sequence's last-position logits only,
    /// one row per sequence, in order.
    fn forward_batch(
        &mut self,
        batch: &mut [(&mut Self::Sequence, &[u32])],
    ) -> EngineResult<Vec<Vec<f32>>> {
        let ones = vec![1; batch.len()];
        self.forward_rows(batch, &ones)
    }

    /// Forgets every position of `seq` at or after `len` (their keys and values, and a draft
    /// model's), as if they had never been fed: how a speculative step drops the proposals the
    /// model rejected. Default: an error (see [`supports_truncate`](Self::supports_truncate)).
    fn truncate_sequence(&self, _seq: &mut Self::Sequence, _len: usize) -> EngineResult<()> {
        Err(EngineError::Internal(
            "this model cannot forget positions".into(),
        ))
    }

    /// Whether [`truncate_sequence`](Self::truncate_sequence) works, so the serving loop may
    /// speculate. Default false.
    fn supports_truncate(&self) -> bool {
        false
    }

    /// How this model's decode steps speculate (set where the model is served). Default: off.
    fn speculation(&self) -> Speculation {
        Speculation::default()
    }

    /// Method [`SpeculationMethod::Draft`](super::speculative::SpeculationMethod::Draft): for
    /// each `(sequence, ask)`, up to `ask.max` tokens a draft model proposes after
    /// `ask.context` (every token of the sequence so far, the last one not yet fed to the served
    /// model): greedily, or drawn from its distribution with `ask.draws` (returned with them).
    /// The draft keeps its own state per sequence, fed what it has not seen of the context,
    /// and forgets with [`truncate_sequence`](Self::truncate_sequence). Default: no proposals.
    fn propose(
        &mut self,
        batch: &mut [(&mut Self::Sequence, DraftAsk<'_>)],
    ) -> EngineResult<Vec<Proposal>> {
        Ok(vec![Proposal::default(); batch.len()])
    }

    /// [`forward_batch`](Self::forward_batch) for one sequence: feeds `tokens` (a whole prompt,
    /// or one decode token) and returns the logits of the last position.
    fn forward(&mut self, seq: &mut Self::Sequence, tokens: &[u32]) -> EngineResult<Vec<f32>> {
        let rows = self.forward_batch(&mut [(seq, tokens)])?;
        let n = rows.len();
        <[Vec<f32>; 1]>::try_from(rows)
            .map(|[row]| row)
            .map_err(|_| {
                EngineError::Internal(format!("the model returned {n} rows for one sequence"))
            })
    }

    /// A new sequence holding a copy of `seq`'s state (its KV cache and position), so that the
    /// other choices of a request (`n` > 1) start after its prompt instead of prefilling it
    /// again. Default `Ok(None)`: the model cannot copy sequences, and each choice prefills its
    /// own.
    fn fork_sequence(&self, _seq: &Self::Sequence) -> EngineResult<Option<Self::Sequence>> {
        Ok(None)
    }

    /// Whether [`copy_block`](Self::copy_block) and [`extend_sequence`](Self::extend_sequence)
    /// work, so the serving loop may cache prompt prefixes. Default false.
    fn supports_blocks(&self) -> bool {
        false
    }

    /// A copy of positions `start..start + len` of `seq`'s state (all of them computed), for
    /// the prefix cache: sequences whose prompts start with the same tokens start from it
    /// instead of computing those positions again. Default `Ok(None)`: this model's sequences
    /// are not cached.
    fn copy_block(
        &self,
        _seq: &Self::Sequence,
        _start: usize,
        _len: usize,
    ) -> EngineResult<Option<Self::Block>> {
        Ok(None)
    }

    /// Appends `blocks` (consecutive positions, in order, copied by
    /// [`copy_block`](Self::copy_block)) to `seq`, which holds the positions before them. On
    /// error `seq` is as it was. Default: an error (nothing is ever copied).
    fn extend_sequence(
        &self,
        _seq: &mut Self::Sequence,
        _blocks: &[&Self::Block],
    ) -> EngineResult<()> {
        Err(EngineError::Internal(
            "this model does not restore cached positions".into(),
        ))
    }

    /// The most positions of KV memory a sequence may hold once it has grown to `len`
    /// positions (its buffers may grow in steps larger than a token). The prefix cache keeps
    /// this room for every running sequence. Default `len`.
    fn kv_reserve(&self, len: usize) -> usize {
        len
    }

    /// The width of this model's embedding vectors ([`embed`](Self::embed)), or `None` when it
    /// gives none. Default `None`.
    fn embedding_size(&self) -> Option<usize> {
        None
    }

    /// The embedding of `tokens` (one input, non-empty, within the context): the model's final
    /// hidden states pooled as its configuration says and L2-normalised, computed on a sequence
    /// of its own (no running sequence is touched). Default: an invalid request naming `model`.
    fn embed(&mut self, _tokens: &[u32]) -> EngineResult<Vec<f32>> {
        Err(EngineError::InvalidRequest {
            message: "this model does not give embeddings".into(),
            param: Some("model".into()),
        })
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

    /// Text to token ids with special-token text (`<|im_start|>`) kept as text. Default:
    /// [`encode`](Self::encode), right for codecs without special tokens.
    fn encode_literal(&self, text: &str, add_special_tokens: bool) -> EngineResult<Vec<u32>> {
        self.encode(text, add_special_tokens)
    }

    /// `messages` through the chat template into token ids: the template's markup as control
    /// tokens, special-token text in the messages as text unless `parse_special_in_content`.
    /// Default: render, then [`encode`](Self::encode) without adding special tokens (right for
    /// codecs without special tokens).
    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        _parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        let text = self.render_chat(messages, add_generation_prompt)?;
        self.encode(&text, false)
    }

    /// [`encode_chat`](Self::encode_chat) with the template's `tools` variable set to `tools`
    /// (`{"type": "function", "function": {..}}` each) and the extra template `variables` set.
    /// Default: without either.
    fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        variables: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> EngineResult<Vec<u32>> {
        if !tools.is_empty() || !variables.is_empty() {
            return Err(EngineError::Internal(
                "this codec's chat template does not render tools or template variables".into(),
            ));
        }
        self.encode_chat(messages, add_generation_prompt, parse_special_in_content)
    }

    /// What the chat template does with tools (the call format, whether it renders them).
    /// Default: Hermes markup, tools folded into the messages.
    fn tool_support(&self) -> ToolSupport {
        ToolSupport::default()
    }

    /// The reasoning markup of the chat template's replies, when they are read apart
    /// (settled at load from the template and the model's `reasoning_format`). Default: none.
    fn reasoning_format(&self) -> Option<ReasoningFormat> {
        None
    }

    /// Token ids to text. Incomplete UTF-8 at the end decodes to U+FFFD (the incremental
    /// detokenizer relies on that to hold such bytes back).
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> EngineResult<String>;

    /// The raw bytes one token stands for (for the `bytes` field of logprobs); empty if unknown.
    fn token_bytes(&self, id: u32) -> Vec<u8>;

    /// Whether `id` is a special (control) token such as `<|im_end|>`: a grammar never lets it
    /// appear inside constrained text. Default: none are.
    fn is_special_token(&self, _id: u32) -> bool {
        false
    }

    /// This vocabulary's grammar compiler (`response_format`), built on first use and cached.
    /// Default: grammars are not supported (an invalid request naming `response_format`).
    fn grammar_compiler(&self) -> EngineResult<Arc<GrammarCompiler>> {
        Err(EngineError::InvalidRequest {
            message: "this model's tokenizer does not support `response_format` grammars".into(),
            param: Some(super::grammar::GRAMMAR_PARAM.into()),
        })
    }

    /// Token ids that end a generation (EOS, `<|im_end|>`, `<|eot_id|>`, ...).
    fn eos_token_ids(&self) -> &[u32];

    /// What a request that names no sampling values samples with: the model's settings, else
    /// what its files recommend, else llama.cpp's defaults (settled when the model loads).
    /// Only `temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty` are defaults of
    /// the model; the other fields are neutral.
    fn sampling_defaults(&self) -> SamplingParams;

    /// Renders chat messages through the chat template into one prompt string.
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String>;
}
