//! The cache of the start-up calibration's measured rates ([`super::calibrate`]), so `serve`
//! and `ferry plan` measure once per machine instead of at every start: a JSON file
//! (`$XDG_CACHE_HOME/ferry/calibration.json`, else `~/.cache/ferry/calibration.json`) of
//! entries, each the rates measured under one [`CacheKey`]: the cache format's version,
//! ferry's version, build profile and executable, the CPU model, the compute thread count, the device,
//! the weight type and the CPU kernels that multiply it, and the probe sizes. An entry whose
//! key differs in any of them is not used (a new CPU, a release build, another thread count
//! measure again), and is kept beside the new one.
//!
//! Only measured rates are cached, each entry with the time it was measured (the start log
//! says it), and only from a run whose probes were steady ([`super::calibrate::CachePolicy`]);
//! a rate the configuration sets is never read from or written to the cache. A missing,
//! unreadable or malformed file is a cache miss (the rates are measured and the file
//! rewritten); failing to write it is logged, never fatal. `--recalibrate` (or deleting the
//! file) measures again.

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use serde::{Deserialize, Serialize};

/// Bumped when what is measured, or how, changes: older entries are then ignored.
pub const CACHE_VERSION: u32 = 1;

/// Most entries the file keeps (the newest).
const MAX_ENTRIES: usize = 32;

/// Everything a cached measurement depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    /// [`CACHE_VERSION`].
    pub version: u32,
    /// ferry's version.
    pub ferry: String,
    /// `release` or `debug` (the kernels' speed differs by an order of magnitude).
    pub profile: String,
    /// The running executable's modification time (seconds since the epoch; 0 unknown): a
    /// rebuilt binary, whose kernels may have changed, measures again.
    pub build: u64,
    /// The CPU model (`/proc/cpuinfo`'s `model name`, else the architecture).
    pub cpu: String,
    /// Threads the CPU kernels run on.
    pub threads: usize,
    /// The compute device ([`ferry_gpu::describe`]).
    pub device: String,
    /// The weight type of the host probe.
    pub weight_type: String,
    /// The CPU kernels the weight type runs through (`ferry`, `candle` or `dense`).
    pub kernels: String,
    /// Probe matrix bytes, input width, host rows, device rows, repetitions.
    pub probe: [usize; 5],
}

impl CacheKey {
    /// The key of this machine and build for `device`, a probe of `weight_type` multiplied by
    /// `kernels`, with `probe` sizes.
    pub fn current(
        device: &Device,
        weight_type: GgmlDType,
        kernels: &str,
        probe: [usize; 5],
    ) -> Self {
        CacheKey {
            version: CACHE_VERSION,
            ferry: env!("CARGO_PKG_VERSION").to_string(),
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_string(),
            build: executable_mtime(),
            cpu: cpu_model(),
            threads: candle_core::utils::get_num_threads(),
            device: ferry_gpu::describe(device),
            weight_type: super::calibrate::type_name(weight_type),
            kernels: kernels.to_string(),
            probe,
        }
    }
}

/// The measured rates of one entry (`None`: not measured under that key yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredRates {
    /// Host-to-device link, bytes/s.
    pub link_bytes_per_s: Option<f64>,
    /// Host compute, flop/s.
    pub host_flops_per_s: Option<f64>,
    /// Host read, bytes/s.
    pub host_read_bytes_per_s: Option<f64>,
    /// Device compute, flop/s.
    pub device_flops_per_s: Option<f64>,
    /// A host-computed unit's rows to the host and its results back (CUDA), bytes/s both ways
    /// together (absent from entries written before it was measured: measured then).
    #[serde(default)]
    pub activation_bytes_per_s: Option<f64>,
}

impl MeasuredRates {
    /// `self`'s rates, with `newer`'s where it has them.
    pub fn merged(self, newer: MeasuredRates) -> MeasuredRates {
        MeasuredRates {
            link_bytes_per_s: newer.link_bytes_per_s.or(self.link_bytes_per_s),
            host_flops_per_s: newer.host_flops_per_s.or(self.host_flops_per_s),
            host_read_bytes_per_s: newer.host_read_bytes_per_s.or(self.host_read_bytes_per_s),
            device_flops_per_s: newer.device_flops_per_s.or(self.device_flops_per_s),
            activation_bytes_per_s: newer.activation_bytes_per_s.or(self.activation_bytes_per_s),
        }
    }

