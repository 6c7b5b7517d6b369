//! What a checkpoint's weights are once loaded, for the start log: per held type and use, how
//! many tensors and bytes, and what multiplies them (ferry's CPU kernels and the instruction
//! sets they run with, candle's quantized matmul, or a dense matmul), decided by the same
//! [`Holding`] and kernel rule ([`runs_on_ferry_kernels`]) the loader follows. A Q4_K_M file on
//! the CPU is `q4_k` and `q6_k` matrices on ferry's kernels plus `f32` norms, while the compute
//! dtype (activations, dense weights) stays `f32`.

use candle_core::Device;

use super::holding::{Holding, Role, TensorKind};
use crate::checkpoint::Checkpoint;
use crate::cpu_qmatmul::CpuQMatMul;
use crate::error::Result;
use crate::tensors::TensorRecord;
use crate::weights::runs_on_ferry_kernels;

/// Tensors held alike and multiplied by the same code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightGroup {
    /// The held type: a GGUF block type (`q4_k`) or a dense dtype (`f32`).
    pub held: String,
    /// `matrices` (projections, head, embedding) or `vectors` (norms, biases).
    pub role: &'static str,
    /// What multiplies them: `ferry CPU kernels (avx2)`, `candle QMatMul`, `dense matmul`, or
    /// `elementwise` for vectors.
    pub kernels: String,
    /// How many tensors.
    pub tensors: usize,
    /// Their bytes as held.
    pub bytes: u64,
}

/// The groups of `checkpoint`'s tensors as `holding` holds them on `device`, largest first.
pub fn weight_groups(
    checkpoint: &Checkpoint,
    holding: &Holding,
    device: &Device,
) -> Result<Vec<WeightGroup>> {
    let table = checkpoint.tensors();
    let mut tensors: Vec<(Role, &TensorRecord)> = vec![
        (Role::Embedding, &table.embedding),
        (Role::Vector, &table.final_norm),
    ];
    if let Some(head) = &table.head {
        tensors.push((Role::Matrix, head));
    }
    for layer in &table.layers {
        for (part, record) in &layer.tensors {
            let role = if part.is_matrix() {
                Role::Matrix
            } else {
                Role::Vector
            };
            tensors.push((role, record));
        }
    }
    let mut groups: Vec<WeightGroup> = Vec::new();
    for (role, record) in tensors {
        let kind = holding.kind(role, record)?;
        let bytes = Holding::bytes(kind, record) as u64;
        let (held, kernels) = match kind {
            TensorKind::Blocks(ty) if runs_on_ferry_kernels(ty, device.is_cpu()) => (
                ty.name().to_ascii_lowercase(),
                format!(
                    "ferry CPU kernels ({})",
                    CpuQMatMul::instruction_sets(ty).unwrap_or("scalar")
                ),
            ),
            TensorKind::Blocks(ty) => (ty.name().to_ascii_lowercase(), "candle QMatMul".into()),
            TensorKind::Dense(dtype) if role == Role::Vector => {
                (dtype.as_str().to_owned(), "elementwise".into())
            }
            TensorKind::Dense(dtype) => (dtype.as_str().to_owned(), "dense matmul".into()),
        };
        let role = if role == Role::Vector {
            "vectors"
        } else {
            "matrices"
        };
        match groups
            .iter_mut()
            .find(|g| g.held == held && g.role == role && g.kernels == kernels)
        {
            Some(group) => {
                group.tensors += 1;
                group.bytes += bytes;
            }
            None => groups.push(WeightGroup {
                held,
                role,
                kernels,
                tensors: 1,
                bytes,
            }),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.bytes));
    Ok(groups)
}
