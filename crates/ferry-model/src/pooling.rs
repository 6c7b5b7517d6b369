//! Embeddings from a model's final hidden states: which [`Pooling`] a model asks for (GGUF
//! `{arch}.pooling_type`, or a sentence-transformers `1_Pooling/config.json` beside an HF
//! directory's config.json), else [`Pooling::DEFAULT`] for a plain decoder LM, and the
//! [`Pooler`] that folds the hidden-state rows of an input (fed in chunks) into one
//! L2-normalised vector. The hidden states themselves come from the one forward path
//! ([`crate::decoder::Model::forward_hidden`]).

use std::path::Path;

use serde::Deserialize;

use super::checkpoint::Checkpoint;
use super::error::{ModelError, Result};
use super::source::ModelFiles;
use super::spec::as_u64;

/// How one input's hidden-state rows become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every position's row.
    Mean,
    /// The first position's row (BERT's `[CLS]`).
    First,
    /// The last position's row (the one that saw the whole input in a causal model).
    Last,
    /// The element-wise maximum over the positions.
    Max,
}

/// Where a model's pooling came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingOrigin {
    /// GGUF `{arch}.pooling_type`.
    Gguf,
    /// sentence-transformers' `1_Pooling/config.json`.
    SentenceTransformers,
    /// The model says nothing: [`Pooling::DEFAULT`].
    Default,
}

impl Pooling {
    /// The pooling of a decoder LM whose files name none: the mean over the positions. A causal
    /// LM's last position is trained to predict the next token, not to sum up the input, so
    /// averaging every position's state gives steadier similarities than the last one alone.
    pub const DEFAULT: Pooling = Pooling::Mean;

    /// Its name in logs and docs.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::First => "cls",
            Pooling::Last => "last",
            Pooling::Max => "max",
        }
    }

    /// The pooling `checkpoint`'s files ask for, or the default. A kind ferry cannot pool
    /// (GGUF's `rank`, an unknown value) is an [`ModelError::Unsupported`] naming it.
    pub fn of_checkpoint(checkpoint: &Checkpoint) -> Result<(Pooling, PoolingOrigin)> {
        let declared = match (checkpoint.files(), checkpoint.gguf()) {
            (_, Some(header)) => {
                let arch = header
                    .metadata
                    .get("general.architecture")
                    .and_then(|v| v.to_string().ok().cloned())
                    .unwrap_or_default();
                let key = format!("{arch}.pooling_type");
                match header.metadata.get(&key) {
                    None => None,
                    Some(v) => {
                        let id = as_u64(v)
                            .map_err(|e| ModelError::Config(format!("GGUF `{key}`: {e}")))?;
                        Self::from_gguf_type(id)?.map(|p| (p, PoolingOrigin::Gguf))
                    }
                }
            }
            (ModelFiles::HfDir { dir, .. }, None) => {
                Self::from_dir(dir)?.map(|p| (p, PoolingOrigin::SentenceTransformers))
            }
            (ModelFiles::Gguf { .. }, None) => None,
        };
        Ok(declared.unwrap_or((Self::DEFAULT, PoolingOrigin::Default)))
    }

    /// llama.cpp's `enum llama_pooling_type`: 0 none (per-token output, so the default here),
    /// 1 mean, 2 cls, 3 last, 4 rank (a reranker: not an embedding).
    pub fn from_gguf_type(id: u64) -> Result<Option<Pooling>> {
        match id {
            0 => Ok(None),
            1 => Ok(Some(Pooling::Mean)),
            2 => Ok(Some(Pooling::First)),
            3 => Ok(Some(Pooling::Last)),
            4 => Err(ModelError::Unsupported(
                "the model's pooling is `rank` (a reranker), which gives no embeddings".into(),
            )),
            other => Err(ModelError::Unsupported(format!(
                "the model's GGUF pooling_type {other} is not one ferry knows"
            ))),
        }
    }

    /// The pooling of sentence-transformers' `1_Pooling/config.json` in `dir`, if there is one.
    pub fn from_dir(dir: &Path) -> Result<Option<Pooling>> {
        let path = dir.join("1_Pooling").join("config.json");
        if !path.is_file() {
            return Ok(None);
        }
        let json = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        Self::from_sentence_transformers(&json)
            .map(Some)
            .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
    }

    /// The one mode a sentence-transformers pooling config turns on.
    pub fn from_sentence_transformers(json: &str) -> std::result::Result<Pooling, String> {
        #[derive(Deserialize)]
        struct Modes {
            #[serde(default)]
            pooling_mode_cls_token: bool,
            #[serde(default)]
            pooling_mode_mean_tokens: bool,
            #[serde(default)]
            pooling_mode_max_tokens: bool,
            #[serde(default)]
            pooling_mode_lasttoken: bool,
            #[serde(default)]
            pooling_mode_mean_sqrt_len_tokens: bool,
            #[serde(default)]
            pooling_mode_weightedmean_tokens: bool,
        }
        let m: Modes = serde_json::from_str(json).map_err(|e| e.to_string())?;
        if m.pooling_mode_mean_sqrt_len_tokens || m.pooling_mode_weightedmean_tokens {
            return Err("sqrt-length and weighted mean pooling are not supported".into());
        }
        let on = [
            (m.pooling_mode_mean_tokens, Pooling::Mean),
            (m.pooling_mode_cls_token, Pooling::First),
            (m.pooling_mode_lasttoken, Pooling::Last),
            (m.pooling_mode_max_tokens, Pooling::Max),
        ];
        let mut chosen = on.iter().filter(|(set, _)| *set).map(|&(_, p)| p);
        match (chosen.next(), chosen.next()) {
            (Some(p), None) => Ok(p),
            (None, _) => Err("no pooling mode is set".into()),
            (Some(_), Some(_)) => {
                Err("several pooling modes are set (their concatenation is not supported)".into())
            }
        }
    }
}

