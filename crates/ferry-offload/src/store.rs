//! [`WeightStore`]: hands the forward loop each decoder layer's weights, resident or streamed,
//! behind the model's [`LayerSource`], so the model code is the same in every offload mode
//! (DESIGN.md section 3):
//!
//! ```text
//! store.prefetch_ahead()    // queue copies for the next streamed layers, never blocks
//! let w = store.layer(i)    // resident tensors, or a slot the copy engine filled
//! ... forward ...
//! store.release(i)          // slot reusable; queues the next copy
//! ```
//!
//! `layer(i)` calls `prefetch_ahead()` itself, so a loop that only knows `layer` / `release`
//! (the model's [`LayerSource`]) streams just as well.
//!
//! Offloaded dense layers have two tiers (issue 13): *stream* (copied into a slot, as above) or
//! *host* (computed where its slab lies, through views into it: no weight byte moves, only the
//! activations). At the start of each step ([`LayerSource::begin_step`], with the step's rows)
//! the store decides per offloaded layer, by [`LayerTiers`]: a forced tier (`offload.tier`),
//! else the cost model ([`CostModel::choose`] on the layer's work and rows), else stream. Each
//! decision is counted in [`Accounting::tier_decisions`]; the streamer is told which layers
//! stream this step ([`Streamer::select`]), so prefetch skips the host-tier ones.
//!
//! A MoE model's expert store is told each step's kind too (prefill or decode,
//! [`StepKind::of`]): a prefill streams through scratch slots instead of the expert cache.
//!
//! The host tier needs the slab in CPU memory: it runs on the CPU device, whose KV cache is
//! in the same memory already. On CUDA (pinned slabs, the KV cache on the GPU) every
//! offloaded layer streams: `auto` never picks host there and a forced `host` is refused
//! ([`WeightStore::set_layer_tiers`]).

use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::Device;

use super::accounting::Accounting;
use super::cost::{CostModel, Tier, UnitWork};
use super::error::OffloadError;
use super::experts::ExpertStore;
use super::experts_steps::StepKind;
use super::host::{HostStore, Result};
use super::stream::{StreamConfig, Streamer};
use super::tier_report::{unit_kinds, Offloaded};
use ferry_model::decoder::{LayerSource, StepRows};
use ferry_model::spec::MoeSpec;
use ferry_model::weights::LayerWeights;

/// How the store picks the tier of an offloaded dense layer each step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LayerTiers {
    /// Decides per layer and step from the layer's work and the step's rows; `None` (and no
    /// forced tier): every offloaded layer streams.
    pub cost: Option<CostModel>,
    /// `offload.tier` = `stream` or `host`: every offloaded layer, every step.
    pub forced: Option<Tier>,
}

/// What the store knows of its offloaded layers' tiers.
#[derive(Debug, Default)]
struct TierState {
    tiers: LayerTiers,
    /// Each offloaded layer's work per row, in offloaded order (empty until tiers are set).
    works: Vec<UnitWork>,
}

/// Every decoder layer's weights: a resident prefix and, when some layers are offloaded, a
/// streamer for the rest.
#[derive(Debug)]
pub struct WeightStore {
    resident: Vec<LayerWeights>,
    streamer: Option<Streamer>,
    /// Each offloaded layer as views into its host slab (the host tier), in offloaded order;
    /// `None` where the slab cannot be computed on (pinned memory, a CUDA device's).
    host_views: Vec<Option<LayerWeights>>,
    /// The offloaded layers' slab layouts, in offloaded order (their work for the cost model).
    host: Option<Arc<HostStore>>,
    tier_state: Mutex<TierState>,
    /// Whether each offloaded layer runs on the host in the current step.
    on_host: Vec<bool>,
    /// A MoE model placed expert by expert: its offloaded experts, pool and host tier.
    experts: Option<Arc<ExpertStore>>,
    n_layers: usize,
    accounting: Arc<Accounting>,
}

impl WeightStore {
    /// All layers resident (mode `none`, or `auto` when everything fits).
    pub fn resident(layers: Vec<LayerWeights>, accounting: Arc<Accounting>) -> Self {
        for w in &layers {
            accounting.add_weights(w.size_in_bytes() as u64);
        }
        Self {
            n_layers: layers.len(),
            resident: layers,
            streamer: None,
            host_views: Vec::new(),
            host: None,
            tier_state: Mutex::default(),
            on_host: Vec::new(),
            experts: None,
            accounting,
        }
    }

