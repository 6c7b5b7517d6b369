//! Table tests for the tier cost model: batch 1 against 64, slow against fast links, cheap
//! against dear host compute, forced tiers, device-cached units, and the crossover row count.

use super::*;

const GB: f64 = 1e9;
const GFLOP: f64 = 1e9;

/// One expert of a Qwen3-30B-A3B-shaped model: gate, up and down of 2048 x 768 at about 4.5
/// bits per weight, rows of 2048 f32 activations.
fn expert() -> UnitWork {
    let elems = 3 * 2048 * 768;
    UnitWork::matmuls(elems * 9 / 16, elems, 2048 * 4)
}

/// A PCIe 4.0 x16 link, a DDR5 desktop CPU with its quantized kernels, a large GPU.
fn desktop() -> CostModel {
    CostModel {
        link_bytes_per_s: 25.0 * GB,
        host_flops_per_s: 200.0 * GFLOP,
        host_read_bytes_per_s: 60.0 * GB,
        device_flops_per_s: 20_000.0 * GFLOP,
        forced: None,
        activation_bytes_per_s: None,
    }
}

#[test]
fn decisions_follow_batch_link_and_host_compute() {
    let slow_link = CostModel {
        link_bytes_per_s: 4.0 * GB,
        ..desktop()
    };
    let fast_link = CostModel {
        link_bytes_per_s: 64.0 * GB,
        ..desktop()
    };
    let cheap_host = CostModel {
        host_flops_per_s: 2_000.0 * GFLOP,
        ..desktop()
    };
    let dear_host = CostModel {
        host_flops_per_s: 20.0 * GFLOP,
        ..desktop()
    };
    let cases: [(&str, CostModel, usize, Tier); 12] = [
        ("desktop, batch 1", desktop(), 1, Tier::Host),
        ("desktop, batch 64", desktop(), 64, Tier::Stream),
        ("slow link, batch 1", slow_link, 1, Tier::Host),
        ("slow link, batch 8", slow_link, 8, Tier::Host),
        ("slow link, batch 64", slow_link, 64, Tier::Stream),
        ("fast link, batch 1", fast_link, 1, Tier::Stream),
        ("fast link, batch 64", fast_link, 64, Tier::Stream),
        ("cheap host, batch 1", cheap_host, 1, Tier::Host),
        ("cheap host, batch 16", cheap_host, 16, Tier::Host),
        ("cheap host, batch 64", cheap_host, 64, Tier::Stream),
        ("dear host, batch 1", dear_host, 1, Tier::Stream),
        ("dear host, batch 64", dear_host, 64, Tier::Stream),
    ];
    let unit = expert();
    for (name, model, rows, tier) in cases {
        assert_eq!(model.choose(&unit, rows), tier, "{name}");
        let (chosen, other) = match tier {
            Tier::Stream => (Tier::Stream, Tier::Host),
            Tier::Host => (Tier::Host, Tier::Stream),
        };
        assert!(
            model.estimate(&unit, rows, chosen) <= model.estimate(&unit, rows, other),
            "{name}: the chosen tier is not the cheaper one"
        );
    }
}

#[test]
fn estimates_are_the_documented_formulas() {
    let model = CostModel {
        link_bytes_per_s: 10.0,
        host_flops_per_s: 4.0,
        host_read_bytes_per_s: 20.0,
        device_flops_per_s: 100.0,
        forced: None,
        activation_bytes_per_s: None,
    };
    let unit = UnitWork {
        weight_bytes: 100,
        flops_per_row: 8.0,
        activation_bytes_per_row: 5,
    };
    // stream: 100 / 10 + 3 * 8 / 100; cached: only the compute.
    assert_eq!(model.seconds(&unit, 3, Tier::Stream, false), 10.0 + 0.24);
    assert_eq!(model.seconds(&unit, 3, Tier::Stream, true), 0.24);
    // host, read-bound at 1 row: max(100 / 20, 8 / 4) + 2 * 5 / 10.
    assert_eq!(model.seconds(&unit, 1, Tier::Host, false), 5.0 + 1.0);
    // host, compute-bound at 4 rows: max(5, 32 / 4) + 2 * 4 * 5 / 10.
    assert_eq!(model.seconds(&unit, 4, Tier::Host, false), 8.0 + 4.0);
    assert_eq!(
        model.estimate(&unit, 4, Tier::Host),
        Duration::from_secs(12)
    );
    // No rows, no work, on either tier.
    for tier in Tier::ALL {
        assert_eq!(model.estimate(&unit, 0, tier), Duration::ZERO);
    }
}

