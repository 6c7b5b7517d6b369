//! Weight containers: [`Linear`] (dense or GGUF-quantized), [`LayerWeights`] (one decoder
//! layer, by [`Part`]) and [`FixedWeights`] (embedding, final norm, head).
//!
//! These types only hold tensors; they never decide where the tensors live. Every field is a
//! reference-counted handle, so cloning a [`LayerWeights`] is cheap and the offload engine can
//! hand out slot-backed copies without moving data.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::cpu_qmatmul::{self, Blocks, CpuQMatMul, Kernel};
use super::error::{ModelError, Result};
use super::header::GgufType;
use super::tensors::Part;
use ferry_config::CpuQmatmul;

/// Whether `device.cpu_qmatmul = "candle"` asked for candle's kernels on the CPU.
static CANDLE_FORCED: AtomicBool = AtomicBool::new(false);

/// Sets the process-wide choice of CPU kernels for quantized weights (`device.cpu_qmatmul`,
/// `FERRY_CPU_QMATMUL`) that [`Linear::quantized`] reads, and the instruction sets ferry's
/// kernels are held to ([`cpu_qmatmul::set_process_kernel`]: `avx2` runs the AVX2-only path
/// on any CPU that has AVX2). The binary sets it once, before any model loads; the default is
/// [`CpuQmatmul::Auto`].
pub fn set_cpu_qmatmul(choice: CpuQmatmul) {
    CANDLE_FORCED.store(choice == CpuQmatmul::Candle, Ordering::Relaxed);
    cpu_qmatmul::set_process_kernel(match choice {
        CpuQmatmul::Auto | CpuQmatmul::Candle => Kernel::Auto,
        CpuQmatmul::Avx512 => Kernel::Avx512,
        CpuQmatmul::AvxVnni => Kernel::AvxVnni,
        CpuQmatmul::Avx2 => Kernel::Avx2,
        CpuQmatmul::Scalar => Kernel::Scalar,
    });
}

/// Whether a quantized matrix of `ty` (on the CPU when `on_cpu`) is multiplied by ferry's
/// kernels ([`CpuQMatMul`]) rather than candle's `QMatMul`: on the CPU, for the types they
/// support, unless `device.cpu_qmatmul = "candle"` and candle has the type.
pub fn runs_on_ferry_kernels(ty: GgufType, on_cpu: bool) -> bool {
    let candle_forced = CANDLE_FORCED.load(Ordering::Relaxed) && ty.to_candle().is_some();
    on_cpu && CpuQMatMul::supports(ty) && !candle_forced
}

/// A linear projection `y = x W^T + b`, with `W` stored as `[out, in]`.
#[derive(Debug, Clone)]
pub enum Linear {
    /// Dense weight in the model's compute dtype.
    Dense {
        /// `[out, in]`.
        weight: Tensor,
        /// `[out]`, if the checkpoint has one.
        bias: Option<Tensor>,
    },
    /// GGUF block-quantized weight, multiplied through candle's quantized matmul.
    Quantized {
        /// The quantized `[out, in]` matrix.
        weight: Arc<QMatMul>,
        /// `[out]` bias (dense f32), if the checkpoint has one.
        bias: Option<Tensor>,
    },
    /// GGUF block-quantized weight on the CPU, multiplied by ferry's SIMD kernels
    /// ([`CpuQMatMul`]: Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4) over the raw blocks (a
    /// view of the mapped file when loaded from one).
    CpuQuantized {
        /// The quantized `[out, in]` matrix.
        weight: CpuQMatMul,
        /// `[out]` bias (dense f32), if the checkpoint has one.
        bias: Option<Tensor>,
    },
}

impl Linear {
    /// A quantized linear layer: ferry's CPU kernels ([`CpuQMatMul`]) where they apply (the
    /// types [`CpuQMatMul::supports`], on the CPU), else candle's `QMatMul` (every CUDA weight,
    /// other formats).
    /// `device.cpu_qmatmul = "candle"` ([`set_cpu_qmatmul`]) keeps candle's kernels on the CPU
    /// too, for comparisons.
    pub fn quantized(weight: Arc<QTensor>, bias: Option<Tensor>) -> Result<Self> {
        let ty = GgufType::from_candle(weight.dtype());
        if runs_on_ferry_kernels(ty, weight.device().is_cpu()) {
            return Ok(Linear::CpuQuantized {
                weight: CpuQMatMul::new(weight)?,
                bias,
            });
        }
        Ok(Linear::Quantized {
            weight: Arc::new(QMatMul::from_arc(weight)?),
            bias,
        })
    }

