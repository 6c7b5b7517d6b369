//! The calibration on the CPU device: real probes (small ones, so the tests stay quick), the
//! configured rates taking the place of measurements, and the log line.

use std::path::PathBuf;

use super::*;
use crate::calibrate_cache::{CacheKey, CalibrationCache, MeasuredRates, CACHE_VERSION};
use ferry_config::TierChoice;

/// A small probe: 1 MiB matrices, 2 repetitions.
fn small() -> Probe {
    Probe {
        bytes: 1 << 20,
        in_features: 1024,
        host_rows: 4,
        device_rows: 8,
        repeats: 2,
    }
}

fn input<'a>(tier: &'a TierConfig, dtype: GgmlDType, link: Option<u64>) -> CalibrationInput<'a> {
    CalibrationInput {
        device: &Device::Cpu,
        weight_type: dtype,
        link_bandwidth: link,
        tier,
        probe: small(),
    }
}

#[test]
fn measures_positive_finite_rates_for_each_kernel_type() {
    let tier = TierConfig::default();
    for dtype in [
        GgmlDType::Q4_1,
        GgmlDType::Q8_0,
        GgmlDType::Q4K,
        GgmlDType::F32,
    ] {
        let calibration = calibrate(&input(&tier, dtype, None)).unwrap();
        let m = calibration.model;
        for (name, rate) in [
            ("link", m.link_bytes_per_s),
            ("host flops", m.host_flops_per_s),
            ("host read", m.host_read_bytes_per_s),
            ("device flops", m.device_flops_per_s),
        ] {
            assert!(rate.is_finite() && rate > 0.0, "{dtype:?} {name}: {rate}");
        }
        // The CPU device computes with the host's kernels.
        assert_eq!(m.device_flops_per_s, m.host_flops_per_s);
        assert_eq!(
            calibration.sources,
            [
                Source::Measured,
                Source::Measured,
                Source::Measured,
                Source::SameAsHost
            ]
        );
        assert_eq!(m.forced, None);
        assert_eq!(
            m.activation_bytes_per_s,
            Some(f64::INFINITY),
            "the CPU device"
        );
        assert_eq!(calibration.weight_type, dtype);
    }
}

#[test]
fn configured_rates_replace_measurements() {
    let tier = TierConfig {
        choice: TierChoice::Host,
        host_gflops: Some(120.0),
        host_bandwidth: Some(40_000_000_000),
        device_gflops: Some(20_000.0),
        experts: true,
        host_expert_layers: Default::default(),
        expert_routes: true,
    };
    let calibration = calibrate(&input(&tier, GgmlDType::Q4_0, Some(8_000_000_000))).unwrap();
    assert_eq!(
        calibration.model,
        CostModel {
            link_bytes_per_s: 8e9,
            host_flops_per_s: 120e9,
            host_read_bytes_per_s: 40e9,
            device_flops_per_s: 20_000e9,
            forced: Some(Tier::Host),
            // The CPU device: the rows are where the host computes.
            activation_bytes_per_s: Some(f64::INFINITY),
        }
    );
    assert_eq!(calibration.sources, [Source::Set; 4]);
    assert_eq!(
        calibration.summary(),
        format!(
            "calibration: link 8 GB/s (set), host 120.0 GFLOP/s (set) for q4_0 (reads 40 GB/s (set)), device 20000.0 GFLOP/s (set), tier host, nothing measured",
        )
    );
}

#[test]
fn the_cpu_device_link_is_its_throttle_and_its_compute_the_hosts() {
    let tier = TierConfig {
        host_gflops: Some(50.0),
        ..TierConfig::default()
    };
    let calibration = calibrate(&input(&tier, GgmlDType::Q4_1, Some(2_000_000_000))).unwrap();
    let m = calibration.model;
    assert_eq!(m.link_bytes_per_s, 2e9);
    assert_eq!(m.host_flops_per_s, 50e9);
    assert_eq!(m.device_flops_per_s, 50e9);
    assert!(m.host_read_bytes_per_s > 0.0);
    assert_eq!(
        calibration.sources,
        [
            Source::Set,
            Source::Set,
            Source::Measured,
            Source::SameAsHost
        ]
    );
    let line = calibration.summary();
    assert!(
        line.starts_with(
            "calibration: link 2 GB/s (set), host 50.0 GFLOP/s (set) for q4_1 (reads "
        ),
        "{line}"
    );
    assert!(
        line.contains("device 50.0 GFLOP/s (the host's), tier auto, measured in "),
        "{line}"
    );
}

