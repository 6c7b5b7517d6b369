//! Tests for slab and slot layouts: a Q4_K_M-shaped GGUF (attn_v / ffn_down q6_K in some layers,
//! q4_K in the others) needs CUDA slots that hold the union of its matrix buffers, and the plan
//! says so; every dense view is 256-byte aligned in slabs and slots.

use std::collections::BTreeSet;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::*;
use crate::buffer::HostMemory;
use crate::host::HostStore;
use crate::plan::{plan, PlanInput};
use crate::sizing::ModelSizes;
use crate::slot::SlotBuffers;
use ferry_config::OffloadMode;
use ferry_model::header::GgufType;
use ferry_model::loader::{DtypeChoice, LoadOptions};
use ferry_model::source::ModelFiles;

/// The dimensions of a test model.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    hidden: usize,
    inter: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
}

/// Multiples of 256, as k-quants need.
pub(crate) const K_QUANT: Dims = Dims {
    hidden: 256,
    inter: 512,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    vocab: 256,
};

/// Sizes whose tensors are not whole multiples of 256 bytes (Q8_0 blocks of 32 elements), so
/// that alignment padding shows.
const ODD: Dims = Dims {
    hidden: 96,
    inter: 160,
    heads: 3,
    kv_heads: 1,
    head_dim: 32,
    vocab: 100,
};

const LAYERS: usize = 4;
/// Layers whose attn_v and ffn_down get q6_K (llama.cpp's Q4_K_M gives more bits to a few
/// layers at both ends and every third one; two of four here).
const MORE_BITS: [usize; 2] = [0, 3];

/// The type Q4_K_M gives a tensor: q6_K for attn_v / ffn_down of [`MORE_BITS`] layers and the
/// head, q4_K for every other matrix, f32 norms.
pub(crate) fn q4_k_m(name: &str, rank: usize) -> GgmlDType {
    if rank == 1 {
        return GgmlDType::F32;
    }
    let more_bits = MORE_BITS
        .iter()
        .any(|l| name.starts_with(&format!("blk.{l}.")));
    let sensitive = name.contains("attn_v") || name.contains("ffn_down");
    if (more_bits && sensitive) || name == "output.weight" {
        GgmlDType::Q6K
    } else {
        GgmlDType::Q4K
    }
}

/// Writes a small Llama of `d` in llama.cpp layout with `types` choosing each tensor's type.
pub(crate) fn write_gguf(path: &Path, d: Dims, types: &dyn Fn(&str, usize) -> GgmlDType) {
    let (h, q, kv, i) = (
        d.hidden,
        d.heads * d.head_dim,
        d.kv_heads * d.head_dim,
        d.inter,
    );
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![d.vocab, h]),
        ("output_norm.weight".into(), vec![h]),
        ("output.weight".into(), vec![d.vocab, h]),
    ];
    for l in 0..LAYERS {
        for (name, shape) in [
            ("attn_norm.weight", vec![h]),
            ("ffn_norm.weight", vec![h]),
            ("attn_q.weight", vec![q, h]),
            ("attn_k.weight", vec![kv, h]),
            ("attn_v.weight", vec![kv, h]),
            ("attn_output.weight", vec![h, q]),
            ("ffn_gate.weight", vec![i, h]),
            ("ffn_up.weight", vec![i, h]),
            ("ffn_down.weight", vec![h, i]),
        ] {
            shapes.push((format!("blk.{l}.{name}"), shape));
        }
    }
    let tensors: Vec<(String, QTensor)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|j| ((j * 7919 + i * 104729) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let t = Tensor::from_vec(values, shape.as_slice(), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&t, types(&name, shape.len())).expect("quantize");
            (name, q)
        })
        .collect();
    let u32v = |v: usize| gguf_file::Value::U32(v as u32);
    let metadata = [
        (
            "general.architecture",
            gguf_file::Value::String("llama".into()),
        ),
        ("llama.context_length", u32v(128)),
        ("llama.embedding_length", u32v(h)),
        ("llama.feed_forward_length", u32v(i)),
        ("llama.block_count", u32v(LAYERS)),
        ("llama.attention.head_count", u32v(d.heads)),
        ("llama.attention.head_count_kv", u32v(d.kv_heads)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            gguf_file::Value::F32(1e-5),
        ),
    ];
    let meta: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).expect("create");
    gguf_file::write(&mut file, &meta, &refs).expect("write");
}