/// Folds an input's hidden-state rows, fed in order and in chunks, into its embedding.
#[derive(Debug, Clone)]
pub struct Pooler {
    pooling: Pooling,
    width: usize,
    acc: Vec<f32>,
    rows: usize,
}

impl Pooler {
    /// An empty pooler for rows of `width` values.
    pub fn new(pooling: Pooling, width: usize) -> Self {
        let start = if pooling == Pooling::Max {
            f32::NEG_INFINITY
        } else {
            0.0
        };
        Self {
            pooling,
            width,
            acc: vec![start; width],
            rows: 0,
        }
    }

    /// Adds the next rows (`rows.len()` a multiple of the width, row after row).
    pub fn add(&mut self, rows: &[f32]) -> Result<()> {
        if self.width == 0 || !rows.len().is_multiple_of(self.width) {
            return Err(ModelError::Config(format!(
                "{} hidden values are not whole rows of {}",
                rows.len(),
                self.width
            )));
        }
        for row in rows.chunks_exact(self.width) {
            match self.pooling {
                Pooling::Mean => self.acc.iter_mut().zip(row).for_each(|(a, v)| *a += v),
                Pooling::First if self.rows == 0 => self.acc.copy_from_slice(row),
                Pooling::First => {}
                Pooling::Last => self.acc.copy_from_slice(row),
                Pooling::Max => self
                    .acc
                    .iter_mut()
                    .zip(row)
                    .for_each(|(a, v)| *a = a.max(*v)),
            }
            self.rows += 1;
        }
        Ok(())
    }

    /// The pooled vector, scaled to unit L2 norm (OpenAI's embeddings are, and clients compare
    /// them by dot product). An input without rows is [`ModelError::EmptyInput`].
    pub fn finish(mut self) -> Result<Vec<f32>> {
        if self.rows == 0 {
            return Err(ModelError::EmptyInput);
        }
        if self.pooling == Pooling::Mean {
            let n = self.rows as f32;
            self.acc.iter_mut().for_each(|a| *a /= n);
        }
        l2_normalize(&mut self.acc);
        Ok(self.acc)
    }
}

/// Scales `v` to unit L2 norm (summed in f64); a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooled(pooling: Pooling, chunks: &[&[f32]]) -> Vec<f32> {
        let mut p = Pooler::new(pooling, 2);
        for c in chunks {
            p.add(c).unwrap();
        }
        p.finish().unwrap()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    #[test]
    fn each_pooling_over_chunks() {
        // Rows (3,0), (1,4) | (5,0): the chunk boundary must not matter.
        let chunks: &[&[f32]] = &[&[3.0, 0.0, 1.0, 4.0], &[5.0, 0.0]];
        let mean = pooled(Pooling::Mean, chunks);
        // mean (3, 4/3) -> normalised
        let n = (9.0f32 + 16.0 / 9.0).sqrt();
        assert!(close(&mean, &[3.0 / n, 4.0 / 3.0 / n]), "{mean:?}");
        assert!(close(&pooled(Pooling::First, chunks), &[1.0, 0.0]));
        assert!(close(&pooled(Pooling::Last, chunks), &[1.0, 0.0]));
        let max = pooled(Pooling::Max, chunks);
        let n = (25.0f32 + 16.0).sqrt();
        assert!(close(&max, &[5.0 / n, 4.0 / n]), "{max:?}");
        let first = pooled(Pooling::First, &[&[0.0, 2.0], &[7.0, 0.0]]);
        assert!(close(&first, &[0.0, 1.0]), "{first:?}");
    }

    #[test]
    fn refuses_empty_and_ragged() {
        assert!(matches!(
            Pooler::new(Pooling::Mean, 2).finish(),
            Err(ModelError::EmptyInput)
        ));
        assert!(Pooler::new(Pooling::Mean, 2).add(&[1.0, 2.0, 3.0]).is_err());
    }

    #[test]
    fn reads_declared_poolings() {
        assert_eq!(Pooling::from_gguf_type(0).unwrap(), None);
        assert_eq!(Pooling::from_gguf_type(1).unwrap(), Some(Pooling::Mean));
        assert_eq!(Pooling::from_gguf_type(2).unwrap(), Some(Pooling::First));
        assert_eq!(Pooling::from_gguf_type(3).unwrap(), Some(Pooling::Last));
        assert!(Pooling::from_gguf_type(4).is_err());
        let st = |s: &str| Pooling::from_sentence_transformers(s);
        assert_eq!(
            st(r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true}"#),
            Ok(Pooling::First)
        );
        assert_eq!(st(r#"{"pooling_mode_lasttoken": true}"#), Ok(Pooling::Last));
        assert!(
            st(r#"{"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#).is_err()
        );
        assert!(st("{}").is_err());
    }

    #[test]
    fn reads_a_sentence_transformers_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Pooling::from_dir(dir.path()).unwrap(), None);
        std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
        std::fs::write(
            dir.path().join("1_Pooling/config.json"),
            r#"{"pooling_mode_max_tokens": true}"#,
        )
        .unwrap();
        assert_eq!(Pooling::from_dir(dir.path()).unwrap(), Some(Pooling::Max));
    }
}
