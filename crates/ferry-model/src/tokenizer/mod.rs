//! Text <-> token ids for a model, and its chat template.
//!
//! [`TextTokenizer`] wraps a [`tokenizers::Tokenizer`] built either from a GGUF file's metadata
//! ([`gguf`]: byte-level BPE with a pre-tokenizer from [`pretokenizers`], or SentencePiece
//! vocabularies, both tokenizing as llama.cpp does) or from Hugging Face files ([`hf`]:
//! tokenizer.json + tokenizer_config.json + generation_config.json), together with
//! what generation needs besides ids: BOS/EOS ids, whether BOS is added, and the chat template
//! ([`chat_template`], rendered with minijinja like transformers does).
//!
//! A model without a template of its own chats with one of ferry's ([`builtin_template`]),
//! and the `chat_template` setting replaces either ([`TextTokenizer::settle_chat_template`]).
//!
//! Prompts rendered from a chat template already contain the special tokens the model wants;
//! encode them with `add_special_tokens = false`, as transformers does.

pub mod builtin_template;
mod chat_encode;
pub mod chat_template;
mod compact_bpe;
mod gguf;
mod gguf_bpe;
mod gguf_meta;
mod gguf_spm;
mod gguf_vocab;
mod hf;
mod pipeline;
pub mod pretokenizers;
mod template_json;

use std::path::Path;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Content;
pub use pipeline::{Pipeline, SharedModel};

use crate::error::{ModelError, Result};
use crate::header::GgufMetadata;
use crate::spec::Architecture;
pub use builtin_template::BuiltinTemplate;
use chat_encode::ChatEncoder;
pub use chat_template::ChatMessage;
use chat_template::{ChatTemplate, TemplateContext};
use ferry_config::ChatTemplateSource;

/// Where the chat template a model serves with came from
/// ([`TextTokenizer::settle_chat_template`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// The model's own (GGUF metadata, tokenizer_config.json, chat_template.jinja).
    Model,
    /// The `chat_template` setting.
    Configured,
    /// One of ferry's: the model has none.
    Builtin(BuiltinTemplate),
}

/// Special tokens and BOS policy, whichever source they came from.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialTokens {
    bos_id: Option<u32>,
    bos_text: Option<String>,
    /// Ids that end generation; the model's EOS first.
    eos_ids: Vec<u32>,
    eos_text: Option<String>,
    unk_text: Option<String>,
    pad_text: Option<String>,
    /// `encode(.., add_special_tokens = true)` puts BOS first.
    add_bos: bool,
}

/// A model's tokenizer: encode, decode, special tokens and chat template.
#[derive(Debug)]
pub struct TextTokenizer {
    tokenizer: Pipeline,
    special: SpecialTokens,
    /// Tokens are spelled in GPT-2's byte alphabet (byte-level BPE).
    byte_level: bool,
    chat_template: Option<ChatTemplate>,
    /// The template's source, for the aliased copy [`chat_encode`] compiles.
    chat_template_source: Option<String>,
    /// Built on first use: the literal tokenizer and the aliased template ([`chat_encode`]).
    chat_encoder: OnceLock<std::result::Result<ChatEncoder, String>>,
}

