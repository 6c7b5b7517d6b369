//! Structured outputs: a grammar (a JSON schema, or any JSON object) that constrains sampling
//! token by token, with llguidance. [`GrammarCompiler`] holds a model's token trie (built once
//! per tokenizer, its special tokens marked so no grammar lets them appear inside the text) and
//! compiles a [`GrammarSpec`] into a [`Grammar`]; each sequence runs its own [`GrammarState`],
//! which masks the logits before every draw and takes each sampled token after it. EOS is
//! allowed only when the grammar accepts what has been generated.
//!
//! A compile checks a schema against [`limits`] first and runs on its own large-stack thread
//! ([`thread`]); it computes the first mask too, so a grammar the engine cannot start an output
//! for (one no value matches, or too many alternatives at once) is the request's error before
//! it is queued. llguidance's errors reach clients as their first line only (the parser state
//! it appends is logged at debug).

pub mod limits;
pub mod thread;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::{json, Value};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::{traits::TextCodec, EngineError, EngineResult};
use thread::on_grammar_thread;

/// The request field whose grammar is compiled (compile errors name it).
pub const GRAMMAR_PARAM: &str = "response_format";

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// `response_format: {"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `response_format: {"type": "json_schema"}`: JSON valid against this schema.
    JsonSchema(Value),
    /// A Lark grammar (`tool_choice: required` or a named function: see
    /// [`super::tool_calls::constrain`]).
    Lark(String),
}

impl GrammarSpec {
    /// The grammar llguidance compiles: a Lark grammar as it is, or a JSON schema. Unless the schema sets its own `x-guidance`
    /// options, the JSON is compact (no free whitespace between tokens): small models otherwise
    /// tend to fill the output with newlines.
    fn grammar(&self) -> TopLevelGrammar {
        let mut schema = match self {
            GrammarSpec::JsonObject => json!({"type": "object"}),
            GrammarSpec::JsonSchema(schema) => schema.clone(),
            GrammarSpec::Lark(lark) => return TopLevelGrammar::from_lark(lark.clone()),
        };
        if let Value::Object(map) = &mut schema {
            map.entry("x-guidance")
                .or_insert_with(|| json!({"whitespace_flexible": false}));
        }
        TopLevelGrammar::from_json_schema(schema)
    }
}

/// llguidance's bound on the Earley items of one parser row (its default is 2000). A row
/// holds about four items for each optional property an object may still take, so the default
/// failed generations (mid-output) of objects with more than about 500; this one fits every
/// schema within [`limits::MAX_SCHEMA_PROPERTIES`].
const MAX_ITEMS_IN_ROW: usize = 4 * limits::MAX_SCHEMA_PROPERTIES + 2000;

/// One model's grammar compiler: its token trie and llguidance's parser factory.
pub struct GrammarCompiler {
    factory: ParserFactory,
    eos: Arc<[u32]>,
}

impl GrammarCompiler {
    /// Builds the token trie of `codec`'s first `vocab_size` ids: each token's bytes, special
    /// tokens (`is_special_token`, and every EOS id) marked as such. The first EOS id is the
    /// one llguidance allows when the grammar accepts; the others are allowed with it.
    pub fn new(codec: &dyn TextCodec, vocab_size: usize) -> EngineResult<Self> {
        let eos: Arc<[u32]> = codec.eos_token_ids().into();
        let Some(&first_eos) = eos.first() else {
            return Err(EngineError::Internal(
                "the tokenizer has no EOS token, so a grammar could never end".into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| {
                let bytes = codec.token_bytes(id);
                if codec.is_special_token(id) || eos.contains(&id) {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(&bytes);
                    marked
                } else {
                    bytes
                }
            })
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(vocab_size as u32, first_eos), &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::Internal(format!("building the grammar engine: {e}")))?;
        factory.quiet();
        let limits = factory.limits_mut();
        limits.max_items_in_row = MAX_ITEMS_IN_ROW;
        limits.verbose_errors = false;
        Ok(Self { factory, eos })
    }

    /// Compiles `spec` on a [`thread::GRAMMAR_STACK_BYTES`] stack. A schema outside
    /// [`limits`], one llguidance rejects (invalid, or using a feature it does not support), or
    /// one it cannot start an output for, is an invalid request naming [`GRAMMAR_PARAM`], with
    /// the reason.
    pub fn compile(&self, spec: &GrammarSpec) -> EngineResult<Grammar> {
        on_grammar_thread(GRAMMAR_PARAM, || self.compile_here(spec))
    }

    fn compile_here(&self, spec: &GrammarSpec) -> EngineResult<Grammar> {
        let invalid = |why: String| EngineError::InvalidRequest {
            message: format!("Invalid `{GRAMMAR_PARAM}` schema: {why}"),
            param: Some(GRAMMAR_PARAM.into()),
        };
        if let GrammarSpec::JsonSchema(schema) = spec {
            limits::check(schema).map_err(invalid)?;
        }
        let parser = self
            .factory
            .create_parser(spec.grammar())
            .map_err(|e| invalid(short_reason(&e)))?;
        Matcher::new(Ok(parser.clone()))
            .compute_mask_or_eos()
            .map_err(|e| {
                invalid(format!(
                    "the grammar engine cannot start an output for it ({})",
                    short_reason(&e)
                ))
            })?;
        Ok(Grammar {
            parser: Arc::new(parser),
            eos: Arc::clone(&self.eos),
        })
    }
}

/// A compiled grammar, ready to start a [`GrammarState`] per sequence. Cheap to clone.
#[derive(Clone)]
pub struct Grammar {
    parser: Arc<TokenParser>,
    eos: Arc<[u32]>,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammar")
    }
}

