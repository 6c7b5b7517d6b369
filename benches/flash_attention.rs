//! The CPU attention (`flash_cpu::attend`) on its own, per KV cache dtype: one prefill chunk of
//! query rows at a given position, the same pseudo-random keys and values stored as f32, f16 and
//! bf16, the dtypes alternating in one process so their ratio holds on a shared machine. Shape
//! defaults to SmolLM2-135M's (9 query heads, 3 key/value heads, head_dim 64). Prints one line
//! per call and each dtype's best time, with the rate it read the cache at and, against it, the
//! time the same cache would take over a link of `--link-bandwidth` bytes/s: what attention on
//! the host (`kv_offload = on`) costs per layer against streaming the layer's cache to the GPU.
//!
//! Usage: cargo bench --bench flash_attention -- [--seq 512] [--pos 3584] [--rounds 4]
//!        [--link-bandwidth 16e9] [--cpu-qmatmul auto|avx2|scalar|...]
//! (`--cpu-qmatmul` holds attention to the instruction sets that kernel choice allows, as the
//! setting does in the server: `avx2` runs the AVX2-only CPU's loops.)
//! Threads: RAYON_NUM_THREADS.

use std::time::Instant;

use clap::Parser;
use ferry::config::values::{Codec, Kernels};
use ferry::config::CpuQmatmul;
use ferry::model::decoder::flash_cpu::{attend, KvData, KvHeads, Shape};
use half::{bf16, f16};

/// `cargo bench --bench flash_attention -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    /// Query rows (the chunk's new tokens).
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Position of the first query row (keys before it are already cached).
    #[arg(long, default_value_t = 3584)]
    pos: usize,
    /// Query heads.
    #[arg(long, default_value_t = 9)]
    heads: usize,
    /// Key/value heads.
    #[arg(long, default_value_t = 3)]
    kv_heads: usize,
    /// Width of one head.
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Rounds, each timing one call per dtype.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Host-to-device bytes/s the cache would stream at instead (PCIe 4.0 x16 moves about 25e9).
    #[arg(long, default_value_t = 16e9)]
    link_bandwidth: f64,
    /// CPU kernel choice, as the `cpu_qmatmul` setting takes it (attention follows it).
    #[arg(long, default_value = "auto", value_parser = Kernels::parse)]
    cpu_qmatmul: CpuQmatmul,
    /// The flag `cargo bench` appends.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// Deterministic values in [-1, 1) (xorshift).
fn values(n: usize, mut state: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn main() -> Result<(), String> {
    let o = Options::parse();
    ferry::model::weights::set_cpu_qmatmul(o.cpu_qmatmul);
    let (d, len) = (o.head_dim, o.pos + o.seq);
    let q = values(o.heads * o.seq * d, 1);
    let k32 = values(o.kv_heads * len * d, 2);
    let v32 = values(o.kv_heads * len * d, 3);
    let k16: Vec<f16> = k32.iter().map(|&x| f16::from_f32(x)).collect();
    let v16: Vec<f16> = v32.iter().map(|&x| f16::from_f32(x)).collect();
    let kb: Vec<bf16> = k32.iter().map(|&x| bf16::from_f32(x)).collect();
    let vb: Vec<bf16> = v32.iter().map(|&x| bf16::from_f32(x)).collect();
    let caches = [
        ("f32", KvData::F32(&k32), KvData::F32(&v32)),
        ("f16", KvData::F16(&k16), KvData::F16(&v16)),
        ("bf16", KvData::BF16(&kb), KvData::BF16(&vb)),
    ];
    let shape = Shape {
        n_heads: o.heads,
        n_kv_heads: o.kv_heads,
        head_dim: d,
        seq: o.seq,
        pos: o.pos,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: None,
        window: None,
        sinks: None,
    };
    let mut out = vec![0f32; q.len()];
    let mut best = [f64::INFINITY; 3];
    for round in 0..o.rounds {
        for (i, &(name, k, v)) in caches.iter().enumerate() {
            let heads = |data| KvHeads {
                data,
                head_stride: len * d,
            };
            let started = Instant::now();
            attend(&q, heads(k), heads(v), &shape, &mut out).map_err(|e| e.to_string())?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            best[i] = best[i].min(ms);
            println!("round {round} {name}: {ms:.1} ms");
        }
    }
    let pairs = (o.heads * o.seq) as f64 * (o.pos as f64 + (o.seq as f64 + 1.0) / 2.0);
    for (i, (name, _, _)) in caches.iter().enumerate() {
        // Two multiply-adds per (query row, visible key, column): scores and weighted values.
        let gflops = 4.0 * pairs * d as f64 / (best[i] * 1e6);
        let element = [4.0, 2.0, 2.0][i];
        let cache_bytes = 2.0 * (o.kv_heads * len * d) as f64 * element;
        let read = cache_bytes / (best[i] * 1e6);
        let stream_ms = cache_bytes / o.link_bandwidth * 1e3;
        println!(
            "best {name}: {:.2} ms ({gflops:.1} GFLOP/s, cache {:.1} MB read at {read:.1} GB/s); streaming it at {:.0} GB/s: {stream_ms:.2} ms (host / stream = {:.2})",
            best[i],
            cache_bytes / 1e6,
            o.link_bandwidth / 1e9,
            best[i] / stream_ms
        );
    }
    Ok(())
}
