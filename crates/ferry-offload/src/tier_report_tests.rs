//! Unit kinds from hand-built layer layouts (a dense layer, a MoE layer), the dominant weight
//! type, and the report's decisions, text and JSON against fixed rates.

use std::time::Duration;

use super::*;
use crate::calibrate::Source;
use crate::cost::CostModel;
use crate::layout::TensorEntry;
use ferry_model::header::GgufType;
use ferry_model::tensors::Part;

fn entry(part: Part, unit: usize, kind: TensorKind, shape: &[usize], len: usize) -> TensorEntry {
    TensorEntry {
        name: format!("{part:?}.{unit}"),
        part,
        unit,
        kind,
        shape: shape.to_vec(),
        offset: 0,
        len,
    }
}

const Q4_1: TensorKind = TensorKind::Blocks(GgufType::Q4_1);
const Q8_0: TensorKind = TensorKind::Blocks(GgufType::Q8_0);
const F32: TensorKind = TensorKind::Dense(DType::F32);

/// Q4_1 bytes of `elems` weights.
fn q4_1(elems: usize) -> usize {
    elems / 32 * 20
}

/// A dense layer: hidden 64, MLP 256; attention in Q8_0, MLP in Q4_1, one f32 norm.
fn dense_layer() -> LayerLayout {
    let mut entries = vec![entry(Part::AttnNorm, 0, F32, &[64], 256)];
    for part in [Part::Q, Part::K, Part::V, Part::O] {
        entries.push(entry(part, 0, Q8_0, &[64, 64], 64 * 64 / 32 * 34));
    }
    for part in [Part::Gate, Part::Up, Part::Down] {
        entries.push(entry(part, 0, Q4_1, &[256, 64], q4_1(256 * 64)));
    }
    LayerLayout {
        index: 3,
        entries,
        blocks_len: 0,
        dense_len: 0,
    }
}

/// A MoE layer: hidden 64, 8 experts of width 32, top-2; attention and router in Q8_0.
fn moe_layer() -> LayerLayout {
    let mut entries = vec![entry(Part::AttnNorm, 0, F32, &[64], 256)];
    for part in [Part::Q, Part::K, Part::V, Part::O] {
        entries.push(entry(part, 0, Q8_0, &[64, 64], 64 * 64 / 32 * 34));
    }
    entries.push(entry(Part::Router, 0, Q8_0, &[8, 64], 8 * 64 / 32 * 34));
    for unit in 0..8 {
        for part in [Part::ExpGate, Part::ExpUp, Part::ExpDown] {
            entries.push(entry(part, unit, Q4_1, &[32, 64], q4_1(32 * 64)));
        }
    }
    LayerLayout {
        index: 5,
        entries,
        blocks_len: 0,
        dense_len: 0,
    }
}

fn moe() -> MoeSpec {
    MoeSpec {
        n_experts: 8,
        n_used: 2,
        expert_ff: 32,
        norm_topk: true,
        ..MoeSpec::plain()
    }
}

fn calibration(model: CostModel) -> Calibration {
    Calibration {
        model,
        weight_type: GgmlDType::Q4_1,
        sources: [Source::Set; 4],
        activations: None,
        elapsed: Duration::ZERO,
        cached_from: None,
        cached_at: None,
        saved_to: None,
        spread: None,
        unstable_above: None,
    }
}

#[test]
fn a_dense_layer_is_one_unit_of_all_its_matrices() {
    let kinds = unit_kinds(&dense_layer(), Offloaded::Layers(20), None, 64, 8);
    assert_eq!(kinds.len(), 1);
    let layer = &kinds[0];
    assert_eq!(
        (layer.name, layer.count, layer.rows_at_max_batch),
        ("layer", 20, 8)
    );
    let elems = 4 * 64 * 64 + 3 * 256 * 64;
    assert_eq!(layer.work.flops_per_row, 2.0 * elems as f64);
    assert_eq!(
        layer.work.weight_bytes,
        (256 + 4 * (64 * 64 / 32 * 34) + 3 * q4_1(256 * 64)) as u64
    );
    assert_eq!(layer.work.activation_bytes_per_row, 64 * 4);
    assert!(unit_kinds(&dense_layer(), Offloaded::Layers(0), None, 64, 8).is_empty());
    // The MLP's Q4_1 holds more bytes than the attention's Q8_0.
    assert_eq!(weight_type(&dense_layer()), GgmlDType::Q4_1);
}