impl PartialEq for Grammar {
    /// The same compiled grammar (compiling one schema twice gives two unequal grammars).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.parser, &other.parser)
    }
}

/// One sequence's position in its grammar.
pub struct GrammarState {
    matcher: Matcher,
    eos: Arc<[u32]>,
    mask_time: Duration,
    compute_time: Duration,
    masks: u32,
}

impl GrammarState {
    /// A fresh state at the start of `grammar`.
    pub fn new(grammar: &Grammar) -> Self {
        Self {
            matcher: Matcher::new(Ok(TokenParser::clone(&grammar.parser))),
            eos: Arc::clone(&grammar.eos),
            mask_time: Duration::ZERO,
            compute_time: Duration::ZERO,
            masks: 0,
        }
    }

    /// Sets every logit the grammar forbids next to -inf (EOS ids only when it accepts).
    pub fn mask(&mut self, logits: &mut [f32]) -> EngineResult<()> {
        let start = Instant::now();
        let mask = self.matcher.compute_mask_or_eos().map_err(grammar_error)?;
        self.compute_time += start.elapsed();
        let eos_allowed = self
            .eos
            .first()
            .is_some_and(|&id| (id as usize) < mask.len() && mask.is_allowed(id));
        let eos_logits: Vec<Option<f32>> = self
            .eos
            .iter()
            .map(|&id| logits.get(id as usize).copied())
            .collect();
        let n = mask.len().min(logits.len());
        for (id, l) in logits[..n].iter_mut().enumerate() {
            if !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        logits[n..].fill(f32::NEG_INFINITY);
        for (&id, saved) in self.eos.iter().zip(eos_logits) {
            if let (Some(l), Some(saved)) = (logits.get_mut(id as usize), saved) {
                *l = if eos_allowed {
                    saved
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        self.mask_time += start.elapsed();
        self.masks += 1;
        Ok(())
    }

    /// Advances the grammar by the sampled `token` (not EOS: that ends the sequence).
    pub fn commit(&mut self, token: u32) -> EngineResult<()> {
        self.matcher.consume_token(token).map_err(grammar_error)
    }

    /// Masks computed so far and their average cost: in all, and of that llguidance's own
    /// computation (the rest is applying it to the logits).
    pub fn mask_stats(&self) -> (u32, Duration, Duration) {
        let n = self.masks.max(1);
        (self.masks, self.mask_time / n, self.compute_time / n)
    }
}

fn grammar_error(e: anyhow::Error) -> EngineError {
    EngineError::Internal(format!("grammar engine: {}", short_reason(&e)))
}

/// Most characters of llguidance's reason that reach a client.
const MAX_REASON_CHARS: usize = 300;

/// llguidance's reason for a client: its first line (what follows is the parser's state, for
/// debugging), at most [`MAX_REASON_CHARS`]. The whole text is logged at debug.
fn short_reason(e: &anyhow::Error) -> String {
    let full = format!("{e:#}");
    tracing::debug!(error = %full, "grammar engine error");
    let line = full.lines().next().unwrap_or_default().trim();
    match line.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_its_first_line_and_bounded() {
        let dump = anyhow::anyhow!("NoExtensionBias\n<state>\nTokens: []\nParser: {{}}");
        assert_eq!(short_reason(&dump), "NoExtensionBias");
        let long = anyhow::anyhow!("{}", "é".repeat(MAX_REASON_CHARS + 10));
        let reason = short_reason(&long);
        assert_eq!(reason.chars().count(), MAX_REASON_CHARS + 3);
        assert!(reason.ends_with("..."));
    }
}
