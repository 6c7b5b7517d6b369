//! [`ExpertStore`]: the running side of expert-level offload (issue 13, items 2 and 3). A MoE
//! model placed by an [`ExpertPlan`] keeps every layer's other parts and its resident experts
//! on the device; each offloaded expert lives in a host slab of its own (gate, up and down
//! together), filled once from the file.
//!
//! The MoE forward asks for the experts a step's rows were routed to, after its router ran
//! ([`RoutedExperts`]), with the number of rows routed to each; for each one the store hands
//! out, in this order:
//!
//! - a resident expert as it is;
//! - an expert already in the device pool (the cache of hot experts, least recently used
//!   evicted first): a *hit*;
//! - otherwise a tier decided for that expert alone, from the rows routed to it ([`decide`]:
//!   the cost model, or a forced tier), recorded per expert ([`ExpertStore::last_decisions`],
//!   the tier decision counters);
//! - on tier [`TierChoice::Host`], the expert computed where it is: views into its host slab,
//!   so only the activations meet it (on the CPU device the slab is ordinary memory and the
//!   same kernels run on the same bytes);
//! - on tier [`TierChoice::Stream`], the expert copied into a free slot of the pool (a *miss*:
//!   its bytes cross the link, throttled on the CPU device like the layer ring); when every
//!   slot is taken by this layer's experts, the rest are computed on the host.
//!
//! The pool's slots are allocated once, at start, sized for the largest offloaded expert.
//! Slots handed out for a layer are pinned until the layer is released (or the next layer asks).
//!
//! Prefill and decode steps ([`StepKind`], told by [`ExpertStore::begin_step`]) differ in one
//! way: a prefill's streamed experts (the cost model streams an expert many rows were routed
//! to) go through the plan's *scratch slots* beside the pool, one after another, the next one's
//! copy issued as soon as a scratch slot is free, while the current one computes
//! ([`ExpertStore::through_scratch`]); they never enter the pool's cache, and a prefill's hits
//! do not refresh the cache's recency, so a prompt leaves the experts decoding keeps hot where
//! they are. A prefill predicts nothing (its predictions would be copied into the cache). Every
//! routed expert is counted by how it was served and by step kind, with the bytes issued over
//! the link and the step's tokens ([`super::experts_steps`]).
//!
//! Copies run on the pool's copy thread ([`super::experts_copy`]): as soon as the router has
//! picked the experts, every miss's copy is issued, then the experts already on the device
//! (resident, hits) and the host-computed ones are handed out first, while the copies run, and
//! each miss as its copy lands ([`RoutedExperts::each_expert`]). With prefetch depth >= 1
//! (`offload.prefetch`) a layer's experts are also *predicted* before its attention runs
//! (pre-gating: the layer's router applied to the hidden state entering it,
//! [`RoutedExperts::predict`]) and the streamed ones among them copied while the attention
//! computes; a routed expert found so is a *prefetch hit*, a wrong guess only costs its copy
//! (and its slot until the layer is released). The depth beyond 1 changes nothing: only the
//! next layer is predicted.
//!
//! On a CUDA device ([`super::experts_gpu`]) the pool's slots are device buffers and each
//! offloaded expert's slab is pinned host memory; a copy is queued on the copy stream (behind
//! the compute queued so far) instead of the copy thread, and the compute stream waits for its
//! event just before the expert's kernels are queued, so nothing blocks the host. When every
//! slot is taken by a layer's experts, the streamed ones left are copied in further rounds,
//! each after the previous round's kernels were queued.
//!
//! The host tier on CUDA: a pinned slab of GGUF blocks is also viewed by ferry's CPU kernels in
//! place ([`HostLayer::views`]), so such an expert computes on the host like on the CPU device;
//! an expert held dense on CUDA (f16/bf16 weights, or a type candle's CUDA kernels lack,
//! dequantized at load) has no CPU view and always streams ([`ExpertStore::computes_on_host`]).
//! Its rows are on the GPU: before handing anything out, the store tells the MoE forward which
//! experts it will compute on the host (`on_host` of [`RoutedExperts::each_expert`]), so their
//! rows go to the host once, before any expert kernel is queued; then the device's experts are
//! handed out (their kernels queued, nothing waited for), and the host ones last, computed by
//! the CPU while the GPU runs.

use candle_core::{DType, Device};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::accounting::Accounting;
use super::buffer::HostMemory;
use super::cost::{CostModel, Tier, UnitWork};
use super::error::OffloadError;
use super::experts_copy::{CopyJob, CopyKind, ExpertCopier};
use super::experts_gpu::GpuExpertPool;
use super::experts_plan::ExpertPlan;
use super::experts_steps::StepKind;
use super::host::{HostLayer, LayerLayout, Result};
use super::layout::SlotKind;
use super::slot::SlotBuffers;
use ferry_config::TierChoice;
use ferry_model::checkpoint::Checkpoint;
use ferry_model::loader::Holding;
use ferry_model::weights::{ExpertWeights, RoutedExperts};

/// Rows routed to an expert from which [`TierChoice::Auto`] (without a cost model) streams instead of computing on the host.
pub const AUTO_HOST_ROWS: usize = 32;

/// The tier an expert that `rows` rows of a step were routed to uses under the `setting`
/// (never `Auto`).
pub fn tier_for_rows(setting: TierChoice, rows: usize) -> TierChoice {
    match setting {
        TierChoice::Auto if rows < AUTO_HOST_ROWS => TierChoice::Host,
        TierChoice::Auto => TierChoice::Stream,
        tier => tier,
    }
}

/// One offloaded expert: its layout and its host slab.
#[derive(Debug)]
struct HostExpert {
    layout: Arc<LayerLayout>,
    /// Its work per row, for the cost model.
    work: UnitWork,
    slab: HostSlab,
}

