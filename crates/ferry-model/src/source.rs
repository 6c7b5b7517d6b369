//! Where a model comes from: a GGUF file, a Hugging Face directory, or a hub id
//! `org/name[@revision]` resolved through hf-hub and the standard HF cache. Produces
//! [`ModelFiles`], the list of local files to load.
//!
//! Hub resolution honours `HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` and
//! `HF_HUB_OFFLINE=1` (cache only, a missing file is an error naming the repo and the cache path).

use std::path::{Path, PathBuf};

use super::{ModelError, Result};

/// The local files a model is loaded from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelFiles {
    /// A single GGUF file: weights, spec, tokenizer and chat template all come from it.
    Gguf {
        /// The .gguf file.
        path: PathBuf,
    },
    /// A Hugging Face layout: config.json, tokenizer files and safetensors shards.
    HfDir {
        /// The directory (or hub snapshot directory).
        dir: PathBuf,
        /// config.json.
        config: PathBuf,
        /// tokenizer.json.
        tokenizer: PathBuf,
        /// tokenizer_config.json (chat template, bos/eos), if present.
        tokenizer_config: Option<PathBuf>,
        /// generation_config.json (extra eos ids), if present.
        generation_config: Option<PathBuf>,
        /// The safetensors files, in shard order.
        weights: Vec<PathBuf>,
    },
}

/// A parsed `source` value, before any file is looked at on the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A local .gguf file.
    GgufFile(PathBuf),
    /// A local directory in Hugging Face layout.
    HfDir(PathBuf),
    /// A hub repository, at a branch, tag or commit.
    Hub {
        /// `org/name`.
        repo: String,
        /// Branch, tag or commit; "main" when not given.
        revision: String,
        /// Which of its files make the model.
        files: HubFiles,
    },
}

/// Which files of a hub repository make the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubFiles {
    /// `org/name`: a safetensors model when the repo has config.json, else its GGUF
    /// (Q4_K_M when it has several, as llama.cpp picks).
    Auto,
    /// `org/name:QUANT`: the GGUF (or split GGUF) whose name carries this quantization tag.
    Quant(String),
    /// `org/name/path/file.gguf`: that GGUF (with its other splits if it is the first).
    File(String),
}

impl ModelSource {
    /// Interprets a source string: an existing path wins; otherwise `org/name[@revision]` is a
    /// hub id; anything else is an error that says what was looked for.
    pub fn parse(text: &str) -> Result<Self> {
        let trimmed = text.trim();
        let path = Path::new(trimmed);
        if path.is_file() {
            return if has_gguf_extension(path) {
                Ok(Self::GgufFile(path.to_path_buf()))
            } else {
                Err(ModelError::Source(format!(
                    "{trimmed} is a file but not a .gguf; pass a GGUF file, a directory with config.json, or a hub id org/name"
                )))
            };
        }
        if path.is_dir() {
            return Self::from_dir(path);
        }
        if let Some((repo, revision, files)) = parse_hub_id(trimmed) {
            return Ok(Self::Hub {
                repo,
                revision,
                files,
            });
        }
        let hint = if has_gguf_extension(path) {
            " (for the default model, run scripts/fetch-model.sh first)"
        } else {
            ""
        };
        Err(ModelError::Source(format!(
            "model source `{trimmed}` is neither an existing file or directory nor a hub id like org/name[@revision]{hint}"
        )))
    }

    fn from_dir(dir: &Path) -> Result<Self> {
        if dir.join("config.json").is_file() {
            return Ok(Self::HfDir(dir.to_path_buf()));
        }
        let ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| ModelError::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && has_gguf_extension(p))
            .collect();
        match ggufs.as_slice() {
            [single] => Ok(Self::GgufFile(single.clone())),
            [] => Err(ModelError::Source(format!(
                "{} has no config.json and no .gguf file",
                dir.display()
            ))),
            _ => Err(ModelError::Source(format!(
                "{} holds several .gguf files; name the one to serve",
                dir.display()
            ))),
        }
    }
}

fn has_gguf_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"))
}

