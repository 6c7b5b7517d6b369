//! The start-up calibration of the tier cost model ([`super::cost`]): measures the four rates a
//! [`CostModel`] divides by, in well under a second, and takes any the configuration sets
//! instead of measuring them.
//!
//! - link (host to device): on the CPU device the configured `device.link_bandwidth` (the
//!   throttle of its copies, [`super::link`]), else the rate of a plain copy of a probe buffer
//!   (what an unthrottled slot fill costs); on CUDA a pinned host buffer copied into device
//!   memory through [`ferry_gpu`]'s copy link, unless `device.link_bandwidth` is set.
//! - host: a probe matrix of the model's own weight type (tiled from one quantized block of
//!   rows, larger than the caches) multiplied on the CPU through the model's own
//!   [`Linear::quantized`] (ferry's CPU kernels where they apply): one row gives the read rate
//!   (`bytes / t(1 row)`), a few rows the compute rate (`rows * flops / t(rows)`), so the cost
//!   model reproduces both measured points.
//! - device: on the CPU device the host compute rate (it is the same CPU and the same
//!   kernels); on CUDA the same probe matrix resident on the device, at more rows.
//! - activations: on CUDA a host-computed unit's rows cross the link both ways: a probe of
//!   `probe.host_rows` rows of `probe.in_features` f32 copied to the host and back, as the MoE
//!   forward moves them (candle's copies on the compute stream), gives the rate of the round
//!   trip (both directions' bytes over its time: small copies are mostly latency, so this is
//!   well below the link's); on the CPU device they are already where the host computes, so
//!   they cost nothing (an emulated link throttles weight copies only).
//!
//! Each measurement takes the best of a few repetitions (a loaded machine only slows a run), and
//! notes their *spread* (the slowest repetition over the fastest, minus one): a busy machine
//! spreads them. [`calibrate_cached`] measures only what [`super::calibrate_cache`] does not
//! already hold for this machine and build, so a start after the first measures nothing; it
//! writes what it measured only when the spread stayed under [`CachePolicy::max_spread`] (a
//! calibration taken under load is used once, not kept), and [`CachePolicy::recalibrate`]
//! measures everything again. The log line says which happened.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::calibrate_cache::{CacheKey, CalibrationCache, MeasuredRates};
use super::cost::{CostModel, Tier};
use super::error::OffloadError;
use super::units::format_bandwidth;
use ferry_config::TierConfig;
use ferry_model::weights::Linear;

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

/// How [`calibrate_cached`] uses the cache (`device.recalibrate`, `device.calibration_spread`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePolicy {
    /// Measure every rate again, ignoring (and then replacing) the cached ones.
    pub recalibrate: bool,
    /// Write the measurements only when their spread is below this (a fraction: 0.5 is 50%).
    pub max_spread: f64,
}