/// Where an offloaded expert's bytes live.
#[derive(Debug)]
enum HostSlab {
    /// A CPU buffer the expert is computed from on the host tier and copied from on the stream
    /// tier, with the expert as views into it (the host tier).
    Cpu {
        slab: Arc<SlotBuffers>,
        views: ExpertWeights,
    },
    /// Pinned memory a CUDA pool slot is filled from, with the expert as CPU views into its
    /// block region (the host tier on CUDA) when the slab has no dense region.
    Pinned {
        layer: HostLayer,
        views: Option<ExpertWeights>,
    },
}

impl HostExpert {
    /// The expert as views into its slab, where ferry's CPU kernels compute it: every slab on
    /// the CPU device, a pinned slab of GGUF blocks on CUDA.
    fn host_views(&self) -> Option<&ExpertWeights> {
        match &self.slab {
            HostSlab::Cpu { views, .. } => Some(views),
            HostSlab::Pinned { views, .. } => views.as_ref(),
        }
    }
}

/// How the pool's slots are filled.
#[derive(Debug)]
enum Copies {
    /// CPU slots, filled by the copy thread.
    Cpu(ExpertCopier),
    /// CUDA slots, filled on the copy stream.
    Cuda(GpuExpertPool),
}

/// One layer's experts: resident ones by index, offloaded ones by index.
#[derive(Debug, Default)]
struct LayerExpertSet {
    resident: Vec<Option<ExpertWeights>>,
    host: Vec<Option<HostExpert>>,
}

/// What a slot of the device pool holds.
#[derive(Debug)]
enum Content {
    Empty,
    /// `(layer, expert)` being copied in by copy `ticket`; `predicted`: by a prefetch.
    Loading {
        key: (usize, usize),
        ticket: u64,
        predicted: bool,
    },
    /// `(layer, expert)` landed, with its views; `predicted`: by a prefetch, not used since.
    Loaded {
        key: (usize, usize),
        views: Box<ExpertWeights>,
        predicted: bool,
    },
}

/// One slot of the device pool.
#[derive(Debug)]
struct PoolSlot {
    /// The slot's CPU buffers (`None` on CUDA: the slot is [`GpuExpertPool`]'s of its index).
    buffers: Option<Arc<SlotBuffers>>,
    content: Content,
    /// The layout of the expert it holds or receives.
    layout: Option<Arc<LayerLayout>>,
    last_used: u64,
    /// The layer it was handed out (or predicted) for, until that layer is released.
    pinned: Option<usize>,
    /// A scratch slot: holds a prefill's streamed expert for one computation, never part of
    /// the cache (not in the index, never a victim).
    scratch: bool,
}

#[derive(Debug)]
struct Pool {
    slots: Vec<PoolSlot>,
    /// `(layer, expert)` -> slot.
    index: HashMap<(usize, usize), usize>,
    clock: u64,
    tier: TierChoice,
    cost: Option<CostModel>,
    /// Per layer, its last step's routed experts ([`ExpertStore::last_decisions`]).
    last: Vec<Vec<ExpertDecision>>,
    /// Prefetch depth: 0 predicts nothing.
    prefetch: usize,
    /// When every slot is taken by a layer's experts, refill the pool in rounds instead of
    /// computing the rest on the host (always on CUDA; [`ExpertStore::set_rounds`]).
    rounds: bool,
    /// The kind of the step running now ([`ExpertStore::begin_step`]).
    step: StepKind,
}

/// Every layer's experts, the device pool and the host tier.
#[derive(Debug)]
pub struct ExpertStore {
    /// First field: dropped first, it stops the copy thread or drains the copy stream before
    /// the slabs it copies from are freed.
    copies: Copies,
    layers: Vec<LayerExpertSet>,
    pool: Mutex<Pool>,
    accounting: Arc<Accounting>,
}

/// A routed expert as [`ExpertStore::each_expert`] hands it out.
enum Handout {
    /// Resident, in a CPU pool slot, or computed on the host: ready now.
    Ready(Box<ExpertWeights>),
    /// In CUDA pool slot `.0`: the compute stream waits for the slot's fill just before it is
    /// handed out (so a miss's wait is queued after the kernels handed out before it).
    Filled(usize, Box<ExpertWeights>),
    /// Copy `ticket` into pool slot `.1` must land first.
    Copying(u64, usize),
}

/// What [`ExpertStore::new`] needs.
pub struct ExpertStoreInput<'a> {
    /// The file the offloaded experts are read from.
    pub checkpoint: &'a Checkpoint,
    /// How the loader holds its tensors.
    pub holding: &'a Holding,
    /// Where every expert goes.
    pub plan: &'a ExpertPlan,
    /// Every layer's experts as loaded, in expert order: the resident ones (`None` for the
    /// offloaded ones, which the loader already dropped).
    pub loaded: Vec<Vec<Option<ExpertWeights>>>,
    /// The compute device.
    pub device: &'a Device,
    /// Copy throttle in bytes/s on the CPU device.
    pub link_bandwidth: Option<u64>,
    /// Prefetch depth (`offload.prefetch`): from 1, each layer's experts are predicted and
    /// copied ahead of its router.
    pub prefetch: usize,
    /// Device-memory and copy counters.
    pub accounting: Arc<Accounting>,
}

