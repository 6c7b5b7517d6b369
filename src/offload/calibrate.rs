//! The start-up calibration of the tier cost model ([`super::cost`]): measures the four rates a
//! [`CostModel`] divides by, in well under a second, and takes any the configuration sets
//! instead of measuring them.
//!
//! - link (host to device): on the CPU device the configured `device.link_bandwidth` (the
//!   throttle of its copies, [`super::link`]), else the rate of a plain copy of a probe buffer
//!   (what an unthrottled slot fill costs); on CUDA a pinned host buffer copied into device
//!   memory through [`crate::gpu`]'s copy link, unless `device.link_bandwidth` is set.
//! - host: a probe matrix of the model's own weight type (tiled from one quantized block of
//!   rows, larger than the caches) multiplied on the CPU through the model's own
//!   [`Linear::quantized`] (ferry's CPU kernels where they apply): one row gives the read rate
//!   (`bytes / t(1 row)`), a few rows the compute rate (`rows * flops / t(rows)`), so the cost
//!   model reproduces both measured points.
//! - device: on the CPU device the host compute rate (it is the same CPU and the same
//!   kernels); on CUDA the same probe matrix resident on the device, at more rows.
//!
//! Each measurement takes the best of a few repetitions (a loaded machine only slows a run).
//! [`calibrate_cached`] measures only what [`super::calibrate_cache`] does not already hold for
//! this machine and build, so a start after the first measures nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::calibrate_cache::{CacheKey, CalibrationCache, MeasuredRates};
use super::cost::{CostModel, Tier};
use super::error::OffloadError;
use super::units::format_bandwidth;
use crate::config::TierConfig;
use crate::model::weights::Linear;

/// How big the probes are; [`Probe::default`] is the start-up calibration's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Bytes of the probe matrix (and of the link probe buffer).
    pub bytes: usize,
    /// Input width of the probe matrix (a multiple of 256, for the k-quant blocks).
    pub in_features: usize,
    /// Rows of the host compute probe.
    pub host_rows: usize,
    /// Rows of the device compute probe (CUDA).
    pub device_rows: usize,
    /// Repetitions of each timed run (the best counts).
    pub repeats: usize,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            bytes: 16 << 20,
            in_features: 4096,
            host_rows: 8,
            device_rows: 64,
            repeats: 3,
        }
    }
}

/// What the calibration needs to know.
#[derive(Debug, Clone, Copy)]
pub struct CalibrationInput<'a> {
    /// The compute device.
    pub device: &'a Device,
    /// The weight type of the offloaded units' matrices (their host kernels' type).
    pub weight_type: GgmlDType,
    /// `device.link_bandwidth`: the CPU device's throttle, or a set link rate on any device.
    pub link_bandwidth: Option<u64>,
    /// The model's tier settings (forced tier and rate overrides).
    pub tier: &'a TierConfig,
    /// Probe sizes.
    pub probe: Probe,
}

/// Where one rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Measured by this calibration.
    Measured,
    /// Set in the configuration.
    Set,
    /// Taken from another measured rate (the CPU device's compute is the host's).
    SameAsHost,
    /// Measured by an earlier start on this machine and build ([`super::calibrate_cache`]).
    Cached,
}

/// The calibrated cost model, where each rate came from, and how long measuring took.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The rates and forced tier.
    pub model: CostModel,
    /// The weight type the host rates are for.
    pub weight_type: GgmlDType,
    /// Sources of link, host compute, host read and device compute, in that order.
    pub sources: [Source; 4],
    /// Time spent measuring (and reading the cache).
    pub elapsed: Duration,
    /// The cache file some rates were read from.
    pub cached_from: Option<PathBuf>,
    /// The cache file this run's measurements were written to.
    pub saved_to: Option<PathBuf>,
}

