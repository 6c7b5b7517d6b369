//! Fetching a model's files from the Hugging Face hub (through hf-hub) or, offline, from the
//! standard HF cache layout (`models--org--name/{refs,snapshots}`): a safetensors repository's
//! config, tokenizer and shards, or the GGUF (every split of it) that [`super::hub_gguf`]
//! chooses from the repository's listing (the hub's file list online, the cached snapshot's
//! files offline).

use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use hf_hub::{Repo, RepoType};

use super::hub_gguf;
use super::source::{shard_names, HubFiles, HubOptions, ModelFiles};
use super::{ModelError, Result};

/// Where files of one repo at one revision come from.
enum Origin {
    /// The cache only (`HF_HUB_OFFLINE=1`).
    Cache,
    /// The hub, through hf-hub (which also consults the cache first).
    Online(Box<ApiRepo>),
}

/// Resolves the files of one hub repository at one revision.
pub struct HubFetcher {
    repo: String,
    revision: String,
    options: HubOptions,
    origin: Origin,
}

impl HubFetcher {
    /// Prepares a fetcher; builds the hf-hub client unless offline.
    pub fn new(repo: &str, revision: &str, options: &HubOptions) -> Result<Self> {
        let origin = if options.offline {
            Origin::Cache
        } else {
            let mut builder = ApiBuilder::new()
                .with_cache_dir(options.cache_dir.clone())
                .with_progress(options.progress)
                .with_token(options.token.clone());
            if let Some(endpoint) = &options.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            let api = builder.build().map_err(|e| ModelError::Hub {
                repo: repo.to_string(),
                file: String::new(),
                message: e.to_string(),
            })?;
            let handle =
                Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string());
            Origin::Online(Box::new(api.repo(handle)))
        };
        Ok(Self {
            repo: repo.to_string(),
            revision: revision.to_string(),
            options: options.clone(),
            origin,
        })
    }

    /// Fetches the model `files` names: a GGUF (with its splits), or a safetensors model.
    pub fn fetch(&self, files: &HubFiles) -> Result<ModelFiles> {
        let gguf = match files {
            HubFiles::Auto => {
                // A repository with config.json is a safetensors model (as before GGUF
                // repositories were known); only without one is the listing needed.
                if self.optional("config.json")?.is_some() {
                    return self.fetch_safetensors();
                }
                hub_gguf::choose(&self.repo, &self.listing()?, None)?
            }
            HubFiles::Quant(tag) => hub_gguf::choose(&self.repo, &self.listing()?, Some(tag))?,
            HubFiles::File(file) => hub_gguf::with_splits(&self.repo, &self.listing()?, file)?,
        };
        tracing::info!(repo = %self.repo, files = gguf.join(", "), "fetching a GGUF model");
        let paths = gguf
            .iter()
            .map(|file| self.required(file))
            .collect::<Result<Vec<_>>>()?;
        let path = paths
            .into_iter()
            .next()
            .ok_or_else(|| self.missing("*.gguf"))?;
        Ok(ModelFiles::Gguf { path })
    }

    /// The repository's files: the hub's listing online, the cached snapshot's offline.
    fn listing(&self) -> Result<Vec<String>> {
        match &self.origin {
            Origin::Online(api) => api
                .info()
                .map(|info| info.siblings.into_iter().map(|s| s.rfilename).collect())
                .map_err(|err| ModelError::Hub {
                    repo: self.repo.clone(),
                    file: String::new(),
                    message: format!(
                        "cannot list the repository: {err} (set HF_HUB_OFFLINE=1 to use only the \
                         cache at {})",
                        self.options.cache_dir.display()
                    ),
                }),
            Origin::Cache => {
                let snapshot = self.snapshot_dir();
                let mut files = Vec::new();
                list_files(&snapshot, &snapshot, &mut files);
                if files.is_empty() {
                    return Err(self.missing("(any file: the repository is not in the cache)"));
                }
                Ok(files)
            }
        }
    }

    /// Fetches config, tokenizer files and every weight shard.
    fn fetch_safetensors(&self) -> Result<ModelFiles> {
        let config = self.required("config.json")?;
        let tokenizer = self.required("tokenizer.json")?;
        let tokenizer_config = self.optional("tokenizer_config.json")?;
        let generation_config = self.optional("generation_config.json")?;
        // A sentence-transformers model's pooling (read from the snapshot beside config.json
        // by `pooling`), fetched so that a hub id embeds as its directory would.
        self.optional("1_Pooling/config.json")?;
        let weights = match self.optional("model.safetensors.index.json")? {
            Some(index) => shard_names(&index)?
                .iter()
                .map(|name| self.required(name))
                .collect::<Result<Vec<_>>>()?,
            None => vec![self.required("model.safetensors")?],
        };
        let dir = config.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(ModelFiles::HfDir {
            dir,
            config,
            tokenizer,
            tokenizer_config,
            generation_config,
            weights,
        })
    }

    fn required(&self, file: &str) -> Result<PathBuf> {
        self.optional(file)?.ok_or_else(|| self.missing(file))
    }

    /// `Ok(None)` when the file does not exist in the repo (online) or in the cache (offline).
    fn optional(&self, file: &str) -> Result<Option<PathBuf>> {
        match &self.origin {
            Origin::Cache => Ok(self.cached(file)),
            Origin::Online(api) => match api.get(file) {
                Ok(path) => Ok(Some(path)),
                Err(err) if is_not_found(&err) => Ok(None),
                Err(err) => Err(ModelError::Hub {
                    repo: self.repo.clone(),
                    file: file.to_string(),
                    message: format!(
                        "{err} (set HF_HUB_OFFLINE=1 to use only the cache at {})",
                        self.options.cache_dir.display()
                    ),
                }),
            },
        }
    }

    /// Looks a file up in the cache.
    fn cached(&self, file: &str) -> Option<PathBuf> {
        let path = self.snapshot_dir().join(file);
        path.is_file().then_some(path)
    }

    /// The cached snapshot of the revision: `refs/<revision>` names a commit, or the revision
    /// is one.
    fn snapshot_dir(&self) -> PathBuf {
        let repo_dir = self
            .options
            .cache_dir
            .join(format!("models--{}", self.repo.replace('/', "--")));
        let commit = std::fs::read_to_string(repo_dir.join("refs").join(&self.revision))
            .map(|text| text.trim().to_string())
            .unwrap_or_else(|_| self.revision.clone());
        repo_dir.join("snapshots").join(commit)
    }

    fn missing(&self, file: &str) -> ModelError {
        let hint = if self.options.offline {
            " (HF_HUB_OFFLINE=1 is set, so only the cache was searched; download it on a connected machine or unset HF_HUB_OFFLINE)"
                .to_string()
        } else {
            format!(
                " and the hub has no such file at revision `{}`",
                self.revision
            )
        };
        ModelError::NotCached {
            repo: format!("{}@{}", self.repo, self.revision),
            file: file.to_string(),
            cache: self.options.cache_dir.clone(),
            hint,
        }
    }
}

/// Every file under `dir`, as paths relative to `root` with `/` separators (symlinks followed:
/// the cache links snapshot files to its blobs).
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            list_files(root, &path, out);
        } else if let Ok(relative) = path.strip_prefix(root) {
            let parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
}

fn is_not_found(err: &hf_hub::api::sync::ApiError) -> bool {
    use hf_hub::api::sync::ApiError;
    match err {
        ApiError::RequestError(inner) => matches!(**inner, ureq::Error::Status(404, _)),
        _ => false,
    }
}
