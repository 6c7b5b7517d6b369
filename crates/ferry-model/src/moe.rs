//! The mixture-of-experts MLP (Qwen3-MoE, Mixtral, Qwen2-MoE, gpt-oss, GLM-4.5, DeepSeek): a router
//! scores every expert for each row, the top-k experts run their gated MLP on that row, and
//! their outputs are summed weighted by the routing weights. The families differ in how the
//! weights come from the router's logits ([`Gating`]: a softmax over all experts, gpt-oss's
//! softmax over the chosen k logits, or GLM-4.5's sigmoid per expert; renormalised over the
//! top k and scaled when the model says so), in how the top k are chosen (GLM-4.5's and
//! DeepSeek-V3's correction bias, added to the scores that choose and not to the weights;
//! DeepSeek-V3's expert groups), in the experts' activation
//! ([`ExpertActivation`]: SwiGLU or gpt-oss's clamped one), in biases (gpt-oss: the router's
//! and each expert's, kept as stacked layer parts) and in a shared expert (Qwen2-MoE,
//! GLM-4.5, DeepSeek): a SwiGLU every row runs, added to the routed sum (Qwen2-MoE's scaled by
//! `sigmoid(h . w)` first). The shared expert is part of the layer (the offload engine keeps
//! it with the layer's other tensors); only the routed experts are units.
//!
//! Each expert's gate/up/down is its own unit in [`LayerWeights`] (one table record each, a
//! slice of GGUF's stacked tensors), so the offload engine can place experts one by one; the
//! layer is asked for the routed experts only after the router ran, so an expert that no row
//! of the step picked is neither touched nor fetched.
//!
//! Reference: HF transformers' `modeling_qwen3_moe.py` / `modeling_mixtral.py`,
//! cross-checked in `tests/suite/arch_families.rs` against candle-transformers' `qwen3_moe`,
//! `mixtral`, `quantized_qwen3_moe` and `quantized_llama`; Qwen2-MoE and gpt-oss against
//! llama.cpp (`tests/suite/arch_llamacpp.rs`), whose `build_moe_ffn` fixes the order of the
//! steps (gpt-oss's alpha 1.702 and limit 7.0 are llama.cpp's constants too); GLM-4.5 too.

use std::cell::OnceCell;

use candle_core::{DType, Device, Tensor};

use super::decoder::block::projections;
use super::error::{ModelError, Result};
use super::spec::{ExpertActivation, ExpertGroups, Gating, MoeSpec};
use super::tensors::Part;
use super::weights::{ExpertWeights, LayerWeights};

/// Which experts each row goes to: per expert, its rows and their routing weights.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Routing {
    /// `rows[e]`: the rows routed to expert `e`, ascending.
    pub rows: Vec<Vec<u32>>,
    /// `weights[e][i]`: the weight of expert `e`'s output for row `rows[e][i]`.
    pub weights: Vec<Vec<f32>>,
}

/// gpt-oss's clamped SwiGLU: the gate is capped at `CLAMP_LIMIT`, the up projection clamped
/// to `±CLAMP_LIMIT`, and the gate's sigmoid is sharpened by `CLAMP_ALPHA` (llama.cpp's
/// constants for `swiglu_oai`).
const CLAMP_ALPHA: f64 = 1.702;
/// See [`CLAMP_ALPHA`].
const CLAMP_LIMIT: f64 = 7.0;