    /// A quantized linear layer on the CPU over raw GGUF blocks (the loader's views of the
    /// file): ferry's kernels where they apply, used in place; otherwise (or with
    /// `device.cpu_qmatmul = "candle"`, for a type candle has) candle's `QMatMul` over a copy of
    /// the blocks, which candle's kernels need in storage of their own.
    pub fn from_blocks(weight: Blocks, bias: Option<Tensor>) -> Result<Self> {
        if runs_on_ferry_kernels(weight.ty(), true) {
            return Ok(Linear::CpuQuantized {
                weight: CpuQMatMul::from_blocks(weight)?,
                bias,
            });
        }
        let copy = Arc::new(weight.to_qtensor(&Device::Cpu)?);
        Ok(Linear::Quantized {
            weight: Arc::new(QMatMul::from_arc(copy)?),
            bias,
        })
    }

    /// A CPU-quantized layer with its weight's panel layout made where the process's
    /// kernels read it ([`CpuQMatMul::with_panels`]); any other layer as it is.
    pub fn with_panels(self) -> Self {
        match self {
            Linear::CpuQuantized { weight, bias } => Linear::CpuQuantized {
                weight: weight.with_panels(),
                bias,
            },
            other => other,
        }
    }

    /// Applies the projection to `x` of shape `[.., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match self {
            Linear::Dense { weight, .. } => {
                let dims = x.dims();
                let (in_dim, lead) = match dims.split_last() {
                    Some((last, lead)) => (*last, lead.to_vec()),
                    None => {
                        return Err(candle_core::Error::Msg("linear: scalar input".into()).into())
                    }
                };
                let rows: usize = lead.iter().product();
                let x = x.reshape((rows, in_dim))?;
                // A few f32 rows on the CPU: each row alike whatever the rows beside it.
                let y = match crate::dense_rows::project(&x, weight)? {
                    Some(y) => y,
                    None => x.matmul(&weight.t()?)?,
                };
                let mut out = lead;
                out.push(weight.dim(0)?);
                y.reshape(out)?
            }
            Linear::Quantized { weight, .. } => weight.forward(&x.contiguous()?)?,
            Linear::CpuQuantized { weight, .. } => weight.forward(x)?,
        };
        match self.bias() {
            Some(b) => Ok(y.broadcast_add(b)?),
            None => Ok(y),
        }
    }

    /// Applies several projections to the same input `x`. When all of them run on ferry's CPU
    /// kernels they share one parallel pass ([`CpuQMatMul::forward_many`]); otherwise each runs
    /// on its own. Either way result `i` equals `linears[i].forward(x)`.
    pub fn forward_many(linears: &[&Linear], x: &Tensor) -> Result<Vec<Tensor>> {
        let cpu: Option<Vec<&CpuQMatMul>> = linears
            .iter()
            .map(|l| match l {
                Linear::CpuQuantized { weight, .. } => Some(weight),
                _ => None,
            })
            .collect();
        let Some(mats) = cpu.filter(|mats| mats.len() > 1) else {
            return linears.iter().map(|l| l.forward(x)).collect();
        };
        let ys = CpuQMatMul::forward_many(&mats, x, cpu_qmatmul::process_kernel())?;
        linears
            .iter()
            .zip(ys)
            .map(|(l, y)| match l.bias() {
                Some(b) => Ok(y.broadcast_add(b)?),
                None => Ok(y),
            })
            .collect()
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense { bias, .. }
            | Linear::Quantized { bias, .. }
            | Linear::CpuQuantized { bias, .. } => bias.as_ref(),
        }
    }

    /// Output features (rows of the weight).
    pub fn out_features(&self) -> Result<usize> {
        match self {
            Linear::Dense { weight, .. } => Ok(weight.dim(0)?),
            Linear::Quantized { weight, .. } => match weight.as_ref() {
                QMatMul::QTensor(q) => Ok(q.shape().dims2()?.0),
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => Ok(t.dim(0)?),
            },
            Linear::CpuQuantized { weight, .. } => Ok(weight.out_features()),
        }
    }

    /// Bytes held by the weight and bias (quantized weights count their packed size).
    pub fn size_in_bytes(&self) -> usize {
        let (w, b) = match self {
            Linear::Dense { weight, bias } => (tensor_bytes(weight), bias.as_ref()),
            Linear::Quantized { weight, bias } => {
                let w = match weight.as_ref() {
                    QMatMul::QTensor(q) => q.storage_size_in_bytes(),
                    QMatMul::Tensor(t) | QMatMul::TensorF16(t) => tensor_bytes(t),
                };
                (w, bias.as_ref())
            }
            Linear::CpuQuantized { weight, bias } => (weight.weight().len(), bias.as_ref()),
        };
        w + b.map_or(0, tensor_bytes)
    }
}

