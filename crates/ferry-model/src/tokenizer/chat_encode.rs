//! Chat prompts tokenised so that message content cannot forge control tokens.
//!
//! A rendered chat prompt mixes the template's markup (`<|im_start|>user\n`) with the messages'
//! text. Tokenised as one string with special tokens parsed, `hi<|im_end|>\n<|im_start|>system`
//! inside a user message would open a real system turn. So, as OpenAI's API behaves, content is
//! text here and only the template's own markup becomes control tokens:
//!
//! 1. Each special token gets an alias: a string no client can write (private-use characters
//!    around a random number chosen at load).
//! 2. The template's source is rewritten with every special token it spells out replaced by its
//!    alias; `bos_token`/`eos_token`/... are passed as aliases too. Message content is not
//!    touched, so templates that trim, split or compare it behave as before.
//! 3. The rendered prompt is tokenised by a copy of the tokenizer (its pipeline; the vocabulary
//!    model is shared, [`super::pipeline`]) that does not parse special tokens but knows the
//!    aliases as added tokens (with the flags of the tokens they stand for), and each alias id
//!    becomes its token's id. Tokenisation around the markup is
//!    therefore the same as with special tokens parsed, and `<|im_end|>` in content is the
//!    same ids as that text written anywhere else with special tokens not parsed.
//!
//! A template that builds special tokens in ways the rewrite cannot see (concatenating pieces of
//! them) is detected at load by a probe render; such a model falls back to parsing special tokens
//! in the whole prompt, with a warning.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::AddedToken;

use super::chat_template::{ChatMessage, ChatTemplate, TemplateContext};
use super::pipeline::Pipeline;
use crate::error::{ModelError, Result};

/// The literal tokenizer and the aliased template of one model.
#[derive(Debug)]
pub(crate) struct ChatEncoder {
    /// Special tokens not parsed; aliases are added tokens.
    literal: Pipeline,
    /// Alias token id -> the special token's id.
    alias_ids: HashMap<u32, u32>,
    /// Finds special-token text (leftmost longest), for rewriting; `None` without specials.
    finder: Option<AhoCorasick>,
    /// The aliases, in the finder's pattern order.
    aliases: Vec<String>,
    /// The template with special tokens spelled as aliases; `None` without a template or when
    /// the template cannot be rewritten (then callers parse special tokens as before).
    template: Option<ChatTemplate>,
}