#[test]
fn a_moe_layer_has_expert_units_and_computes_only_top_k_of_them() {
    let kinds = unit_kinds(&moe_layer(), Offloaded::Layers(4), Some(&moe()), 64, 8);
    let names: Vec<_> = kinds.iter().map(|k| (k.name, k.count)).collect();
    assert_eq!(names, [("layer", 4), ("expert", 32)]);
    let expert = &kinds[1];
    assert_eq!(expert.work.weight_bytes, 3 * q4_1(32 * 64) as u64);
    assert_eq!(expert.work.flops_per_row, 2.0 * (3 * 32 * 64) as f64);
    // 8 sequences x top-2 over 8 experts: 2 rows per expert.
    assert_eq!(expert.rows_at_max_batch, 2);
    let layer = &kinds[0];
    let dense = 4 * 64 * 64 + 8 * 64;
    assert_eq!(
        layer.work.flops_per_row,
        2.0 * (dense + 2 * 3 * 32 * 64) as f64
    );
    assert_eq!(
        unit_kinds(&moe_layer(), Offloaded::Layers(4), Some(&moe()), 64, 1)[1].rows_at_max_batch,
        1
    );
    // The experts' type counts, not the attention's (which here holds as many bytes).
    assert_eq!(weight_type(&moe_layer()), GgmlDType::Q4_1);
}

#[test]
fn the_report_decides_renders_and_serialises() {
    // A slow link and a quick host: one row computes on the host, many stream.
    let model = CostModel {
        link_bytes_per_s: 1e9,
        host_flops_per_s: 10e9,
        host_read_bytes_per_s: 20e9,
        device_flops_per_s: 1000e9,
        forced: None,
        activation_bytes_per_s: None,
    };
    let kinds = unit_kinds(&dense_layer(), Offloaded::Layers(20), None, 64, 64);
    let work = kinds[0].work;
    let report = TierReport::new(calibration(model), 64, kinds);
    let line = &report.lines[0];
    assert_eq!(line.at_one, Tier::Host);
    assert_eq!(line.at_max_batch, Tier::Stream);
    let rows = line.crossover.expect("streams at some batch");
    assert!(rows > 1 && rows <= 64, "{rows}");
    assert_eq!(model.choose(&work, rows), Tier::Stream);
    assert_eq!(model.choose(&work, rows - 1), Tier::Host);
    let text = report.render_text();
    assert!(
        text.starts_with("tiers   link 1 GB/s (set), host 10.0 GFLOP/s (set) for q4_1"),
        "{text}"
    );
    let expected = format!(
        "  layer   20 x {}: batch 1 host, max_batch 64 (64 rows) stream; streams from {rows} rows\n",
        format_bytes(work.weight_bytes)
    );
    assert!(text.ends_with(&expected), "{text}");
    let json = report.json();
    assert_eq!(json["weight_type"], "q4_1");
    assert_eq!(json["forced"], Value::Null);
    assert_eq!(json["units"][0]["tier_at_1"], "host");
    assert_eq!(json["units"][0]["tier_at_max_batch"], "stream");
    assert_eq!(json["units"][0]["crossover_rows"], rows);

    // Forced host: every line says host and never streams.
    let forced = TierReport::new(
        calibration(CostModel {
            forced: Some(Tier::Host),
            ..model
        }),
        64,
        unit_kinds(&dense_layer(), Offloaded::Layers(20), None, 64, 64),
    );
    assert!(forced
        .render_text()
        .contains("batch 1 host, max_batch 64 (64 rows) host; never streams"));
    assert_eq!(forced.json()["forced"], "host");
}

/// Units a device cannot compute on the host (whole layers on CUDA) stream at every batch,
/// and the report says why.
#[test]
fn stream_only_units_say_why() {
    let model = CostModel {
        link_bytes_per_s: 1e9,
        host_flops_per_s: 10e9,
        host_read_bytes_per_s: 20e9,
        device_flops_per_s: 1e15,
        forced: None,
        activation_bytes_per_s: None,
    };
    let kinds = unit_kinds(&dense_layer(), Offloaded::Layers(20), None, 64, 64);
    let free = TierReport::new(calibration(model), 64, kinds.clone());
    assert_eq!(
        free.lines[0].at_one,
        Tier::Host,
        "the rates alone pick host at 1 row"
    );
    assert_eq!(free.json()["stream_only"], Value::Null);
    let report = TierReport::new(calibration(model), 64, kinds).stream_only("no host tier here");
    let line = &report.lines[0];
    assert_eq!(
        (line.at_one, line.at_max_batch),
        (Tier::Stream, Tier::Stream)
    );
    assert_eq!(line.crossover, Some(1));
    assert_eq!(report.calibration.model.forced, Some(Tier::Stream));
    let text = report.render_text();
    assert!(
        text.contains("\n  stream only: no host tier here\n"),
        "{text}"
    );
    assert!(text.contains("batch 1 stream, max_batch 64 (64 rows) stream; streams from 1 row"));
    assert_eq!(report.json()["stream_only"], "no host tier here");
    assert_eq!(report.json()["forced"], "stream");
}