#[test]
fn forced_tiers_decide_every_batch() {
    let unit = expert();
    for forced in Tier::ALL {
        let model = CostModel {
            forced: Some(forced),
            ..desktop()
        };
        for rows in [1, 2, 32, 64, 4096] {
            assert_eq!(model.choose(&unit, rows), forced, "{forced} at {rows}");
        }
    }
    let host = CostModel {
        forced: Some(Tier::Host),
        ..desktop()
    };
    assert_eq!(host.crossover(&unit), None);
    let stream = CostModel {
        forced: Some(Tier::Stream),
        ..desktop()
    };
    assert_eq!(stream.crossover(&unit), Some(1));
}

#[test]
fn a_unit_cached_on_the_device_always_streams() {
    let unit = expert();
    let slow_link = CostModel {
        link_bytes_per_s: 1.0 * GB,
        ..desktop()
    };
    for model in [
        desktop(),
        slow_link,
        CostModel {
            forced: Some(Tier::Host),
            ..slow_link
        },
    ] {
        // Uncached at batch 1 on a slow link, the host wins; cached, the device does.
        assert_eq!(model.choose_cached(&unit, 1, true), Tier::Stream);
        assert!(
            model.seconds(&unit, 1, Tier::Stream, true)
                < model.seconds(&unit, 1, Tier::Host, false)
        );
    }
    assert_eq!(slow_link.choose(&unit, 1), Tier::Host);
}

#[test]
fn ties_stream() {
    // Stream: 10 / 1 + 0; host: max(10 / 1, 0) + 0 (no flops, no activations).
    let model = CostModel {
        link_bytes_per_s: 1.0,
        host_flops_per_s: 1.0,
        host_read_bytes_per_s: 1.0,
        device_flops_per_s: 1.0,
        forced: None,
        activation_bytes_per_s: None,
    };
    let unit = UnitWork {
        weight_bytes: 10,
        flops_per_row: 0.0,
        activation_bytes_per_row: 0,
    };
    assert_eq!(
        model.estimate(&unit, 5, Tier::Stream),
        model.estimate(&unit, 5, Tier::Host)
    );
    assert_eq!(model.choose(&unit, 5), Tier::Stream);
}

