//! Whole-model residency for offload mode `model` (DESIGN.md 4.2): several models share one
//! device; each keeps every decoder layer parked in a [`HostStore`] and moves onto the device as a
//! unit when a request for it is about to run.
//!
//! One [`SwapManager`] per server holds the budget: the device bytes that the resident copies of
//! decoder layers may take together (fixed parts, KV caches and workspace are outside it; see
//! `runtime::swap` for how a server derives it). A model registers its host slabs and gets a
//! [`SwapClient`]; `acquire` returns a [`Lease`] on the resident copy:
//!
//! - already resident: the lease is immediate;
//! - parked, and it fits next to the other resident models: its slabs are copied into fresh
//!   device buffers ([`super::swap_copy`]: bulk copies of the pinned slabs on CUDA; on the CPU
//!   the streaming ring's fill path, throttled to `link_bandwidth` so a swap costs what PCIe
//!   would), counted as a swap-in;
//! - parked and it does not fit: idle resident models (no lease) are moved out, least recently
//!   used first, each counted as a swap-out; if the room is held by busy models the caller waits,
//!   and fails with [`OffloadError::Busy`] after the manager's wait timeout rather than hang.
//!
//! A model stays resident while any lease on it lives and for its `keep_alive` after the last
//! lease ends; a background thread moves expired models out even when no request arrives.
//! Moving out only drops the device buffers; the host slabs stay, so the next swap-in is a copy,
//! not a reload from disk. The copy runs outside the manager's lock, so other models keep
//! acquiring and releasing meanwhile.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Device;

use super::accounting::Accounting;
use super::error::OffloadError;
use super::host::{HostStore, Result};
use super::swap_copy::copy_to_device;
use ferry_model::weights::LayerWeights;

/// Server-wide settings of the residency manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapConfig {
    /// Device bytes the resident copies of decoder layers may take together.
    pub budget_bytes: u64,
    /// Copy throttle in bytes/s (CPU device); `None`: as fast as memcpy.
    pub link_bandwidth: Option<u64>,
    /// Longest a request waits for room held by busy models before failing.
    pub wait_timeout: Duration,
}

/// Where a model's decoder layers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Parked in host memory only.
    Host,
    /// Being copied onto the device.
    Moving,
    /// Resident on the device.
    Device,
}

impl Location {
    /// `"host"`, `"moving"` or `"device"` (what `GET /v1/models` prints).
    pub fn as_str(self) -> &'static str {
        match self {
            Location::Host => "host",
            Location::Moving => "moving",
            Location::Device => "device",
        }
    }
}

/// Counters of the whole manager, for metrics (`ferry_model_swaps_total`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwapStats {
    /// Models copied onto the device.
    pub swaps_in: u64,
    /// Models moved off the device (for room or after keep_alive).
    pub swaps_out: u64,
    /// Of `swaps_out`, those caused by keep_alive expiring.
    pub expired: u64,
    /// Device bytes the resident (or moving) models take now.
    pub resident_bytes: u64,
    /// The budget.
    pub budget_bytes: u64,
}

/// One model as the manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSwapStats {
    /// The served name.
    pub name: String,
    /// Where its layers are.
    pub location: Location,
    /// Leases alive (requests running).
    pub busy: usize,
    /// Device bytes of its resident copy.
    pub bytes: u64,
    /// Times it was copied onto the device.
    pub swaps_in: u64,
    /// Times it was moved off.
    pub swaps_out: u64,
}

enum Residency {
    Host,
    Moving,
    Device(Arc<Vec<LayerWeights>>),
}

struct Entry {
    name: String,
    host: Arc<HostStore>,
    device: Device,
    keep_alive: Duration,
    accounting: Option<Arc<Accounting>>,
    bytes: u64,
    residency: Residency,
    busy: usize,
    last_used: Instant,
    swaps_in: u64,
    swaps_out: u64,
}

impl Entry {
    fn location(&self) -> Location {
        match self.residency {
            Residency::Host => Location::Host,
            Residency::Moving => Location::Moving,
            Residency::Device(_) => Location::Device,
        }
    }

    fn holds_device(&self) -> bool {
        !matches!(self.residency, Residency::Host)
    }

    fn idle_resident(&self) -> bool {
        self.busy == 0 && matches!(self.residency, Residency::Device(_))
    }
}

#[derive(Default)]
struct State {
    models: Vec<Entry>,
    swaps_in: u64,
    swaps_out: u64,
    expired: u64,
    shutdown: bool,
}

