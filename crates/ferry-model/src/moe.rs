//! The routed mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router scores every expert for
//! each row, the softmax's top-k experts run their SwiGLU on that row, and their outputs are
//! summed weighted by the routing probabilities (renormalised over the top k when the model
//! says so). No shared expert.
//!
//! Each expert's gate/up/down is its own unit in [`LayerWeights`] (one table record each, a
//! slice of GGUF's stacked tensors), so the offload engine can place experts one by one; the
//! layer is asked for the routed experts only after the router ran, so an expert that no row
//! of the step picked is neither touched nor fetched.
//!
//! Reference: HF transformers' `modeling_qwen3_moe.py` / `modeling_mixtral.py`,
//! cross-checked in `tests/suite/arch_families.rs` against candle-transformers' `qwen3_moe`,
//! `mixtral`, `quantized_qwen3_moe` and `quantized_llama`.

use candle_core::{DType, Tensor};

use super::decoder::block::projections;
use super::error::{ModelError, Result};
use super::spec::MoeSpec;
use super::tensors::Part;
use super::weights::LayerWeights;

/// Which experts each row goes to: per expert, its rows and their routing weights.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Routing {
    /// `rows[e]`: the rows routed to expert `e`, ascending.
    pub rows: Vec<Vec<u32>>,
    /// `weights[e][i]`: the weight of expert `e`'s output for row `rows[e][i]`.
    pub weights: Vec<Vec<f32>>,
}

/// Routes rows whose router probabilities are `probs` (`[rows][n_experts]`, a softmax): each
/// row's `moe.n_used` most probable experts (ties: lower index), weighted by their probability,
/// renormalised over the chosen ones when `moe.norm_topk`.
pub fn route(probs: &[Vec<f32>], moe: MoeSpec) -> Routing {
    let mut routing = Routing {
        rows: vec![Vec::new(); moe.n_experts],
        weights: vec![Vec::new(); moe.n_experts],
    };
    for (row, p) in probs.iter().enumerate() {
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let top = &order[..moe.n_used.min(order.len())];
        let sum: f32 = top.iter().map(|&e| p[e]).sum();
        for &e in top {
            let w = if moe.norm_topk { p[e] / sum } else { p[e] };
            routing.rows[e].push(row as u32);
            routing.weights[e].push(w);
        }
    }
    routing
}

/// The routing of `x` (`[rows, hidden]`) by layer `w`'s router: the routing, the experts
/// some row went to (ascending) and how many rows went to each.
fn route_rows(
    x: &Tensor,
    w: &LayerWeights,
    moe: MoeSpec,
) -> Result<(Routing, Vec<usize>, Vec<usize>)> {
    let logits = w.linear(Part::Router)?.forward(x)?.to_dtype(DType::F32)?;
    if logits.dim(1)? != moe.n_experts {
        return Err(ModelError::MissingTensor(format!(
            "a router over {} of {} experts",
            logits.dim(1)?,
            moe.n_experts
        )));
    }
    let probs = candle_nn::ops::softmax_last_dim(&logits)?.to_vec2::<f32>()?;
    let routing = route(&probs, moe);
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
pub fn forward(h: &Tensor, w: &LayerWeights, moe: MoeSpec) -> Result<Tensor> {
    let dims = h.dims().to_vec();
    let hidden = *dims.last().unwrap_or(&0);
    let x = h.reshape(((), hidden))?;
    let (routing, wanted, rows) = route_rows(&x, w, moe)?;
    let mut outputs: Vec<Option<Tensor>> = vec![None; wanted.len()];
    w.each_routed_expert(&wanted, &rows, &mut |i, [gate, up, down]| {
        let e = wanted[i];
        let idx = Tensor::new(routing.rows[e].as_slice(), x.device())?;
        let xe = x.index_select(&idx, 0)?;
        let [g, u] = projections(&[gate, up], &xe)?;
        let y = down.forward(&(candle_nn::ops::silu(&g)? * u)?)?;
        let weights = Tensor::new(routing.weights[e].as_slice(), x.device())?
            .to_dtype(y.dtype())?
            .unsqueeze(1)?;
        outputs[i] = Some(y.broadcast_mul(&weights)?);
        Ok(())
    })?;
    let mut out = x.zeros_like()?;
    for (&e, y) in wanted.iter().zip(outputs) {
        let y = y.ok_or_else(|| {
            ModelError::MissingTensor(format!("routed expert {e} was not handed out"))
        })?;
        let idx = Tensor::new(routing.rows[e].as_slice(), x.device())?;
        out = out.index_add(&idx, &y, 0)?;
    }
    Ok(out.reshape(dims)?)
}

/// Pre-gating: before layer `w`'s attention runs, its router applied to `normed` (the hidden
/// state entering the layer, through the layer's FFN norm) predicts the experts its MoE will
/// route to, and the layer's expert source may start copying them
/// ([`LayerWeights::predict_experts`]). Only a hint: the real routing after attention
/// decides; a wrong guess costs a copy, never a different result.
pub fn pregate(normed: &Tensor, w: &LayerWeights, moe: MoeSpec) -> Result<()> {
    let hidden = *normed.dims().last().unwrap_or(&0);
    let x = normed.reshape(((), hidden))?;
    let (_, wanted, rows) = route_rows(&x, w, moe)?;
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
        };
        let probs = vec![vec![0.1, 0.4, 0.2, 0.3], vec![0.25, 0.25, 0.25, 0.25]];
        let r = route(&probs, moe);
        assert_eq!(r.rows, vec![vec![1], vec![0, 1], vec![], vec![0]]);
        assert!((r.weights[1][0] - 0.4 / 0.7).abs() < 1e-6);
        assert!((r.weights[3][0] - 0.3 / 0.7).abs() < 1e-6);
        assert_eq!(r.weights[0], vec![0.5]);
        let raw = route(
            &probs,
            MoeSpec {
                norm_topk: false,
                ..moe
            },
        );
        assert_eq!(raw.weights[1], vec![0.4, 0.25]);
    }
}