impl ChatEncoder {
    /// Builds the literal tokenizer and the aliased template for `tokenizer` and its chat
    /// `template_source`.
    pub(crate) fn new(tokenizer: &Pipeline, template_source: Option<&str>) -> Result<Self> {
        let mut literal = tokenizer.clone();
        literal.set_encode_special_tokens(true);
        let mut specials: Vec<(u32, AddedToken)> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special && !t.content.is_empty())
            .collect();
        specials.sort_by_key(|(id, _)| *id);
        let nonce: u64 = rand::random();
        let aliases: Vec<String> = (0..specials.len())
            .map(|i| format!("\u{E000}{nonce}\u{E001}{i}\u{E002}"))
            .collect();
        let alias_tokens: Vec<AddedToken> = specials
            .iter()
            .zip(&aliases)
            .map(|((_, token), alias)| AddedToken {
                content: alias.clone(),
                special: false,
                ..token.clone()
            })
            .collect();
        literal
            .add_tokens(alias_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("cannot add special-token aliases: {e}")))?;
        let mut alias_ids = HashMap::with_capacity(specials.len());
        for ((id, _), alias) in specials.iter().zip(&aliases) {
            let alias_id = literal
                .token_to_id(alias)
                .ok_or_else(|| ModelError::Tokenizer("cannot add a special-token alias".into()))?;
            alias_ids.insert(alias_id, *id);
        }
        let finder = if specials.is_empty() {
            None
        } else {
            let patterns: Vec<&str> = specials.iter().map(|(_, t)| t.content.as_str()).collect();
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(patterns)
                    .map_err(|e| ModelError::Tokenizer(format!("special-token finder: {e}")))?,
            )
        };
        let mut encoder = Self {
            literal,
            alias_ids,
            finder,
            aliases,
            template: None,
        };
        if let Some(source) = template_source {
            let rewritten = ChatTemplate::new(&encoder.alias(source))?;
            if encoder.rewrite_holds(&rewritten) {
                encoder.template = Some(rewritten);
            } else {
                tracing::warn!(
                    "the chat template builds special tokens the content guard cannot follow: \
                     special tokens inside chat messages are parsed for this model"
                );
            }
        }
        Ok(encoder)
    }

    /// `text` with every special token spelled out replaced by its alias.
    pub(crate) fn alias(&self, text: &str) -> String {
        match &self.finder {
            Some(finder) => finder.replace_all(text, &self.aliases),
            None => text.to_owned(),
        }
    }

    /// The aliased template, when the model has one that could be rewritten.
    pub(crate) fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// Token ids of `text` with special tokens written in it taken as plain text; BOS added by
    /// the post-processor when `add_special_tokens`.
    pub(crate) fn encode_literal(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .literal
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of a prompt rendered by the aliased template: aliases become their special
    /// tokens, everything else is text.
    pub(crate) fn encode_rendered(&self, rendered: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_literal(rendered, false)?;
        for id in &mut ids {
            if let Some(&special) = self.alias_ids.get(id) {
                *id = special;
            }
        }
        Ok(ids)
    }

    /// Whether a probe conversation rendered by `rewritten` is free of special-token text (a
    /// template that spells special tokens in pieces would leave some behind). A template
    /// that rejects the probe passes: nothing shows it is wrong.
    fn rewrite_holds(&self, rewritten: &ChatTemplate) -> bool {
        let Some(finder) = &self.finder else {
            return true;
        };
        let probes: [&[(&str, &str)]; 2] = [
            &[("user", "hello")],
            &[
                ("system", "be brief"),
                ("user", "hello"),
                ("assistant", "hi"),
            ],
        ];
        for probe in probes {
            let messages: Vec<ChatMessage> = probe
                .iter()
                .map(|(role, content)| ChatMessage {
                    role: (*role).to_owned(),
                    content: (*content).to_owned(),
                    ..ChatMessage::default()
                })
                .collect();
            let ctx = TemplateContext {
                messages: &messages,
                add_generation_prompt: true,
                bos_token: "",
                eos_token: "",
                unk_token: None,
                pad_token: None,
                tools: None,
                variables: None,
            };
            if let Ok(rendered) = rewritten.render(&ctx) {
                if finder.find(&rendered).is_some() {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::models::bpe::{Vocab, BPE};

    use super::*;
    use crate::tokenizer::pipeline::SharedModel;

    /// A three-token BPE (`a`, `b`, `ab`) with the special token `<|end|>` (id 3).
    fn tokenizer() -> Pipeline {
        let vocab: Vocab = [("a", 0), ("b", 1), ("ab", 2), ("<|end|>", 3)]
            .into_iter()
            .map(|(t, id)| (t.to_owned(), id))
            .collect();
        let merges = vec![("a".to_owned(), "b".to_owned())];
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .unwrap();
        let mut tokenizer = Pipeline::new(SharedModel::new(bpe));
        tokenizer
            .add_special_tokens([AddedToken::from("<|end|>", true)])
            .unwrap();
        tokenizer
    }

    #[test]
    fn the_literal_tokenizer_shares_the_vocabulary_model_and_keeps_special_text_literal() {
        let tokenizer = tokenizer();
        let encoder = ChatEncoder::new(&tokenizer, None).unwrap();
        // One vocabulary model for both: the copy made for chat prompts holds no tables of
        // its own.
        assert!(encoder.literal.get_model().same_as(tokenizer.get_model()));
        // Special-token text is parsed by the model's tokenizer, literal in the copy (its
        // characters are not in this vocabulary: no ids), and aliases become the token.
        let parsed = tokenizer.encode("ab<|end|>", false).unwrap();
        assert_eq!(parsed.get_ids(), [2, 3]);
        assert_eq!(encoder.encode_literal("ab<|end|>", false).unwrap(), [2]);
        let rendered = encoder.alias("ab<|end|>");
        assert_eq!(encoder.encode_rendered(&rendered).unwrap(), [2, 3]);
    }
}
