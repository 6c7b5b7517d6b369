//! Tests of host slabs held in one buffer, the shape a CUDA device's pinned slabs have: an
//! expert of GGUF blocks is computed in place by the CPU kernels exactly as the CPU device's
//! slot-shaped slab computes it (the host tier on CUDA), and an expert held dense is refused.

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;
use crate::experts::experts_of;
use ferry_model::loader::{DtypeChoice, LoadOptions};
use ferry_model::source::ModelFiles;

const HIDDEN: usize = 256;
const FF: usize = 512;
const EXPERTS: usize = 4;

/// A one-layer Mixtral-shaped GGUF (llama with experts), every matrix `ty`.
fn write_moe(path: &std::path::Path, ty: GgmlDType) {
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("token_embd.weight", vec![64, HIDDEN]),
        ("output_norm.weight", vec![HIDDEN]),
        ("output.weight", vec![64, HIDDEN]),
        ("blk.0.attn_norm.weight", vec![HIDDEN]),
        ("blk.0.ffn_norm.weight", vec![HIDDEN]),
        ("blk.0.attn_q.weight", vec![HIDDEN, HIDDEN]),
        ("blk.0.attn_k.weight", vec![HIDDEN, HIDDEN]),
        ("blk.0.attn_v.weight", vec![HIDDEN, HIDDEN]),
        ("blk.0.attn_output.weight", vec![HIDDEN, HIDDEN]),
        ("blk.0.ffn_gate_inp.weight", vec![EXPERTS, HIDDEN]),
        ("blk.0.ffn_gate_exps.weight", vec![EXPERTS, FF, HIDDEN]),
        ("blk.0.ffn_up_exps.weight", vec![EXPERTS, FF, HIDDEN]),
        ("blk.0.ffn_down_exps.weight", vec![EXPERTS, HIDDEN, FF]),
    ];
    let tensors: Vec<(&str, QTensor)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|j| ((j * 7919 + i * 104729) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let t = Tensor::from_vec(values, shape.as_slice(), &Device::Cpu).expect("tensor");
            let ty = match shape.len() {
                1 => GgmlDType::F32,
                _ if name.contains("gate_inp") => GgmlDType::F32,
                _ => ty,
            };
            (name, QTensor::quantize(&t, ty).expect("quantize"))
        })
        .collect();
    let u32v = |v: usize| gguf_file::Value::U32(v as u32);
    let metadata = [
        (
            "general.architecture",
            gguf_file::Value::String("llama".into()),
        ),
        ("llama.context_length", u32v(64)),
        ("llama.embedding_length", u32v(HIDDEN)),
        ("llama.feed_forward_length", u32v(FF)),
        ("llama.block_count", u32v(1)),
        ("llama.attention.head_count", u32v(4)),
        ("llama.attention.head_count_kv", u32v(4)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            gguf_file::Value::F32(1e-5),
        ),
        ("llama.expert_count", u32v(EXPERTS)),
        ("llama.expert_used_count", u32v(2)),
    ];
    let meta: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    let mut file = std::fs::File::create(path).expect("create");
    gguf_file::write(&mut file, &meta, &refs).expect("write");
}

fn open(dir: &std::path::Path, ty: GgmlDType, dtype: DtypeChoice) -> (Checkpoint, LayerLayout) {
    let path = dir.join("moe.gguf");
    write_moe(&path, ty);
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf { path }).expect("opens");
    let options = LoadOptions {
        device: Device::Cpu,
        dtype,
    };
    let holding = Holding::new(&checkpoint, &options).expect("holding");
    let layout = LayerLayout::of(&checkpoint, &holding, 0).expect("layout");
    (checkpoint, layout)
}

#[test]
fn an_expert_of_blocks_in_one_buffer_computes_like_the_cpu_slab() {
    let dir = tempfile::tempdir().expect("tempdir");
    for ty in [GgmlDType::Q8_0, GgmlDType::Q4K] {
        let (checkpoint, layout) = open(dir.path(), ty, DtypeChoice::Auto);
        for e in [0, EXPERTS - 1] {
            let slot_shaped =
                HostLayer::expert(&checkpoint, &layout, e, &HostMemory::Heap).expect("cpu slab");
            let one = HostLayer::expert_in_one_buffer(&checkpoint, &layout, e).expect("one");
            assert!(one.cpu_slab().is_none() && slot_shaped.cpu_slab().is_some());
            assert!(one.can_view() && slot_shaped.can_view(), "{ty:?}");
            assert_eq!(
                one.dense_len, 0,
                "{ty:?}: an expert of blocks has no dense region"
            );
            // The copy stream's source: the block region, the file's bytes.
            assert_eq!(one.blocks().expect("bytes").len(), one.blocks_len);
            let x = Tensor::from_vec(
                (0..3 * HIDDEN)
                    .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                    .collect::<Vec<f32>>(),
                (3, HIDDEN),
                &Device::Cpu,
            )
            .expect("x");
            let h = Tensor::from_vec(
                (0..3 * FF)
                    .map(|i| ((i * 13) % 97) as f32 / 48.0 - 1.0)
                    .collect::<Vec<f32>>(),
                (3, FF),
                &Device::Cpu,
            )
            .expect("h");
            let [g1, u1, d1] = experts_of(one.views().expect("views")).expect("expert");
            let [g2, u2, d2] = experts_of(slot_shaped.views().expect("views")).expect("expert");
            for (a, b, input) in [(&g1, &g2, &x), (&u1, &u2, &x), (&d1, &d2, &h)] {
                let ya: Vec<Vec<f32>> = a.forward(input).unwrap().to_vec2().unwrap();
                let yb: Vec<Vec<f32>> = b.forward(input).unwrap().to_vec2().unwrap();
                assert_eq!(
                    ya, yb,
                    "{ty:?} expert {e}: the same kernels on the same bytes"
                );
                assert!(
                    ya.iter().flatten().any(|v| *v != 0.0),
                    "{ty:?}: a real product"
                );
            }
        }
    }
}

#[test]
fn an_expert_held_dense_in_one_buffer_has_no_cpu_view() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (checkpoint, layout) = open(dir.path(), GgmlDType::Q8_0, DtypeChoice::F32);
    let one = HostLayer::expert_in_one_buffer(&checkpoint, &layout, 1).expect("one");
    assert!(one.dense_len > 0);
    assert!(!one.can_view());
    let err = one.views().expect_err("dense").to_string();
    assert!(err.contains("dense tensors"), "{err}");
    // It still streams: its bytes are there for the copies.
    assert_eq!(one.dense().expect("dense bytes").len(), one.dense_len);
}
