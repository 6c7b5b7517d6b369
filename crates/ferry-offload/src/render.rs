//! What `ferry plan` prints: a human table of a [`Plan`] (runs of consecutive layers with the same
//! home, the KV cache's context, batch and dtype and where they came from, bytes per tier, the
//! slot ring and the PCIe-bound decode estimate) and the same plan as JSON
//! (`--json`). Sizes use binary units (KiB, MiB, GiB); link speeds decimal ones (GB/s), as they are
//! quoted.

use std::fmt::Write as _;

use serde_json::json;

use super::experts_plan::ExpertPlan;
use super::layout::SlotLayout;
use super::plan::{mode_name, Home, Plan};
use super::units::{format_bandwidth, format_bytes};

/// A run of consecutive layers with the same home.
struct Run {
    first: usize,
    last: usize,
    home: Home,
    total: u64,
    smallest: u64,
    largest: u64,
}

fn runs(plan: &Plan) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for layer in &plan.layers {
        match runs.last_mut() {
            Some(run) if run.home == layer.home && run.last + 1 == layer.index => {
                run.last = layer.index;
                run.total = run.total.saturating_add(layer.bytes);
                run.smallest = run.smallest.min(layer.bytes);
                run.largest = run.largest.max(layer.bytes);
            }
            _ => runs.push(Run {
                first: layer.index,
                last: layer.index,
                home: layer.home,
                total: layer.bytes,
                smallest: layer.bytes,
                largest: layer.bytes,
            }),
        }
    }
    runs
}

