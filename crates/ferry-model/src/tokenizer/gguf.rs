//! Builds a [`tokenizers::Tokenizer`] from a GGUF file's `tokenizer.*` metadata (llama.cpp's keys),
//! tokenizing as llama.cpp does.
//!
//! Two vocabulary kinds: byte-level BPE (`tokenizer.ggml.model = "gpt2"`, [`super::gguf_bpe`])
//! and SentencePiece (`"llama"`, [`super::gguf_spm`]). For both, the tokens and their roles come
//! from [`super::gguf_vocab`]: control and unknown tokens become special added tokens (matched
//! whole in the text when special tokens are parsed), user-defined ones plain added tokens
//! (always matched), as llama.cpp partitions the text before tokenizing the pieces in between.
//! BOS and EOS are added by a post-processor when the model wants them
//! (`tokenizer.ggml.add_bos_token` / `add_eos_token`, else llama.cpp's default for the kind).

use super::pipeline::Pipeline;
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};

use super::gguf_meta::Meta;
use super::gguf_vocab::GgufVocab;
use super::{gguf_bpe, gguf_spm, SpecialTokens};
use crate::error::{ModelError, Result};
use crate::header::GgufMetadata;

/// What a GGUF says about its tokenizer, ready for [`super::TextTokenizer`].
pub(super) struct GgufTokenizer {
    pub tokenizer: Pipeline,
    pub special: SpecialTokens,
    pub chat_template: Option<String>,
    /// Tokens are spelled in GPT-2's byte alphabet (byte-level BPE).
    pub byte_level: bool,
}

/// Reads the tokenizer out of GGUF metadata.
pub(super) fn build(metadata: GgufMetadata<'_>) -> Result<GgufTokenizer> {
    let meta = Meta(metadata);
    let model = meta.str("tokenizer.ggml.model")?.ok_or_else(|| {
        ModelError::Config("GGUF has no tokenizer (`tokenizer.ggml.model` is missing)".into())
    })?;
    let vocab = GgufVocab::read(&meta)?;
    let n = vocab.tokens.len() as u32;
    // An id outside the vocabulary is ignored (llama.cpp warns and keeps its default).
    let id = |key: &str| -> Result<Option<u32>> { Ok(meta.u32(key)?.filter(|&i| i < n)) };
    // llama.cpp's defaults when a key is missing: SentencePiece vocabularies have <unk> = 0,
    // <s> = 1, </s> = 2 and add BOS; byte-level BPE has no fixed ids and its pre type decides BOS.
    let in_vocab = |i: u32| Some(i).filter(|&i| i < n);

    let (mut tokenizer, byte_level, defaults) = match model {
        "gpt2" => {
            let (tokenizer, pre) = gguf_bpe::build(&meta, &vocab)?;
            let defaults = KindDefaults {
                bos: None,
                eos: None,
                unk: None,
                add_bos: pre.add_bos,
            };
            (tokenizer, true, defaults)
        }
        "llama" => {
            let unk = id("tokenizer.ggml.unknown_token_id")?.or(in_vocab(0));
            let tokenizer = gguf_spm::build(&meta, &vocab, unk)?;
            let defaults = KindDefaults {
                bos: in_vocab(1),
                eos: in_vocab(2),
                unk: in_vocab(0),
                add_bos: true,
            };
            (tokenizer, false, defaults)
        }
        other => {
            return Err(ModelError::Unsupported(format!(
                "GGUF tokenizer model `tokenizer.ggml.model = {other}` (supported: \"gpt2\", \
                 byte-level BPE, and \"llama\", SentencePiece; load the model from its Hugging \
                 Face tokenizer.json instead)"
            )))
        }
    };

    let (special, user) = if byte_level {
        vocab.added_tokens(gguf_bpe::is_spelled)
    } else {
        vocab.added_tokens(|_| true)
    };
    tokenizer
        .add_special_tokens(special)
        .and_then(|_| tokenizer.add_tokens(user))
        .map_err(|e| ModelError::Tokenizer(format!("cannot add GGUF special tokens: {e}")))?;

    let bos_id = id("tokenizer.ggml.bos_token_id")?.or(defaults.bos);
    let eos_id = id("tokenizer.ggml.eos_token_id")?.or(defaults.eos);
    let unk_id = id("tokenizer.ggml.unknown_token_id")?.or(defaults.unk);
    let add_bos = meta
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(defaults.add_bos);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let ends = |add: bool, id: Option<u32>, what: &str| -> Result<Option<(u32, String)>> {
        if !add {
            return Ok(None);
        }
        let token = id.zip(vocab.text(id)).ok_or_else(|| {
            ModelError::Config(format!(
                "GGUF asks to add {what} but has no valid {what} id"
            ))
        })?;
        Ok(Some(token))
    };
    let bos = ends(add_bos, bos_id, "BOS")?;
    let eos = ends(add_eos, eos_id, "EOS")?;
    if bos.is_some() || eos.is_some() {
        tokenizer.with_post_processor(Some(ends_template(bos, eos)?));
    }

    // Generation ends on EOS, the EOT/EOM ids, and the tokens llama.cpp finds by their text.
    let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        eos_ids.extend(id(key)?);
    }
    eos_ids.extend(vocab.end_of_generation.iter().copied());
    dedup_keep_order(&mut eos_ids);

    Ok(GgufTokenizer {
        tokenizer,
        special: SpecialTokens {
            bos_id,
            bos_text: vocab.text(bos_id),
            eos_ids,
            eos_text: vocab.text(eos_id),
            unk_text: vocab.text(unk_id),
            pad_text: vocab.text(id("tokenizer.ggml.padding_token_id")?),
            add_bos,
        },
        chat_template: meta.str("tokenizer.chat_template")?.map(str::to_string),
        byte_level,
    })
}

/// Special-token defaults of one vocabulary kind, when the GGUF has no key for them.
struct KindDefaults {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
}

/// A post-processor that puts BOS first (and before each sequence of a pair).
pub(super) fn bos_template(id: u32, text: String) -> Result<TemplateProcessing> {
    ends_template(Some((id, text)), None)
}

/// A post-processor that puts `bos` before and `eos` after the text (each sequence of a pair).
fn ends_template(
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
) -> Result<TemplateProcessing> {
    let mut specials = Vec::new();
    let mut piece = |name: &str, token: Option<(u32, String)>| -> Result<bool> {
        let Some((id, text)) = token else {
            return Ok(false);
        };
        specials.push(
            SpecialToken::new(name.into(), vec![id], vec![text])
                .map_err(|e| ModelError::Tokenizer(e.to_string()))?,
        );
        Ok(true)
    };
    let (with_bos, with_eos) = (piece("BOS", bos)?, piece("EOS", eos)?);
    let sequence = |seq: &str, type_id: &str| {
        let mut parts = Vec::new();
        if with_bos {
            parts.push(format!("BOS{type_id}"));
        }
        parts.push(format!("${seq}{type_id}"));
        if with_eos {
            parts.push(format!("EOS{type_id}"));
        }
        parts.join(" ")
    };
    let single = sequence("A", "");
    let pair = format!("{} {}", sequence("A", ""), sequence("B", ":1"));
    TemplateProcessing::builder()
        .try_single(single.as_str())
        .and_then(|b| b.try_pair(pair.as_str()))
        .map_err(|e| ModelError::Tokenizer(format!("BOS/EOS template: {e}")))?
        .special_tokens(specials)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("BOS/EOS template: {e}")))
}

/// Removes repeated ids, keeping the first occurrence of each.
pub(super) fn dedup_keep_order(ids: &mut Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
}
