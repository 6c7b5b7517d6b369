//! What a model's own files recommend sampling with: a GGUF's `general.sampling.*` keys
//! (`temp`, `top_p`, `top_k`, `min_p`, `penalty_repeat`, as llama.cpp's converter writes them
//! from the checkpoint) or a Hugging Face directory's `generation_config.json` (`temperature`,
//! `top_p`, `top_k`, `min_p`, `repetition_penalty`, the values vLLM also takes as defaults).
//! Values out of range are dropped with a warning, so a stray file falls back to the defaults
//! instead of failing requests; the merge with the settings is `ferry_config::sampling`.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use ferry_config::SamplingSettings;
use serde_json::Value as Json;

use super::checkpoint::Checkpoint;
use super::header::gguf::GgufMetadata;
use super::source::read_json;
use super::source::ModelFiles;
use super::spec::{as_f64, as_u64};
use super::ModelError;

/// What `checkpoint`'s files recommend (all unset when they say nothing).
pub fn recommended_sampling(checkpoint: &Checkpoint) -> Result<SamplingSettings, ModelError> {
    let mut settings = match checkpoint.files() {
        ModelFiles::Gguf { .. } => checkpoint
            .gguf_metadata()
            .map(|metadata| from_gguf(&metadata))
            .unwrap_or_default(),
        ModelFiles::HfDir {
            generation_config, ..
        } => match generation_config {
            Some(path) => from_generation_config(path.as_path())?,
            None => SamplingSettings::default(),
        },
    };
    let dropped = settings.keep_valid();
    if !dropped.is_empty() {
        tracing::warn!(
            values = dropped.join(", "),
            "the model's recommended sampling values are out of range; using the defaults for them"
        );
    }
    Ok(settings)
}

/// The `general.sampling.*` keys of a GGUF header.
pub fn from_gguf(metadata: &GgufMetadata<'_>) -> SamplingSettings {
    let float = |key: &str| {
        metadata
            .value(&format!("general.sampling.{key}"))
            .and_then(|v: &Value| as_f64(v).ok())
            .map(|v| v as f32)
    };
    SamplingSettings {
        temperature: float("temp"),
        top_p: float("top_p"),
        top_k: metadata
            .value("general.sampling.top_k")
            .and_then(|v| as_u64(v).ok())
            .and_then(|v| usize::try_from(v).ok()),
        min_p: float("min_p"),
        repetition_penalty: float("penalty_repeat"),
    }
}

/// The sampling values of a `generation_config.json`.
pub fn from_generation_config(path: &Path) -> Result<SamplingSettings, ModelError> {
    Ok(from_generation_json(&read_json(path)?))
}

fn from_generation_json(json: &Json) -> SamplingSettings {
    let float = |key: &str| json.get(key).and_then(Json::as_f64).map(|v| v as f32);
    SamplingSettings {
        temperature: float("temperature"),
        top_p: float("top_p"),
        top_k: json
            .get("top_k")
            .and_then(Json::as_u64)
            .and_then(|v| usize::try_from(v).ok()),
        min_p: float("min_p"),
        repetition_penalty: float("repetition_penalty"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_config_values_are_read_and_others_ignored() {
        let read = from_generation_json(&json!({
            "bos_token_id": 1, "do_sample": true, "temperature": 0.6, "top_p": 0.9,
            "top_k": 20, "repetition_penalty": 1.05
        }));
        assert_eq!(
            read,
            SamplingSettings {
                temperature: Some(0.6),
                top_p: Some(0.9),
                top_k: Some(20),
                min_p: None,
                repetition_penalty: Some(1.05),
            }
        );
        assert_eq!(
            from_generation_json(&json!({"eos_token_id": [1, 2]})),
            SamplingSettings::default()
        );
    }

    #[test]
    fn a_gguf_header_says_what_llama_cpp_reads() {
        use crate::header::gguf::GgufHeader;
        use candle_core::quantized::gguf_file;
        let metadata = [
            ("general.sampling.temp", Value::F32(0.7)),
            ("general.sampling.top_k", Value::I32(20)),
            ("general.sampling.top_p", Value::F64(0.8)),
            ("general.sampling.penalty_repeat", Value::F32(1.1)),
            ("general.sampling.mirostat", Value::U32(0)),
        ];
        let refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let mut bytes = std::io::Cursor::new(Vec::new());
        gguf_file::write(&mut bytes, &refs, &[]).expect("write");
        let bytes = bytes.into_inner();
        let header = GgufHeader::parse(&bytes).expect("parse");
        let read = from_gguf(&GgufMetadata::new(&header, &bytes));
        assert_eq!(
            read,
            SamplingSettings {
                temperature: Some(0.7),
                top_p: Some(0.8),
                top_k: Some(20),
                min_p: None,
                repetition_penalty: Some(1.1),
            }
        );
    }
}
