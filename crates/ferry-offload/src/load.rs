//! Loads a model according to its [`Plan`]: fixed parts and the resident prefix of decoder layers
//! through the model loader, the offloaded suffix into a [`HostStore`] straight from the file,
//! and a [`WeightStore`] that streams it. Mode `none` (and `auto` when everything fits) ends up
//! with every layer resident and no slot ring. [`load_parked`] loads a model for mode `model`:
//! fixed parts resident, every decoder layer parked in host slabs for the swap manager.

use std::sync::Arc;

use candle_core::Device;

use super::accounting::Accounting;
use super::buffer::HostMemory;
use super::error::OffloadError;
use super::experts::{ExpertStore, ExpertStoreInput};
use super::experts_plan::ExpertPlan;
use super::host::{HostStore, Result};
use super::layout::SlotKind;
use super::plan::{Home, Plan};
use super::store::WeightStore;
use super::stream::StreamConfig;
use ferry_model::checkpoint::Checkpoint;
use ferry_model::decoder::{Model, ModelParts};
use ferry_model::loader::{read_prefix, LoadOptions, LoadProgress, WeightReader};
use ferry_model::spec::ModelSpec;
use ferry_model::weights::{ExpertWeights, LayerWeights};
use ferry_model::ModelError;

/// A model placed by its plan.
#[derive(Debug)]
pub struct PlacedModel {
    /// Shape and hyper-parameters.
    pub spec: ModelSpec,
    /// Fixed weights, RoPE tables and the forward loop.
    pub model: Model,
    /// Decoder layers, resident or streamed.
    pub store: WeightStore,
}