impl Calibration {
    /// The rates and where they came from: `link 8 GB/s (set), host 41.3 GFLOP/s for q4_1
    /// (reads 9.2 GB/s), device 41.3 GFLOP/s (the host's), tier auto`.
    pub fn rates(&self) -> String {
        let m = &self.model;
        let note = |source: Source| match source {
            Source::Measured => "",
            Source::Set => " (set)",
            Source::SameAsHost => " (the host's)",
            Source::Cached => " (cached)",
        };
        let tier = m.forced.map_or("auto", Tier::name);
        format!(
            "link {}{}, host {:.1} GFLOP/s{} for {} (reads {}{}), device {:.1} GFLOP/s{}, tier {tier}",
            format_bandwidth(m.link_bytes_per_s as u64),
            note(self.sources[0]),
            m.host_flops_per_s / 1e9,
            note(self.sources[1]),
            type_name(self.weight_type),
            format_bandwidth(m.host_read_bytes_per_s as u64),
            note(self.sources[2]),
            m.device_flops_per_s / 1e9,
            note(self.sources[3]),
        )
    }

    /// The log line, once per start: `calibration: cached from PATH: ` + the rates when the
    /// cache had them all, `calibration: ` + the rates + `, measured in 85 ms` (`, saved to
    /// PATH` when written to the cache) when some were measured, `, nothing measured` when all
    /// are set.
    pub fn summary(&self) -> String {
        let rates = self.rates();
        let measured = self.sources.contains(&Source::Measured);
        let ms = self.elapsed.as_millis();
        let saved = self
            .saved_to
            .as_ref()
            .map(|p| format!(", saved to {}", p.display()))
            .unwrap_or_default();
        match (&self.cached_from, measured) {
            (Some(path), false) => format!("calibration: cached from {}: {rates}", path.display()),
            (Some(path), true) => format!(
                "calibration: cached from {}, the rest measured in {ms} ms{saved}: {rates}",
                path.display()
            ),
            (None, true) => format!("calibration: {rates}, measured in {ms} ms{saved}"),
            (None, false) => format!("calibration: {rates}, nothing measured"),
        }
    }
}

/// The lower-case GGUF spelling of a weight type: `q4_1`, `q8_0`, `q4k`, `f16`.
pub fn type_name(dtype: GgmlDType) -> String {
    format!("{dtype:?}").to_ascii_lowercase()
}

/// Measures what `input.tier` does not set and builds the cost model (the forced tier from
/// `offload.tier`). Runs on the calling thread; well under a second with [`Probe::default`].
pub fn calibrate(input: &CalibrationInput<'_>) -> Result<Calibration, OffloadError> {
    run(input, None)
}

/// [`calibrate`], taking the rates `cache` holds for this machine, build and probe
/// ([`CacheKey::current`]) instead of measuring them, and storing what it had to measure
/// (a failed write is logged and otherwise ignored). Set rates still override cached ones.
pub fn calibrate_cached(
    input: &CalibrationInput<'_>,
    cache: &CalibrationCache,
) -> Result<Calibration, OffloadError> {
    run(input, Some(cache))
}

