//! The expert route counts of the served models across runs ([`ferry_offload::expert_routes`]):
//! the planner reads what earlier runs recorded for a model file ([`recorded_routes`]) so the
//! most routed experts are resident first, and `serve` adds what its expert stores counted to
//! the file ([`RouteKeeper`]) every [`ROUTES_INTERVAL`] and when it stops.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_config::ModelConfig;
use ferry_model::checkpoint::Checkpoint;
use ferry_offload::expert_routes::{total, ModelKey, RouteCache};
use ferry_offload::Accounting;

/// How often a serving process adds its counts to the file (so a crash loses at most this).
pub const ROUTES_INTERVAL: Duration = Duration::from_secs(300);

/// Route counts an earlier run recorded for a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRoutes {
    /// Rows routed per layer and expert.
    pub counts: Vec<Vec<u64>>,
    /// The file they came from.
    pub file: PathBuf,
}

impl RecordedRoutes {
    /// The plan's note saying where the residency order came from.
    pub fn note(&self) -> String {
        format!(
            "resident experts: the most routed first, from {} expert routes recorded in {}",
            total(&self.counts),
            self.file.display()
        )
    }
}

/// The counts recorded for `checkpoint`'s file in the user's routes file, when `model` places
/// its experts one by one with `offload.expert_routes` on and any were recorded; a file that
/// cannot be used is logged and ignored.
pub fn recorded_routes(model: &ModelConfig, checkpoint: &Checkpoint) -> Option<RecordedRoutes> {
    if !(model.tier.experts && model.tier.expert_routes) || checkpoint.spec().moe.is_none() {
        return None;
    }
    let cache = RouteCache::user()?;
    let key = ModelKey::of(checkpoint.files())?;
    recorded_in(&cache, &key, &model.name)
}

/// The counts `cache` keeps for `key` (none when they are all zero).
pub fn recorded_in(cache: &RouteCache, key: &ModelKey, name: &str) -> Option<RecordedRoutes> {
    match cache.load(key) {
        Ok(Some(counts)) if total(&counts) > 0 => Some(RecordedRoutes {
            counts,
            file: cache.path().to_path_buf(),
        }),
        Ok(_) => None,
        Err(why) => {
            tracing::warn!(model = %name, "expert route counts ignored: {why}");
            None
        }
    }
}

/// The served models whose expert stores count routes, and the file their counts go to.
#[derive(Debug)]
pub struct RouteKeeper {
    cache: RouteCache,
    models: Mutex<Vec<(String, ModelKey, Arc<Accounting>)>>,
}

impl RouteKeeper {
    /// A keeper writing to `cache`.
    pub fn new(cache: RouteCache) -> Self {
        RouteKeeper {
            cache,
            models: Mutex::new(Vec::new()),
        }
    }

    /// Keeps the counts of model `name`, whose file is `key`, counted in `accounting`.
    pub fn add(&self, name: &str, key: ModelKey, accounting: Arc<Accounting>) {
        self.lock().push((name.to_owned(), key, accounting));
    }

    /// Adds every model's counts since the last write to the file; a failed write is logged
    /// and its counts kept for the next.
    pub fn write(&self) {
        for (name, key, accounting) in self.lock().iter() {
            let counts = accounting.routes().take();
            if total(&counts) == 0 {
                continue;
            }
            if let Err(e) = self.cache.merge(key, &counts) {
                tracing::warn!(
                    model = %name,
                    "could not write expert route counts to {}: {e}",
                    self.cache.path().display()
                );
                accounting.routes().give_back(&counts);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, ModelKey, Arc<Accounting>)>> {
        self.models.lock().unwrap_or_else(|p| p.into_inner())
    }
}