/// Loads `checkpoint` onto `options.device` as `plan` places them, streaming with `stream`.
/// `progress` is called after each tensor the loader reads (resident parts).
pub fn load_placed(
    checkpoint: &Checkpoint,
    options: &LoadOptions,
    plan: &Plan,
    stream: StreamConfig,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<PlacedModel> {
    let resident_count = plan
        .layers
        .iter()
        .take_while(|l| l.home == Home::Device)
        .count();
    let accounting = Arc::new(Accounting::new(plan));
    if let Some(experts) = &plan.experts {
        return load_experts(
            checkpoint, options, plan, experts, stream, progress, accounting,
        );
    }
    let split = |spec: &ModelSpec| check_layers(spec, plan).map(|()| resident_count);
    let read = read_model(checkpoint, options, &split, progress)?;
    accounting.add_weights(read.fixed_bytes);
    if let Some(host) = &read.host {
        check_slot_layout(host, plan, &options.device)?;
    }
    let spec = read.parts.spec.clone();
    let model = Model::new(read.parts)?;
    let store = build_store(read.resident, read.host, stream, options, accounting)?;
    Ok(PlacedModel { spec, model, store })
}

/// Loads a MoE model placed expert by expert: fixed parts and every layer's other parts
/// resident, experts resident or in host slabs as `experts` says ([`ExpertStore`]). Layers
/// are read one at a time, so at most one layer's offloaded experts are held beyond the plan.
fn load_experts(
    checkpoint: &Checkpoint,
    options: &LoadOptions,
    plan: &Plan,
    experts: &ExpertPlan,
    stream: StreamConfig,
    progress: &mut dyn FnMut(LoadProgress),
    accounting: Arc<Accounting>,
) -> Result<PlacedModel> {
    let mut reader = WeightReader::new(checkpoint, options)?.with_progress(progress);
    check_layers(reader.spec(), plan)?;
    let (parts, _) = read_prefix(&mut reader, 0)?;
    let mut layers = Vec::with_capacity(plan.layers.len());
    let mut loaded = Vec::with_capacity(plan.layers.len());
    for (i, placed) in experts.layers.iter().enumerate() {
        let mut layer = reader.layer(i)?;
        // Offloaded experts are dropped as soon as their layer is read.
        let own: Vec<Option<ExpertWeights>> = layer
            .take_experts()
            .into_iter()
            .enumerate()
            .map(|(e, w)| placed.is_resident(e).then_some(w))
            .collect();
        layers.push(layer);
        loaded.push(own);
    }
    let holding = reader.holding();
    let tied = checkpoint.tensors().head.is_none();
    accounting.add_weights(parts.fixed.size_in_bytes(tied) as u64);
    let spec = parts.spec.clone();
    let model = Model::new(parts)?;
    let store = ExpertStore::new(ExpertStoreInput {
        checkpoint,
        holding: &holding,
        plan: experts,
        loaded,
        device: &options.device,
        link_bandwidth: stream.link_bandwidth,
        prefetch: stream.prefetch,
        accounting: accounting.clone(),
    })?;
    let store = WeightStore::with_experts(layers, store, accounting);
    Ok(PlacedModel { spec, model, store })
}

/// A model parked for mode `model`: fixed parts resident, every decoder layer in host slabs.
#[derive(Debug)]
pub struct ParkedModel {
    /// Shape and hyper-parameters.
    pub spec: ModelSpec,
    /// Fixed weights (resident on the device), RoPE tables and the forward loop.
    pub model: Model,
    /// Every decoder layer, in host slabs.
    pub host: HostStore,
    /// Device bytes of the fixed parts (always resident).
    pub fixed_bytes: u64,
}

/// Loads `checkpoint` for mode `model`: the fixed parts onto `options.device` through the model
/// loader, every decoder layer into a [`HostStore`] straight from the file.
pub fn load_parked(
    checkpoint: &Checkpoint,
    options: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<ParkedModel> {
    let read = read_model(checkpoint, options, &|_| Ok(0), progress)?;
    let host = read
        .host
        .ok_or_else(|| OffloadError::Weights("the model has no decoder layers".into()))?;
    let spec = read.parts.spec.clone();
    Ok(ParkedModel {
        spec,
        model: Model::new(read.parts)?,
        host,
        fixed_bytes: read.fixed_bytes,
    })
}

/// What [`read_model`] read: model parts, a resident prefix of layers, host slabs for the rest.
struct ReadModel {
    parts: ModelParts,
    resident: Vec<LayerWeights>,
    host: Option<HostStore>,
    fixed_bytes: u64,
}

/// Reads the fixed parts, layers `0..split(spec)` resident and the rest into host slabs.
fn read_model(
    checkpoint: &Checkpoint,
    options: &LoadOptions,
    split: &dyn Fn(&ModelSpec) -> Result<usize>,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<ReadModel> {
    let memory = HostMemory::for_device(&options.device);
    let mut reader = WeightReader::new(checkpoint, options)?.with_progress(progress);
    let (count, offloaded) = split_layers(reader.spec(), split)?;
    let (parts, resident) = read_prefix(&mut reader, count)?;
    let host = (!offloaded.is_empty())
        .then(|| HostStore::fill(checkpoint, &reader.holding(), &offloaded, &memory))
        .transpose()?;
    let tied = checkpoint.tensors().head.is_none();
    let fixed_bytes = parts.fixed.size_in_bytes(tied) as u64;
    Ok(ReadModel {
        parts,
        resident,
        host,
        fixed_bytes,
    })
}

/// How many layers `split` keeps resident, and the offloaded rest.
fn split_layers(
    spec: &ModelSpec,
    split: &dyn Fn(&ModelSpec) -> Result<usize>,
) -> Result<(usize, Vec<usize>)> {
    let count = split(spec)?;
    Ok((count, (count..spec.n_layers).collect()))
}

fn build_store(
    resident: Vec<LayerWeights>,
    host: Option<HostStore>,
    stream: StreamConfig,
    options: &LoadOptions,
    accounting: Arc<Accounting>,
) -> Result<WeightStore> {
    match host {
        None => Ok(WeightStore::resident(resident, accounting)),
        Some(host) => WeightStore::streaming(
            resident,
            Arc::new(host),
            stream,
            &options.device,
            accounting,
        ),
    }
}

/// The slots the streamer allocates for `host` (its [`super::SlotLayout`] on `device`) are the ones the
/// plan counted, so the device holds what the plan says.
fn check_slot_layout(host: &HostStore, plan: &Plan, device: &Device) -> Result<()> {
    let Some(planned) = &plan.slot_layout else {
        return Ok(());
    };
    let held = host.slot_layout(SlotKind::for_device(device));
    if planned.kind == held.kind && *planned != held {
        return Err(OffloadError::Weights(format!(
            "the plan counted {} bytes per {} slot, the streamed layers need {}",
            planned.total_bytes(),
            planned.kind.as_str(),
            held.total_bytes()
        )));
    }
    Ok(())
}

fn check_layers(spec: &ModelSpec, plan: &Plan) -> Result<()> {
    if spec.n_layers != plan.layers.len() {
        return Err(OffloadError::Model(ModelError::Config(format!(
            "the plan places {} layers, the model has {}",
            plan.layers.len(),
            spec.n_layers
        ))));
    }
    Ok(())
}
