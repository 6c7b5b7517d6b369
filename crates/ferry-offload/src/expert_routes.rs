//! How often each expert of a mixture-of-experts model is routed to, counted while serving and
//! kept across runs, so the planner makes the most routed experts resident first
//! ([`super::experts_plan::residency_order`]); no GGUF says which experts are hot.
//!
//! [`RouteCounter`] counts, per (layer, expert), the rows a step routed there (prefill and
//! decode alike); the expert store records every routed expert of a layer, resident or not
//! ([`super::ExpertStore`]), so only a model whose experts are offloaded counts. It lives in the
//! model's [`super::Accounting`], which the server shares with telemetry.
//!
//! [`RouteCache`] is the file the counts persist in, beside the calibration cache
//! (`$XDG_CACHE_HOME/ferry/expert-routes.json`, else `~/.cache/ferry/expert-routes.json`): one
//! entry per model file, keyed by [`ModelKey`] (its canonical path, size and modification time:
//! a replaced file starts again), the counts merged into what was there. It is bounded: at
//! most [`MAX_MODELS`] entries (the least recently written dropped first), each at most
//! [`MAX_LAYERS`] x [`MAX_EXPERTS`] counters. A missing file is no counts; a corrupt one, or
//! one of another format, is no counts and a warning, and is replaced on the next write.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ferry_model::source::ModelFiles;
use serde::{Deserialize, Serialize};

/// Bumped when what is counted changes: entries of another version are dropped.
pub const ROUTES_VERSION: u32 = 1;

/// Most model entries the file keeps (the most recently written).
pub const MAX_MODELS: usize = 16;

/// Most layers and experts per layer an entry keeps (a larger one is not a real model's).
pub const MAX_LAYERS: usize = 1024;
/// See [`MAX_LAYERS`].
pub const MAX_EXPERTS: usize = 4096;

/// Rows routed to each expert of each layer since the counter started (or was last taken).
#[derive(Debug, Default)]
pub struct RouteCounter {
    counts: Mutex<Vec<Vec<u64>>>,
}

impl RouteCounter {
    /// Counts `rows[i]` rows routed to expert `wanted[i]` of `layer`, whose experts number
    /// `n_experts` (a larger index, or a layer or expert past the bounds, is not counted).
    pub fn record(&self, layer: usize, n_experts: usize, wanted: &[usize], rows: &[usize]) {
        if layer >= MAX_LAYERS || n_experts > MAX_EXPERTS {
            return;
        }
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.len() <= layer {
            counts.resize(layer + 1, Vec::new());
        }
        let line = &mut counts[layer];
        if line.len() < n_experts {
            line.resize(n_experts, 0);
        }
        for (&e, &n) in wanted.iter().zip(rows) {
            if let Some(c) = line.get_mut(e).filter(|_| e < n_experts) {
                *c = c.saturating_add(n as u64);
            }
        }
    }

    /// The counts now, per layer and expert.
    pub fn snapshot(&self) -> Vec<Vec<u64>> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The counts now, leaving zeros (what a periodic write merges into the file, once).
    pub fn take(&self) -> Vec<Vec<u64>> {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts counts [`Self::take`] took back (a write that failed).
    pub fn give_back(&self, taken: &[Vec<u64>]) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        add_counts(&mut counts, taken);
    }
}

/// Adds `counts` into `into` per layer and expert, within [`MAX_LAYERS`] x [`MAX_EXPERTS`]
/// (saturating), growing `into` where `counts` are wider.
fn add_counts(into: &mut Vec<Vec<u64>>, counts: &[Vec<u64>]) {
    for (layer, line) in counts.iter().enumerate().take(MAX_LAYERS) {
        if into.len() <= layer {
            into.resize(layer + 1, Vec::new());
        }
        let n = line.len().min(MAX_EXPERTS);
        let kept = &mut into[layer];
        if kept.len() < n {
            kept.resize(n, 0);
        }
        for (c, &add) in kept.iter_mut().zip(&line[..n]) {
            *c = c.saturating_add(add);
        }
    }
}

/// The sum of every count.
pub fn total(counts: &[Vec<u64>]) -> u64 {
    counts
        .iter()
        .flatten()
        .fold(0u64, |sum, &c| sum.saturating_add(c))
}