impl State {
    fn resident_bytes(&self) -> u64 {
        self.models
            .iter()
            .filter(|e| e.holds_device())
            .map(|e| e.bytes)
            .sum()
    }

    /// Moves model `id` off the device (it must be idle and resident).
    fn evict(&mut self, id: usize, expired: bool) {
        let entry = &mut self.models[id];
        entry.residency = Residency::Host;
        entry.swaps_out += 1;
        if let Some(acc) = &entry.accounting {
            acc.sub_weights(entry.bytes);
        }
        tracing::info!(model = %entry.name, expired, "model moved off the device");
        self.swaps_out += 1;
        if expired {
            self.expired += 1;
        }
    }
}

struct Inner {
    config: SwapConfig,
    state: Mutex<State>,
    changed: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn release(&self, id: usize) {
        let mut state = self.lock();
        if let Some(entry) = state.models.get_mut(id) {
            entry.busy = entry.busy.saturating_sub(1);
            entry.last_used = Instant::now();
        }
        drop(state);
        self.changed.notify_all();
    }
}

/// The server's residency manager for mode `model`. Create it once with [`SwapManager::new`] and
/// register every mode-`model` model; dropping it stops its keep-alive thread.
pub struct SwapManager {
    inner: Arc<Inner>,
    reaper: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SwapManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapManager")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SwapManager {
    /// A manager with `config`, and its keep-alive thread.
    pub fn new(config: SwapConfig) -> Result<Arc<Self>> {
        let inner = Arc::new(Inner {
            config,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let reaper_inner = inner.clone();
        let reaper = std::thread::Builder::new()
            .name("ferry-keep-alive".into())
            .spawn(move || reap(&reaper_inner))
            .map_err(|e| OffloadError::CopyThread(e.to_string()))?;
        Ok(Arc::new(Self {
            inner,
            reaper: Mutex::new(Some(reaper)),
        }))
    }

    /// The settings.
    pub fn config(&self) -> SwapConfig {
        self.inner.config
    }

    /// Registers model `name` with every decoder layer parked in `host`; its resident copy goes
    /// to `device`, and `accounting` (if any) counts its bytes while resident. Fails if the name
    /// is taken or the model alone is larger than the budget.
    pub fn register(
        &self,
        name: &str,
        host: Arc<HostStore>,
        device: &Device,
        keep_alive: Duration,
        accounting: Option<Arc<Accounting>>,
    ) -> Result<SwapClient> {
        let bytes: u64 = host
            .layers()
            .iter()
            .map(|l| (l.blocks_len + l.dense_len) as u64)
            .sum();
        if bytes > self.inner.config.budget_bytes {
            return Err(OffloadError::Weights(format!(
                "model `{name}` needs {} of device memory for its layers, more than the {} mode `model` may use",
                super::units::format_bytes(bytes),
                super::units::format_bytes(self.inner.config.budget_bytes)
            )));
        }
        let mut state = self.inner.lock();
        if state.models.iter().any(|e| e.name == name) {
            return Err(OffloadError::Weights(format!(
                "model `{name}` is registered twice"
            )));
        }
        state.models.push(Entry {
            name: name.to_string(),
            host,
            device: device.clone(),
            keep_alive,
            accounting,
            bytes,
            residency: Residency::Host,
            busy: 0,
            last_used: Instant::now(),
            swaps_in: 0,
            swaps_out: 0,
        });
        Ok(SwapClient {
            inner: self.inner.clone(),
            id: state.models.len() - 1,
        })
    }

    /// Where model `name` is, if registered.
    pub fn location(&self, name: &str) -> Option<Location> {
        let state = self.inner.lock();
        state
            .models
            .iter()
            .find(|e| e.name == name)
            .map(Entry::location)
    }

    /// Manager-wide counters.
    pub fn stats(&self) -> SwapStats {
        let state = self.inner.lock();
        SwapStats {
            swaps_in: state.swaps_in,
            swaps_out: state.swaps_out,
            expired: state.expired,
            resident_bytes: state.resident_bytes(),
            budget_bytes: self.inner.config.budget_bytes,
        }
    }

    /// Per-model counters, in registration order.
    pub fn models(&self) -> Vec<ModelSwapStats> {
        let state = self.inner.lock();
        state
            .models
            .iter()
            .map(|e| ModelSwapStats {
                name: e.name.clone(),
                location: e.location(),
                busy: e.busy,
                bytes: e.bytes,
                swaps_in: e.swaps_in,
                swaps_out: e.swaps_out,
            })
            .collect()
    }
}

impl Drop for SwapManager {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.changed.notify_all();
        let thread = self
            .reaper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The keep-alive thread: moves idle models out once their keep_alive has passed.
fn reap(inner: &Inner) {
    let mut state = inner.lock();
    loop {
        if state.shutdown {
            return;
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for id in 0..state.models.len() {
            let entry = &state.models[id];
            if !entry.idle_resident() {
                continue;
            }
            let deadline = entry.last_used + entry.keep_alive;
            if deadline <= now {
                state.evict(id, true);
            } else {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
        }
        let wait = next.map_or(Duration::from_secs(3600), |n| n - now);
        state = inner
            .changed
            .wait_timeout(state, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// A registered model's handle on the manager. Cheap to clone.
#[derive(Clone)]
pub struct SwapClient {
    inner: Arc<Inner>,
    id: usize,
}

impl std::fmt::Debug for SwapClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapClient").field("id", &self.id).finish()
    }
}

impl SwapClient {
    /// Makes the model resident (moving idle models out if needed) and returns a lease that keeps
    /// it there until dropped. Blocks while the copy runs or while busy models hold the room;
    /// [`OffloadError::Busy`] after the manager's wait timeout.
    pub fn acquire(&self) -> Result<Lease> {
        let deadline = Instant::now() + self.inner.config.wait_timeout;
        let budget = self.inner.config.budget_bytes;
        let mut state = self.inner.lock();
        loop {
            let entry = &mut state.models[self.id];
            let parked = match &entry.residency {
                Residency::Device(layers) => {
                    let layers = layers.clone();
                    entry.busy += 1;
                    entry.last_used = Instant::now();
                    return Ok(self.lease(layers));
                }
                Residency::Moving => None,
                Residency::Host => Some(entry.bytes),
            };
            if let Some(need) = parked {
                loop {
                    if state.resident_bytes() + need <= budget {
                        return self.swap_in(state);
                    }
                    let victim = state
                        .models
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| e.idle_resident())
                        .min_by_key(|(_, e)| e.last_used)
                        .map(|(id, _)| id);
                    match victim {
                        Some(id) => state.evict(id, false),
                        None => break,
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let name = state.models[self.id].name.clone();
                return Err(OffloadError::Busy(format!(
                    "model `{name}` waited {:?} for device memory held by other models' running requests",
                    self.inner.config.wait_timeout
                )));
            }
            state = self
                .inner
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn lease(&self, layers: Arc<Vec<LayerWeights>>) -> Lease {
        Lease {
            inner: self.inner.clone(),
            id: self.id,
            layers,
        }
    }

    /// Marks the model moving, copies it outside the lock, and publishes the resident copy.
    fn swap_in(&self, mut state: MutexGuard<'_, State>) -> Result<Lease> {
        let entry = &mut state.models[self.id];
        entry.residency = Residency::Moving;
        let host = entry.host.clone();
        let device = entry.device.clone();
        let name = entry.name.clone();
        drop(state);
        let started = Instant::now();
        let copied = copy_to_device(&host, &device, self.inner.config.link_bandwidth);
        let mut state = self.inner.lock();
        let entry = &mut state.models[self.id];
        let result = match copied {
            Ok(layers) => {
                let layers = Arc::new(layers);
                entry.residency = Residency::Device(layers.clone());
                entry.busy += 1;
                entry.last_used = Instant::now();
                entry.swaps_in += 1;
                if let Some(acc) = &entry.accounting {
                    acc.add_weights(entry.bytes);
                }
                tracing::info!(
                    model = %name,
                    bytes = entry.bytes,
                    ms = started.elapsed().as_millis() as u64,
                    "model moved onto the device"
                );
                state.swaps_in += 1;
                Ok(self.lease(layers))
            }
            Err(err) => {
                entry.residency = Residency::Host;
                Err(err)
            }
        };
        drop(state);
        self.inner.changed.notify_all();
        result
    }
}

/// Keeps a model resident while alive; the forward loop reads its layers.
pub struct Lease {
    inner: Arc<Inner>,
    id: usize,
    layers: Arc<Vec<LayerWeights>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).finish()
    }
}

impl Lease {
    /// Every decoder layer's resident weights, in order.
    pub fn layers(&self) -> &[LayerWeights] {
        &self.layers
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.inner.release(self.id);
    }
}