fn run(
    input: &CalibrationInput<'_>,
    cache: Option<&CalibrationCache>,
) -> Result<Calibration, OffloadError> {
    let started = Instant::now();
    let tier = input.tier;
    let probe = input.probe;
    let on_cpu = input.device.is_cpu();
    // What the configuration leaves to measure (the CPU device's compute is the host's).
    let need_link = input.link_bandwidth.is_none();
    let need_flops = tier.host_gflops.is_none();
    let need_read = tier.host_bandwidth.is_none();
    let need_device = tier.device_gflops.is_none() && !on_cpu;
    let any_needed = need_link || need_flops || need_read || need_device;
    let key = match cache {
        Some(_) if any_needed => Some(CacheKey::current(
            input.device,
            input.weight_type,
            kernels(input.weight_type, probe)?,
            [
                probe.bytes,
                probe.in_features,
                probe.host_rows,
                probe.device_rows,
                probe.repeats,
            ],
        )),
        _ => None,
    };
    let cached = match (cache, &key) {
        (Some(cache), Some(key)) => cache.load(key),
        _ => MeasuredRates::default(),
    };
    let mut fresh = MeasuredRates::default();
    if need_link && cached.link_bytes_per_s.is_none() {
        fresh.link_bytes_per_s = Some(measure_link(input.device, probe)?);
    }
    let host_missing = (need_flops && cached.host_flops_per_s.is_none())
        || (need_read && cached.host_read_bytes_per_s.is_none());
    let device_missing = need_device && cached.device_flops_per_s.is_none();
    let matrix = if host_missing || device_missing {
        Some(probe_matrix(input.weight_type, probe)?)
    } else {
        None
    };
    if let (Some(matrix), true) = (&matrix, host_missing) {
        let host = measure_matmul(matrix, &Device::Cpu, probe.host_rows, probe)?;
        fresh.host_flops_per_s = Some(host.flops_per_s);
        fresh.host_read_bytes_per_s = Some(host.read_bytes_per_s);
    }
    if let (Some(matrix), true) = (&matrix, device_missing) {
        let device = measure_matmul(matrix, input.device, probe.device_rows, probe)?;
        fresh.device_flops_per_s = Some(device.flops_per_s);
    }
    // Whole units per second: a rate reads back from the cache's JSON exactly as measured.
    let fresh = fresh.rounded();
    let measured_any = fresh != MeasuredRates::default();
    let mut saved_to = None;
    if let (Some(cache), Some(key), true) = (cache, &key, measured_any) {
        match cache.store(key, fresh) {
            Ok(()) => saved_to = Some(cache.path().to_path_buf()),
            Err(e) => tracing::warn!(
                "calibration: could not write the cache {}: {e}",
                cache.path().display()
            ),
        }
    }
    // A set rate wins; else this run's measurement; else the cache's. A rate left at 0 is
    // infinitely slow to the cost model; none is: every unset rate is measured or cached.
    let pick = |set: Option<f64>, fresh: Option<f64>, cached: Option<f64>| match (set, fresh) {
        (Some(rate), _) => (rate, Source::Set),
        (None, Some(rate)) => (rate, Source::Measured),
        (None, None) => cached.map_or((0.0, Source::Measured), |rate| (rate, Source::Cached)),
    };
    let link = pick(
        input.link_bandwidth.map(|r| r as f64),
        fresh.link_bytes_per_s,
        cached.link_bytes_per_s,
    );
    let host_flops = pick(
        tier.host_gflops.map(|g| g * 1e9),
        fresh.host_flops_per_s,
        cached.host_flops_per_s,
    );
    let host_read = pick(
        tier.host_bandwidth.map(|r| r as f64),
        fresh.host_read_bytes_per_s,
        cached.host_read_bytes_per_s,
    );
    let device = match tier.device_gflops {
        None if on_cpu => (host_flops.0, Source::SameAsHost),
        set => pick(
            set.map(|g| g * 1e9),
            fresh.device_flops_per_s,
            cached.device_flops_per_s,
        ),
    };
    let sources = [link.1, host_flops.1, host_read.1, device.1];
    let cached_from = match cache {
        Some(cache) if sources.contains(&Source::Cached) => Some(cache.path().to_path_buf()),
        _ => None,
    };
    Ok(Calibration {
        model: CostModel {
            link_bytes_per_s: link.0,
            host_flops_per_s: host_flops.0,
            host_read_bytes_per_s: host_read.0,
            device_flops_per_s: device.0,
            forced: Tier::forced_by(tier.choice),
        },
        weight_type: input.weight_type,
        sources,
        elapsed: started.elapsed(),
        cached_from,
        saved_to,
    })
}

/// Which CPU kernels multiply `dtype` (part of the cache key): `ferry`, `candle` or `dense`.
fn kernels(dtype: GgmlDType, probe: Probe) -> Result<&'static str, OffloadError> {
    let tiny = probe_matrix(dtype, Probe { bytes: 1, ..probe })?;
    Ok(match tiny.linear(&Device::Cpu)? {
        Linear::CpuQuantized { .. } => "ferry",
        Linear::Quantized { .. } => "candle",
        Linear::Dense { .. } => "dense",
    })
}