/// The token embedding table, dense or quantized (rows are dequantized on lookup).
#[derive(Debug, Clone)]
pub enum Embedding {
    /// `[vocab, hidden]` in the compute dtype.
    Dense(Tensor),
    /// `[vocab, hidden]` GGUF-quantized candle tensor (on CUDA); lookups produce f32 rows.
    Quantized(Arc<QTensor>),
    /// `[vocab, hidden]` raw GGUF blocks on the CPU (a view of the mapped file, shared with a
    /// tied head); lookups dequantize only the rows asked for, as f32.
    Blocks(Blocks),
}

impl Embedding {
    /// Looks up `ids` (u32, any shape) and returns `[.., hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Embedding::Dense(table) => {
                let mut dims = ids.dims().to_vec();
                dims.push(table.dim(1)?);
                Ok(table.index_select(&ids.flatten_all()?, 0)?.reshape(dims)?)
            }
            Embedding::Quantized(q) => Ok(q.embedding(ids)?),
            Embedding::Blocks(b) => {
                let mut dims = ids.dims().to_vec();
                dims.push(b.cols());
                let ids = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1::<u32>()?;
                let mut rows = vec![0f32; ids.len() * b.cols()];
                b.dequantize_rows(&ids, &mut rows)?;
                Ok(Tensor::from_vec(rows, dims, &Device::Cpu)?)
            }
        }
    }

    /// Bytes held by the table.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Embedding::Dense(t) => tensor_bytes(t),
            Embedding::Quantized(q) => q.storage_size_in_bytes(),
            Embedding::Blocks(b) => b.len(),
        }
    }
}

/// One tensor of a decoder layer: a projection (with its bias folded in) or a vector (a norm
/// weight).
#[derive(Debug, Clone)]
pub enum LayerTensor {
    /// A projection matrix and its bias, if any.
    Linear(Linear),
    /// A norm weight, dense in the compute dtype.
    Vector(Tensor),
}

/// The weights of one decoder layer, by [`Part`]: whatever the family's layer has (the tensor
/// table decides which parts that is). A block asks for the parts it uses
/// ([`LayerWeights::linear`], [`LayerWeights::vector`]).
#[derive(Debug, Clone)]
pub struct LayerWeights {
    parts: Vec<(Part, LayerTensor)>,
    /// Where a MoE layer's experts come from when the layer does not hold them itself (the
    /// offload engine's expert store); `None`: the experts are parts of the layer.
    routed: Option<Arc<dyn RoutedExperts>>,
}

/// One MoE expert's `[gate, up, down]` projections (cheap handles: cloning copies no weight).
pub type ExpertWeights = [Linear; 3];

/// The experts of one MoE layer, handed out after the router ran: the MoE forward asks for the
/// experts the step's rows were routed to, and the source decides where each one comes from
/// (resident, copied into a device slot, or computed from its host slab). A layer built with
/// [`LayerWeights::with_routed`] asks it instead of reading its own expert parts.
pub trait RoutedExperts: fmt::Debug + Send + Sync {
    /// The weights of experts `wanted` (ascending expert indices), in that order; `rows[i]` is
    /// the number of the step's rows routed to `wanted[i]` (what a per-expert tier decides by).
    fn experts(&self, wanted: &[usize], rows: &[usize]) -> Result<Vec<ExpertWeights>>;