impl ExpertStore {
    /// Fills a host slab per offloaded expert, keeps the resident ones (counting them in the
    /// accounting), and allocates the plan's pool of expert slots once.
    pub fn new(input: ExpertStoreInput<'_>) -> Result<Self> {
        let ExpertStoreInput {
            checkpoint,
            holding,
            plan,
            loaded,
            device,
            link_bandwidth,
            prefetch,
            accounting,
        } = input;
        if !device.is_cpu() && !device.is_cuda() {
            return Err(OffloadError::Weights(
                "offloading single experts is implemented for the CPU and CUDA devices only".into(),
            ));
        }
        let dtype = holding.compute();
        let layouts = (0..plan.layers.len())
            .map(|i| LayerLayout::of(checkpoint, holding, i))
            .collect::<ferry_model::Result<Vec<_>>>()?;
        let mut layers = Vec::with_capacity(plan.layers.len());
        for ((placed, experts), layout) in plan.layers.iter().zip(loaded).zip(&layouts) {
            if experts.len() != placed.n_experts() {
                return Err(OffloadError::Weights(format!(
                    "layer {}: {} experts loaded, the plan places {}",
                    placed.index,
                    experts.len(),
                    placed.n_experts()
                )));
            }
            let mut set = LayerExpertSet::default();
            for (e, weights) in experts.into_iter().enumerate() {
                if placed.is_resident(e) {
                    let weights = weights.ok_or_else(|| {
                        OffloadError::Weights(format!(
                            "layer {}: resident expert {e} was not loaded",
                            placed.index
                        ))
                    })?;
                    let bytes: usize = weights.iter().map(|l| l.size_in_bytes()).sum();
                    accounting.add_weights(bytes as u64);
                    set.resident.push(Some(weights));
                    set.host.push(None);
                } else {
                    set.resident.push(None);
                    set.host
                        .push(Some(host_expert(checkpoint, layout, e, dtype, device)?));
                }
            }
            layers.push(set);
        }
        let n_layers = layers.len();
        let slot = &plan.slot;
        let empty = |buffers| PoolSlot {
            buffers,
            content: Content::Empty,
            layout: None,
            last_used: 0,
            pinned: None,
            scratch: false,
        };
        let n_slots = plan.slot_count();
        let cuda = device.is_cuda();
        let (copies, slots) = if cuda {
            let offloaded = layers.iter().any(|l| l.host.iter().any(Option::is_some));
            if offloaded && plan.pool_slots == 0 {
                return Err(OffloadError::Weights(
                    "offloaded experts on a CUDA device need at least one pool slot".into(),
                ));
            }
            let gpu = GpuExpertPool::new(device, slot, dtype, n_slots, accounting.clone())?;
            let slots = (0..gpu.len()).map(|_| empty(None)).collect();
            (Copies::Cuda(gpu), slots)
        } else {
            if slot.kind != SlotKind::Cpu {
                return Err(OffloadError::Weights(format!(
                    "the expert pool on the CPU device needs a cpu slot layout, got {} (plan \
                     for the CPU device)",
                    slot.kind.as_str()
                )));
            }
            let slots = (0..n_slots)
                .map(|_| {
                    let buffers =
                        SlotBuffers::new(slot.blocks_bytes, slot.dense_bytes, dtype, device)?;
                    accounting.add_slots(buffers.allocated_bytes());
                    Ok(empty(Some(Arc::new(buffers))))
                })
                .collect::<Result<Vec<_>>>()?;
            let copier = ExpertCopier::start(link_bandwidth, accounting.clone())?;
            (Copies::Cpu(copier), slots)
        };
        // The pool's slots first, then the scratch ones.
        let mut slots: Vec<PoolSlot> = slots;
        for slot in slots.iter_mut().skip(plan.pool_slots) {
            slot.scratch = true;
        }
        Ok(Self {
            copies,
            layers,
            pool: Mutex::new(Pool {
                slots,
                index: HashMap::new(),
                clock: 0,
                tier: TierChoice::default(),
                cost: None,
                last: vec![Vec::new(); n_layers],
                prefetch,
                rounds: cuda,
                step: StepKind::Decode,
            }),
            accounting,
        })
    }

    /// Forces a tier (or `Auto`) for the steps to come.
    pub fn set_tier(&self, tier: TierChoice) {
        self.lock().tier = tier;
    }

    /// Whether a layer whose streamed experts outnumber the free slots refills the pool in
    /// rounds (each round after the previous one computed) rather than computing the rest on
    /// the host: CUDA's way, always on there (a stream decision stays one: the round's copies
    /// do not block the host); on the CPU off by default, and on here to check the rounds on
    /// the CPU.
    pub fn set_rounds(&self, on: bool) {
        let mut pool = self.lock();
        pool.rounds = on || self.on_cuda();
    }

    /// The cost model tier `Auto` decides by (`None`: the fixed row switch).
    pub fn set_cost_model(&self, cost: Option<CostModel>) {
        self.lock().cost = cost;
    }

    /// The tier setting.
    pub fn tier(&self) -> TierChoice {
        self.lock().tier
    }

    /// Slots of the device pool (its cache of hot experts; the scratch slots not counted).
    pub fn pool_slots(&self) -> usize {
        self.lock().slots.iter().filter(|s| !s.scratch).count()
    }

    /// Scratch slots beside the pool, for a prefill's streamed experts.
    pub fn scratch_slots(&self) -> usize {
        self.lock().slots.iter().filter(|s| s.scratch).count()
    }

    /// Starts a forward pass of `kind` with `rows` rows (counted for the per-token rates).
    pub fn begin_step(&self, kind: StepKind, rows: usize) {
        self.lock().step = kind;
        self.accounting.expert_steps().record_step(kind, rows);
    }

    /// The kind of the step running now (the last [`ExpertStore::begin_step`]'s).
    pub fn step_kind(&self) -> StepKind {
        self.lock().step
    }

    /// The `(layer, expert)`s the pool's cache holds (landed or being copied), in slot order.
    pub fn cached(&self) -> Vec<(usize, usize)> {
        self.lock()
            .slots
            .iter()
            .filter(|s| !s.scratch)
            .filter_map(PoolSlot::key)
            .collect()
    }