/// The probe matrix's raw GGUF bytes and shape: one block of quantized rows, tiled to
/// `probe.bytes`.
struct ProbeMatrix {
    dtype: GgmlDType,
    bytes: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl ProbeMatrix {
    /// The matrix as a quantized linear layer on `device`.
    fn linear(&self, device: &Device) -> Result<Linear, OffloadError> {
        let q = qtensor_from_ggml(self.dtype, &self.bytes, vec![self.rows, self.cols], device)?;
        Ok(Linear::quantized(Arc::new(q), None)?)
    }
}

fn probe_matrix(dtype: GgmlDType, probe: Probe) -> Result<ProbeMatrix, OffloadError> {
    const SEED_ROWS: usize = 16;
    let cols = probe.in_features;
    let values: Vec<f32> = (0..SEED_ROWS * cols)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 2001) as f32 - 1000.0) / 1000.0)
        .collect();
    let seed = Tensor::from_vec(values, (SEED_ROWS, cols), &Device::Cpu)?;
    let seed = QTensor::quantize(&seed, dtype)?;
    let block = seed.data()?;
    let row_bytes = block.len() / SEED_ROWS;
    let rows = probe.bytes.div_ceil(row_bytes).div_ceil(SEED_ROWS).max(1) * SEED_ROWS;
    let mut bytes = Vec::with_capacity(rows * row_bytes);
    while bytes.len() < rows * row_bytes {
        bytes.extend_from_slice(&block);
    }
    Ok(ProbeMatrix {
        dtype,
        bytes,
        rows,
        cols,
    })
}

/// A matmul probe's result.
#[derive(Debug, Clone, Copy)]
struct MatmulRates {
    /// `rows * flops_per_row / t(rows)`.
    flops_per_s: f64,
    /// `weight bytes / t(1 row)`.
    read_bytes_per_s: f64,
}

fn measure_matmul(
    matrix: &ProbeMatrix,
    device: &Device,
    rows: usize,
    probe: Probe,
) -> Result<MatmulRates, OffloadError> {
    let linear = matrix.linear(device)?;
    let input = |rows: usize| Tensor::ones((rows, matrix.cols), DType::F32, device);
    let one = input(1)?;
    let many = input(rows.max(1))?;
    let run = |x: &Tensor| -> Result<Duration, OffloadError> {
        let started = Instant::now();
        let y = linear.forward(x)?;
        device.synchronize()?;
        drop(y);
        Ok(started.elapsed())
    };
    run(&one)?; // warm-up: first touch, kernel selection
    let best = |x: &Tensor| -> Result<f64, OffloadError> {
        let mut best = f64::INFINITY;
        for _ in 0..probe.repeats.max(1) {
            best = best.min(run(x)?.as_secs_f64());
        }
        Ok(best.max(1e-9))
    };
    let t_one = best(&one)?;
    let t_many = best(&many)?;
    let flops = 2.0 * matrix.rows as f64 * matrix.cols as f64 * rows.max(1) as f64;
    Ok(MatmulRates {
        flops_per_s: flops / t_many,
        read_bytes_per_s: matrix.bytes.len() as f64 / t_one,
    })
}

/// The host-to-device copy rate of `probe.bytes`: a plain copy on the CPU device, a pinned copy
/// through the copy link on CUDA.
fn measure_link(device: &Device, probe: Probe) -> Result<f64, OffloadError> {
    let len = probe.bytes.max(1);
    let mut best = f64::INFINITY;
    if device.is_cpu() {
        let src = vec![1u8; len];
        let mut dst = vec![0u8; len];
        for _ in 0..probe.repeats.max(1) + 1 {
            let started = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            best = best.min(started.elapsed().as_secs_f64());
        }
    } else {
        // SAFETY: every byte is written just below, before anything reads it.
        let mut pinned = unsafe { crate::gpu::PinnedBytes::uninit(device, len)? };
        // SAFETY: `as_mut_ptr` addresses `len` writable bytes of `pinned`.
        unsafe { std::ptr::write_bytes(pinned.as_mut_ptr(), 1, len) };
        let (_buffer, address) = crate::gpu::dense_zeros(device, len.div_ceil(4), DType::F32)?;
        let link = crate::gpu::CopyLink::new(device, 1)?;
        link.copy_after_compute()?;
        for _ in 0..probe.repeats.max(1) + 1 {
            let started = Instant::now();
            // SAFETY: `address` heads a device buffer of at least `len` bytes that `_buffer`
            // keeps alive, and `pinned` lives unmodified past the synchronize below.
            unsafe { link.copy_to_device(address, pinned.as_bytes())? };
            link.synchronize()?;
            best = best.min(started.elapsed().as_secs_f64());
        }
    }
    Ok(len as f64 / best.max(1e-9))
}

#[cfg(test)]
#[path = "calibrate_tests.rs"]
mod tests;