#[test]
fn the_probe_matrix_has_the_asked_type_and_size() {
    let matrix = probe_matrix(GgmlDType::Q4_1, small()).unwrap();
    assert_eq!(matrix.cols, 1024);
    // Q4_1: 20 bytes per 32 weights.
    assert_eq!(matrix.bytes.len(), matrix.rows * 1024 / 32 * 20);
    assert!(matrix.bytes.len() >= 1 << 20);
    let linear = matrix.linear(&Device::Cpu).unwrap();
    let y = linear
        .forward(&Tensor::ones((2, 1024), DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(y.dims(), &[2, matrix.rows]);
}

/// The cache used, every run kept (a loaded test machine spreads the probes).
fn steady() -> CachePolicy {
    CachePolicy {
        recalibrate: false,
        max_spread: f64::INFINITY,
    }
}

/// A cache file in a fresh temporary directory (kept alive by the returned guard).
fn temp_cache() -> (tempfile::TempDir, CalibrationCache) {
    let dir = tempfile::tempdir().unwrap();
    let cache = CalibrationCache::at(dir.path().join("ferry").join("calibration.json"));
    (dir, cache)
}

#[test]
fn the_second_calibration_reads_the_first_ones_rates_from_the_cache() {
    let (_dir, cache) = temp_cache();
    let tier = TierConfig::default();
    let first = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(
        first.sources,
        [
            Source::Measured,
            Source::Measured,
            Source::Measured,
            Source::SameAsHost
        ]
    );
    assert_eq!(first.cached_from, None);
    assert_eq!(first.saved_to.as_deref(), Some(cache.path()));
    assert!(cache.path().is_file());
    let line = first.summary();
    assert!(
        line.contains(", measured in ") && line.contains(", saved to "),
        "{line}"
    );

    let second = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(second.model, first.model, "the same rates, bit for bit");
    assert_eq!(
        second.sources,
        [
            Source::Cached,
            Source::Cached,
            Source::Cached,
            Source::SameAsHost
        ]
    );
    assert_eq!(second.cached_from.as_deref(), Some(cache.path()));
    assert_eq!(second.saved_to, None, "nothing measured, nothing written");
    let line = second.summary();
    let prefix = format!("calibration from {} (measured 20", cache.path().display());
    assert!(line.starts_with(&prefix), "{line}");
    assert!(
        line.ends_with(&format!(
            " UTC); --recalibrate to measure again: {}",
            second.rates()
        )),
        "{line}"
    );
    assert!(second.cached_at.is_some());
}

#[test]
fn an_unsteady_run_is_used_but_not_cached_and_recalibrate_measures_again() {
    let (_dir, cache) = temp_cache();
    let tier = TierConfig::default();
    // A spread limit no run meets: the rates are measured and used, nothing is written.
    let never = CachePolicy {
        recalibrate: false,
        max_spread: 0.0,
    };
    let busy = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, never).unwrap();
    assert_eq!(busy.sources[1], Source::Measured);
    assert!(busy.model.host_flops_per_s > 0.0);
    assert!(busy.spread.is_some_and(|s| s >= 0.0), "{busy:?}");
    assert_eq!(
        (busy.saved_to.as_deref(), busy.unstable_above),
        (None, Some(0.0))
    );
    assert!(!cache.path().exists(), "nothing written");
    assert!(busy
        .summary()
        .contains(", not cached: the probes spread beyond calibration_spread 0%"));
    let again = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(again.sources[1], Source::Measured, "measured again");
    assert_eq!(again.saved_to.as_deref(), Some(cache.path()));
    // Recalibrating ignores the cached rates and replaces them.
    let recalibrate = CachePolicy {
        recalibrate: true,
        ..steady()
    };
    let fresh =
        calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, recalibrate).unwrap();
    assert_eq!(fresh.sources[1], Source::Measured);
    assert_eq!(fresh.cached_from, None);
    let cached = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(cached.sources[1], Source::Cached);
    assert_eq!(
        cached.model, fresh.model,
        "the recalibrated rates replaced the old ones"
    );
}