#[test]
fn crossover_is_where_the_decision_flips() {
    let unit = expert();
    let cases: [(&str, CostModel); 4] = [
        ("desktop", desktop()),
        (
            "slow link",
            CostModel {
                link_bytes_per_s: 4.0 * GB,
                ..desktop()
            },
        ),
        (
            "cheap host",
            CostModel {
                host_flops_per_s: 2_000.0 * GFLOP,
                ..desktop()
            },
        ),
        (
            "emulated link on a CPU device",
            CostModel {
                link_bytes_per_s: 2.0 * GB,
                host_flops_per_s: 30.0 * GFLOP,
                host_read_bytes_per_s: 10.0 * GB,
                device_flops_per_s: 30.0 * GFLOP,
                forced: None,
                activation_bytes_per_s: None,
            },
        ),
    ];
    for (name, model) in cases {
        let rows = model.crossover(&unit).expect(name);
        assert!(rows > 1, "{name}: host wins at batch 1");
        assert_eq!(model.choose(&unit, rows), Tier::Stream, "{name} at {rows}");
        assert_eq!(
            model.choose(&unit, rows - 1),
            Tier::Host,
            "{name} at {}",
            rows - 1
        );
    }
    // Desktop: the copy (about 106 us) is paid back by about 47 us of host compute a row.
    assert_eq!(desktop().crossover(&unit), Some(3));
    // Streaming at once when the link is fast, never when the device computes slower than the
    // host and the link is slower than host memory; with equal compute, the activations the
    // host tier moves make streaming win at last.
    let fast = CostModel {
        link_bytes_per_s: 64.0 * GB,
        ..desktop()
    };
    assert_eq!(fast.crossover(&unit), Some(1));
    let same = CostModel {
        link_bytes_per_s: 10.0 * GB,
        host_flops_per_s: 100.0 * GFLOP,
        host_read_bytes_per_s: 20.0 * GB,
        device_flops_per_s: 100.0 * GFLOP,
        forced: None,
        activation_bytes_per_s: None,
    };
    let rows = same.crossover(&unit).unwrap();
    assert!(rows > 64, "{rows}");
    assert_eq!(same.choose(&unit, rows), Tier::Stream);
    assert_eq!(same.choose(&unit, rows - 1), Tier::Host);
    let slower = CostModel {
        device_flops_per_s: 50.0 * GFLOP,
        ..same
    };
    assert_eq!(slower.crossover(&unit), None);
    assert_eq!(slower.choose(&unit, 1 << 20), Tier::Host);
}

#[test]
fn broken_rates_never_panic() {
    let unit = expert();
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let model = CostModel {
            link_bytes_per_s: rate,
            host_flops_per_s: rate,
            host_read_bytes_per_s: rate,
            device_flops_per_s: rate,
            forced: None,
            activation_bytes_per_s: None,
        };
        for rows in [0, 1, 64] {
            let _ = model.choose(&unit, rows);
            for tier in Tier::ALL {
                let _ = model.estimate(&unit, rows, tier);
            }
        }
        let _ = model.crossover(&unit);
    }
    // No link: both tiers need it (the host one for the activations), both are infinite, and
    // the tie streams.
    let no_link = CostModel {
        link_bytes_per_s: 0.0,
        ..desktop()
    };
    assert_eq!(no_link.estimate(&unit, 1, Tier::Stream), Duration::MAX);
    assert_eq!(no_link.estimate(&unit, 1, Tier::Host), Duration::MAX);
    assert_eq!(no_link.choose(&unit, 1), Tier::Stream);
}

/// On the CPU device (its calibration: the device's rate is the host's, activations move at no
/// cost) the host tier has the same compute and no copy, so it wins at every row count, where
/// charging the rows to the link would stream a heavily routed expert.
#[test]
fn on_the_cpu_device_the_host_tier_is_never_slower() {
    let cpu = CostModel {
        link_bytes_per_s: 16.0 * GB,
        host_flops_per_s: 60.0 * GFLOP,
        host_read_bytes_per_s: 20.0 * GB,
        device_flops_per_s: 60.0 * GFLOP,
        forced: None,
        activation_bytes_per_s: Some(f64::INFINITY),
    };
    let unit = expert();
    for rows in [1, 8, 32, 512, 4096, 1 << 20] {
        assert_eq!(cpu.choose(&unit, rows), Tier::Host, "{rows} rows");
    }
    assert_eq!(cpu.crossover(&unit), None);
    // The same rates with the rows charged to the link stream from a few hundred rows.
    let charged = CostModel {
        activation_bytes_per_s: None,
        ..cpu
    };
    let from = charged.crossover(&unit).expect("streams at some row count");
    assert!((100..2000).contains(&from), "{from}");
    assert_eq!(charged.choose(&unit, from), Tier::Stream);
    assert_eq!(charged.choose(&unit, from - 1), Tier::Host);
    // A finite activation rate is charged like the link.
    let slow = CostModel {
        activation_bytes_per_s: Some(1.0),
        ..cpu
    };
    assert!(slow.estimate(&unit, 1, Tier::Host) > Duration::from_secs(1000));
}
