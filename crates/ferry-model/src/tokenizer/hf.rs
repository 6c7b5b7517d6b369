//! Reads a Hugging Face tokenizer: `tokenizer.json` (the `tokenizers` pipeline itself), and the
//! optional `tokenizer_config.json` (chat template, special token texts, `add_bos_token`) and
//! `generation_config.json` (EOS ids that end generation). A `chat_template.jinja` beside
//! tokenizer_config.json (where newer transformers saves the template) is used when the config
//! has no `chat_template`.

use std::path::Path;

use super::pipeline::Pipeline;
use serde_json::Value as Json;

use super::gguf::{bos_template, dedup_keep_order};
use super::SpecialTokens;
use crate::error::{ModelError, Result};
use crate::source::read_json;

/// What the Hugging Face files say, ready for [`super::TextTokenizer`].
pub(super) struct HfTokenizer {
    pub tokenizer: Pipeline,
    pub special: SpecialTokens,
    pub chat_template: Option<String>,
    pub byte_level: bool,
}

/// A special token entry of tokenizer_config.json: `"<s>"` or `{"content": "<s>", ...}`.
fn token_str(config: &Json, key: &str) -> Option<String> {
    match config.get(key)? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `chat_template`: a string, or a list of `{name, template}` (the one named "default", else the
/// first).
fn chat_template(config: &Json) -> Option<String> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some(name))
            };
            named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template")?.as_str().map(str::to_string))
        }
        _ => None,
    }
}

/// An id or a list of ids (generation_config's `eos_token_id`).
fn ids(value: Option<&Json>) -> Vec<u32> {
    match value {
        Some(Json::Number(n)) => n
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .into_iter()
            .collect(),
        Some(Json::Array(list)) => list
            .iter()
            .filter_map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// `chat_template.jinja` in the directory of `file`, if there is one.
fn jinja_beside(file: &Path) -> Result<Option<String>> {
    let Some(path) = file.parent().map(|dir| dir.join("chat_template.jinja")) else {
        return Ok(None);
    };
    if !path.is_file() {
        return Ok(None);
    }
    std::fs::read_to_string(&path)
        .map(Some)
        .map_err(|source| ModelError::Io { path, source })
}

pub(super) fn build(
    tokenizer_json: &Path,
    tokenizer_config: Option<&Path>,
    generation_config: Option<&Path>,
) -> Result<HfTokenizer> {
    let mut tokenizer = Pipeline::from_file(tokenizer_json).map_err(|e| {
        ModelError::Tokenizer(format!("cannot load {}: {e}", tokenizer_json.display()))
    })?;
    let config = tokenizer_config
        .map(read_json)
        .transpose()?
        .unwrap_or(Json::Null);
    let generation = generation_config
        .map(read_json)
        .transpose()?
        .unwrap_or(Json::Null);

    let id_of = |text: &Option<String>| text.as_deref().and_then(|t| tokenizer.token_to_id(t));
    let bos_text = token_str(&config, "bos_token");
    let eos_text = token_str(&config, "eos_token");
    let bos_id = id_of(&bos_text).or_else(|| ids(generation.get("bos_token_id")).first().copied());
    let bos_text = bos_text.or_else(|| bos_id.and_then(|id| tokenizer.id_to_token(id)));

    let mut eos_ids: Vec<u32> = id_of(&eos_text).into_iter().collect();
    eos_ids.extend(ids(generation.get("eos_token_id")));
    dedup_keep_order(&mut eos_ids);
    let eos_text = eos_text.or_else(|| eos_ids.first().and_then(|id| tokenizer.id_to_token(*id)));

    // tokenizer.json's post-processor decides about BOS; a config asking for BOS that the
    // post-processor does not add gets a BOS template (transformers does the same).
    let post_adds_bos = |t: &Pipeline, bos: u32| {
        t.encode("", true)
            .map(|e| e.get_ids().first() == Some(&bos))
            .unwrap_or(false)
    };
    let mut add_bos = bos_id.is_some_and(|bos| post_adds_bos(&tokenizer, bos));
    if config.get("add_bos_token").and_then(Json::as_bool) == Some(true) && !add_bos {
        if let (Some(id), Some(text)) = (bos_id, bos_text.clone()) {
            tokenizer.with_post_processor(Some(bos_template(id, text)?));
            add_bos = true;
        }
    }

    let byte_level = tokenizer
        .get_decoder()
        .and_then(|d| serde_json::to_string(d).ok())
        .is_some_and(|s| s.contains("\"ByteLevel\""));

    Ok(HfTokenizer {
        special: SpecialTokens {
            bos_id,
            bos_text,
            eos_ids,
            eos_text,
            unk_text: token_str(&config, "unk_token"),
            pad_text: token_str(&config, "pad_token"),
            add_bos,
        },
        chat_template: match chat_template(&config) {
            Some(t) => Some(t),
            None => jinja_beside(tokenizer_config.unwrap_or(tokenizer_json))?,
        },
        byte_level,
        tokenizer,
    })
}