#[test]
fn set_rates_override_cached_ones() {
    let (_dir, cache) = temp_cache();
    let measured = calibrate_cached(
        &input(&TierConfig::default(), GgmlDType::Q8_0, None),
        &cache,
        steady(),
    )
    .unwrap()
    .model;
    let tier = TierConfig {
        host_gflops: Some(7.0),
        ..TierConfig::default()
    };
    let c = calibrate_cached(
        &input(&tier, GgmlDType::Q8_0, Some(3_000_000_000)),
        &cache,
        steady(),
    )
    .unwrap();
    assert_eq!(c.model.link_bytes_per_s, 3e9);
    assert_eq!(c.model.host_flops_per_s, 7e9);
    assert_eq!(c.model.device_flops_per_s, 7e9);
    assert_eq!(
        c.model.host_read_bytes_per_s,
        measured.host_read_bytes_per_s
    );
    assert_eq!(
        c.sources,
        [Source::Set, Source::Set, Source::Cached, Source::SameAsHost]
    );
    // The set rates were not written over the measured ones.
    let again = calibrate_cached(
        &input(&TierConfig::default(), GgmlDType::Q8_0, None),
        &cache,
        steady(),
    )
    .unwrap();
    assert_eq!(again.model, measured);
}

#[test]
fn a_rate_the_cache_lacks_is_measured_and_added() {
    let (_dir, cache) = temp_cache();
    let tier = TierConfig::default();
    // The first start had the link set: only the host was measured.
    let first = calibrate_cached(
        &input(&tier, GgmlDType::Q8_0, Some(1_000_000_000)),
        &cache,
        steady(),
    )
    .unwrap();
    assert_eq!(first.sources[0], Source::Set);
    let second = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(
        second.sources,
        [
            Source::Measured,
            Source::Cached,
            Source::Cached,
            Source::SameAsHost
        ]
    );
    assert_eq!(second.model.host_flops_per_s, first.model.host_flops_per_s);
    let line = second.summary();
    assert!(line.contains("the rest measured in "), "{line}");
    let third = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(third.sources[0], Source::Cached);
    assert_eq!(third.model, second.model);
}

#[test]
fn another_key_or_a_bad_file_measures_again() {
    let (_dir, cache) = temp_cache();
    let tier = TierConfig::default();
    calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    // Another weight type is another key: measured, and both entries kept.
    let q4 = calibrate_cached(&input(&tier, GgmlDType::Q4_1, None), &cache, steady()).unwrap();
    assert_eq!(q4.sources[1], Source::Measured);
    let q8 = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(q8.sources[1], Source::Cached);
    // Other probe sizes (and so the start-up probe against a test's) are another key.
    let mut bigger = input(&tier, GgmlDType::Q8_0, None);
    bigger.probe.repeats = 3;
    assert_eq!(
        calibrate_cached(&bigger, &cache, steady()).unwrap().sources[1],
        Source::Measured
    );

    // An entry of another cache version, CPU, build or thread count is not used.
    let key = |version| {
        let mut key = CacheKey::current(&Device::Cpu, GgmlDType::Q8_0, "ferry", [1, 2, 3, 4, 5]);
        key.version = version;
        key
    };
    let rates = MeasuredRates {
        host_flops_per_s: Some(1e9),
        ..MeasuredRates::default()
    };
    cache.store(&key(CACHE_VERSION + 1), rates).unwrap();
    assert_eq!(cache.load(&key(CACHE_VERSION)), MeasuredRates::default());
    assert_eq!(cache.load(&key(CACHE_VERSION + 1)), rates);
    let mut other_cpu = key(CACHE_VERSION + 1);
    other_cpu.cpu.push_str(" (another)");
    assert_eq!(cache.load(&other_cpu), MeasuredRates::default());
    let mut rebuilt = key(CACHE_VERSION + 1);
    rebuilt.build += 1;
    assert_eq!(cache.load(&rebuilt), MeasuredRates::default());
    let mut fewer_threads = key(CACHE_VERSION + 1);
    fewer_threads.threads += 1;
    assert_eq!(cache.load(&fewer_threads), MeasuredRates::default());
    // A stored zero is no rate.
    let zero = MeasuredRates {
        link_bytes_per_s: Some(0.0),
        ..MeasuredRates::default()
    };
    cache.store(&key(7), zero).unwrap();
    assert_eq!(cache.load(&key(7)), MeasuredRates::default());

    // A malformed file is a miss, and is rewritten whole.
    std::fs::write(cache.path(), "{ not json").unwrap();
    let c = calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady()).unwrap();
    assert_eq!(c.sources[1], Source::Measured);
    let text = std::fs::read_to_string(cache.path()).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_ok(),
        "{text}"
    );
    assert_eq!(
        calibrate_cached(&input(&tier, GgmlDType::Q8_0, None), &cache, steady())
            .unwrap()
            .sources[1],
        Source::Cached
    );
}

