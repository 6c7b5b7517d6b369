//! The calibration on the CPU device: real probes (small ones, so the tests stay quick), the
//! configured rates taking the place of measurements, and the log line.

use super::*;
use crate::config::TierChoice;

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
        }
    );
    assert_eq!(calibration.sources, [Source::Set; 4]);
    assert_eq!(
        calibration.summary(),
        format!(
            "calibration: link 8 GB/s (set), host 120.0 GFLOP/s (set) for q4_0 (reads 40 GB/s (set)), device 20000.0 GFLOP/s (set), tier host, in {} ms",
            calibration.elapsed.as_millis()
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
        line.contains("device 50.0 GFLOP/s (the host's), tier auto"),
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