impl Default for CachePolicy {
    /// The settings' defaults: use the cache, keep runs whose repetitions are within 50%.
    fn default() -> Self {
        CachePolicy {
            recalibrate: false,
            max_spread: 0.5,
        }
    }
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
    /// Source of the activations' round trip (`None` on the CPU device: it costs nothing).
    pub activations: Option<Source>,
    /// Time spent measuring (and reading the cache).
    pub elapsed: Duration,
    /// The cache file some rates were read from.
    pub cached_from: Option<PathBuf>,
    /// When the cached rates were measured (seconds since the epoch; `None` when unknown).
    pub cached_at: Option<u64>,
    /// The cache file this run's measurements were written to.
    pub saved_to: Option<PathBuf>,
    /// The largest spread of this run's measurements (`None` when nothing was measured).
    pub spread: Option<f64>,
    /// Measured with the cache in use but not written to it: the spread was at or above this
    /// limit.
    pub unstable_above: Option<f64>,
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
        let activations = match (m.activation_bytes_per_s, self.activations) {
            (Some(rate), Some(source)) if rate.is_finite() => format!(
                ", activations round trip {}{}",
                format_bandwidth(rate as u64),
                note(source)
            ),
            _ => String::new(),
        };
        format!(
            "link {}{}, host {:.1} GFLOP/s{} for {} (reads {}{}), device {:.1} GFLOP/s{}{activations}, tier {tier}",
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

    /// The log line, once per start: `calibration from PATH (measured DATE); --recalibrate to
    /// measure again: ` + the rates when the cache had them all (`, the rest measured in 85
    /// ms` before the `;` when it had some), `calibration: ` + the rates + `, measured in 85
    /// ms (probe spread 12%)` when all were measured, then `, saved to PATH` when written to the
    /// cache or why not (an unstable run), `, nothing measured` when all are set.
    pub fn summary(&self) -> String {
        let rates = self.rates();
        let measured =
            self.sources.contains(&Source::Measured) || self.activations == Some(Source::Measured);
        let ms = self.elapsed.as_millis();
        let spread = self
            .spread
            .map(|s| format!(" (probe spread {:.0}%)", s * 100.0))
            .unwrap_or_default();
        let saved = match (&self.saved_to, self.unstable_above) {
            (Some(path), _) => format!(", saved to {}", path.display()),
            (None, Some(limit)) => format!(
                ", not cached: the probes spread beyond calibration_spread {:.0}% (a busy \
                 machine?), so the next start measures again",
                limit * 100.0
            ),
            (None, None) => String::new(),
        };
        match (&self.cached_from, measured) {
            (Some(path), false) => format!(
                "calibration from {} (measured {}); --recalibrate to measure again: {rates}",
                path.display(),
                measured_date(self.cached_at)
            ),
            (Some(path), true) => format!(
                "calibration from {} (measured {}), the rest measured in {ms} ms{spread}{saved}; \
                 --recalibrate to measure again: {rates}",
                path.display(),
                measured_date(self.cached_at)
            ),
            (None, true) => format!("calibration: {rates}, measured in {ms} ms{spread}{saved}"),
            (None, false) => format!("calibration: {rates}, nothing measured"),
        }
    }
}

/// `2026-12-04 20:49 UTC`, or `at an earlier start` when the cache did not record it.
fn measured_date(at: Option<u64>) -> String {
    at.and_then(|secs| chrono::DateTime::from_timestamp(i64::try_from(secs).ok()?, 0))
        .map_or_else(
            || "at an earlier start".to_owned(),
            |t| t.format("%Y-%m-%d %H:%M UTC").to_string(),
        )
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
/// ([`CacheKey::current`]) instead of measuring them (unless `policy.recalibrate`), and
/// storing what it had to measure when the run was stable (`policy.max_spread`; a failed write
/// is logged and otherwise ignored). Set rates still override cached ones.
pub fn calibrate_cached(
    input: &CalibrationInput<'_>,
    cache: &CalibrationCache,
    policy: CachePolicy,
) -> Result<Calibration, OffloadError> {
    run(input, Some((cache, policy)))
}

fn run(
    input: &CalibrationInput<'_>,
    cache: Option<(&CalibrationCache, CachePolicy)>,
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
    let need_activations = !on_cpu;
    let any_needed = need_link || need_flops || need_read || need_device || need_activations;
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
    let (cached, cached_at) = match (cache, &key) {
        (Some((cache, policy)), Some(key)) if !policy.recalibrate => cache.load_dated(key),
        _ => (MeasuredRates::default(), None),
    };
    let host_missing = (need_flops && cached.host_flops_per_s.is_none())
        || (need_read && cached.host_read_bytes_per_s.is_none());
    let device_missing = need_device && cached.device_flops_per_s.is_none();
    let link_missing = need_link && cached.link_bytes_per_s.is_none();
    let activations_missing = need_activations && cached.activation_bytes_per_s.is_none();
    if let (Some((cache, _)), true) = (
        cache,
        link_missing || host_missing || device_missing || activations_missing,
    ) {
        tracing::info!(
            "measuring calibration for {} (cached in {} when its probes are stable)",
            type_name(input.weight_type),
            cache.path().display()
        );
    }
    let mut fresh = MeasuredRates::default();
    let mut spread: Option<f64> = None;
    let mut note = |s: f64| spread = Some(spread.map_or(s, |t| t.max(s)));
    if link_missing {
        let link = measure_link(input.device, probe)?;
        note(link.spread);
        fresh.link_bytes_per_s = Some(link.rate);
    }
    if activations_missing {
        let round_trip = measure_round_trip(input.device, probe)?;
        note(round_trip.spread);
        fresh.activation_bytes_per_s = Some(round_trip.rate);
    }
    let matrix = if host_missing || device_missing {
        Some(probe_matrix(input.weight_type, probe)?)
    } else {
        None
    };
    if let (Some(matrix), true) = (&matrix, host_missing) {
        let host = measure_matmul(matrix, &Device::Cpu, probe.host_rows, probe)?;
        note(host.spread);
        fresh.host_flops_per_s = Some(host.flops_per_s);
        fresh.host_read_bytes_per_s = Some(host.read_bytes_per_s);
    }
    if let (Some(matrix), true) = (&matrix, device_missing) {
        let device = measure_matmul(matrix, input.device, probe.device_rows, probe)?;
        note(device.spread);
        fresh.device_flops_per_s = Some(device.flops_per_s);
    }
    // Whole units per second: a rate reads back from the cache's JSON exactly as measured.
    let fresh = fresh.rounded();
    let measured_any = fresh != MeasuredRates::default();
    let mut saved_to = None;
    let mut unstable_above = None;
    if let (Some((cache, policy)), Some(key), true) = (cache, &key, measured_any) {
        let spread = spread.unwrap_or(0.0);
        if spread < policy.max_spread {
            match cache.store(key, fresh) {
                Ok(()) => saved_to = Some(cache.path().to_path_buf()),
                Err(e) => tracing::warn!(
                    "calibration: could not write the cache {}: {e}",
                    cache.path().display()
                ),
            }
        } else {
            unstable_above = Some(policy.max_spread);
            tracing::warn!(
                "calibration: the probes' repetitions spread {:.0}% (limit \
                 calibration_spread {:.0}%): the machine looks busy, so these rates are used \
                 now but not cached",
                spread * 100.0,
                policy.max_spread * 100.0
            );
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
    // On CUDA this run's round trip, else the cache's; neither: the link's rate.
    let activations = match (fresh.activation_bytes_per_s, cached.activation_bytes_per_s) {
        _ if on_cpu => None,
        (Some(rate), _) => Some((rate, Source::Measured)),
        (None, Some(rate)) => Some((rate, Source::Cached)),
        (None, None) => None,
    };
    let sources = [link.1, host_flops.1, host_read.1, device.1];
    let any_cached =
        sources.contains(&Source::Cached) || activations.is_some_and(|a| a.1 == Source::Cached);
    let cached_from = match cache {
        Some((cache, _)) if any_cached => Some(cache.path().to_path_buf()),
        _ => None,
    };
    Ok(Calibration {
        model: CostModel {
            link_bytes_per_s: link.0,
            host_flops_per_s: host_flops.0,
            host_read_bytes_per_s: host_read.0,
            device_flops_per_s: device.0,
            forced: Tier::forced_by(tier.choice),
            // On the CPU device the host's rows are the device's: nothing crosses a link.
            activation_bytes_per_s: match activations {
                _ if on_cpu => Some(f64::INFINITY),
                Some((rate, _)) => Some(rate),
                None => None,
            },
        },
        weight_type: input.weight_type,
        sources,
        activations: activations.map(|a| a.1),
        elapsed: started.elapsed(),
        cached_at: cached_from.as_ref().and(cached_at),
        cached_from,
        saved_to,
        spread,
        unstable_above,
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

/// The times of a probe's repetitions after its warm-up: the best counts, the spread says how
/// steady they were.
#[derive(Debug, Clone, Copy)]
struct Timings {
    best: f64,
    worst: f64,
}

impl Timings {
    /// Runs `once` (seconds per run) `repeats` times after one warm-up run.
    fn of(
        repeats: usize,
        mut once: impl FnMut() -> Result<f64, OffloadError>,
    ) -> Result<Self, OffloadError> {
        once()?; // warm-up: first touch, kernel selection
        let mut t = Timings {
            best: f64::INFINITY,
            worst: 0.0,
        };
        for _ in 0..repeats.max(1) {
            let secs = once()?;
            t.best = t.best.min(secs);
            t.worst = t.worst.max(secs);
        }
        t.best = t.best.max(1e-9);
        Ok(t)
    }

    /// The slowest repetition over the fastest, minus one (0 when they agree).
    fn spread(self) -> f64 {
        (self.worst / self.best - 1.0).max(0.0)
    }
}

/// A matmul probe's result.
#[derive(Debug, Clone, Copy)]
struct MatmulRates {
    /// `rows * flops_per_row / t(rows)`.
    flops_per_s: f64,
    /// `weight bytes / t(1 row)`.
    read_bytes_per_s: f64,
    /// The larger spread of the two timings.
    spread: f64,
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
    let run = |x: &Tensor| -> Result<f64, OffloadError> {
        let started = Instant::now();
        let y = linear.forward(x)?;
        device.synchronize()?;
        drop(y);
        Ok(started.elapsed().as_secs_f64())
    };
    let t_one = Timings::of(probe.repeats, || run(&one))?;
    let t_many = Timings::of(probe.repeats, || run(&many))?;
    let flops = 2.0 * matrix.rows as f64 * matrix.cols as f64 * rows.max(1) as f64;
    Ok(MatmulRates {
        flops_per_s: flops / t_many.best,
        read_bytes_per_s: matrix.bytes.len() as f64 / t_one.best,
        spread: t_one.spread().max(t_many.spread()),
    })
}

/// A link probe's result.
#[derive(Debug, Clone, Copy)]
struct LinkRate {
    /// Bytes/s of the best copy.
    rate: f64,
    /// How steady the copies were.
    spread: f64,
}

/// The host-to-device copy rate of `probe.bytes`: a plain copy on the CPU device, a pinned copy
/// through the copy link on CUDA.
fn measure_link(device: &Device, probe: Probe) -> Result<LinkRate, OffloadError> {
    let len = probe.bytes.max(1);
    let timings = if device.is_cpu() {
        let src = vec![1u8; len];
        let mut dst = vec![0u8; len];
        Timings::of(probe.repeats, || {
            let started = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            Ok(started.elapsed().as_secs_f64())
        })?
    } else {
        // SAFETY: every byte is written just below, before anything reads it.
        let mut pinned = unsafe { ferry_gpu::PinnedBytes::uninit(device, len)? };
        // SAFETY: `as_mut_ptr` addresses `len` writable bytes of `pinned`.
        unsafe { std::ptr::write_bytes(pinned.as_mut_ptr(), 1, len) };
        let (_buffer, address) = ferry_gpu::dense_zeros(device, len.div_ceil(4), DType::F32)?;
        let link = ferry_gpu::CopyLink::new(device, 1)?;
        link.copy_after_compute()?;
        Timings::of(probe.repeats, || {
            let started = Instant::now();
            // SAFETY: `address` heads a device buffer of at least `len` bytes that `_buffer`
            // keeps alive, and `pinned` lives unmodified past the synchronize below.
            unsafe { link.copy_to_device(address, pinned.as_bytes())? };
            link.synchronize()?;
            Ok(started.elapsed().as_secs_f64())
        })?
    };
    Ok(LinkRate {
        rate: len as f64 / timings.best,
        spread: timings.spread(),
    })
}

/// The round trip of a host-computed unit's activations on `device` (CUDA): `probe.host_rows`
/// f32 rows of `probe.in_features` on the device, copied to the host and back (candle's copies
/// on the compute stream, as the MoE forward makes them), timed to the end of the copy back.
/// The rate counts both directions' bytes.
fn measure_round_trip(device: &Device, probe: Probe) -> Result<LinkRate, OffloadError> {
    let rows = Tensor::ones(
        (probe.host_rows.max(1), probe.in_features),
        DType::F32,
        device,
    )?;
    device.synchronize()?;
    let bytes = 2 * rows.elem_count() * DType::F32.size_in_bytes();
    let timings = Timings::of(probe.repeats, || {
        let started = Instant::now();
        let on_host = rows.to_device(&Device::Cpu)?;
        let back = on_host.to_device(device)?;
        device.synchronize()?;
        drop(back);
        Ok(started.elapsed().as_secs_f64())
    })?;
    Ok(LinkRate {
        rate: bytes as f64 / timings.best,
        spread: timings.spread(),
    })
}

#[cfg(test)]
#[path = "calibrate_tests.rs"]
mod tests;