    /// Every rate rounded to a whole number (at least 1) per second, which JSON carries exactly.
    pub fn rounded(self) -> MeasuredRates {
        let round = |r: Option<f64>| r.map(|r| r.round().max(1.0));
        MeasuredRates {
            link_bytes_per_s: round(self.link_bytes_per_s),
            host_flops_per_s: round(self.host_flops_per_s),
            host_read_bytes_per_s: round(self.host_read_bytes_per_s),
            device_flops_per_s: round(self.device_flops_per_s),
            activation_bytes_per_s: round(self.activation_bytes_per_s),
        }
    }

    /// Keeps only positive finite rates (a hand-edited file cannot feed the cost model a zero).
    fn valid(self) -> MeasuredRates {
        let ok = |r: Option<f64>| r.filter(|r| r.is_finite() && *r > 0.0);
        MeasuredRates {
            link_bytes_per_s: ok(self.link_bytes_per_s),
            host_flops_per_s: ok(self.host_flops_per_s),
            host_read_bytes_per_s: ok(self.host_read_bytes_per_s),
            device_flops_per_s: ok(self.device_flops_per_s),
            activation_bytes_per_s: ok(self.activation_bytes_per_s),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: CacheKey,
    rates: MeasuredRates,
    /// When the rates were last stored (seconds since the epoch; absent in older files).
    #[serde(default)]
    measured_at: Option<u64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: Vec<Entry>,
}

/// The calibration cache file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalibrationCache {
    path: PathBuf,
}

impl CalibrationCache {
    /// The cache at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        CalibrationCache { path: path.into() }
    }

    /// The user's cache (`$XDG_CACHE_HOME/ferry/calibration.json`, else
    /// `$HOME/.cache/ferry/calibration.json`); `None` without either variable.
    pub fn user() -> Option<Self> {
        Self::user_from(|k| std::env::var_os(k).map(PathBuf::from))
    }

    /// [`CalibrationCache::user`] with the environment read through `var`.
    pub fn user_from(var: impl Fn(&str) -> Option<PathBuf>) -> Option<Self> {
        let folder = ferry_config::user_cache_folder(var)?;
        Some(Self::at(folder.join("calibration.json")))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rates cached under `key` (all `None` when there are none, or the file is missing or
    /// unreadable).
    pub fn load(&self, key: &CacheKey) -> MeasuredRates {
        self.load_dated(key).0
    }

    /// [`Self::load`] and when those rates were stored (`None` when unknown or none).
    pub fn load_dated(&self, key: &CacheKey) -> (MeasuredRates, Option<u64>) {
        self.read()
            .entries
            .into_iter()
            .find(|e| &e.key == key)
            .map(|e| (e.rates.valid(), e.measured_at))
            .unwrap_or_default()
    }

    /// Stores `rates` under `key` (merged over what it held), keeping the other keys' entries.
    pub fn store(&self, key: &CacheKey, rates: MeasuredRates) -> std::io::Result<()> {
        let mut file = self.read();
        let old = file
            .entries
            .iter()
            .position(|e| &e.key == key)
            .map(|i| file.entries.remove(i).rates)
            .unwrap_or_default();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        file.entries.push(Entry {
            key: key.clone(),
            rates: old.valid().merged(rates.valid()),
            measured_at: Some(now),
        });
        let excess = file.entries.len().saturating_sub(MAX_ENTRIES);
        file.entries.drain(..excess);
        let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
        replace_file(&self.path, text.as_bytes())
    }

    fn read(&self) -> CacheFile {
        std::fs::read(&self.path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }
}

/// The running executable's modification time in seconds since the epoch (0 when unknown).
fn executable_mtime() -> u64 {
    std::env::current_exe()
        .and_then(std::fs::metadata)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// The CPU's model name, else the architecture.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Writes `bytes` as the file at `path` (its folder made when missing), written beside and
/// renamed over so a reader never sees half a file: the caches' one way of writing.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let partial = path.with_extension(format!("json.{}", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}