    /// [`RoutedExperts::experts`] handed out one by one as each becomes available:
    /// `each(i, weights of wanted[i])` once per `i`, in any order (a source that copies
    /// experts hands out the ones already on the device first, so their compute overlaps the
    /// copies). Before the first `each`, `on_host(is)` once with the `i`s whose weights are
    /// handed out on the host (computed by the CPU where they live) rather than on the compute
    /// device, ascending (empty when none are): where the rows are on another device, the MoE
    /// forward moves those experts' rows to the host then, before any expert computes.
    fn each_expert(
        &self,
        wanted: &[usize],
        rows: &[usize],
        on_host: &mut dyn FnMut(&[usize]) -> Result<()>,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> Result<()>,
    ) -> Result<()> {
        let experts = self.experts(wanted, rows)?;
        on_host(&[])?;
        for (i, w) in experts.iter().enumerate() {
            each(i, w)?;
        }
        Ok(())
    }

    /// Whether the source takes predictions ([`RoutedExperts::predict`]); computing one costs
    /// a router pass, so the MoE forward asks first.
    fn predicts(&self) -> bool {
        false
    }

    /// A prediction of the experts this layer's step will ask for (`rows[i]` rows for
    /// `wanted[i]`), made before its attention runs, so their copies can start early. Only a
    /// hint: what [`RoutedExperts::experts`] is asked for decides.
    fn predict(&self, wanted: &[usize], rows: &[usize]) -> Result<()> {
        let _ = (wanted, rows);
        Ok(())
    }
}

impl LayerWeights {
    /// The weights of a layer that has `parts` (in table order; expert parts once per
    /// expert): every matrix through `linear(its position, its bias's position if the layer
    /// has one)`, every other non-bias part through `vector(its position)`. The loader and the
    /// offload engine's slots both assemble layers here, so a streamed layer holds exactly what
    /// a resident one does.
    pub fn assemble<E>(
        parts: &[Part],
        mut linear: impl FnMut(usize, Option<usize>) -> std::result::Result<Linear, E>,
        mut vector: impl FnMut(usize) -> std::result::Result<Tensor, E>,
    ) -> std::result::Result<Self, E> {
        let mut out = Vec::with_capacity(parts.len());
        for (i, &part) in parts.iter().enumerate() {
            if part.is_matrix() {
                let bias = part.bias().and_then(|b| parts.iter().position(|p| *p == b));
                out.push((part, LayerTensor::Linear(linear(i, bias)?)));
            } else if !part.is_bias() {
                out.push((part, LayerTensor::Vector(vector(i)?)));
            }
        }
        Ok(Self {
            parts: out,
            routed: None,
        })
    }

    /// This layer asking `routed` for its experts ([`LayerWeights::routed_experts`]).
    pub fn with_routed(mut self, routed: Arc<dyn RoutedExperts>) -> Self {
        self.routed = Some(routed);
        self
    }

    /// Removes the expert parts from the layer and returns them, in expert order (the offload
    /// engine places them one by one).
    pub fn take_experts(&mut self) -> Vec<ExpertWeights> {
        let experts = self
            .experts()
            .into_iter()
            .map(|e| e.map(Linear::clone))
            .collect();
        self.parts.retain(|(p, _)| !p.is_expert());
        experts
    }

    /// The weights of experts `wanted` (ascending), `rows[i]` rows routed to `wanted[i]`: from
    /// the layer's routed source if it has one, else its own expert parts.
    pub fn routed_experts(&self, wanted: &[usize], rows: &[usize]) -> Result<Vec<ExpertWeights>> {
        if let Some(routed) = &self.routed {
            return routed.experts(wanted, rows);
        }
        let own = self.experts();
        wanted
            .iter()
            .map(|&e| {
                own.get(e).map(|x| x.map(Linear::clone)).ok_or_else(|| {
                    ModelError::MissingTensor(format!("expert {e} of {}", own.len()))
                })
            })
            .collect()
    }