pub(crate) fn open(path: &Path) -> Checkpoint {
    Checkpoint::open(&ModelFiles::Gguf {
        path: path.to_path_buf(),
    })
    .expect("opens")
}

pub(crate) fn holding(checkpoint: &Checkpoint, dtype: DtypeChoice) -> Holding {
    let options = LoadOptions {
        device: Device::Cpu,
        dtype,
    };
    Holding::new(checkpoint, &options).expect("holding")
}

/// What a CUDA slot allocates for `layers` when it keeps one candle `QCudaStorage::zeros`
/// buffer per (part, type, shape) and one dense region as large as the largest: computed here
/// straight from the slabs' entries with candle's formula, `ceil((elems + 512) / block) * size`.
fn cuda_slot_as_candle_allocates(layers: &[&LayerLayout]) -> u64 {
    let mut seen = BTreeSet::new();
    let mut bytes = 0usize;
    for entry in layers.iter().flat_map(|l| l.entries.iter()) {
        let TensorKind::Blocks(dtype) = entry.kind else {
            continue;
        };
        if seen.insert((entry.part, format!("{dtype:?}"), entry.shape.clone())) {
            let elems: usize = entry.shape.iter().product();
            bytes += (elems + 512).div_ceil(dtype.block_size()) * dtype.type_size();
        }
    }
    let dense = layers.iter().map(|l| l.dense_len).max().unwrap_or(0);
    (bytes + dense) as u64
}

#[test]
fn cuda_slots_hold_the_union_of_a_mixed_type_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q4_k_m.gguf");
    write_gguf(&path, K_QUANT, &q4_k_m);
    let checkpoint = open(&path);
    let holding = holding(&checkpoint, DtypeChoice::Auto);
    let sizes = ModelSizes::of(&checkpoint, &holding, SlotKind::Cuda).expect("sizes");

    // Layers 1 and 2 are all q4_K, 0 and 3 carry two q6_K matrices: two layer sizes.
    let kinds =
        |l: usize| -> Vec<TensorKind> { sizes.layouts[l].entries.iter().map(|e| e.kind).collect() };
    assert!(kinds(0).contains(&TensorKind::Blocks(GgufType::Q6_K)));
    assert!(!kinds(1).contains(&TensorKind::Blocks(GgufType::Q6_K)));
    assert!(sizes.layers[0] > sizes.layers[1]);
    assert_eq!(sizes.layers[0], sizes.layers[3]);

    // Mode sequential streams every layer through three slots.
    let mut input = PlanInput::new(
        OffloadMode::Sequential,
        sizes.layers.clone(),
        sizes.fixed,
        0,
    );
    input.prefetch = 2;
    input.layer_layouts = sizes.layouts.clone();
    input.slot_kind = SlotKind::Cuda;
    let streamed: Vec<&LayerLayout> = sizes.layouts.iter().collect();
    let union = cuda_slot_as_candle_allocates(&streamed);
    input.budget_bytes = sizes.fixed + 3 * union;
    let plan = plan(&input).expect("fits");
    assert_eq!((plan.device_layers(), plan.slots), (0, 3));

    // The slot is the union, as candle would allocate it, and more than the largest layer:
    // attn_v and ffn_down each need a q4_K and a q6_K buffer.
    assert_eq!(plan.slot_bytes, union);
    let largest = *sizes.layers.iter().max().expect("layers");
    assert!(
        plan.slot_bytes > largest,
        "{} <= {largest}",
        plan.slot_bytes
    );
    let slot = plan.slot_layout.clone().expect("a slot layout");
    assert_eq!(slot.kind, SlotKind::Cuda);
    assert_eq!(slot.matrices.len(), 7 + 2);
    for part in [Part::V, Part::Down] {
        let types: Vec<GgmlDType> = slot
            .matrices
            .iter()
            .filter(|m| m.part == part)
            .map(|m| m.dtype)
            .collect();
        // First-seen order: layer 0 has the q6_K one.
        assert_eq!(types, [GgmlDType::Q6K, GgmlDType::Q4K], "{part:?}");
    }
    for m in &slot.matrices {
        assert_eq!(m.allocated, m.bytes + 512 / 256 * m.dtype.type_size());
    }

    // The host store of the streamed layers needs exactly the plan's slot, and every streamed
    // layer's every matrix has its buffer in it: the device holds the slot ring the plan counts.
    let host =
        HostStore::fill(&checkpoint, &holding, &[0, 1, 2, 3], &HostMemory::Heap).expect("slabs");
    assert_eq!(host.slot_layout(SlotKind::Cuda), slot);
    for layer in host.layers() {
        for entry in &layer.entries {
            if let TensorKind::Blocks(_) = entry.kind {
                let m = slot.matrix(entry).expect("a buffer for every matrix");
                assert!(entry.len <= m.bytes);
            } else {
                assert!(entry.offset + entry.len <= slot.dense_bytes);
            }
        }
    }
    assert_eq!(plan.device_bytes, sizes.fixed + 3 * plan.slot_bytes);
    assert_eq!(plan.device_bytes, plan.budget_bytes);

    // The largest-layer rule the planner had (still used for plain byte tables) would have
    // under-counted every slot.
    let mut by_size = input.clone();
    by_size.layer_layouts.clear();
    let naive = crate::plan::plan(&by_size).expect("fits");
    assert_eq!(naive.slot_bytes, largest);
    assert!(naive.slot_bytes < union);

    // On the CPU a slot is the largest block region plus the largest dense region.
    let cpu = SlotLayout::of(SlotKind::Cpu, streamed.iter().copied());
    assert_eq!(
        cpu.total_bytes(),
        (streamed.iter().map(|l| l.blocks_len).max().unwrap_or(0)
            + streamed.iter().map(|l| l.dense_len).max().unwrap_or(0)) as u64
    );
    assert_eq!(host.slot_regions(), (cpu.blocks_bytes, cpu.dense_bytes));
}