#[test]
fn the_user_cache_follows_xdg_then_home() {
    let at = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, PathBuf)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect();
        CalibrationCache::user_from(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
            .map(|c| c.path().to_path_buf())
    };
    assert_eq!(
        at(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]),
        Some(PathBuf::from("/x/ferry/calibration.json"))
    );
    assert_eq!(
        at(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]),
        Some(PathBuf::from("/h/.cache/ferry/calibration.json"))
    );
    assert_eq!(at(&[]), None);
}

/// The activations' round trip (item 4 of issue 30): measured only off the CPU device, whose
/// rows are already on the host; the probe itself runs anywhere (on the CPU its copies are
/// plain ones) and gives a positive finite rate; the cache keeps it, reads entries written
/// before it existed, and the log line shows it.
#[test]
fn the_activation_round_trip_is_a_cuda_rate_and_cached_like_the_others() {
    let tier = TierConfig::default();
    let on_cpu = calibrate(&input(&tier, GgmlDType::Q8_0, None)).unwrap();
    assert_eq!(on_cpu.activations, None);
    assert_eq!(on_cpu.model.activation_bytes_per_s, Some(f64::INFINITY));
    assert!(
        !on_cpu.rates().contains("activations"),
        "{}",
        on_cpu.rates()
    );

    let round_trip = measure_round_trip(&Device::Cpu, small()).unwrap();
    assert!(
        round_trip.rate.is_finite() && round_trip.rate > 0.0,
        "{round_trip:?}"
    );

    let (_dir, cache) = temp_cache();
    let key = CacheKey::current(&Device::Cpu, GgmlDType::Q8_0, "ferry", [1, 2, 3, 4, 5]);
    let rates = MeasuredRates {
        activation_bytes_per_s: Some(3e9),
        ..MeasuredRates::default()
    };
    cache.store(&key, rates).unwrap();
    assert_eq!(cache.load(&key).activation_bytes_per_s, Some(3e9));
    // An entry written before the field existed reads as not measured.
    let old: MeasuredRates = serde_json::from_str(
        r#"{"link_bytes_per_s": 1e9, "host_flops_per_s": null,
            "host_read_bytes_per_s": null, "device_flops_per_s": null}"#,
    )
    .unwrap();
    assert_eq!(old.activation_bytes_per_s, None);
    assert_eq!(old.link_bytes_per_s, Some(1e9));

    let mut shown = on_cpu.clone();
    shown.model.activation_bytes_per_s = Some(3e9);
    shown.activations = Some(Source::Cached);
    assert!(
        shown
            .rates()
            .contains(", activations round trip 3 GB/s (cached), tier auto"),
        "{}",
        shown.rates()
    );
}