/// What identifies a model file cheaply: its canonical path, size and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelKey {
    /// The canonical path of the weights file (the first shard, or config.json's directory).
    pub path: String,
    /// Bytes of the weights files together.
    pub size: u64,
    /// The newest modification time of them, seconds since the epoch.
    pub modified: u64,
}

impl ModelKey {
    /// The key of `files`; `None` when a file cannot be read.
    pub fn of(files: &ModelFiles) -> Option<Self> {
        let (first, paths): (PathBuf, Vec<PathBuf>) = match files {
            ModelFiles::Gguf { path } => (path.clone(), vec![path.clone()]),
            ModelFiles::HfDir {
                dir,
                config,
                weights,
                ..
            } => {
                let mut paths = weights.clone();
                paths.push(config.clone());
                (dir.clone(), paths)
            }
        };
        let path = std::fs::canonicalize(first).ok()?;
        let (mut size, mut modified) = (0u64, 0u64);
        for p in &paths {
            let meta = std::fs::metadata(p).ok()?;
            size = size.saturating_add(meta.len());
            let t = meta
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            modified = modified.max(t);
        }
        Some(ModelKey {
            path: path.display().to_string(),
            size,
            modified,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: ModelKey,
    /// Rows routed per layer and expert.
    counts: Vec<Vec<u64>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RoutesFile {
    version: u32,
    entries: Vec<Entry>,
}

/// The route counts file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCache {
    path: PathBuf,
}

impl RouteCache {
    /// The file at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        RouteCache { path: path.into() }
    }

    /// The user's file, beside the calibration cache; `None` without `XDG_CACHE_HOME` or
    /// `HOME`.
    pub fn user() -> Option<Self> {
        let calibration = super::calibrate_cache::CalibrationCache::user()?;
        Some(Self::at(
            calibration.path().with_file_name("expert-routes.json"),
        ))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The counts kept for `key` (`Ok(None)`: none, or no file); `Err` says why the file was
    /// not usable (corrupt, another format), for a warning.
    pub fn load(&self, key: &ModelKey) -> Result<Option<Vec<Vec<u64>>>, String> {
        Ok(self
            .read()?
            .entries
            .into_iter()
            .find(|e| &e.key == key)
            .map(|e| e.counts))
    }

    /// Adds `counts` to what the file keeps for `key` (a file that was not usable is
    /// replaced), the entry becoming the most recent; nothing is written when `counts` are
    /// all zero.
    pub fn merge(&self, key: &ModelKey, counts: &[Vec<u64>]) -> std::io::Result<()> {
        if total(counts) == 0 {
            return Ok(());
        }
        let mut file = self.read().unwrap_or_default();
        file.version = ROUTES_VERSION;
        let mut kept = file
            .entries
            .iter()
            .position(|e| &e.key == key)
            .map(|i| file.entries.remove(i).counts)
            .unwrap_or_default();
        add_counts(&mut kept, counts);
        file.entries.push(Entry {
            key: key.clone(),
            counts: kept,
        });
        let excess = file.entries.len().saturating_sub(MAX_MODELS);
        file.entries.drain(..excess);
        let text = serde_json::to_string(&file).map_err(std::io::Error::other)?;
        super::calibrate_cache::replace_file(&self.path, text.as_bytes())
    }

    /// The file's entries: none when it is missing; an error when it is not a routes file of
    /// this version or breaks the bounds.
    fn read(&self) -> Result<RoutesFile, String> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RoutesFile::default()),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let file: RoutesFile = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not an expert routes file ({e})", self.path.display()))?;
        if file.version != ROUTES_VERSION {
            return Err(format!(
                "{}: version {}, this ferry writes {ROUTES_VERSION}",
                self.path.display(),
                file.version
            ));
        }
        let too_big = file.entries.len() > MAX_MODELS
            || file.entries.iter().any(|e| {
                e.counts.len() > MAX_LAYERS || e.counts.iter().any(|l| l.len() > MAX_EXPERTS)
            });
        if too_big {
            return Err(format!(
                "{}: more entries or counters than ferry keeps",
                self.path.display()
            ));
        }
        Ok(file)
    }
}

#[cfg(test)]
#[path = "expert_routes_tests.rs"]
mod tests;