#[test]
fn resident_cuda_layers_count_candles_padding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q4_k_m.gguf");
    write_gguf(&path, K_QUANT, &q4_k_m);
    let checkpoint = open(&path);
    let holding = holding(&checkpoint, DtypeChoice::Auto);
    let cpu = ModelSizes::of(&checkpoint, &holding, SlotKind::Cpu).expect("sizes");
    let cuda = ModelSizes::of(&checkpoint, &holding, SlotKind::Cuda).expect("sizes");
    // Seven quantized matrices a layer, each with 512 elements of padding on CUDA.
    for (l, layout) in cpu.layouts.iter().enumerate() {
        let padding: u64 = layout
            .entries
            .iter()
            .filter_map(|e| match e.kind {
                TensorKind::Blocks(dt) => Some((512 / dt.block_size() * dt.type_size()) as u64),
                TensorKind::Dense(_) => None,
            })
            .sum();
        assert_eq!(cuda.layers[l], cpu.layers[l] + padding, "layer {l}");
        assert_eq!(cpu.layers[l], layout.weight_bytes());
    }
    // The quantized embedding and head are padded too; the f32 norm is not.
    assert_eq!(cuda.fixed, cpu.fixed + 2 * 144 + 2 * 210);
}

#[test]
fn dense_views_are_256_byte_aligned() {
    // The alignment cuBLAS picks its fastest kernels for (not TENSOR_ALIGN itself, which this
    // test checks).
    const ALIGN: usize = 256;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q8_0.gguf");
    let q8_0 = |_: &str, rank: usize| {
        if rank == 1 {
            GgmlDType::F32
        } else {
            GgmlDType::Q8_0
        }
    };
    write_gguf(&path, ODD, &q8_0);
    let checkpoint = open(&path);
    for dtype in [DtypeChoice::Auto, DtypeChoice::F16, DtypeChoice::F32] {
        let holding = holding(&checkpoint, dtype);
        let host = HostStore::fill(&checkpoint, &holding, &[0, 1, 2, 3], &HostMemory::Heap)
            .expect("slabs");
        let (blocks, dense) = host.slot_regions();
        let slot = SlotBuffers::new(blocks, dense, holding.compute(), &Device::Cpu).expect("slot");
        let mut dense_views = 0;
        let mut padded = 0;
        for layer in host.layers() {
            padded += layer.slab_bytes() - layer.weight_bytes();
            assert_eq!(layer.blocks_len % ALIGN, 0);
            assert_eq!(layer.dense_len % ALIGN, 0);
            for entry in &layer.entries {
                assert_eq!(entry.offset % ALIGN, 0, "{dtype:?} {}", entry.name);
                if let TensorKind::Dense(_) = entry.kind {
                    dense_views += 1;
                    // In the slab the dense region starts at `blocks_len`, itself aligned; in
                    // the slot the view starts `offset` bytes into the dense region.
                    assert_eq!((layer.blocks_len + entry.offset) % ALIGN, 0);
                }
            }
            // The slot views the slab's bytes: the same values at the aligned offsets.
            slot.fill(layer).expect("fill");
            let views = slot.views(layer).expect("views");
            let expected = checkpoint
                .read_dense(
                    checkpoint.tensors().layers[layer.index]
                        .get(Part::FfnNorm)
                        .expect("norm"),
                    holding.compute(),
                    &Device::Cpu,
                )
                .expect("norm");
            let diff = (views
                .vector(Part::FfnNorm)
                .expect("norm")
                .to_dtype(DType::F32)
                .expect("f32")
                - expected.to_dtype(DType::F32).expect("f32"))
            .expect("diff")
            .abs()
            .expect("abs")
            .max_all()
            .expect("max")
            .to_scalar::<f32>()
            .expect("scalar");
            assert_eq!(diff, 0.0, "{dtype:?} layer {}", layer.index);
        }
        // Auto: two norms a layer; dense dtypes: every tensor.
        let per_layer = if dtype == DtypeChoice::Auto { 2 } else { 9 };
        assert_eq!(dense_views, per_layer * LAYERS, "{dtype:?}");
        // These sizes are not multiples of 256 bytes: the alignment really pads.
        assert!(padded > 0, "{dtype:?}");
    }
}