    /// Every layer's other parts resident (`layers`, without their experts), the experts
    /// handed out by `experts` (resident, pooled or computed on the host).
    pub fn with_experts(
        layers: Vec<LayerWeights>,
        experts: ExpertStore,
        accounting: Arc<Accounting>,
    ) -> Self {
        let mut store = Self::resident(layers, accounting);
        store.experts = Some(Arc::new(experts));
        store
    }

    /// The expert store of a MoE model placed expert by expert.
    pub fn experts(&self) -> Option<&Arc<ExpertStore>> {
        self.experts.as_ref()
    }

    /// Layers `0..resident.len()` resident, the layers of `host` (which must be the rest, in
    /// order) streamed through a ring of `config.prefetch + 1` slots on `device`.
    pub fn streaming(
        resident: Vec<LayerWeights>,
        host: Arc<HostStore>,
        config: StreamConfig,
        device: &Device,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        let first = resident.len();
        let expected: Vec<usize> = (first..first + host.layers().len()).collect();
        let streamed: Vec<usize> = host.layers().iter().map(|l| l.index).collect();
        if streamed != expected {
            return Err(OffloadError::Weights(format!(
                "offloaded layers {streamed:?} do not follow the {first} resident ones"
            )));
        }
        for w in &resident {
            accounting.add_weights(w.size_in_bytes() as u64);
        }
        // Views only (handles into the slabs), built once: a host slab is never rewritten.
        let host_views = host
            .layers()
            .iter()
            .map(|l| l.cpu_slab().map(|_| l.views()).transpose())
            .collect::<Result<Vec<_>>>()?;
        let streamer = Streamer::start(host.clone(), config, device, accounting.clone())?;
        Ok(Self {
            n_layers: first + streamed.len(),
            resident,
            streamer: Some(streamer),
            on_host: vec![false; host_views.len()],
            host_views,
            host: Some(host),
            tier_state: Mutex::default(),
            experts: None,
            accounting,
        })
    }