    /// Experts in host slabs.
    pub fn host_experts(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.host.iter().flatten().count())
            .sum()
    }

    /// Whether layer `index` has experts the store hands out.
    pub fn has_layer(&self, index: usize) -> bool {
        self.layers
            .get(index)
            .is_some_and(|l| !l.resident.is_empty())
    }

    /// The handle a layer's weights ask for their routed experts.
    pub fn layer(self: &Arc<Self>, index: usize) -> Arc<dyn RoutedExperts> {
        Arc::new(LayerHandle {
            store: self.clone(),
            layer: index,
        })
    }

    /// Unpins the slots handed out for layer `index` (it has been computed).
    pub fn release(&self, index: usize) {
        self.lock()
            .slots
            .iter_mut()
            .filter(|s| s.pinned == Some(index))
            .for_each(|s| s.pinned = None);
    }

    /// Waits until every copy issued so far has landed (the counters then include them).
    pub fn settle(&self) {
        if let Copies::Cpu(copier) = &self.copies {
            copier.settle();
        }
    }

    /// Whether every offloaded expert can be computed where it lives, by ferry's CPU kernels
    /// on its host slab: always on the CPU device; on CUDA when each slab is GGUF blocks
    /// only (an expert held dense there, f16/bf16 or a type candle's CUDA kernels lack, has a
    /// pinned dense region the CPU cannot view, so it streams whatever the tier).
    pub fn computes_on_host(&self) -> bool {
        self.layers
            .iter()
            .flat_map(|l| l.host.iter().flatten())
            .all(|h| h.host_views().is_some())
    }

    /// Offloaded experts that cannot be computed on the host (see
    /// [`ExpertStore::computes_on_host`]).
    pub fn stream_only_experts(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.host.iter().flatten())
            .filter(|h| h.host_views().is_none())
            .count()
    }

    /// Whether the pool lives on a CUDA device.
    fn on_cuda(&self) -> bool {
        matches!(self.copies, Copies::Cuda(_))
    }

    /// The tier decision for an offloaded expert: [`decide`] when it can be computed on the
    /// host, else streaming.
    fn decide(
        &self,
        setting: TierChoice,
        cost: Option<&CostModel>,
        expert: &HostExpert,
        rows: usize,
    ) -> Tier {
        match expert.host_views() {
            Some(_) => decide(setting, cost, &expert.work, rows),
            None => Tier::Stream,
        }
    }

    /// How a slot that holds or receives an expert hands it out.
    fn hand_out(&self, slot: &PoolSlot, s: usize) -> Result<Handout> {
        match (&self.copies, &slot.content) {
            (Copies::Cuda(_), Content::Loaded { views, .. }) => {
                Ok(Handout::Filled(s, views.clone()))
            }
            (Copies::Cpu(_), Content::Loaded { views, .. }) => Ok(Handout::Ready(views.clone())),
            (_, Content::Loading { ticket, .. }) => Ok(Handout::Copying(*ticket, s)),
            (_, Content::Empty) => Err(OffloadError::Weights(format!("expert slot {s} is empty"))),
        }
    }

    /// Hands `handout` (expert `i`) to `each`: on CUDA the compute stream first waits for the
    /// slot's fill, on the CPU the copy thread's copy lands first.
    fn give(
        &self,
        i: usize,
        handout: Handout,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> ferry_model::Result<()>,
    ) -> ferry_model::Result<()> {
        match handout {
            Handout::Ready(w) => each(i, &w),
            Handout::Filled(s, w) => {
                if let Copies::Cuda(gpu) = &self.copies {
                    gpu.ready(s)?;
                }
                each(i, &w)
            }
            Handout::Copying(ticket, s) => each(i, &self.landed(ticket, s)?),
        }
    }

    /// Whether layers are predicted: prefetch depth >= 1, a tier that may stream (a forced
    /// host tier copies nothing, so it skips the prediction's router pass) and a decode step
    /// (a prefill's predictions would be copied into the cache).
    pub fn predicts(&self) -> bool {
        let pool = self.lock();
        pool.prefetch > 0 && pool.tier != TierChoice::Host && pool.step == StepKind::Decode
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands out the experts `wanted` of `layer`, `rows[i]` rows routed to `wanted[i]` (see
    /// the module header), through `each(i, weights)`: every tier decided and every miss's
    /// copy issued first, then `on_host(the i computed on the host)` once, then the ready
    /// ones, then each miss as it lands. Each offloaded one not on the device gets its own
    /// tier decision.
    fn each_expert(
        &self,
        layer: usize,
        wanted: &[usize],
        rows: &[usize],
        on_host: &mut dyn FnMut(&[usize]) -> ferry_model::Result<()>,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> ferry_model::Result<()>,
    ) -> ferry_model::Result<()> {
        self.each_expert_in(layer, wanted, rows, true, on_host, each)
    }

    /// [`ExpertStore::each_expert`]; without `rounds` (every expert wanted at once) the
    /// experts no slot is free for are computed on the host, and on CUDA a pool too small for
    /// them is an error instead of further rounds.
    ///
    /// The order: on the CPU device the experts ready now (resident, hits, host-computed) in
    /// expert order, then the copies as they land, further rounds, the scratch slots. On CUDA
    /// nothing there waits on the host (a fill is queued on the copy stream, and the compute
    /// stream waits for it just before the expert's kernels), so the device's experts come
    /// first, every round and scratch slot included, and the host-computed ones last: the CPU
    /// computes them while the GPU runs what was queued.
    fn each_expert_in(
        &self,
        layer: usize,
        wanted: &[usize],
        rows: &[usize],
        rounds: bool,
        on_host: &mut dyn FnMut(&[usize]) -> ferry_model::Result<()>,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> ferry_model::Result<()>,
    ) -> ferry_model::Result<()> {
        let set = self.set(layer)?;
        if rows.len() != wanted.len() {
            return Err(OffloadError::Weights(format!(
                "layer {layer}: {} experts asked for with {} row counts",
                wanted.len(),
                rows.len()
            ))
            .into());
        }
        // Every routed expert counts, resident or not: the next plan's residents are the most
        // routed ones.
        self.accounting
            .routes()
            .record(layer, set.resident.len(), wanted, rows);
        let mut pool = self.lock();
        self.begin(&mut pool, layer);
        // What this layer predicted and did not route gives its slot back.
        for slot in pool.slots.iter_mut().filter(|s| s.pinned == Some(layer)) {
            if let Some((_, e)) = slot.key() {
                if wanted.binary_search(&e).is_err() {
                    slot.pinned = None;
                }
            }
        }
        let (setting, cost, in_rounds, step) = (pool.tier, pool.cost, pool.rounds, pool.step);
        // A prefill's streamed experts go through the scratch slots, one after another, when
        // they are handed out one by one.
        let scratch = step == StepKind::Prefill && rounds && pool.slots.iter().any(|s| s.scratch);
        let (mut hits, mut host, mut prefetch_hits) = (0, 0, 0);
        let mut out = Vec::with_capacity(wanted.len());
        let mut log = Vec::with_capacity(wanted.len());
        // Streamed experts no slot was free for, in rounds (CUDA; `set_rounds` on the CPU).
        let mut deferred = Vec::new();
        // A prefill's streamed experts, for the scratch slots.
        let mut through_scratch = Vec::new();
        // The experts computed on the host, from their slabs.
        let mut on_host_now: Vec<(usize, Box<ExpertWeights>)> = Vec::new();
        // The experts copied into the pool now, handed out after those already there.
        let mut misses = Vec::new();
        for (i, (&e, &n)) in wanted.iter().zip(rows).enumerate() {
            let missing = || OffloadError::Weights(format!("layer {layer} has no expert {e}"));
            let record = |tier, served| ExpertDecision {
                expert: e,
                rows: n,
                tier,
                served,
            };
            if let Some(w) = set.resident.get(e).ok_or_else(missing)? {
                hits += 1;
                out.push((i, Handout::Ready(Box::new(w.clone()))));
                log.push(record(None, Served::Resident));
                continue;
            }
            let expert = set
                .host
                .get(e)
                .and_then(Option::as_ref)
                .ok_or_else(missing)?;
            pool.clock += 1;
            let now = pool.clock;
            let held = pool.index.get(&(layer, e)).copied();
            if let Some(s) = held.filter(|&s| !matches!(pool.slots[s].content, Content::Empty)) {
                let slot = &mut pool.slots[s];
                // A prefill's hits leave the cache's recency to decoding.
                if step == StepKind::Decode {
                    slot.last_used = now;
                }
                slot.pinned = Some(layer);
                let predicted = match &mut slot.content {
                    Content::Loaded { predicted, .. } | Content::Loading { predicted, .. } => {
                        std::mem::take(predicted)
                    }
                    Content::Empty => false,
                };
                let handout = self.hand_out(&pool.slots[s], s)?;
                hits += 1;
                prefetch_hits += u64::from(predicted);
                out.push((i, handout));
                log.push(record(None, Served::Hit));
                continue;
            }
            let decided = self.decide(setting, cost.as_ref(), expert, n);
            self.accounting.tier_decisions().record(decided, 1);
            if scratch && decided == Tier::Stream {
                through_scratch.push((i, e));
                log.push(record(Some(decided), Served::Copied));
                continue;
            }
            let victim = match decided {
                Tier::Stream => pool.victim(),
                Tier::Host => None,
            };
            let Some(s) = victim else {
                let round = in_rounds && rounds && decided == Tier::Stream;
                match expert.host_views().filter(|_| !round) {
                    Some(views) => {
                        host += 1;
                        on_host_now.push((i, Box::new(views.clone())));
                        log.push(record(Some(decided), Served::Host));
                    }
                    None => {
                        deferred.push((i, e));
                        log.push(record(Some(decided), Served::Copied));
                    }
                }
                continue;
            };
            self.load(&mut pool, s, (layer, e), expert, layer, CopyKind::Routed)?;
            pool.slots[s].last_used = now;
            misses.push((i, self.hand_out(&pool.slots[s], s)?));
            log.push(record(Some(decided), Served::Copied));
        }
        let steps = self.accounting.expert_steps();
        for d in &log {
            steps.record_served(step, d.served);
        }
        if let Some(last) = pool.last.get_mut(layer) {
            *last = log;
        }
        drop(pool);
        self.accounting.record_expert_hits(hits);
        self.accounting.record_expert_host(host);
        self.accounting.record_expert_prefetch_hits(prefetch_hits);
        // Before anything is handed out (no expert kernel queued yet): where the rows must be
        // for the host-computed ones.
        let host_indices: Vec<usize> = on_host_now.iter().map(|(i, _)| *i).collect();
        on_host(&host_indices)?;
        if !self.on_cuda() {
            out.extend(on_host_now.drain(..).map(|(i, w)| (i, Handout::Ready(w))));
            out.sort_by_key(|(i, _)| *i);
        }
        out.extend(misses);
        // The ready ones compute while the copies run.
        let mut copying = Vec::new();
        for (i, handout) in out {
            match handout {
                Handout::Copying(ticket, s) => copying.push((i, ticket, s)),
                handout => self.give(i, handout, each)?,
            }
        }
        for (i, ticket, s) in copying {
            self.give(i, Handout::Copying(ticket, s), each)?;
        }
        while !deferred.is_empty() {
            deferred = self.next_round(layer, set, deferred, rounds, each)?;
        }
        self.through_scratch(layer, set, through_scratch, each)?;
        for (i, w) in on_host_now {
            each(i, &w)?;
        }
        Ok(())
    }

    /// A prefill's streamed experts `queue` (`(i, expert)`) of `layer`, through the scratch
    /// slots: each scratch slot receives one copy, then, as soon as the expert it holds has been
    /// handed out (computed on the CPU device; its kernels queued on CUDA, which the next fill
    /// waits for), the next one's, so one expert's copy runs while the one before computes.
    /// Nothing enters the pool's cache.
    fn through_scratch(
        &self,
        layer: usize,
        set: &LayerExpertSet,
        queue: Vec<(usize, usize)>,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> ferry_model::Result<()>,
    ) -> ferry_model::Result<()> {
        if queue.is_empty() {
            return Ok(());
        }
        let scratch: Vec<usize> = {
            let pool = self.lock();
            (0..pool.slots.len())
                .filter(|&s| pool.slots[s].scratch)
                .collect()
        };
        let mut queue = queue.into_iter();
        let mut in_flight = std::collections::VecDeque::with_capacity(scratch.len());
        let mut issue = |s: usize, in_flight: &mut std::collections::VecDeque<_>| {
            let Some((i, e)) = queue.next() else {
                return Ok::<(), OffloadError>(());
            };
            let expert =
                set.host.get(e).and_then(Option::as_ref).ok_or_else(|| {
                    OffloadError::Weights(format!("layer {layer} has no expert {e}"))
                })?;
            let mut pool = self.lock();
            self.issue(&mut pool, s, (layer, e), expert, layer, CopyKind::Routed)?;
            let handout = self.hand_out(&pool.slots[s], s)?;
            in_flight.push_back((i, handout, s));
            Ok(())
        };
        for &s in &scratch {
            issue(s, &mut in_flight)?;
        }
        while let Some((i, handout, s)) = in_flight.pop_front() {
            self.give(i, handout, each)?;
            issue(s, &mut in_flight)?;
        }
        Ok(())
    }

    /// One more round of the experts of `layer` no slot was free for (CUDA, every slot taken by
    /// the layer): the kernels of the experts handed out so far are queued, so their slots are
    /// free again (a fill waits for the compute queued before it); as many as fit are copied and
    /// handed out. Returns the ones left for the next round.
    fn next_round(
        &self,
        layer: usize,
        set: &LayerExpertSet,
        deferred: Vec<(usize, usize)>,
        rounds: bool,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> ferry_model::Result<()>,
    ) -> ferry_model::Result<Vec<(usize, usize)>> {
        let too_small = || {
            OffloadError::Weights(format!(
                "layer {layer}: the expert pool has too few slots for the experts asked for at once"
            ))
        };
        if !rounds {
            return Err(too_small().into());
        }
        let mut pool = self.lock();
        for slot in pool.slots.iter_mut().filter(|s| s.pinned == Some(layer)) {
            slot.pinned = None;
        }
        // A predicted copy still in flight keeps its slot from being a victim: let it land, so
        // the round does not find the pool full only because a guess is still copying (only
        // the CPU pool has copies in flight; a failed one leaves its slot empty, as good here).
        if let Copies::Cpu(copier) = &self.copies {
            for slot in pool
                .slots
                .iter_mut()
                .filter(|s| s.pinned.is_none() && matches!(s.content, Content::Loading { .. }))
            {
                let _landed = slot.take_in(copier);
            }
        }
        let (mut round, mut rest) = (Vec::new(), Vec::new());
        for (i, e) in deferred {
            let expert =
                set.host.get(e).and_then(Option::as_ref).ok_or_else(|| {
                    OffloadError::Weights(format!("layer {layer} has no expert {e}"))
                })?;
            let Some(s) = pool.victim() else {
                rest.push((i, e));
                continue;
            };
            self.load(&mut pool, s, (layer, e), expert, layer, CopyKind::Routed)?;
            pool.clock += 1;
            pool.slots[s].last_used = pool.clock;
            round.push((i, self.hand_out(&pool.slots[s], s)?));
        }
        drop(pool);
        if round.is_empty() {
            return Err(too_small().into());
        }
        for (i, handout) in round {
            self.give(i, handout, each)?;
        }
        Ok(rest)
    }

    /// The experts `wanted` of `layer` ([`ExpertStore::each_expert`]), all at once.
    fn experts(
        &self,
        layer: usize,
        wanted: &[usize],
        rows: &[usize],
    ) -> ferry_model::Result<Vec<ExpertWeights>> {
        let mut out: Vec<Option<ExpertWeights>> = vec![None; wanted.len()];
        self.each_expert_in(layer, wanted, rows, false, &mut |_| Ok(()), &mut |i, w| {
            out[i] = Some(w.clone());
            Ok(())
        })?;
        Ok(out.into_iter().flatten().collect())
    }

    /// Copies the predicted experts `wanted` of `layer` (`rows[i]` rows predicted for
    /// `wanted[i]`) that are offloaded, not on the device and that the tier decision would
    /// stream, into free pool slots, without waiting; pinned for the layer.
    fn predict(&self, layer: usize, wanted: &[usize], rows: &[usize]) -> Result<()> {
        let set = self.set(layer)?;
        let mut pool = self.lock();
        if pool.prefetch == 0 || pool.step == StepKind::Prefill {
            return Ok(());
        }
        self.begin(&mut pool, layer);
        let (setting, cost) = (pool.tier, pool.cost);
        for (&e, &n) in wanted.iter().zip(rows) {
            let Some(expert) = set.host.get(e).and_then(Option::as_ref) else {
                continue;
            };
            if let Some(&s) = pool.index.get(&(layer, e)) {
                pool.slots[s].pinned = Some(layer);
                continue;
            }
            if self.decide(setting, cost.as_ref(), expert, n) != Tier::Stream {
                continue;
            }
            let Some(s) = pool.victim() else { break };
            self.load(&mut pool, s, (layer, e), expert, layer, CopyKind::Predicted)?;
        }
        Ok(())
    }

    fn set(&self, layer: usize) -> Result<&LayerExpertSet> {
        self.layers.get(layer).ok_or(OffloadError::NoSuchLayer {
            index: layer,
            n_layers: self.layers.len(),
        })
    }

    /// Starts work on `layer`: what other layers pinned is free again (one layer is computed
    /// at a time), and copies that landed are taken in.
    fn begin(&self, pool: &mut Pool, layer: usize) {
        for slot in &mut pool.slots {
            if slot.pinned.is_some_and(|l| l != layer) {
                slot.pinned = None;
            }
            // Only the copy thread leaves slots loading (CUDA fills are stream-ordered).
            let Copies::Cpu(copier) = &self.copies else {
                continue;
            };
            if let Content::Loading { key, ticket, .. } = slot.content {
                // A failed copy empties its slot (to be refilled): a prediction's error is
                // dropped, a routed expert's is its waiter's.
                // A scratch slot is not in the index (the same expert may be cached in the
                // pool: its entry stays).
                if copier.is_done(ticket) && slot.take_in(copier).is_err() && !slot.scratch {
                    pool.index.remove(&key);
                }
            }
        }
    }

    /// Issues the copy of `expert` (`key`) into slot `s`, evicting what it held; pinned for
    /// `layer`. Returns the copy's ticket (on CUDA 0: the fill is queued on the copy stream and
    /// the slot holds the expert's views at once).
    fn load(
        &self,
        pool: &mut Pool,
        s: usize,
        key: (usize, usize),
        expert: &HostExpert,
        layer: usize,
        kind: CopyKind,
    ) -> Result<u64> {
        if let Some(old) = pool.slots[s].key() {
            pool.index.remove(&old);
        }
        let ticket = self.issue(pool, s, key, expert, layer, kind)?;
        pool.index.insert(key, s);
        Ok(ticket)
    }

    /// [`ExpertStore::load`] without the cache's index: the copy into slot `s`, counted as
    /// expert bytes over the link in the current step's kind.
    fn issue(
        &self,
        pool: &mut Pool,
        s: usize,
        key: (usize, usize),
        expert: &HostExpert,
        layer: usize,
        kind: CopyKind,
    ) -> Result<u64> {
        self.accounting
            .expert_steps()
            .record_link_bytes(pool.step, expert.work.weight_bytes);
        let slot = &mut pool.slots[s];
        slot.content = Content::Empty;
        let predicted = kind == CopyKind::Predicted;
        let ticket = match (&self.copies, &expert.slab, &slot.buffers) {
            (Copies::Cpu(copier), HostSlab::Cpu { slab, .. }, Some(dst)) => {
                let ticket = copier.issue(CopyJob {
                    dst: dst.clone(),
                    src: slab.clone(),
                    layout: expert.layout.clone(),
                    kind,
                });
                slot.content = Content::Loading {
                    key,
                    ticket,
                    predicted,
                };
                ticket
            }
            (Copies::Cuda(gpu), HostSlab::Pinned { layer: host, .. }, None) => {
                let views = gpu.fill(s, host, kind)?;
                slot.content = Content::Loaded {
                    key,
                    views: Box::new(views),
                    predicted,
                };
                0
            }
            _ => {
                return Err(OffloadError::Weights(
                    "an expert slab and its pool slot live on different devices".into(),
                ))
            }
        };
        slot.layout = Some(expert.layout.clone());
        slot.pinned = Some(layer);
        Ok(ticket)
    }

    /// Waits for copy `ticket` into slot `s` and returns the expert's views there.
    fn landed(&self, ticket: u64, s: usize) -> Result<ExpertWeights> {
        let Copies::Cpu(copier) = &self.copies else {
            return Err(OffloadError::Weights(
                "a CUDA expert slot has no copy to wait for".into(),
            ));
        };
        copier.wait(ticket)?;
        let mut pool = self.lock();
        let slot = &mut pool.slots[s];
        match &slot.content {
            Content::Loaded { views, .. } => Ok((**views).clone()),
            Content::Loading { ticket: t, .. } if *t == ticket => slot.take_in(copier),
            _ => Err(OffloadError::Weights(
                "an expert slot was refilled while its layer used it".into(),
            )),
        }
    }

    /// What layer `layer`'s last step did with each routed expert, in expert order (empty
    /// before its first step).
    pub fn last_decisions(&self, layer: usize) -> Vec<ExpertDecision> {
        self.lock().last.get(layer).cloned().unwrap_or_default()
    }

    /// The work per row of offloaded expert `expert` of `layer` (what its tier is decided by);
    /// `None` for a resident expert.
    pub fn expert_work(&self, layer: usize, expert: usize) -> Option<UnitWork> {
        let set = self.layers.get(layer)?;
        set.host.get(expert)?.as_ref().map(|h| h.work)
    }
}

/// The tier of an offloaded expert not on the device, for the `rows` rows of a step routed to
/// *that expert* (not the step's rows: in a batch of 8, an expert one row picked may be
/// computed on the host while one six rows picked is streamed). `Auto` with a cost model asks
/// it; `Auto` without one computes on the host below [`AUTO_HOST_ROWS`] rows; a forced tier
/// decides alone.
pub fn decide(setting: TierChoice, cost: Option<&CostModel>, work: &UnitWork, rows: usize) -> Tier {
    match (setting, cost) {
        (TierChoice::Auto, Some(cost)) => cost.choose(work, rows),
        (setting, _) => match tier_for_rows(setting, rows) {
            TierChoice::Host => Tier::Host,
            _ => Tier::Stream,
        },
    }
}

/// Where a routed expert came from in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Resident on the device.
    Resident,
    /// Found in the device pool.
    Hit,
    /// Copied into a pool slot.
    Copied,
    /// Computed on the host, from its slab.
    Host,
}

