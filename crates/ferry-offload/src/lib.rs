//! # ferry-offload
//!
//! Layer 2 of ferry (docs/ARCHITECTURE.md, "Crates"): where every layer and expert of a model
//! lives and how offloaded ones reach the compute device. It depends on `ferry-model` (it sizes a
//! [`ferry_model::checkpoint::Checkpoint`] and hands the model its layers through
//! [`ferry_model::decoder::LayerSource`]), `ferry-gpu` (the CUDA primitives its slots and copy
//! streams are built from) and `ferry-config`; it may know nothing of the generation engine, the
//! HTTP layer or the runtime that chooses what to load.
//!
//! A reuser plans with [`plan::plan`] (a pure function: sizes, budget, mode -> [`Plan`]; no
//! device), prints it with [`render`], and loads a model as planned with [`load_placed`] (or
//! parks it on the host with [`load_parked`]); its [`WeightStore`] is the model's layer source in
//! every mode.
//!
//! The offload engine: where every decoder layer lives (device or host) and how offloaded layers are
//! streamed onto the compute device (DESIGN.md section 4).
//!
//! The pure side, which needs no device:
//!
//! - [`sizing`]: device bytes per decoder layer and of the fixed parts, from an open
//!   [`ferry_model::checkpoint::Checkpoint`] (its tensor table, held as the loader holds it),
//!   without loading any weights; KV-cache and activation workspace estimates.
//! - [`layout`]: where each tensor of an offloaded layer sits in its host slab (256-byte
//!   aligned) and what a device slot must hold to receive any streamed layer ([`SlotLayout`]).
//! - [`experts_plan`]: experts as placement units for mixture-of-experts models (which experts
//!   stay on the device, the pool of expert slots, the routed-expert bytes per token).
//! - [`plan`]: the placement planner, a pure function from sizes, budget and mode to a [`Plan`]
//!   (which layers stay on the device, the slot ring, bytes per tier, PCIe-bound decode estimate).
//! - [`fit`]: chooses unset `max_context` / `max_batch` so the KV cache fits the budget before any
//!   layer leaves the device (llama.cpp's `--fit` order), or names them when set ones do not fit.
//! - [`cost`]: the tier cost model, per offloaded unit (an expert or a dense layer) and step:
//!   stream its weights to the device or compute it on the host where they live;
//!   [`calibrate`]: the start-up measurement of its rates (link, host and device compute),
//!   [`calibrate_cache`]: the per-machine cache of what it measured.
//! - [`render`]: the human table and the JSON document that `ferry plan` prints; [`units`]: byte
//!   and bandwidth formatting shared by errors, logs and the renderer.
//!
//! The running side (the CPU device and CUDA devices, one API):
//!
//! - [`host`]: [`HostStore`], one slab per offloaded layer, filled once from the mapped file.
//! - [`slot`] and [`qview`]: a CPU slot's buffers and the weight views into it; [`slot_gpu`]:
//!   its CUDA twin, built from [`ferry_gpu`]'s primitives; [`assemble`]: a layer's
//!   `LayerWeights` from any slot (CPU or CUDA), by the layer's tensor table.
//! - [`stream`]: [`Streamer`], the slot ring and its tickets, with two copy backends:
//!   [`stream_thread`] (a copy thread, the CPU device) and [`stream_gpu`] (a CUDA copy stream and
//!   events; the CUDA primitives themselves live in [`ferry_gpu`]).
//! - [`experts`]: [`ExpertStore`], a MoE model's offloaded experts: host slabs one per expert,
//!   a pool of expert slots with an LRU cache of hot experts, and the host-compute tier;
//!   [`expert_routes`]: how often each expert is routed to, counted while serving and kept in
//!   a per-user file, so the planner makes the most routed experts resident;
//!   `experts_gpu` is the pool's CUDA side (device slots filled on a copy stream);
//!   [`experts_steps`]: prefill and decode steps apart, and the per-kind counters of where each
//!   routed expert was served.
//! - [`store`]: [`WeightStore`], the model's `LayerSource` in every mode.
//! - [`load`]: loads a model as its plan places it, or parks it whole on the host (mode `model`).
//! - [`swap`]: [`SwapManager`], whole-model residency across the models of a server (mode `model`);
//!   [`swap_copy`] moves a parked model's slabs onto the device.
//! - [`accounting`]: device bytes per kind against the plan, and streaming counters.
//! - [`buffer`]: the aligned byte buffer slabs and slots are made of.
//!
//! Planning reports failures through [`PlanError`], the running engine through [`OffloadError`].

mod accounting;
mod assemble;
pub mod buffer;
pub mod calibrate;
pub mod calibrate_cache;
mod copy_shared;
pub mod cost;
mod error;
pub mod expert_routes;
mod experts;
mod experts_copy;
mod experts_gpu;
pub mod experts_plan;
pub mod experts_steps;
pub mod fit;
mod host;
pub mod layout;
mod link;
mod load;
pub mod plan;
mod qview;
pub mod render;
pub mod sizing;
mod slot;
mod slot_gpu;
pub mod store;
mod stream;
mod stream_gpu;
mod stream_thread;
mod swap;
mod swap_copy;
pub mod tier_report;
pub mod units;

pub use accounting::{Accounting, AccountingSnapshot, PlannedBytes};
pub use cost::{CostModel, Tier, TierCounts, UnitWork};
pub use error::{CacheOverflow, OffloadError, PlanError, Result};
pub use experts::{ExpertDecision, ExpertStore, Served};
pub use experts_plan::{ExpertInput, ExpertPlan, LayerExperts};
pub use experts_steps::{ExpertStepCounts, StepKind, StepKindSnapshot};
pub use host::HostStore;
pub use layout::{LayerLayout, SlotKind, SlotLayout, SlotMatrix};
pub use load::{load_parked, load_placed, ParkedModel, PlacedModel};
pub use plan::{plan, CacheOrigins, Home, LayerPlacement, Origin, Plan, PlanInput};
pub use store::{LayerTiers, WeightStore};
pub use stream::{StreamConfig, Streamer};
pub use swap::{Lease, Location, ModelSwapStats, SwapClient, SwapConfig, SwapManager, SwapStats};