    /// Sets how offloaded dense layers pick their tier from the next step on. `moe` and
    /// `hidden` are the model's (a whole MoE layer computes its top-k experts per row; rows
    /// are `hidden` wide). A forced host tier is refused where a slab cannot be computed on:
    /// a CUDA device's pinned slabs of whole layers (their norms are dense), and experts held
    /// dense on CUDA.
    pub fn set_layer_tiers(
        &self,
        tiers: LayerTiers,
        moe: Option<&MoeSpec>,
        hidden: usize,
    ) -> Result<()> {
        if tiers.forced == Some(Tier::Host) && self.host_views.iter().any(Option::is_none) {
            return Err(OffloadError::Weights(
                "offload.tier = \"host\": computing offloaded dense layers on the host is \
                 implemented for the CPU device only; use \"stream\" or \"auto\""
                    .into(),
            ));
        }
        if let Some(experts) = self
            .experts
            .as_ref()
            .filter(|_| tiers.forced == Some(Tier::Host))
        {
            let dense = experts.stream_only_experts();
            if dense > 0 {
                return Err(OffloadError::Weights(format!(
                    "offload.tier = \"host\": {dense} offloaded experts are held dense on this \
                     device (f16/bf16 weights, or a GGUF type CUDA's kernels lack, dequantized \
                     at load); ferry's CPU kernels compute only GGUF blocks from a pinned slab, \
                     so these can only stream; use \"stream\" or \"auto\""
                )));
            }
        }
        let works = match &self.host {
            Some(host) => host
                .layers()
                .iter()
                .map(|l| {
                    unit_kinds(l.layout(), Offloaded::Layers(1), moe, hidden, 1)
                        .into_iter()
                        .find(|k| k.name == "layer")
                        .map(|k| k.work)
                        .ok_or_else(|| OffloadError::Weights("no layer work".into()))
                })
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        *self.tiers() = TierState { tiers, works };
        Ok(())
    }

    /// How offloaded dense layers pick their tier.
    pub fn layer_tiers(&self) -> LayerTiers {
        self.tiers().tiers
    }

    /// The offloaded layers computed on the host in the current (or last) step.
    pub fn host_tier_layers(&self) -> Vec<usize> {
        let first = self.resident.len();
        (0..self.on_host.len())
            .filter(|&p| self.on_host[p])
            .map(|p| first + p)
            .collect()
    }

    fn tiers(&self) -> MutexGuard<'_, TierState> {
        self.tier_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tier of offloaded layer `p` (in offloaded order) for a step of `rows` rows.
    fn decide(&self, state: &TierState, p: usize, rows: usize) -> Tier {
        if self.host_views.get(p).is_none_or(Option::is_none) {
            return Tier::Stream;
        }
        match (state.tiers.forced, &state.tiers.cost, state.works.get(p)) {
            (Some(tier), _, _) => tier,
            (None, Some(cost), Some(work)) => cost.choose(work, rows),
            _ => Tier::Stream,
        }
    }

    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// Number of resident layers (a prefix).
    pub fn resident_layers(&self) -> usize {
        self.resident.len()
    }

    /// Slots in the ring (0 when nothing streams).
    pub fn slots(&self) -> usize {
        self.streamer.as_ref().map_or(0, Streamer::slots)
    }

    /// The device-memory and streaming counters.
    pub fn accounting(&self) -> &Arc<Accounting> {
        &self.accounting
    }

    /// Queues copies of the next streamed layers, up to the prefetch depth beyond the next one
    /// the forward loop takes (wrapping to the next step); never waits for a copy.
    pub fn prefetch_ahead(&mut self) -> Result<()> {
        if let Some(streamer) = self.streamer.as_mut() {
            streamer.prefetch()?;
        }
        Ok(())
    }

    fn get(&mut self, index: usize) -> Result<LayerWeights> {
        if let Some(w) = self.resident.get(index) {
            return Ok(match &self.experts {
                Some(experts) if experts.has_layer(index) => {
                    w.clone().with_routed(experts.layer(index))
                }
                _ => w.clone(),
            });
        }
        let p = index - self.resident.len();
        if self.on_host.get(p) == Some(&true) {
            if let Some(Some(w)) = self.host_views.get(p) {
                return Ok(w.clone());
            }
        }
        match self.streamer.as_mut() {
            Some(s) if s.streams(index) => s.acquire(index),
            _ => Err(OffloadError::NoSuchLayer {
                index,
                n_layers: self.n_layers,
            }),
        }
    }
}

impl LayerSource for WeightStore {
    fn begin_step(&mut self, step: StepRows) -> ferry_model::Result<()> {
        let rows = step.rows;
        if let Some(experts) = &self.experts {
            experts.begin_step(StepKind::of(step), rows);
        }
        if self.streamer.is_none() {
            return Ok(());
        }
        let on_host: Vec<bool> = {
            let state = self.tiers();
            (0..self.on_host.len())
                .map(|p| self.decide(&state, p, rows) == Tier::Host)
                .collect()
        };
        let hosted = on_host.iter().filter(|&&h| h).count() as u64;
        let decisions = self.accounting.tier_decisions();
        decisions.record(Tier::Host, hosted);
        decisions.record(Tier::Stream, on_host.len() as u64 - hosted);
        self.on_host = on_host;
        let first = self.resident.len();
        let on_host = &self.on_host;
        if let Some(streamer) = self.streamer.as_mut() {
            streamer.select(|index| !on_host[index - first])?;
        }
        Ok(())
    }

    fn layer(&mut self, index: usize) -> ferry_model::Result<LayerWeights> {
        self.prefetch_ahead()?;
        Ok(self.get(index)?)
    }

    /// Nothing streamed (no streamer) and no expert store (whose copies `release` may wait
    /// for): every layer is resident or computed in place on the host tier.
    fn never_waits(&self) -> bool {
        self.streamer.is_none() && self.experts.is_none()
    }

    fn release(&mut self, index: usize) -> ferry_model::Result<()> {
        if let Some(experts) = &self.experts {
            experts.release(index);
        }
        if index >= self.resident.len() {
            if let Some(streamer) = self.streamer.as_mut() {
                streamer.release(index)?;
            }
        }
        Ok(())
    }
}