/// One routed expert of one layer's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertDecision {
    /// The expert's index in its layer.
    pub expert: usize,
    /// Rows of the step routed to it.
    pub rows: usize,
    /// The tier decided for it (`None`: it was on the device, nothing to decide). A stream
    /// decision is served on the host when every pool slot is pinned by the layer.
    pub tier: Option<Tier>,
    /// Where it was served from.
    pub served: Served,
}

impl Pool {
    /// The slot to fill next: an empty one, else the least recently used one neither pinned
    /// nor receiving a copy.
    fn victim(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                !s.scratch && s.pinned.is_none() && !matches!(s.content, Content::Loading { .. })
            })
            .min_by_key(|(_, s)| (!matches!(s.content, Content::Empty), s.last_used))
            .map(|(i, _)| i)
    }
}

impl PoolSlot {
    /// The `(layer, expert)` it holds or receives.
    fn key(&self) -> Option<(usize, usize)> {
        match &self.content {
            Content::Empty => None,
            Content::Loading { key, .. } | Content::Loaded { key, .. } => Some(*key),
        }
    }

    /// A landed copy taken in: the expert's views into the slot (`Empty` again if it failed).
    fn take_in(&mut self, copier: &ExpertCopier) -> Result<ExpertWeights> {
        let Content::Loading {
            key,
            ticket,
            predicted,
        } = self.content
        else {
            return Err(OffloadError::Weights(
                "no copy into this expert slot".into(),
            ));
        };
        let views = copier
            .wait(ticket)
            .and_then(|()| {
                let layout = self.layout.as_ref().ok_or_else(|| {
                    OffloadError::Weights("an expert slot without a layout".into())
                })?;
                let buffers = self.buffers.as_ref().ok_or_else(|| {
                    OffloadError::Weights("an expert slot without CPU buffers".into())
                })?;
                experts_of(buffers.views(layout)?)
            })
            .inspect_err(|_| self.content = Content::Empty)?;
        self.content = Content::Loaded {
            key,
            views: Box::new(views.clone()),
            predicted,
        };
        Ok(views)
    }
}