/// The human table, e.g.
///
/// ```text
/// mode auto, budget 6.0 GiB, 32 layers (12 on the device, 20 streamed from the host)
///   layers 0-11   device  12 x 45.2 MiB = 542.4 MiB
///   layers 12-31  host    20 x 45.2 MiB = 904.0 MiB
/// device  2.3 GiB of 6.0 GiB
///   fixed parts  180.0 MiB
///   ...
/// host    904.0 MiB (pinned)
/// PCIe-bound decode <= 17.7 tok/s at 16 GB/s (904.0 MiB streamed per step)
/// ```
pub fn render_text(plan: &Plan) -> String {
    let mut out = String::new();
    let n = plan.layers.len();
    let _ = writeln!(
        out,
        "mode {}, budget {}, {n} layers ({} on the device, {} streamed from the host)",
        mode_name(plan.mode),
        format_bytes(plan.budget_bytes),
        plan.device_layers(),
        plan.host_layers(),
    );
    for run in runs(plan) {
        let label = if run.first == run.last {
            format!("layer {}", run.first)
        } else {
            format!("layers {}-{}", run.first, run.last)
        };
        let count = run.last - run.first + 1;
        let each = if run.smallest == run.largest {
            format!("{count} x {}", format_bytes(run.largest))
        } else {
            format!(
                "{count} layers of {}-{}",
                format_bytes(run.smallest),
                format_bytes(run.largest)
            )
        };
        let _ = writeln!(
            out,
            "  {label:<14}{:<8}{each} = {}",
            run.home.as_str(),
            format_bytes(run.total)
        );
    }
    if let Some(experts) = &plan.experts {
        expert_lines(&mut out, experts);
    }
    let _ = writeln!(out, "{}", cache_line(plan));
    let _ = writeln!(
        out,
        "device  {} of {}",
        format_bytes(plan.device_bytes),
        format_bytes(plan.budget_bytes)
    );
    let rows = [
        ("fixed parts", format_bytes(plan.fixed_bytes)),
        ("layers", format_bytes(plan.resident_layer_bytes)),
        (
            if plan.experts.is_some() {
                "expert pool"
            } else {
                "slots"
            },
            match &plan.experts {
                Some(experts) => format!(
                    "{} + {} prefill scratch x {} = {}",
                    experts.pool_slots,
                    experts.scratch_slots,
                    format_bytes(plan.slot_bytes),
                    format_bytes(plan.slot_ring_bytes())
                ),
                None => format!(
                    "{} x {} = {}",
                    plan.slots,
                    format_bytes(plan.slot_bytes),
                    format_bytes(plan.slot_ring_bytes())
                ),
            },
        ),
        (
            "KV cache",
            format!("{}{}", format_bytes(plan.kv_bytes), kv_note(plan)),
        ),
        ("workspace", workspace_line(plan)),
        ("reserve", format_bytes(plan.reserve_bytes)),
    ];
    for (name, value) in rows {
        let _ = writeln!(out, "  {name:<13}{value}");
    }
    let host_note = if plan.mode == ferry_config::OffloadMode::Model {
        " (pinned; the whole model parks here while idle)"
    } else {
        " (pinned)"
    };
    let _ = writeln!(out, "host    {}{host_note}", format_bytes(plan.host_bytes));
    if let (Some(rate), Some(bandwidth)) = (plan.estimated_decode_tokens_per_s, plan.link_bandwidth)
    {
        let _ = writeln!(
            out,
            "PCIe-bound decode <= {rate:.1} tok/s at {} ({} streamed per step)",
            format_bandwidth(bandwidth),
            format_bytes(plan.streamed_bytes_per_step)
        );
    }
    for note in &plan.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

/// The expert tiers of a MoE plan, one line per layer (its resident experts, listed when route
/// counts made them other than the first ones, those on the host, and the pool they are cached in when routed), and the bytes moved per token against
/// whole-layer streaming:
///
/// ```text
/// experts top 2 of 8 per token
///   layer 0       experts: 3 device, 5 host (1.5 MiB each; pool 2 + 2 scratch)
///   layer 1       experts: 2 device, 6 host (1.5 MiB each; pool 2 + 2 scratch; resident 3,6)
/// routed experts ~2.9 MiB moved per token (whole-layer streaming 13.5 MiB: 0.21x)
/// ```
fn expert_lines(out: &mut String, experts: &ExpertPlan) {
    let _ = writeln!(
        out,
        "experts top {} of {} per token",
        experts.n_used,
        experts
            .layers
            .iter()
            .map(|l| l.n_experts())
            .max()
            .unwrap_or(0)
    );
    for l in &experts.layers {
        let label = format!("layer {}", l.index);
        if l.n_experts() == 0 {
            // A MoE model's dense layers (GLM-4.5's leading ones).
            let _ = writeln!(out, "  {label:<14}dense (no experts)");
            continue;
        }
        let each = l.expert_bytes.iter().max().copied().unwrap_or(0);
        // Which experts are resident, when they are not simply the first ones (route counts
        // reordered them).
        let resident = l.resident_experts();
        let which = if resident.iter().enumerate().all(|(i, &e)| i == e) {
            String::new()
        } else {
            let list: Vec<String> = resident.iter().map(usize::to_string).collect();
            format!("; resident {}", list.join(","))
        };
        let _ = writeln!(
            out,
            "  {label:<14}experts: {} device, {} host ({} each; pool {} + {} scratch{which})",
            l.device_experts,
            l.host_experts(),
            format_bytes(each),
            experts.pool_slots,
            experts.scratch_slots,
        );
    }
    let whole = experts.whole_layer_bytes_per_token;
    let ratio = if whole > 0 {
        experts.bytes_per_token as f64 / whole as f64
    } else {
        0.0
    };
    let _ = writeln!(
        out,
        "routed experts ~{} moved per token (whole-layer streaming {}: {ratio:.2}x)",
        format_bytes(experts.bytes_per_token),
        format_bytes(whole)
    );
}

fn experts_json(experts: &ExpertPlan) -> serde_json::Value {
    let layers: Vec<serde_json::Value> = experts
        .layers
        .iter()
        .map(|l| {
            json!({
                "index": l.index,
                "base_bytes": l.base_bytes,
                "device_experts": l.device_experts,
                "resident_experts": l.resident_experts(),
                "host_experts": l.host_experts(),
                "expert_bytes": l.expert_bytes.iter().max().copied().unwrap_or(0),
                "device_bytes": l.device_bytes(),
                "host_bytes": l.host_bytes(),
            })
        })
        .collect();
    json!({
        "n_used": experts.n_used,
        "pool_slots": experts.pool_slots,
        "scratch_slots": experts.scratch_slots,
        "bytes_per_token": experts.bytes_per_token,
        "whole_layer_bytes_per_token": experts.whole_layer_bytes_per_token,
        "layers": layers,
    })
}

/// "40.0 MiB (512 tokens per step)": the workspace and the step size that sized it, when told.
fn workspace_line(plan: &Plan) -> String {
    match plan.max_step_tokens {
        0 => format_bytes(plan.workspace_bytes),
        tokens => format!(
            "{} ({tokens} tokens per step)",
            format_bytes(plan.workspace_bytes)
        ),
    }
}

/// What the KV cache's bytes are made of, after its size, and what each choice saves: `(768 B
/// per token and layer in f16; 22 of 26 layers keep a window of at most 1280 positions, 3.1 GiB
/// less than full caches; q8_0: 408 B per token and layer, 1.2 GiB in all; q4_0: ...)`.
fn kv_note(plan: &Plan) -> String {
    let layout = &plan.kv_layout;
    let per_token = plan.kv_bytes_per_token_per_layer;
    if per_token == 0 {
        return String::new();
    }
    let mut parts = Vec::new();
    if plan.kv_host {
        parts.push(
            "in host memory, not on the device: attention runs on the host (kv_offload)"
                .to_string(),
        );
    }
    parts.push(format!(
        "{per_token} B per token and layer in {}",
        plan.kv_dtype.as_str()
    ));
    if let Some(expanded) = layout.expanded_values_per_token {
        let expanded = plan.kv_dtype.row_bytes(expanded) as u64;
        parts.push(format!(
            "the latent attention's latent and RoPE key only: the heads' keys and values \
             expanded would take {expanded} B, {:.1}x more",
            expanded as f64 / per_token as f64
        ));
    }
    if layout.window_layers > 0 {
        let full = (plan.max_batch as u64)
            .saturating_mul(plan.max_context as u64)
            .saturating_mul(plan.layers.len() as u64)
            .saturating_mul(per_token);
        parts.push(format!(
            "{} of {} layers keep a window of at most {} positions, {} less than full caches",
            layout.window_layers,
            plan.layers.len(),
            layout.window_positions,
            format_bytes(full.saturating_sub(plan.kv_bytes))
        ));
    }
    let recurrent = plan.recurrent_kv_bytes();
    if layout.recurrent_layers > 0 {
        parts.push(format!(
            "{} of {} layers keep a recurrent state instead, {} per sequence, which does not grow with the context (on the device; the prefix cache and speculation are off for this model: a recurrent state cannot go back to an earlier position)",
            layout.recurrent_layers,
            plan.layers.len(),
            format_bytes(layout.recurrent_bytes_per_seq)
        ));
    }
    // The same positions in another format: the bytes scale with one token's (a recurrent
    // state's do not).
    let others: Vec<String> = layout
        .per_token_by_format
        .iter()
        .filter(|(name, _)| *name != plan.kv_dtype.as_str())
        .map(|(name, bytes)| {
            let scaled = plan.kv_bytes.saturating_sub(recurrent);
            let total = (scaled as u128 * *bytes as u128 / per_token as u128) as u64 + recurrent;
            format!("{name}: {bytes} B, {} in all", format_bytes(total))
        })
        .collect();
    if !others.is_empty() {
        parts.push(others.join(", "));
    }
    format!(" ({})", parts.join("; "))
}

/// `cache   max_context 4096 (fitted; the model's 131072), max_batch 8 (default), kv_dtype f16
/// (default)`: the KV cache's shape and where each value came from.
fn cache_line(plan: &Plan) -> String {
    let o = &plan.origins;
    let window = if o.model_context > 0 && o.model_context != plan.max_context {
        format!("; the model's {}", o.model_context)
    } else {
        String::new()
    };
    format!(
        "cache   max_context {} ({}{window}), max_batch {} ({}), kv_dtype {} ({})",
        plan.max_context,
        o.max_context.as_str(),
        plan.max_batch,
        o.max_batch.as_str(),
        plan.kv_dtype.as_str(),
        o.kv_dtype.as_str(),
    )
}

/// The plan as a JSON value:
///
/// ```text
/// {"mode", "budget_bytes", "layers": [{"index", "home": "device"|"host", "bytes"}],
///  "device_bytes", "host_bytes", "kv_bytes", "kv_host", "slots", "slot_bytes",
///  "estimated_decode_tokens_per_s", "notes": [".."], "fixed_bytes", "workspace_bytes", "reserve_bytes",
///  "streamed_bytes_per_step", "link_bandwidth",
///  "max_context", "max_batch", "kv_dtype": "f32"|"f16"|"bf16"|"q8_0"|"q4_0", "model_context",
///  "kv_bytes_per_token_per_layer", "kv_window_layers", "kv_window_positions",
///  "kv_bytes_per_token_per_layer_by_dtype": {"f16": .., "q8_0": .., ..},
///  "origin": {"max_context", "max_batch", "kv_dtype": "default"|"set"|"fitted"},
///  "slot_layout": {"kind": "cpu"|"cuda", "dense_bytes", "blocks_bytes",
///                  "matrices": [{"part", "type", "shape", "bytes", "allocated"}]},
///  "experts": {"n_used", "pool_slots", "scratch_slots", "bytes_per_token", "whole_layer_bytes_per_token",
///              "layers": [{"index", "base_bytes", "device_experts", "resident_experts": [..],
///                          "host_experts",
///                          "expert_bytes", "device_bytes", "host_bytes"}]}}
/// ```
///
/// `estimated_decode_tokens_per_s`, `link_bandwidth`, `slot_layout` and `experts` (set for a
/// MoE model placed expert by expert) are `null` when absent.
pub fn plan_json(plan: &Plan) -> serde_json::Value {
    json!({
        "mode": mode_name(plan.mode),
        "budget_bytes": plan.budget_bytes,
        "layers": plan.layers,
        "device_bytes": plan.device_bytes,
        "host_bytes": plan.host_bytes,
        "kv_bytes": plan.kv_bytes,
        "kv_host": plan.kv_host,
        "slots": plan.slots,
        "slot_bytes": plan.slot_bytes,
        "estimated_decode_tokens_per_s": plan.estimated_decode_tokens_per_s,
        "notes": plan.notes,
        "fixed_bytes": plan.fixed_bytes,
        "workspace_bytes": plan.workspace_bytes,
        "max_step_tokens": plan.max_step_tokens,
        "reserve_bytes": plan.reserve_bytes,
        "streamed_bytes_per_step": plan.streamed_bytes_per_step,
        "link_bandwidth": plan.link_bandwidth,
        "slot_layout": plan.slot_layout.as_ref().map(slot_layout_json),
        "experts": plan.experts.as_ref().map(experts_json),
        "max_context": plan.max_context,
        "max_batch": plan.max_batch,
        "kv_dtype": plan.kv_dtype.as_str(),
        "kv_bytes_per_token_per_layer": plan.kv_bytes_per_token_per_layer,
        "kv_expanded_bytes_per_token_per_layer": plan
            .kv_layout
            .expanded_values_per_token
            .map(|v| plan.kv_dtype.row_bytes(v)),
        "kv_window_layers": plan.kv_layout.window_layers,
        "kv_window_positions": plan.kv_layout.window_positions,
        "kv_recurrent_layers": plan.kv_layout.recurrent_layers,
        "kv_recurrent_bytes_per_sequence": plan.kv_layout.recurrent_bytes_per_seq,
        "kv_bytes_per_token_per_layer_by_dtype": plan
            .kv_layout
            .per_token_by_format
            .iter()
            .map(|(name, bytes)| (name.to_string(), json!(bytes)))
            .collect::<serde_json::Map<_, _>>(),
        "model_context": plan.origins.model_context,
        "origin": {
            "max_context": plan.origins.max_context.as_str(),
            "max_batch": plan.origins.max_batch.as_str(),
            "kv_dtype": plan.origins.kv_dtype.as_str(),
        },
    })
}

fn slot_layout_json(slot: &SlotLayout) -> serde_json::Value {
    let matrices: Vec<serde_json::Value> = slot
        .matrices
        .iter()
        .map(|m| {
            json!({
                "part": format!("{:?}", m.part),
                "type": format!("{:?}", m.dtype),
                "shape": m.shape,
                "bytes": m.bytes,
                "allocated": m.allocated,
            })
        })
        .collect();
    json!({
        "kind": slot.kind.as_str(),
        "dense_bytes": slot.dense_bytes,
        "blocks_bytes": slot.blocks_bytes,
        "matrices": matrices,
    })
}

/// [`plan_json`] pretty-printed.
pub fn render_json(plan: &Plan) -> String {
    format!("{:#}", plan_json(plan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, PlanInput};
    use ferry_config::OffloadMode;

    const MIB: u64 = 1024 * 1024;

    fn auto_plan() -> Plan {
        let mut input = PlanInput::new(OffloadMode::Auto, vec![10 * MIB; 8], 20 * MIB, 80 * MIB);
        input.prefetch = 1;
        input.reserve_bytes = 5 * MIB;
        input.link_bandwidth = Some(16_000_000_000);
        // base 25 MiB + 2 slots x 10 MiB = 45 MiB; 3 more layers fit (75 MiB), 5 stream.
        plan(&input).expect("fits")
    }

    #[test]
    fn text_groups_runs_and_shows_tiers_and_estimate() {
        let plan = auto_plan();
        assert_eq!(plan.device_layers(), 3);
        let text = render_text(&plan);
        assert!(text.starts_with("mode auto, budget 80.0 MiB, 8 layers (3 on the device, 5 streamed from the host)\n"), "{text}");
        assert!(
            text.contains("  layers 0-2    device  3 x 10.0 MiB = 30.0 MiB\n"),
            "{text}"
        );
        assert!(
            text.contains("  layers 3-7    host    5 x 10.0 MiB = 50.0 MiB\n"),
            "{text}"
        );
        assert!(text.contains("device  75.0 MiB of 80.0 MiB\n"), "{text}");
        assert!(
            text.contains("  slots        2 x 10.0 MiB = 20.0 MiB\n"),
            "{text}"
        );
        assert!(text.contains("  reserve      5.0 MiB\n"), "{text}");
        assert!(text.contains("host    50.0 MiB (pinned)\n"), "{text}");
        // 16e9 / (50 MiB) = 305.2 tok/s.
        assert!(
            text.contains(
                "PCIe-bound decode <= 305.2 tok/s at 16 GB/s (50.0 MiB streamed per step)"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_kv_line_says_what_windows_formats_and_the_host_save() {
        use crate::plan::KvLayout;
        use candle_core::DType;
        use ferry_model::kv_format::KvFormat;
        let mut input = PlanInput::new(OffloadMode::None, vec![MIB; 4], MIB, 1 << 30);
        input.max_context = 8192;
        input.max_batch = 2;
        input.kv_bytes_per_token_per_layer = 512;
        input.kv_dtype = KvFormat::Dense(DType::F16);
        input.kv_layout = KvLayout {
            window_layers: 3,
            window_positions: 1024,
            per_token_by_format: vec![("f16", 512), ("q8_0", 272)],
            ..KvLayout::default()
        };
        let resident = plan(&input).expect("fits");
        // 2 x (8192 + 3 x 1024) positions x 512 B = 11 MiB; full caches: 2 x 4 x 8192 x 512 B.
        assert_eq!(resident.kv_bytes, 11 * MIB);
        let text = render_text(&resident);
        assert!(
            text.contains("  KV cache     11.0 MiB (512 B per token and layer in f16; 3 of 4 layers keep a window of at most 1024 positions, 21.0 MiB less than full caches; q8_0: 272 B, 5.8 MiB in all)\n"),
            "{text}"
        );
        input.kv_host = true;
        let hosted = plan(&input).expect("fits");
        assert_eq!(hosted.device_bytes + 11 * MIB, resident.device_bytes);
        assert_eq!(hosted.host_bytes, 11 * MIB);
        let text = render_text(&hosted);
        assert!(
            text.contains("  KV cache     11.0 MiB (in host memory, not on the device: attention runs on the host (kv_offload); 512 B"),
            "{text}"
        );
        assert_eq!(plan_json(&hosted)["kv_host"], true);
    }

    #[test]
    fn the_kv_line_says_recurrent_states_do_not_grow_with_the_context() {
        use crate::plan::KvLayout;
        const KIB: u64 = 1024;
        use candle_core::DType;
        use ferry_model::kv_format::KvFormat;
        let mut input = PlanInput::new(OffloadMode::None, vec![MIB; 4], MIB, 1 << 30);
        input.max_context = 8192;
        input.max_batch = 2;
        input.kv_bytes_per_token_per_layer = 512;
        input.kv_dtype = KvFormat::Dense(DType::F16);
        input.kv_layout = KvLayout {
            per_token_by_format: vec![("f16", 512), ("q8_0", 272)],
            recurrent_layers: 3,
            recurrent_bytes_per_seq: 3 * 256 * KIB,
            ..KvLayout::default()
        };
        let short = plan(&input).expect("fits");
        // 2 x 8192 positions x 512 B in the one attention layer, plus 2 x 768 KiB of state.
        assert_eq!(short.kv_bytes, 8 * MIB + 1536 * KIB);
        input.max_context = 16384;
        let long = plan(&input).expect("fits");
        assert_eq!(
            long.kv_bytes - short.kv_bytes,
            8 * MIB,
            "states do not grow"
        );
        let text = render_text(&short);
        assert!(
            text.contains("3 of 4 layers keep a recurrent state instead, 768.0 KiB per sequence, which does not grow with the context"),
            "{text}"
        );
        assert!(
            text.contains("the prefix cache and speculation are off"),
            "{text}"
        );
        // Another format scales only the keys and values: 8 MiB x 272 / 512 + 1.5 MiB.
        assert!(text.contains("q8_0: 272 B, 5.8 MiB in all"), "{text}");
        input.kv_host = true;
        let hosted = plan(&input).expect("fits");
        assert_eq!(
            hosted.device_kv_bytes(),
            1536 * KIB,
            "states stay on the device"
        );
        assert_eq!(plan_json(&hosted)["kv_recurrent_layers"], 3);
    }

    #[test]
    fn text_of_a_resident_plan_has_no_estimate_and_names_single_layers() {
        let mut input = PlanInput::new(OffloadMode::None, vec![3 * MIB, 5 * MIB], MIB, 100 * MIB);
        input.link_bandwidth = Some(16_000_000_000);
        let plan = plan(&input).expect("fits");
        let text = render_text(&plan);
        assert!(
            text.contains("  layers 0-1    device  2 layers of 3.0 MiB-5.0 MiB = 8.0 MiB\n"),
            "{text}"
        );
        assert!(!text.contains("PCIe-bound"), "{text}");
        assert!(text.contains("  slots        0 x 0 B = 0 B\n"), "{text}");

        let mut input = PlanInput::new(OffloadMode::Sequential, vec![MIB], 0, 100 * MIB);
        input.link_bandwidth = Some(16_000_000_000);
        let text = render_text(&plan_fn(&input));
        assert!(
            text.contains("  layer 0       host    1 x 1.0 MiB = 1.0 MiB\n"),
            "{text}"
        );
    }

    fn plan_fn(input: &PlanInput) -> Plan {
        plan(input).expect("fits")
    }

    #[test]
    fn the_cache_line_and_json_say_where_context_batch_and_dtype_came_from() {
        use crate::plan::{CacheOrigins, Origin};
        let mut input = PlanInput::new(OffloadMode::None, vec![MIB], 0, 100 * MIB);
        input.max_context = 4096;
        input.max_batch = 8;
        input.kv_dtype = ferry_model::kv_format::KvFormat::Dense(candle_core::DType::F16);
        input.origins = CacheOrigins {
            max_context: Origin::Fitted,
            max_batch: Origin::Default,
            kv_dtype: Origin::Set,
            model_context: 131072,
        };
        let plan = plan_fn(&input);
        let text = render_text(&plan);
        assert!(
            text.contains("\ncache   max_context 4096 (fitted; the model's 131072), max_batch 8 (default), kv_dtype f16 (set)\n"),
            "{text}"
        );
        let value = plan_json(&plan);
        assert_eq!(value["max_context"], 4096);
        assert_eq!(value["max_batch"], 8);
        assert_eq!(value["kv_dtype"], "f16");
        assert_eq!(value["model_context"], 131072);
        assert_eq!(
            value["origin"],
            json!({"max_context": "fitted", "max_batch": "default", "kv_dtype": "set"})
        );
    }

    #[test]
    fn notes_close_the_text_and_are_listed_in_json() {
        let mut plan = auto_plan();
        assert!(!render_text(&plan).contains("note:"));
        assert_eq!(plan_json(&plan)["notes"], serde_json::json!([]));
        plan.notes = vec!["2 IQ4_XS tensors are dequantized at load".into()];
        let text = render_text(&plan);
        assert!(
            text.ends_with("note: 2 IQ4_XS tensors are dequantized at load\n"),
            "{text}"
        );
        assert_eq!(plan_json(&plan)["notes"][0], plan.notes[0].as_str());
    }

    #[test]
    fn json_has_the_documented_shape() {
        let plan = auto_plan();
        let value: serde_json::Value =
            serde_json::from_str(&render_json(&plan)).expect("valid JSON");
        assert_eq!(value["mode"], "auto");
        assert_eq!(value["budget_bytes"], 80 * MIB);
        assert_eq!(value["device_bytes"], 75 * MIB);
        assert_eq!(value["host_bytes"], 50 * MIB);
        assert_eq!(value["kv_bytes"], 0);
        assert_eq!(value["slots"], 2);
        assert_eq!(value["slot_bytes"], 10 * MIB);
        let layers = value["layers"].as_array().expect("layers array");
        assert_eq!(layers.len(), 8);
        assert_eq!(
            layers[2],
            json!({"index": 2, "home": "device", "bytes": 10 * MIB})
        );
        assert_eq!(
            layers[3],
            json!({"index": 3, "home": "host", "bytes": 10 * MIB})
        );
        let rate = value["estimated_decode_tokens_per_s"]
            .as_f64()
            .expect("a number");
        assert!((rate - 16e9 / (50.0 * MIB as f64)).abs() < 1e-6, "{rate}");

        let resident = plan_fn(&PlanInput::new(OffloadMode::None, vec![MIB], 0, 10 * MIB));
        assert!(plan_json(&resident)["estimated_decode_tokens_per_s"].is_null());
        assert_eq!(plan_json(&resident)["mode"], "none");
    }
}
