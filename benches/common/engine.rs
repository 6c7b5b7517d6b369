//! The engine the serving benches drive: the bench's model loaded on the CPU as `bench`, behind
//! an [`EngineHandle`] batching up to 8 requests.

use std::sync::Arc;

use candle_core::Device;
use ferry::config::{
    DeviceChoice, DeviceConfig, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode,
};
use ferry::engine::{EngineHandle, EngineOptions, PrefixCacheOptions, TextCodec};
use ferry::metrics::Metrics;
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving_on;

use crate::common::ModelArgs;

/// `model` served on the CPU as `bench` (a window of `max_context` tokens, batches of up to 8)
/// in offload `mode` with `prefetch` layers ahead, over an emulated link of `link` bytes/s when
/// given, counting into `metrics`. The prefix cache is off, so every prompt a bench sends is
/// computed (benches/prefix_cache.rs measures the cache with [`cpu_engine_with`]).
pub fn cpu_engine(
    model: &ModelArgs,
    max_context: usize,
    placement: (OffloadMode, usize),
    link: Option<u64>,
    metrics: Metrics,
) -> Result<EngineHandle, String> {
    let options = EngineOptions {
        prefix_cache: PrefixCacheOptions {
            enabled: false,
            ..PrefixCacheOptions::default()
        },
        metrics,
        ..EngineOptions::default()
    };
    cpu_engine_with(model, max_context, placement, link, options)
}

/// [`cpu_engine`] with the engine's `options` (its `max_batch` is set to 8).
pub fn cpu_engine_with(
    model: &ModelArgs,
    max_context: usize,
    (mode, prefetch): (OffloadMode, usize),
    link: Option<u64>,
    options: EngineOptions,
) -> Result<EngineHandle, String> {
    let config = ModelConfig {
        name: "bench".to_string(),
        source: model.source.clone(),
        dtype: model.dtype,
        max_context: Some(max_context),
        max_batch: Some(8),
        offload: OffloadConfig {
            mode,
            gpu_memory: MemoryBudget::FractionOfFree(0.9),
            prefetch,
            keep_alive: std::time::Duration::from_secs(60),
        },
        ..ModelConfig::default()
    };
    let device = DeviceConfig {
        kind: DeviceChoice::Cpu,
        link_bandwidth: link,
        ..DeviceConfig::default()
    };
    let hub = HubOptions::from_env(|_| None);
    let loaded =
        load_for_serving_on(&config, &device, &Device::Cpu, &hub).map_err(|e| e.to_string())?;
    let engine = EngineHandle::with_options(
        ["bench"],
        EngineOptions {
            max_batch: 8,
            ..options
        },
    );
    engine
        .model_ready("bench", loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .map_err(|e| e.to_string())?;
    Ok(engine)
}