/// The handle one layer's weights carry.
#[derive(Debug)]
struct LayerHandle {
    store: Arc<ExpertStore>,
    layer: usize,
}

impl RoutedExperts for LayerHandle {
    fn experts(&self, wanted: &[usize], rows: &[usize]) -> ferry_model::Result<Vec<ExpertWeights>> {
        self.store.experts(self.layer, wanted, rows)
    }

    fn each_expert(
        &self,
        wanted: &[usize],
        rows: &[usize],
        on_host: &mut dyn FnMut(&[usize]) -> ferry_model::Result<()>,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> ferry_model::Result<()>,
    ) -> ferry_model::Result<()> {
        self.store
            .each_expert(self.layer, wanted, rows, on_host, each)
    }

    fn predicts(&self) -> bool {
        self.store.predicts()
    }

    fn predict(&self, wanted: &[usize], rows: &[usize]) -> ferry_model::Result<()> {
        Ok(self.store.predict(self.layer, wanted, rows)?)
    }
}

/// Expert `e` of `layout` in a host slab of its own, filled from `checkpoint`: CPU memory the
/// expert computes from on the CPU `device`, pinned memory a pool slot is filled from on CUDA.
fn host_expert(
    checkpoint: &Checkpoint,
    layout: &LayerLayout,
    e: usize,
    dtype: DType,
    device: &Device,
) -> Result<HostExpert> {
    let memory = HostMemory::for_device(device);
    let layer = HostLayer::expert(checkpoint, layout, e, &memory)?;
    let elems: usize = layer.entries.iter().map(|e| e.elem_count()).sum();
    // Rows in and out are hidden-wide f32 activations (the gate's input width).
    let hidden = layer.entries.first().and_then(|e| e.shape.last()).copied();
    let work = UnitWork::matmuls(
        layer.slab_bytes(),
        elems as u64,
        4 * hidden.unwrap_or(0) as u64,
    );
    let layout = Arc::new(layer.layout().clone());
    let slab = if device.is_cuda() {
        // The CPU kernels read a slab of GGUF blocks in place; a dense one only streams.
        let views = match layer.can_view() {
            true => Some(experts_of(layer.views()?)?),
            false => None,
        };
        HostSlab::Pinned { layer, views }
    } else {
        let slab = SlotBuffers::new(layer.blocks_len, layer.dense_len, dtype, &Device::Cpu)?;
        slab.fill(&layer)?;
        let views = experts_of(slab.views(&layer)?)?;
        HostSlab::Cpu {
            slab: Arc::new(slab),
            views,
        }
    };
    Ok(HostExpert { layout, work, slab })
}

/// The one expert of a single-expert layer's weights.
pub(super) fn experts_of(mut w: ferry_model::weights::LayerWeights) -> Result<ExpertWeights> {
    w.take_experts()
        .pop()
        .ok_or_else(|| OffloadError::Weights("an expert slot without an expert".into()))
}

#[cfg(test)]
#[path = "experts_tests.rs"]
mod tests;
