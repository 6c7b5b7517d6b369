//! Builds a [`tokenizers::Tokenizer`] from a GGUF file's `tokenizer.*` metadata (llama.cpp's keys).
//!
//! Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is supported: the vocabulary and merges
//! become a BPE model, the pre-tokenizer comes from `tokenizer.ggml.pre`
//! ([`super::pretokenizers`]), control (type 3) and user-defined (type 4) tokens become added
//! tokens that are matched whole in the input before BPE (control ones as special tokens), and the
//! decoder is byte-level. BOS is added by a post-processor when the model wants it.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, Tokenizer};

use super::pretokenizers::{byte_level_bytes, for_gguf_pre, spell_bytes};
use super::SpecialTokens;
use crate::model::error::{ModelError, Result};

/// llama.cpp's token type for control tokens (`<|im_start|>`, `<|endoftext|>`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp's token type for user-defined added tokens (`<think>`).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Texts of control tokens that end a turn; llama.cpp stops generation on them too
/// (its "end of generation" set), so we list them with the EOS ids.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
];

/// What a GGUF says about its tokenizer, ready for [`super::TextTokenizer`].
pub(super) struct GgufTokenizer {
    pub tokenizer: Tokenizer,
    pub special: SpecialTokens,
    pub chat_template: Option<String>,
}

/// Reads the tokenizer out of GGUF metadata.
pub(super) fn build(content: &Content) -> Result<GgufTokenizer> {
    let meta = Meta(&content.metadata);
    let model = meta.str("tokenizer.ggml.model")?.ok_or_else(|| {
        ModelError::Config("GGUF has no tokenizer (`tokenizer.ggml.model` is missing)".into())
    })?;
    if model != "gpt2" {
        return Err(ModelError::Unsupported(format!(
            "GGUF tokenizer model `tokenizer.ggml.model = {model}` (only byte-level BPE, \"gpt2\", \
             is supported; load the model from its Hugging Face tokenizer.json instead)"
        )));
    }
    let tokens = meta.strings("tokenizer.ggml.tokens")?.ok_or_else(|| {
        ModelError::Config("GGUF tokenizer has no `tokenizer.ggml.tokens`".into())
    })?;
    let merges = meta.strings("tokenizer.ggml.merges")?.ok_or_else(|| {
        ModelError::Config("byte-level GGUF tokenizer has no `tokenizer.ggml.merges`".into())
    })?;
    let types = meta.ints("tokenizer.ggml.token_type")?.unwrap_or_default();
    let (pre_tokenizer, defaults) = for_gguf_pre(meta.str("tokenizer.ggml.pre")?)?;

    // Tokens are stored in the byte alphabet; the odd one that is not (raw text) is respelled so
    // the BPE model can reach it, as Hugging Face's GGUF conversion does. Later duplicates win.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            let key = if byte_level_bytes(t).is_some() {
                t.to_string()
            } else {
                spell_bytes(t)
            };
            (key, id as u32)
        })
        .collect();
    let merges: Merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| ModelError::Config(format!("GGUF merge `{m}` is not `a b`")))
        })
        .collect::<Result<_>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(defaults.ignore_merges)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("cannot build BPE from GGUF vocab: {e}")))?;

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    // Control and user-defined tokens are matched whole in the text. Ones spelled outside the byte
    // alphabet are llama.cpp mislabels that BPE could not produce anyway; skip them (as HF does).
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (token, ty) in tokens.iter().zip(types.iter()) {
        if byte_level_bytes(token).is_none() {
            continue;
        }
        match *ty {
            TOKEN_TYPE_CONTROL => {
                special.push(AddedToken::from(token.to_string(), true).normalized(false))
            }
            TOKEN_TYPE_USER_DEFINED => {
                user.push(AddedToken::from(token.to_string(), false).normalized(false))
            }
            _ => {}
        }
    }
    tokenizer
        .add_special_tokens(special)
        .and_then(|_| tokenizer.add_tokens(user))
        .map_err(|e| ModelError::Tokenizer(format!("cannot add GGUF special tokens: {e}")))?;

    let token_text = |id: Option<u32>| -> Option<String> {
        id.and_then(|i| tokens.get(i as usize))
            .map(|t| t.to_string())
    };
    let bos_id = meta.u32("tokenizer.ggml.bos_token_id")?;
    let eos_id = meta.u32("tokenizer.ggml.eos_token_id")?;
    let add_bos = meta
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(defaults.add_bos);
    let bos = bos_id.zip(token_text(bos_id));
    if add_bos {
        let (id, text) = bos.clone().ok_or_else(|| {
            ModelError::Config("GGUF asks to add BOS but has no valid bos_token_id".into())
        })?;
        tokenizer.with_post_processor(Some(bos_template(id, text)?));
    }

    let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        eos_ids.extend(meta.u32(key)?);
    }
    for (id, (token, ty)) in tokens.iter().zip(types.iter()).enumerate() {
        if *ty == TOKEN_TYPE_CONTROL && END_OF_TURN_TEXTS.contains(token) {
            eos_ids.push(id as u32);
        }
    }
    dedup_keep_order(&mut eos_ids);

    Ok(GgufTokenizer {
        tokenizer,
        special: SpecialTokens {
            bos_id,
            bos_text: token_text(bos_id),
            eos_ids,
            eos_text: token_text(eos_id),
            unk_text: token_text(meta.u32("tokenizer.ggml.unknown_token_id")?),
            pad_text: token_text(meta.u32("tokenizer.ggml.padding_token_id")?),
            add_bos,
        },
        chat_template: meta.str("tokenizer.chat_template")?.map(str::to_string),
    })
}