/// The start log's weight groups of a Q4_K_M-shaped file on the CPU: its q4_K and q6_K
/// matrices on ferry's kernels, its norms f32 (the compute dtype is not what the weights are).
#[test]
fn a_q4_k_m_file_is_reported_as_its_block_types_and_their_kernels() {
    use ferry_model::loader::summary::weight_groups;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q4_k_m.gguf");
    write_gguf(&path, K_QUANT, &q4_k_m);
    let checkpoint = open(&path);
    let held = holding(&checkpoint, DtypeChoice::Auto);
    let groups = weight_groups(&checkpoint, &held, &Device::Cpu).expect("groups");
    let summary: Vec<(&str, &str, usize)> = groups
        .iter()
        .map(|g| (g.held.as_str(), g.role, g.tensors))
        .collect();
    // 4 layers x 7 matrices + embedding + head; q6_K: attn_v and ffn_down of 2 layers + head.
    let mut expected = vec![
        ("q4_k", "matrices", 25),
        ("q6_k", "matrices", 5),
        ("f32", "vectors", 9),
    ];
    expected.sort_unstable();
    let mut got = summary.clone();
    got.sort_unstable();
    assert_eq!(got, expected, "{groups:?}");
    for g in &groups {
        let want = if g.role == "vectors" {
            "elementwise"
        } else {
            "ferry CPU kernels ("
        };
        assert!(g.kernels.starts_with(want), "{g:?}");
    }
    let bytes: u64 = groups.iter().map(|g| g.bytes).sum();
    assert_eq!(
        bytes,
        ModelSizes::of(&checkpoint, &held, SlotKind::Cpu)
            .expect("sizes")
            .total()
    );
}