/// `org/name`, `org/name:QUANT` or `org/name/path/file.gguf`, each optionally `@revision`
/// and (as Ollama writes them) after `hf.co/` or `huggingface.co/`; every part made of the
/// characters the hub allows.
fn parse_hub_id(text: &str) -> Option<(String, String, HubFiles)> {
    let text = ["https://huggingface.co/", "huggingface.co/", "hf.co/"]
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix))
        .unwrap_or(text);
    let (id, revision) = match text.split_once('@') {
        Some((id, revision)) if !revision.is_empty() => (id, revision),
        Some(_) => return None,
        None => (text, "main"),
    };
    let valid = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let (id, quant) = match id.split_once(':') {
        Some((id, quant)) if valid(quant) => (id, Some(quant)),
        Some(_) => return None,
        None => (id, None),
    };
    let mut parts = id.split('/');
    let (org, name) = (parts.next()?, parts.next()?);
    let path: Vec<&str> = parts.collect();
    let repo = format!("{org}/{name}");
    if !(valid(org) && valid(name)) {
        return None;
    }
    let files = match (quant, path.as_slice()) {
        (Some(quant), []) => HubFiles::Quant(quant.to_string()),
        (None, []) if has_gguf_extension(Path::new(name)) => {
            // `dir/file.gguf` that does not exist is a missing file, not a repository.
            return None;
        }
        (None, []) => HubFiles::Auto,
        (None, path) if path.iter().all(|p| valid(p)) => {
            let file = path.join("/");
            if !has_gguf_extension(Path::new(&file)) {
                return None;
            }
            HubFiles::File(file)
        }
        _ => return None,
    };
    Some((repo, revision.to_string(), files))
}

/// How to reach the hub and its cache; read from the environment with [`HubOptions::from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubOptions {
    /// The hub cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE=1`: use only the cache.
    pub offline: bool,
    /// `HF_ENDPOINT`, if set.
    pub endpoint: Option<String>,
    /// `HF_TOKEN`, if set.
    pub token: Option<String>,
    /// Draw download progress bars (a terminal is attached).
    pub progress: bool,
}

impl HubOptions {
    /// Reads the standard HF variables through `lookup`.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let non_empty = |key: &str| lookup(key).filter(|v| !v.is_empty());
        let cache_dir = non_empty("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| non_empty("HF_HOME").map(|home| PathBuf::from(home).join("hub")))
            .unwrap_or_else(|| {
                let home = non_empty("HOME").unwrap_or_else(|| ".".to_string());
                PathBuf::from(home).join(".cache/huggingface/hub")
            });
        let offline = non_empty("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        Self {
            cache_dir,
            offline,
            endpoint: non_empty("HF_ENDPOINT"),
            token: non_empty("HF_TOKEN"),
            progress: false,
        }
    }
}

/// Resolves a source to local files, downloading from the hub when allowed.
pub fn resolve(source: &ModelSource, hub: &HubOptions) -> Result<ModelFiles> {
    match source {
        ModelSource::GgufFile(path) => Ok(ModelFiles::Gguf { path: path.clone() }),
        ModelSource::HfDir(dir) => hf_dir_files(dir),
        ModelSource::Hub {
            repo,
            revision,
            files,
        } => {
            let fetcher = super::hub::HubFetcher::new(repo, revision, hub)?;
            fetcher.fetch(files)
        }
    }
}

/// The files of a local HF-layout directory.
fn hf_dir_files(dir: &Path) -> Result<ModelFiles> {
    let required = |name: &str| {
        let path = dir.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(ModelError::Source(format!(
                "{} has no {name}; an HF model directory needs config.json, tokenizer.json and safetensors weights",
                dir.display()
            )))
        }
    };
    let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    let config = required("config.json")?;
    let tokenizer = required("tokenizer.json")?;
    let weights = if let Some(index) = optional("model.safetensors.index.json") {
        shard_names(&index)?
            .into_iter()
            .map(|name| dir.join(name))
            .collect::<Vec<_>>()
    } else {
        vec![required("model.safetensors")?]
    };
    if let Some(missing) = weights.iter().find(|p| !p.is_file()) {
        return Err(ModelError::Source(format!(
            "the safetensors index names {}, which does not exist",
            missing.display()
        )));
    }
    Ok(ModelFiles::HfDir {
        dir: dir.to_path_buf(),
        config,
        tokenizer,
        tokenizer_config: optional("tokenizer_config.json"),
        generation_config: optional("generation_config.json"),
        weights,
    })
}

/// A JSON file of the model's (a config, generation_config.json, ...), parsed; an error names
/// the file.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Config(format!("{} is not valid JSON: {e}", path.display())))
}

/// The shard file names of a `model.safetensors.index.json`, deduplicated, in sorted order.
pub fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|source| ModelError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let parsed: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Config(format!("{}: {e}", index.display())))?;
    let map = parsed
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::Config(format!("{} has no weight_map", index.display())))?;
    let mut names: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(ModelError::Config(format!(
            "{} has an empty weight_map",
            index.display()
        )));
    }
    Ok(names)
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
