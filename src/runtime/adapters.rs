//! The real model and tokenizer behind the engine's traits: [`ModelRunner`] implements
//! `LanguageModel` (one KV cache per sequence, weights from a `LayerSource`), [`TokenizerCodec`]
//! implements `TextCodec`.

use std::sync::Arc;

use crate::engine::traits::{LanguageModel, TextCodec};
use crate::engine::{ChatMessage, EngineError, EngineResult};
use crate::model::kv_cache::KvCache;
use crate::model::llama::{Model, ResidentLayers, SeqInput};
use crate::model::tokenizer::TextTokenizer;
use crate::model::ModelError;

fn internal(err: ModelError) -> EngineError {
    match err {
        ModelError::ContextOverflow { needed, max } => EngineError::InvalidRequest {
            message: format!("the sequence needs {needed} positions but the context holds {max}"),
            param: None,
        },
        other => EngineError::Internal(other.to_string()),
    }
}

/// A loaded model with its resident layer weights, served one forward step at a time.
pub struct ModelRunner {
    model: Model,
    layers: ResidentLayers,
    max_context: usize,
}

impl ModelRunner {
    /// Serves `model` with `layers`, capping the context at `max_context` (and the model's own).
    pub fn new(model: Model, layers: ResidentLayers, max_context: Option<usize>) -> Self {
        let native = model.spec().max_context;
        let max_context = max_context.map_or(native, |cap| cap.min(native));
        Self {
            model,
            layers,
            max_context,
        }
    }

    /// The model (spec, fixed weights, device).
    pub fn model(&self) -> &Model {
        &self.model
    }
}

impl LanguageModel for ModelRunner {
    type Sequence = KvCache;

    fn new_sequence(&self) -> KvCache {
        self.model.new_cache_with_limit(self.max_context)
    }

    fn forward(&mut self, seq: &mut KvCache, tokens: &[u32]) -> EngineResult<Vec<f32>> {
        let logits = self
            .model
            .forward(tokens, seq, &mut self.layers)
            .map_err(internal)?;
        logits
            .to_vec1::<f32>()
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    fn forward_batch(
        &mut self,
        batch: &mut [(&mut KvCache, &[u32])],
    ) -> EngineResult<Vec<Vec<f32>>> {
        let mut inputs: Vec<SeqInput> = batch
            .iter_mut()
            .map(|(cache, tokens)| SeqInput { tokens, cache })
            .collect();
        let logits = self
            .model
            .forward_batch(&mut inputs, &mut self.layers)
            .map_err(internal)?;
        logits
            .to_vec2::<f32>()
            .map_err(|e| EngineError::Internal(e.to_string()))
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
}

impl TokenizerCodec {
    /// Wraps a tokenizer for the engine.
    pub fn new(tokenizer: TextTokenizer) -> Arc<Self> {
        Arc::new(Self { tokenizer })
    }
}

impl TextCodec for TokenizerCodec {
    fn encode(&self, text: &str, add_special_tokens: bool) -> EngineResult<Vec<u32>> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map_err(internal)
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

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> EngineResult<String> {
        self.tokenizer
            .apply_chat_template(messages, add_generation_prompt)
            .map_err(|err| match err {
                ModelError::Template(message) => EngineError::InvalidRequest {
                    message,
                    param: Some("messages".to_string()),
                },
                other => internal(other),
            })
    }
}