impl TextTokenizer {
    /// Builds the tokenizer a GGUF file describes (`tokenizer.ggml.*` and
    /// `tokenizer.chat_template`): byte-level BPE (`tokenizer.ggml.model = "gpt2"`) or
    /// SentencePiece (`"llama"`); other models are [`ModelError::Unsupported`], and so is an
    /// unknown `tokenizer.ggml.pre` of a byte-level vocabulary.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        Self::from_gguf_metadata(&content.metadata)
    }

    /// [`TextTokenizer::from_gguf`] from the metadata alone: a map of every value, or ferry's
    /// own GGUF header with the mapped file ([`crate::checkpoint::Checkpoint::gguf_metadata`],
    /// which reads the vocabulary in place).
    pub fn from_gguf_metadata<'a>(metadata: impl Into<GgufMetadata<'a>>) -> Result<Self> {
        let metadata = metadata.into();
        let source = gguf_meta::Meta(metadata).str("tokenizer.chat_template")?;
        // The template compiles on a thread of its own while the vocabulary builds (both are
        // part of every load).
        std::thread::scope(|scope| {
            let compiled = scope.spawn(|| source.map(ChatTemplate::new).transpose());
            let built = gguf::build(metadata);
            let compiled = compiled
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            let built = built?;
            Ok(Self::with_template(
                built.tokenizer,
                built.special,
                built.byte_level,
                compiled?,
                built.chat_template,
            ))
        })
    }

    /// Builds the tokenizer from Hugging Face files: `tokenizer.json`, plus optionally
    /// `tokenizer_config.json` (chat template, BOS/EOS tokens, `add_bos_token`) and
    /// `generation_config.json` (EOS ids that end generation).
    pub fn from_hf_files(
        tokenizer_json: &Path,
        tokenizer_config: Option<&Path>,
        generation_config: Option<&Path>,
    ) -> Result<Self> {
        let built = hf::build(tokenizer_json, tokenizer_config, generation_config)?;
        Self::assemble(
            built.tokenizer,
            built.special,
            built.byte_level,
            built.chat_template,
        )
    }

    /// The tokenizer with its template compiled (shared by both constructors).
    fn assemble(
        tokenizer: Pipeline,
        special: SpecialTokens,
        byte_level: bool,
        chat_template: Option<String>,
    ) -> Result<Self> {
        let compiled = chat_template
            .as_deref()
            .map(ChatTemplate::new)
            .transpose()?;
        Ok(Self::with_template(
            tokenizer,
            special,
            byte_level,
            compiled,
            chat_template,
        ))
    }

    /// The tokenizer with `compiled`, the template compiled from `source`.
    fn with_template(
        tokenizer: Pipeline,
        special: SpecialTokens,
        byte_level: bool,
        compiled: Option<ChatTemplate>,
        source: Option<String>,
    ) -> Self {
        Self {
            tokenizer,
            special,
            byte_level,
            chat_template: compiled,
            chat_template_source: source,
            chat_encoder: OnceLock::new(),
        }
    }

    /// Replaces the chat template (e.g. from a `chat_template.jinja` file or the user's config).
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        self.chat_template = Some(ChatTemplate::new(source)?);
        self.chat_template_source = Some(source.to_owned());
        self.chat_encoder = OnceLock::new();
        Ok(())
    }

    /// Settles the template chats render with: `configured` (the `chat_template` setting:
    /// the Jinja, or a file read now) when given, else the model's own, else the built-in one
    /// [`BuiltinTemplate::choose`] picks for `architecture` and this vocabulary. A file that
    /// cannot be read or a template that does not compile is a [`ModelError::Template`].
    pub fn settle_chat_template(
        &mut self,
        configured: Option<&ChatTemplateSource>,
        architecture: Architecture,
    ) -> Result<TemplateOrigin> {
        let Some(configured) = configured else {
            if self.has_chat_template() {
                return Ok(TemplateOrigin::Model);
            }
            let builtin = BuiltinTemplate::choose(architecture, |token| {
                self.tokenizer.token_to_id(token).is_some()
            });
            self.set_chat_template(&builtin.source(self.adds_bos()))?;
            return Ok(TemplateOrigin::Builtin(builtin));
        };
        let source = match configured {
            ChatTemplateSource::Inline(text) => text.clone(),
            ChatTemplateSource::File(path) => std::fs::read_to_string(path).map_err(|e| {
                ModelError::Template(format!(
                    "cannot read the chat_template file {}: {e}",
                    path.display()
                ))
            })?,
        };
        self.set_chat_template(&source).map_err(|e| match e {
            ModelError::Template(why) => ModelError::Template(format!("chat_template: {why}")),
            other => other,
        })?;
        Ok(TemplateOrigin::Configured)
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their ids.
    /// `add_special_tokens` adds BOS when the model wants it ([`Self::adds_bos`]).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of `text` with special tokens written in it taken as plain text
    /// (`<|im_start|>` is those characters, not the control token). `add_special_tokens` adds
    /// BOS when the model wants it.
    pub fn encode_literal(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.chat_encoder()?
            .encode_literal(text, add_special_tokens)
    }

    /// The token ids of `messages` rendered with the chat template. The template's own markup
    /// becomes control tokens; special tokens written inside message content are plain text
    /// unless `parse_special_in_content` (see [`chat_encode`]).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> Result<Vec<u32>> {
        self.encode_chat_with_tools(
            messages,
            None,
            None,
            add_generation_prompt,
            parse_special_in_content,
        )
    }

    /// [`Self::encode_chat`] with the template's `tools` variable set to `tools`, and the
    /// extra template `variables` (a request's `chat_template_kwargs`) set.
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        variables: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
        parse_special_in_content: bool,
    ) -> Result<Vec<u32>> {
        if !parse_special_in_content {
            let encoder = self.chat_encoder()?;
            if let Some(template) = encoder.template() {
                let alias = |text: &Option<String>| text.as_deref().map(|t| encoder.alias(t));
                let (bos, eos) = (alias(&self.special.bos_text), alias(&self.special.eos_text));
                let (unk, pad) = (alias(&self.special.unk_text), alias(&self.special.pad_text));
                let rendered = template.render(&TemplateContext {
                    messages,
                    add_generation_prompt,
                    bos_token: bos.as_deref().unwrap_or(""),
                    eos_token: eos.as_deref().unwrap_or(""),
                    unk_token: unk.as_deref(),
                    pad_token: pad.as_deref(),
                    tools,
                    variables,
                })?;
                return encoder.encode_rendered(&rendered);
            }
        }
        // Asked to parse them, or no template the guard can follow (or none at all, which
        // apply_chat_template reports).
        let text = self.render_chat(messages, tools, variables, add_generation_prompt)?;
        self.encode(&text, false)
    }

    fn chat_encoder(&self) -> Result<&ChatEncoder> {
        self.chat_encoder
            .get_or_init(|| {
                let source = self.chat_template_source.as_deref();
                ChatEncoder::new(&self.tokenizer, source).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ModelError::Tokenizer(e.clone()))
    }

    /// Text of `ids`; `skip_special_tokens` leaves out special tokens (BOS, EOS, `<|im_end|>`).
    /// Ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("decode: {e}")))
    }

    /// The decoded text of one token (special tokens included), `None` for an unknown id.
    /// A token holding part of a UTF-8 character decodes to U+FFFD; use [`Self::token_bytes`]
    /// for the exact bytes.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)?;
        self.tokenizer.decode(&[id], false).ok()
    }

    /// The raw bytes one token stands for (byte-level tokens map back to their bytes; `<0xNN>`
    /// byte-fallback tokens to that byte; `▁` to a space). Empty for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(token) = self.tokenizer.id_to_token(id) else {
            return Vec::new();
        };
        if self
            .tokenizer
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some()
        {
            return token.into_bytes();
        }
        if self.byte_level {
            return pretokenizers::byte_level_bytes(&token).unwrap_or_else(|| token.into_bytes());
        }
        if let Some(hex) = token
            .strip_prefix("<0x")
            .and_then(|rest| rest.strip_suffix('>'))
        {
            if let Ok(byte) = u8::from_str_radix(hex, 16) {
                return vec![byte];
            }
        }
        token.replace('\u{2581}', " ").into_bytes()
    }

    /// Ids that end generation: the model's EOS first, then end-of-turn tokens (GGUF: EOT/EOM
    /// ids and control tokens such as `<|im_end|>`/`<|endoftext|>`, as llama.cpp does; HF:
    /// generation_config.json's `eos_token_id`).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.special.eos_ids
    }

    /// The BOS token id, if the model has one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.special.bos_id
    }

    /// Whether `encode(.., true)` puts BOS first.
    pub fn adds_bos(&self) -> bool {
        self.special.add_bos
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Whether `id` is a special token (dropped by `decode(.., skip_special_tokens = true)`).
    pub fn is_special(&self, id: u32) -> bool {
        let added = self.tokenizer.get_added_vocabulary();
        added
            .simple_id_to_token(id)
            .is_some_and(|t| added.is_special_token(&t))
    }

    /// Whether the model ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders `messages` with the model's chat template, like transformers'
    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=..)`.
    /// Encode the result with `add_special_tokens = false`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat(messages, None, None, add_generation_prompt)
    }

    /// The chat template's source, when the model ships one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template_source.as_deref()
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        variables: Option<&serde_json::Map<String, serde_json::Value>>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            ModelError::Template(
                "this model has no chat template (no `tokenizer.chat_template` in the GGUF, no \
                 `chat_template` in tokenizer_config.json); use the completions API or set \
                 `chat_template`"
                    .into(),
            )
        })?;
        template.render(&TemplateContext {
            messages,
            add_generation_prompt,
            bos_token: self.special.bos_text.as_deref().unwrap_or(""),
            eos_token: self.special.eos_text.as_deref().unwrap_or(""),
            unk_token: self.special.unk_text.as_deref(),
            pad_token: self.special.pad_text.as_deref(),
            tools,
            variables,
        })
    }

    /// The underlying `tokenizers` pipeline.
    pub fn inner(&self) -> &Pipeline {
        &self.tokenizer
    }
}