/// A post-processor that puts BOS before the text (and before each sequence of a pair).
pub(super) fn bos_template(id: u32, text: String) -> Result<TemplateProcessing> {
    let bos = SpecialToken::new("BOS".into(), vec![id], vec![text])
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    TemplateProcessing::builder()
        .try_single("BOS $A")
        .and_then(|b| b.try_pair("BOS $A BOS:1 $B:1"))
        .map_err(|e| ModelError::Tokenizer(format!("BOS template: {e}")))?
        .special_tokens(vec![bos])
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("BOS template: {e}")))
}

/// Removes repeated ids, keeping the first occurrence of each.
pub(super) fn dedup_keep_order(ids: &mut Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
}

/// Typed access to GGUF metadata; a present key with the wrong type is a config error.
struct Meta<'a>(&'a HashMap<String, Value>);

impl<'a> Meta<'a> {
    fn bad(key: &str, what: &str) -> ModelError {
        ModelError::Config(format!("GGUF metadata `{key}` is not {what}"))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(Self::bad(key, "a string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => int_of(v)
                .map(|i| Some(i != 0))
                .ok_or_else(|| Self::bad(key, "a boolean")),
        }
    }

    fn u32(&self, key: &str) -> Result<Option<u32>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => int_of(v)
                .and_then(|i| u32::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| Self::bad(key, "a token id")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    _ => Err(Self::bad(key, "an array of strings")),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(Self::bad(key, "an array of strings")),
        }
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| int_of(v).ok_or_else(|| Self::bad(key, "an array of integers")))
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(Self::bad(key, "an array of integers")),
        }
    }
}

/// Any GGUF integer as i64 (`None` for non-integers and u64 beyond i64).
fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::U8(x) => Some(i64::from(*x)),
        Value::I8(x) => Some(i64::from(*x)),
        Value::U16(x) => Some(i64::from(*x)),
        Value::I16(x) => Some(i64::from(*x)),
        Value::U32(x) => Some(i64::from(*x)),
        Value::I32(x) => Some(i64::from(*x)),
        Value::U64(x) => i64::try_from(*x).ok(),
        Value::I64(x) => Some(*x),
        _ => None,
    }
}