/// `e^(x - max)` normalised over `xs`.
fn softmax(xs: &[f32]) -> Vec<f32> {
    let max = xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let exps: Vec<f32> = xs.iter().map(|&x| (x - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// `1 / (1 + e^-x)`.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The indices of `xs`, highest value first (ties: lower index first).
fn ranked(xs: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|&a, &b| xs[b].total_cmp(&xs[a]).then(a.cmp(&b)));
    order
}

/// The `k` experts with the highest `choice` scores (ties: lower index), taken from the best
/// `groups.used` groups only when the experts are grouped (a group's score: the sum of its two
/// best).
fn top_k(choice: &[f32], k: usize, groups: ExpertGroups) -> Vec<usize> {
    let per_group = (choice.len() / groups.count.max(1)).max(1);
    let allowed: Vec<bool> = if groups.count > 1 {
        let group_scores: Vec<f32> = choice
            .chunks(per_group)
            .map(|g| ranked(g).iter().take(2).map(|&e| g[e]).sum())
            .collect();
        let best = &ranked(&group_scores)[..groups.used.min(group_scores.len())];
        (0..choice.len())
            .map(|e| best.contains(&(e / per_group)))
            .collect()
    } else {
        vec![true; choice.len()]
    };
    ranked(choice)
        .into_iter()
        .filter(|&e| allowed[e])
        .take(k)
        .collect()
}

/// Routes rows whose router logits are `logits` (`[rows][n_experts]`, biases added): each
/// row's `moe.n_used` highest-scoring experts (ties: lower index; within the best groups when
/// `moe.groups` has several). With [`Gating::Softmax`] the score and the weight are the
/// softmax probability over all experts; with [`Gating::SoftmaxOfTopK`] the score is the logit
/// and the weights a softmax over the chosen logits; with [`Gating::Sigmoid`] both are each
/// logit's sigmoid. `selection_bias` (one per expert) is added to the scores that choose, never
/// to the weights. The weights are then renormalised over the chosen ones when
/// `moe.norm_topk`, and multiplied by `moe.weights_scale`.
pub fn route(logits: &[Vec<f32>], moe: MoeSpec, selection_bias: Option<&[f32]>) -> Routing {
    let mut routing = Routing {
        rows: vec![Vec::new(); moe.n_experts],
        weights: vec![Vec::new(); moe.n_experts],
    };
    for (row, l) in logits.iter().enumerate() {
        let scores = match moe.gating {
            Gating::Softmax => softmax(l),
            Gating::SoftmaxOfTopK => l.clone(),
            Gating::Sigmoid => l.iter().map(|&x| sigmoid(x)).collect(),
        };
        let choice: Vec<f32> = match selection_bias {
            Some(bias) => scores.iter().zip(bias).map(|(s, b)| s + b).collect(),
            None => scores.clone(),
        };
        let top = top_k(&choice, moe.n_used, moe.groups);
        let mut weights: Vec<f32> = match moe.gating {
            Gating::Softmax | Gating::Sigmoid => top.iter().map(|&e| scores[e]).collect(),
            Gating::SoftmaxOfTopK => softmax(&top.iter().map(|&e| scores[e]).collect::<Vec<_>>()),
        };
        if moe.norm_topk {
            let sum: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        if moe.weights_scale != 1.0 {
            weights.iter_mut().for_each(|w| *w *= moe.weights_scale);
        }
        for (&e, w) in top.iter().zip(weights) {
            routing.rows[e].push(row as u32);
            routing.weights[e].push(w);
        }
    }
    routing
}

/// The routing of `x` (`[rows, hidden]`) by layer `w`'s router, `selection_bias` (the layer's
/// `exp_probs_b` on the host, when `moe.selection_bias`) added to the scores that choose: the
/// routing, the experts some row went to (ascending) and how many rows went to each.
fn route_rows(
    x: &Tensor,
    w: &LayerWeights,
    moe: MoeSpec,
    selection_bias: Option<&[f32]>,
) -> Result<(Routing, Vec<usize>, Vec<usize>)> {
    let logits = w.linear(Part::Router)?.forward(x)?.to_dtype(DType::F32)?;
    if logits.dim(1)? != moe.n_experts {
        return Err(ModelError::MissingTensor(format!(
            "a router over {} of {} experts",
            logits.dim(1)?,
            moe.n_experts
        )));
    }
    if moe.selection_bias && selection_bias.is_none() {
        return Err(ModelError::MissingTensor("exp_probs_b on the host".into()));
    }
    let routing = route(&logits.to_vec2::<f32>()?, moe, selection_bias);
    let wanted: Vec<usize> = (0..moe.n_experts)
        .filter(|&e| !routing.rows[e].is_empty())
        .collect();
    let rows: Vec<usize> = wanted.iter().map(|&e| routing.rows[e].len()).collect();
    Ok((routing, wanted, rows))
}

/// The MoE MLP of layer `w` on `h` (`[1, rows, hidden]`). After the router ran, the layer is
/// asked for only the experts some row was routed to, with the rows routed to each
/// ([`LayerWeights::each_routed_expert`]: its own expert parts, or the offload engine's expert
/// store behind it, which hands out the experts on the device first while the others copy).
/// The experts' outputs are summed in expert order whatever order they came in, so the result
/// does not depend on where each expert was.
///
/// An expert the source computes on the host while the rows are on another device (a GPU's
/// offloaded expert on the host tier) gets its rows from a host copy made once per layer,
/// before any expert computes ([`HostRows`]); its output goes back to the rows' device and is
/// summed like the others. On the CPU device nothing moves.
/// `selection_bias` as [`route`] takes it (read once per layer by the caller).
pub fn forward(
    h: &Tensor,
    w: &LayerWeights,
    moe: MoeSpec,
    selection_bias: Option<&[f32]>,
) -> Result<Tensor> {
    let dims = h.dims().to_vec();
    let hidden = *dims.last().unwrap_or(&0);
    let x = h.reshape(((), hidden))?;
    let staged = !x.device().is_cpu();
    Ok(forward_rows(&x, w, moe, selection_bias, staged)?.reshape(dims)?)
}

/// [`forward`] on rows `x` (`[rows, hidden]`); `stage_host_rows`: the rows of the experts the
/// source computes on the host are copied there first (rows on another device than the CPU;
/// tests stage them on the CPU too, where it changes nothing).
fn forward_rows(
    x: &Tensor,
    w: &LayerWeights,
    moe: MoeSpec,
    selection_bias: Option<&[f32]>,
    stage_host_rows: bool,
) -> Result<Tensor> {
    let (routing, wanted, rows) = route_rows(x, w, moe, selection_bias)?;
    let biases = ExpertBiases::of(w)?;
    let host: OnceCell<HostRows> = OnceCell::new();
    let mut outputs: Vec<Option<Tensor>> = vec![None; wanted.len()];
    w.each_routed_expert(
        &wanted,
        &rows,
        &mut |on_host| {
            if stage_host_rows && !on_host.is_empty() {
                let staged = HostRows::stage(x, &routing, &wanted, on_host, biases.as_ref())?;
                // Told once per forward: a second call finds the rows staged and keeps them.
                let _ = host.set(staged);
            }
            Ok(())
        },
        &mut |i, expert| {
            let e = wanted[i];
            let y = match host.get().and_then(|h| h.position(i).map(|k| (h, k))) {
                Some((h, k)) => h
                    .output(
                        k,
                        &routing.rows[e],
                        &routing.weights[e],
                        expert,
                        moe.activation,
                    )?
                    .to_device(x.device())?
                    .to_dtype(x.dtype())?,
                None => {
                    let idx = Tensor::new(routing.rows[e].as_slice(), x.device())?;
                    let bias = match &biases {
                        Some(b) => Some([b.gate.get(e)?, b.up.get(e)?, b.down.get(e)?]),
                        None => None,
                    };
                    let xe = x.index_select(&idx, 0)?;
                    expert_output(&xe, expert, bias, &routing.weights[e], moe.activation)?
                }
            };
            outputs[i] = Some(y);
            Ok(())
        },
    )?;
    let mut out = x.zeros_like()?;
    for (&e, y) in wanted.iter().zip(outputs) {
        let y = y.ok_or_else(|| {
            ModelError::MissingTensor(format!("routed expert {e} was not handed out"))
        })?;
        let idx = Tensor::new(routing.rows[e].as_slice(), x.device())?;
        out = out.index_add(&idx, &y, 0)?;
    }
    if moe.shared_ff.is_some() {
        out = (out + shared_expert(x, w, moe.shared_gate)?)?;
    }
    Ok(out)
}

/// One expert's output for its rows `xe`: its gated MLP (`bias`: gate, up and down biases of
/// this expert, gpt-oss), each row scaled by its routing weight.
fn expert_output(
    xe: &Tensor,
    [gate, up, down]: &ExpertWeights,
    bias: Option<[Tensor; 3]>,
    weights: &[f32],
    activation: ExpertActivation,
) -> Result<Tensor> {
    let [mut g, mut u] = projections(&[gate, up], xe)?;
    if let Some([bg, bu, _]) = &bias {
        g = g.broadcast_add(bg)?;
        u = u.broadcast_add(bu)?;
    }
    let mut y = down.forward(&activate(&g, &u, activation)?)?;
    if let Some([_, _, bd]) = &bias {
        y = y.broadcast_add(bd)?;
    }
    let weights = Tensor::new(weights, xe.device())?
        .to_dtype(y.dtype())?
        .unsqueeze(1)?;
    Ok(y.broadcast_mul(&weights)?)
}

/// The rows of the experts computed on the host, copied there once per layer right after
/// routing (before any expert's kernels are queued, so the copy waits for nothing but the
/// router), as f32 (what ferry's CPU kernels take), with those experts' biases.
struct HostRows {
    /// The `i`s (positions in the routed experts) computed on the host, ascending.
    experts: Vec<usize>,
    /// The rows any of them takes, ascending: row `rows[j]` of the step is `x[j]`.
    rows: Vec<u32>,
    /// `[rows.len(), hidden]` on the CPU.
    x: Tensor,
    /// Gate, up and down biases of `experts[k]` at row `k` of each (gpt-oss), on the CPU.
    biases: Option<[Tensor; 3]>,
}

impl HostRows {
    /// Copies the rows of `x` the experts `on_host` (positions in `wanted`) take to the host:
    /// every row when they take all (one copy), else the union of theirs gathered first.
    fn stage(
        x: &Tensor,
        routing: &Routing,
        wanted: &[usize],
        on_host: &[usize],
        biases: Option<&ExpertBiases<'_>>,
    ) -> Result<Self> {
        let mut rows: Vec<u32> = on_host
            .iter()
            .flat_map(|&i| routing.rows[wanted[i]].iter().copied())
            .collect();
        rows.sort_unstable();
        rows.dedup();
        let taken = if rows.len() == x.dim(0)? {
            x.clone()
        } else {
            x.index_select(&Tensor::new(rows.as_slice(), x.device())?, 0)?
        };
        let host = taken.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
        let biases = match biases {
            Some(b) => {
                let ids: Vec<u32> = on_host.iter().map(|&i| wanted[i] as u32).collect();
                let ids = Tensor::new(ids.as_slice(), x.device())?;
                let to_host = |t: &Tensor| -> Result<Tensor> {
                    Ok(t.index_select(&ids, 0)?
                        .to_device(&Device::Cpu)?
                        .to_dtype(DType::F32)?)
                };
                Some([to_host(b.gate)?, to_host(b.up)?, to_host(b.down)?])
            }
            None => None,
        };
        Ok(Self {
            experts: on_host.to_vec(),
            rows,
            x: host,
            biases,
        })
    }

    /// Where routed expert `i` is among the host's, if it is one.
    fn position(&self, i: usize) -> Option<usize> {
        self.experts.binary_search(&i).ok()
    }

    /// The output (on the CPU) of host expert `k`, which takes rows `rows` of the step with
    /// routing weights `weights`.
    fn output(
        &self,
        k: usize,
        rows: &[u32],
        weights: &[f32],
        expert: &ExpertWeights,
        activation: ExpertActivation,
    ) -> Result<Tensor> {
        let at = rows
            .iter()
            .map(|r| {
                let j = self.rows.binary_search(r).map_err(|_| {
                    ModelError::MissingTensor(format!("row {r} was not copied to the host"))
                })?;
                Ok(j as u32)
            })
            .collect::<Result<Vec<u32>>>()?;
        let xe = self
            .x
            .index_select(&Tensor::new(at.as_slice(), &Device::Cpu)?, 0)?;
        let bias = match &self.biases {
            Some([g, u, d]) => Some([g.get(k)?, u.get(k)?, d.get(k)?]),
            None => None,
        };
        expert_output(&xe, expert, bias, weights, activation)
    }
}

/// A layer's stacked expert biases (gpt-oss), `[n_experts, width]` each.
struct ExpertBiases<'a> {
    gate: &'a Tensor,
    up: &'a Tensor,
    down: &'a Tensor,
}

impl<'a> ExpertBiases<'a> {
    /// Layer `w`'s expert biases: all three or none.
    fn of(w: &'a LayerWeights) -> Result<Option<Self>> {
        match w.opt_vector(Part::ExpGateBias) {
            None => Ok(None),
            Some(gate) => Ok(Some(Self {
                gate,
                up: w.vector(Part::ExpUpBias)?,
                down: w.vector(Part::ExpDownBias)?,
            })),
        }
    }
}

/// The gated activation of an expert's gate `g` and up `u` projections.
fn activate(g: &Tensor, u: &Tensor, activation: ExpertActivation) -> Result<Tensor> {
    Ok(match activation {
        ExpertActivation::Swiglu => (candle_nn::ops::silu(g)? * u)?,
        ExpertActivation::ClampedSwiglu => {
            let g = g.minimum(CLAMP_LIMIT)?;
            let u = u.clamp(-CLAMP_LIMIT, CLAMP_LIMIT)?;
            let glu = (&g * candle_nn::ops::sigmoid(&(&g * CLAMP_ALPHA)?)?)?;
            (glu * (u + 1.0)?)?
        }
    })
}

/// The shared expert of layer `w` on rows `x` (`[rows, hidden]`): its SwiGLU, scaled per row
/// by `sigmoid(x . gate_inp)` when `gated`.
fn shared_expert(x: &Tensor, w: &LayerWeights, gated: bool) -> Result<Tensor> {
    let [g, u] = projections(&[w.linear(Part::ShexpGate)?, w.linear(Part::ShexpUp)?], x)?;
    let y = w
        .linear(Part::ShexpDown)?
        .forward(&(candle_nn::ops::silu(&g)? * u)?)?;
    if !gated {
        return Ok(y);
    }
    let gate_inp = w.vector(Part::ShexpGateInp)?.to_dtype(x.dtype())?;
    let gate = x.broadcast_mul(&gate_inp)?.sum_keepdim(1)?;
    Ok(y.broadcast_mul(&candle_nn::ops::sigmoid(&gate)?)?)
}

/// Pre-gating: before layer `w`'s attention runs, its router applied to `normed` (the hidden
/// state entering the layer, through the layer's FFN norm) predicts the experts its MoE will
/// route to, and the layer's expert source may start copying them
/// ([`LayerWeights::predict_experts`]). Only a hint: the real routing after attention
/// decides; a wrong guess costs a copy, never a different result.
pub fn pregate(
    normed: &Tensor,
    w: &LayerWeights,
    moe: MoeSpec,
    selection_bias: Option<&[f32]>,
) -> Result<()> {
    let hidden = *normed.dims().last().unwrap_or(&0);
    let x = normed.reshape(((), hidden))?;
    let (_, wanted, rows) = route_rows(&x, w, moe, selection_bias)?;
    w.predict_experts(&wanted, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_takes_the_top_k_and_renormalises() {
        let moe = MoeSpec {
            n_experts: 4,
            n_used: 2,
            expert_ff: 1,
            norm_topk: true,
            ..MoeSpec::plain()
        };
        // Logits whose softmax is [0.1, 0.4, 0.2, 0.3] and a uniform row.
        let probs = [vec![0.1f32, 0.4, 0.2, 0.3], vec![0.25, 0.25, 0.25, 0.25]];
        let logits: Vec<Vec<f32>> = probs
            .iter()
            .map(|p| p.iter().map(|x| x.ln()).collect())
            .collect();
        let r = route(&logits, moe, None);
        assert_eq!(r.rows, vec![vec![1], vec![0, 1], vec![], vec![0]]);
        assert!((r.weights[1][0] - 0.4 / 0.7).abs() < 1e-6);
        assert!((r.weights[3][0] - 0.3 / 0.7).abs() < 1e-6);
        assert!((r.weights[0][0] - 0.5).abs() < 1e-6);
        let raw = route(
            &logits,
            MoeSpec {
                norm_topk: false,
                ..moe
            },
            None,
        );
        assert!((raw.weights[1][0] - 0.4).abs() < 1e-6);
        assert!((raw.weights[1][1] - 0.25).abs() < 1e-6);
    }

    #[test]
    fn softmax_of_top_k_weighs_the_chosen_logits_only() {
        let moe = MoeSpec {
            n_experts: 4,
            n_used: 2,
            expert_ff: 1,
            norm_topk: false,
            gating: Gating::SoftmaxOfTopK,
            activation: ExpertActivation::ClampedSwiglu,
            ..MoeSpec::plain()
        };
        // Top two logits 3 and 1: weights softmax([3, 1]), whatever the others are.
        let r = route(&[vec![1.0, -5.0, 3.0, 0.5]], moe, None);
        assert_eq!(r.rows, vec![vec![0], vec![], vec![0], vec![]]);
        let e = (2f32).exp();
        assert!((r.weights[2][0] - e / (1.0 + e)).abs() < 1e-6);
        assert!((r.weights[0][0] - 1.0 / (1.0 + e)).abs() < 1e-6);
    }

    #[test]
    fn sigmoid_routing_chooses_with_the_bias_and_weighs_without_it() {
        let moe = MoeSpec {
            n_experts: 4,
            n_used: 2,
            expert_ff: 1,
            norm_topk: true,
            gating: Gating::Sigmoid,
            selection_bias: true,
            weights_scale: 2.5,
            ..MoeSpec::plain()
        };
        let logits = [vec![2.0f32, 1.0, 0.0, -1.0]];
        // Without the bias experts 0 and 1 win; the bias lifts 3 past 1.
        let bias = [0.0f32, 0.0, 0.0, 0.9];
        let r = route(&logits, moe, Some(&bias));
        assert_eq!(r.rows, vec![vec![0], vec![], vec![], vec![0]]);
        let (s0, s3) = (sigmoid(2.0), sigmoid(-1.0));
        assert!((r.weights[0][0] - 2.5 * s0 / (s0 + s3)).abs() < 1e-6);
        assert!((r.weights[3][0] - 2.5 * s3 / (s0 + s3)).abs() < 1e-6);
        let plain = route(&logits, moe, None);
        assert_eq!(plain.rows, vec![vec![0], vec![0], vec![], vec![]]);
    }

    #[test]
    fn grouped_selection_keeps_to_the_best_groups() {
        let moe = MoeSpec {
            n_experts: 6,
            n_used: 2,
            expert_ff: 1,
            gating: Gating::Sigmoid,
            groups: ExpertGroups { count: 3, used: 1 },
            ..MoeSpec::plain()
        };
        // Groups {0,1}, {2,3}, {4,5}: the best single expert (0) is in a group whose two best
        // sum lowest, so the top two come from the group {4, 5}.
        let logits = [vec![3.0f32, -3.0, 0.5, 0.4, 1.0, 0.9]];
        let r = route(&logits, moe, None);
        let chosen: Vec<usize> = (0..6).filter(|&e| !r.rows[e].is_empty()).collect();
        assert_eq!(chosen, vec![4, 5]);
        let ungrouped = route(
            &logits,
            MoeSpec {
                groups: ExpertGroups::NONE,
                ..moe
            },
            None,
        );
        let chosen: Vec<usize> = (0..6).filter(|&e| !ungrouped.rows[e].is_empty()).collect();
        assert_eq!(chosen, vec![0, 4]);
    }

    /// Dense experts handed out by a source that says some of them are computed on the host.
    #[derive(Debug)]
    struct SaysHost {
        experts: Vec<ExpertWeights>,
        /// Which expert indices it reports as host-computed.
        host: Vec<usize>,
        /// The `on_host` it reported in the last forward.
        told: std::sync::Mutex<Vec<Vec<usize>>>,
    }

    impl crate::weights::RoutedExperts for SaysHost {
        fn experts(&self, wanted: &[usize], _rows: &[usize]) -> Result<Vec<ExpertWeights>> {
            Ok(wanted.iter().map(|&e| self.experts[e].clone()).collect())
        }

        fn each_expert(
            &self,
            wanted: &[usize],
            rows: &[usize],
            on_host: &mut dyn FnMut(&[usize]) -> Result<()>,
            each: &mut dyn FnMut(usize, &ExpertWeights) -> Result<()>,
        ) -> Result<()> {
            let experts = self.experts(wanted, rows)?;
            let is: Vec<usize> = (0..wanted.len())
                .filter(|&i| self.host.contains(&wanted[i]))
                .collect();
            self.told.lock().unwrap().push(is.clone());
            on_host(&is)?;
            // Host ones last, as the CUDA store hands them out.
            let (host, device): (Vec<usize>, Vec<usize>) =
                (0..wanted.len()).partition(|i| is.contains(i));
            for i in device.into_iter().chain(host) {
                each(i, &experts[i])?;
            }
            Ok(())
        }
    }

    fn dense(rows: usize, cols: usize, seed: usize) -> crate::weights::Linear {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| (((i + seed) * 7919) % 2001) as f32 / 2000.0 - 0.5)
            .collect();
        crate::weights::Linear::Dense {
            weight: Tensor::from_vec(values, (rows, cols), &candle_core::Device::Cpu).unwrap(),
            bias: None,
        }
    }

    /// The rows of host-computed experts staged on the host (what CUDA does) give exactly the
    /// output computed where the rows are, whichever experts the source computes on the host:
    /// the union of their rows is gathered once and each expert finds its rows in it.
    #[test]
    fn staging_host_experts_rows_changes_nothing() {
        let (hidden, ff, n) = (8, 6, 4);
        let moe = MoeSpec {
            n_experts: n,
            n_used: 2,
            expert_ff: ff,
            norm_topk: true,
            ..MoeSpec::plain()
        };
        let experts: Vec<ExpertWeights> = (0..n)
            .map(|e| {
                [
                    dense(ff, hidden, 3 * e),
                    dense(ff, hidden, 3 * e + 1),
                    dense(hidden, ff, 3 * e + 2),
                ]
            })
            .collect();
        let x = Tensor::from_vec(
            (0..5 * hidden)
                .map(|i| ((i * 37) % 23) as f32 / 11.0 - 1.0)
                .collect::<Vec<f32>>(),
            (5, hidden),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let router = dense(n, hidden, 99);
        for host in [vec![], vec![1], vec![0, 2], vec![0, 1, 2, 3]] {
            let source = std::sync::Arc::new(SaysHost {
                experts: experts.clone(),
                host: host.clone(),
                told: Default::default(),
            });
            let w = LayerWeights::assemble(
                &[Part::Router],
                |_, _| Ok::<_, ModelError>(router.clone()),
                |_| unreachable!("no vectors"),
            )
            .unwrap()
            .with_routed(source.clone());
            let here: Vec<Vec<f32>> = forward_rows(&x, &w, moe, None, false)
                .unwrap()
                .to_vec2()
                .unwrap();
            let staged: Vec<Vec<f32>> = forward_rows(&x, &w, moe, None, true)
                .unwrap()
                .to_vec2()
                .unwrap();
            assert_eq!(here, staged, "host experts {host:?}");
            assert!(here.iter().flatten().any(|v| *v != 0.0));
            let told = source.told.lock().unwrap();
            assert_eq!(told.len(), 2, "told once per forward");
            if !host.is_empty() {
                assert!(
                    !told[1].is_empty(),
                    "some routed expert is a host one: {host:?}"
                );
            }
        }
    }

    #[test]
    fn the_clamped_swiglu_clamps_gate_and_up() {
        let g = Tensor::new(&[[0.5f32, 10.0, -3.0]], &candle_core::Device::Cpu).unwrap();
        let u = Tensor::new(&[[1.0f32, 20.0, -9.0]], &candle_core::Device::Cpu).unwrap();
        let y: Vec<f32> = activate(&g, &u, ExpertActivation::ClampedSwiglu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let glu = |x: f32| x / (1.0 + (-1.702 * x).exp());
        let expected = [glu(0.5) * 2.0, glu(7.0) * 8.0, glu(-3.0) * -6.0];
        for (a, b) in y.iter().zip(expected) {
            assert!((a - b).abs() < 1e-5, "{y:?} vs {expected:?}");
        }
    }
}