    /// [`LayerWeights::routed_experts`] one by one as each becomes available, `on_host`
    /// told first which are computed on the host ([`RoutedExperts::each_expert`]; a layer's
    /// own experts are where the layer is: none).
    pub fn each_routed_expert(
        &self,
        wanted: &[usize],
        rows: &[usize],
        on_host: &mut dyn FnMut(&[usize]) -> Result<()>,
        each: &mut dyn FnMut(usize, &ExpertWeights) -> Result<()>,
    ) -> Result<()> {
        match &self.routed {
            Some(routed) => routed.each_expert(wanted, rows, on_host, each),
            None => {
                let experts = self.routed_experts(wanted, rows)?;
                on_host(&[])?;
                for (i, w) in experts.iter().enumerate() {
                    each(i, w)?;
                }
                Ok(())
            }
        }
    }

    /// Whether the layer's expert source takes predictions ([`RoutedExperts::predicts`]).
    pub fn predicts_experts(&self) -> bool {
        self.routed.as_ref().is_some_and(|r| r.predicts())
    }

    /// Passes a prediction of this layer's routed experts to its source
    /// ([`RoutedExperts::predict`]).
    pub fn predict_experts(&self, wanted: &[usize], rows: &[usize]) -> Result<()> {
        match &self.routed {
            Some(routed) => routed.predict(wanted, rows),
            None => Ok(()),
        }
    }

    /// The experts' `[gate, up, down]`, in expert order (empty for a dense layer).
    pub fn experts(&self) -> Vec<[&Linear; 3]> {
        let linears: Vec<&Linear> = self
            .parts
            .iter()
            .filter(|(p, _)| p.is_expert())
            .filter_map(|(_, t)| match t {
                LayerTensor::Linear(l) => Some(l),
                LayerTensor::Vector(_) => None,
            })
            .collect();
        linears
            .chunks_exact(3)
            .map(|c| [c[0], c[1], c[2]])
            .collect()
    }

    fn get(&self, part: Part) -> Option<&LayerTensor> {
        self.parts.iter().find(|(p, _)| *p == part).map(|(_, t)| t)
    }

    /// The projection `part`, or [`ModelError::MissingTensor`].
    pub fn linear(&self, part: Part) -> Result<&Linear> {
        match self.get(part) {
            Some(LayerTensor::Linear(l)) => Ok(l),
            _ => Err(ModelError::MissingTensor(format!("layer part {part:?}"))),
        }
    }

    /// Every projection of `part`, in table order: one per head for a per-head part
    /// ([`Part::is_per_head`]), else the one (none when the layer lacks it).
    pub fn linears(&self, part: Part) -> Vec<&Linear> {
        self.parts
            .iter()
            .filter(|(p, _)| *p == part)
            .filter_map(|(_, t)| match t {
                LayerTensor::Linear(l) => Some(l),
                LayerTensor::Vector(_) => None,
            })
            .collect()
    }

    /// The vector `part` (a norm weight), if the layer has it.
    pub fn opt_vector(&self, part: Part) -> Option<&Tensor> {
        match self.get(part) {
            Some(LayerTensor::Vector(t)) => Some(t),
            _ => None,
        }
    }

    /// The vector `part`, or [`ModelError::MissingTensor`].
    pub fn vector(&self, part: Part) -> Result<&Tensor> {
        self.opt_vector(part)
            .ok_or_else(|| ModelError::MissingTensor(format!("layer part {part:?}")))
    }

    /// Bytes held by this layer's tensors.
    pub fn size_in_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|(_, t)| match t {
                LayerTensor::Linear(l) => l.size_in_bytes(),
                LayerTensor::Vector(v) => tensor_bytes(v),
            })
            .sum()
    }
}

/// The parts of the model that are not per layer.
#[derive(Debug, Clone)]
pub struct FixedWeights {
    /// Token embedding.
    pub embedding: Embedding,
    /// RMSNorm weight after the last layer, `[hidden]`.
    pub final_norm: Tensor,
    /// Output head `[vocab, hidden]`; shares storage with the embedding when tied.
    pub lm_head: Linear,
}

impl FixedWeights {
    /// Bytes held, counting a tied head once.
    pub fn size_in_bytes(&self, tied: bool) -> usize {
        let head = if tied {
            0
        } else {
            self.lm_head.size_in_bytes()
        };
        self.embedding.size_in_bytes() + tensor_bytes(&self.final_norm) + head
    }
}

fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}
