//! Kernel micro-bench of the CPU quantized matmul: for each GGUF block type, ferry's
//! [`CpuQMatMul`] against candle's `QMatMul` on the same weight bytes, at m = 1 (decode: one
//! pass over weights that do not fit in the caches) and m = 64 (a prefill chunk), printed as a
//! markdown table of weight GB/s and the ferry / candle ratio, in one run.
//!
//! Usage: `cargo bench --bench qmatmul_kernels -- [OPTIONS]` (`-- --help` lists them). Both
//! sides run on `--threads` threads (rayon's pool and candle's, via `RAYON_NUM_THREADS`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use clap::Parser;
use ferry::model::cpu_qmatmul::{Blocks, CpuQMatMul, Kernel};
use ferry::model::header::GgufType;
use ferry_testkit::random_bytes;
use half::f16;

/// `cargo bench --bench qmatmul_kernels -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    /// Threads for both implementations.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Weight rows (output features).
    #[arg(long, default_value_t = 4096)]
    rows: usize,
    /// Weight columns (input features; a multiple of 256).
    #[arg(long, default_value_t = 4096)]
    cols: usize,
    /// Bytes of distinct weights cycled through, so m = 1 reads from memory, in MiB.
    #[arg(long, default_value_t = 192)]
    working_set_mib: usize,
    /// Seconds measured per row of the table and implementation (best of 5 windows).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// ferry's kernels: auto (the fastest this CPU has), avx512 (the AVX-512 path even where
    /// AMX is present), avx2 (the AVX2 path even where AVX-512 is present) or scalar.
    #[arg(long, default_value = "auto")]
    kernel: String,
    /// Instead of the tables against candle: ferry's kernels named here (e.g.
    /// `auto,avx512,avx2`) side by side on each type, at the `--ms` row counts, in one run.
    #[arg(long, value_delimiter = ',')]
    kernels: Vec<String>,
    /// Activation rows of the `--kernels` table.
    #[arg(long, value_delimiter = ',', default_value = "16,64,512")]
    ms: Vec<usize>,
    /// Block types to run (default: all with a ferry kernel).
    #[arg(long, value_delimiter = ',')]
    types: Vec<String>,
    /// Give ferry's k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 weights the eight-row panel
    /// layout the loader makes on AVX2 CPUs (`CpuQMatMul::with_panels`), so the AVX2 / AVX-VNNI
    /// kernels read it, as a loaded model's do; without it they read the GGUF rows.
    #[arg(long)]
    panels: bool,
    /// Passed by `cargo bench`.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// The types, their bytes per block, elements per block, and where their f16 scales sit.
const TYPES: [(&str, GgmlDType, usize, usize, &[usize]); 10] = [
    ("q4_0", GgmlDType::Q4_0, 18, 32, &[0]),
    ("q4_1", GgmlDType::Q4_1, 20, 32, &[0, 2]),
    ("q5_0", GgmlDType::Q5_0, 22, 32, &[0]),
    ("q5_1", GgmlDType::Q5_1, 24, 32, &[0, 2]),
    ("q8_0", GgmlDType::Q8_0, 34, 32, &[0]),
    ("q2_k", GgmlDType::Q2K, 84, 256, &[80, 82]),
    ("q3_k", GgmlDType::Q3K, 110, 256, &[108]),
    ("q4_k", GgmlDType::Q4K, 144, 256, &[0, 2]),
    ("q5_k", GgmlDType::Q5K, 176, 256, &[0, 2]),
    ("q6_k", GgmlDType::Q6K, 210, 256, &[208]),
];

/// The types candle has no kernel for (ferry only): name, type, bytes and elements per block,
/// and the offset of the scale (an f16, or MXFP4's E8M0 byte).
const FERRY_ONLY: [(&str, GgufType, usize, usize, usize); 3] = [
    ("iq4_nl", GgufType::IQ4_NL, 18, 32, 0),
    ("iq4_xs", GgufType::IQ4_XS, 136, 256, 0),
    ("mxfp4", GgufType::MXFP4, 17, 32, 0),
];

/// A ferry-only `rows x cols` weight of pseudo-random blocks with small finite scales, with
/// the panel layout of the AVX2 path when `panels`.
fn ferry_only_weight(
    (ty, bytes, elems, at): (GgufType, usize, usize, usize),
    (rows, cols): (usize, usize),
    seed: u64,
    panels: bool,
) -> Result<CpuQMatMul, String> {
    let mut data = random_bytes(rows * cols / elems * bytes, seed);
    for (b, block) in data.chunks_exact_mut(bytes).enumerate() {
        if ty == GgufType::MXFP4 {
            block[at] = 118 + (b % 7) as u8;
        } else {
            let v = ((b % 13) as f32 - 6.0) * 0.001 + 0.0003;
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    let blocks = Blocks::owned(data, ty, &[rows, cols]).map_err(|e| e.to_string())?;
    let matmul = CpuQMatMul::from_blocks(blocks).map_err(|e| e.to_string())?;
    Ok(match panels {
        true => matmul.with_panels_for(Kernel::Avx2),
        false => matmul,
    })
}

/// ferry's matmul of `weight`, with the panel layout of the AVX2 path when `panels` (a no-op
/// for the formats without one).
fn ferry_weight(weight: Arc<QTensor>, panels: bool) -> Result<CpuQMatMul, String> {
    let matmul = CpuQMatMul::new(weight).map_err(|e| e.to_string())?;
    Ok(match panels {
        true => matmul.with_panels_for(Kernel::Avx2),
        false => matmul,
    })
}

/// `m` deterministic input rows of `cols` features in [-1, 1).
fn input(m: usize, cols: usize) -> Vec<f32> {
    (0..m * cols)
        .map(|i| ((i * 7919) % 1999) as f32 / 1000.0 - 1.0)
        .collect()
}

/// A `rows x cols` weight of pseudo-random blocks with small finite scales.
fn weight(
    dtype: GgmlDType,
    (bytes, elems, scales): (usize, usize, &[usize]),
    (rows, cols): (usize, usize),
    seed: u64,
) -> Result<Arc<QTensor>, String> {
    let mut data = random_bytes(rows * cols / elems * bytes, seed);
    for (b, block) in data.chunks_exact_mut(bytes).enumerate() {
        for &at in scales {
            let v = ((b % 13) as f32 - 6.0) * 0.001 + 0.0003;
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    let storage =
        QStorage::from_data(Cow::Owned(data), &Device::Cpu, dtype).map_err(|e| e.to_string())?;
    let q = QTensor::new(storage, (rows, cols)).map_err(|e| e.to_string())?;
    Ok(Arc::new(q))
}

/// Calls per second of each of two implementations, `a(i)` and `b(i)` cycling `i` over
/// `count` weights: after one warm-up call each, `ROUNDS` alternating windows of
/// `seconds / ROUNDS` each, keeping each side's best window (the machine may be shared, and
/// alternating keeps a busy spell from landing on one side only).
fn rates(
    count: usize,
    seconds: f64,
    mut a: impl FnMut(usize) -> Result<(), String>,
    mut b: impl FnMut(usize) -> Result<(), String>,
) -> Result<(f64, f64), String> {
    let best = rates_of(count, seconds, &mut [&mut a, &mut b])?;
    Ok((best[0], best[1]))
}

/// One implementation's call on weight `i` (of those cycled through).
type Call<'a> = dyn FnMut(usize) -> Result<(), String> + 'a;

/// [`rates`] for any number of implementations (windows taken in turn).
fn rates_of(count: usize, seconds: f64, calls: &mut [&mut Call<'_>]) -> Result<Vec<f64>, String> {
    const ROUNDS: usize = 5;
    for call in calls.iter_mut() {
        call(0)?;
    }
    let window = Duration::from_secs_f64(seconds / ROUNDS as f64);
    let window_rate = |call: &mut dyn FnMut(usize) -> Result<(), String>,
                       next: &mut usize|
     -> Result<f64, String> {
        let started = Instant::now();
        let mut calls = 0usize;
        while calls < 1 || started.elapsed() < window {
            call(*next % count)?;
            *next += 1;
            calls += 1;
        }
        Ok(calls as f64 / started.elapsed().as_secs_f64())
    };
    let mut best = vec![0f64; calls.len()];
    let mut next = vec![1usize; calls.len()];
    for _ in 0..ROUNDS {
        for ((call, best), next) in calls.iter_mut().zip(&mut best).zip(&mut next) {
            *best = best.max(window_rate(&mut **call, next)?);
        }
    }
    Ok(best)
}

/// `x` to three significant digits (a prompt's GB/s of weights is small: 0.0312, 1.25, 31.4).
fn significant(x: f64) -> String {
    let digits = if x > 0.0 {
        2 - x.abs().log10().floor() as i32
    } else {
        2
    };
    format!("{x:.*}", digits.clamp(0, 6) as usize)
}

/// The kernel choice called `name` on the command line.
fn kernel_named(name: &str) -> Result<Kernel, String> {
    match name {
        "auto" => Ok(Kernel::Auto),
        "avx512" => Ok(Kernel::Avx512),
        "avx-vnni" => Ok(Kernel::AvxVnni),
        "avx2" => Ok(Kernel::Avx2),
        "scalar" => Ok(Kernel::Scalar),
        other => Err(format!(
            "kernel {other}: auto, avx512, avx-vnni, avx2 or scalar"
        )),
    }
}

/// The `--kernels` table: weight GB/s of each named kernel of ferry's, per type (those of
/// [`TYPES`]) and `--ms` row count, and each kernel's ratio to the first.
fn kernel_table(options: &Options) -> Result<(), String> {
    let kernels = options
        .kernels
        .iter()
        .map(|k| kernel_named(k))
        .collect::<Result<Vec<_>, _>>()?;
    let (rows, cols) = (options.rows, options.cols);
    println!("ferry kernels: {kernels:?}");
    println!();
    let names: Vec<String> = options
        .kernels
        .iter()
        .map(|k| format!("{k} GB/s"))
        .collect();
    let ratios: Vec<String> = options.kernels[1..]
        .iter()
        .map(|k| format!("{} / {k}", options.kernels[0]))
        .collect();
    println!(
        "| type | m | {} | {} |",
        names.join(" | "),
        ratios.join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(kernels.len() + ratios.len()));
    let wanted = |name: &str| options.types.is_empty() || options.types.iter().any(|t| t == name);
    let mut mats: Vec<(&str, usize, Vec<CpuQMatMul>)> = Vec::new();
    for &(name, dtype, bytes, elems, scales) in TYPES.iter().filter(|t| wanted(t.0)) {
        let weights = (1..=2)
            .map(|i| weight(dtype, (bytes, elems, scales), (rows, cols), i))
            .map(|w| w.and_then(|w| ferry_weight(w, options.panels)))
            .collect::<Result<Vec<_>, _>>()?;
        mats.push((name, rows * cols / elems * bytes, weights));
    }
    for &(name, ty, bytes, elems, at) in FERRY_ONLY.iter().filter(|t| wanted(t.0)) {
        let weights = (1..=2)
            .map(|i| ferry_only_weight((ty, bytes, elems, at), (rows, cols), i, options.panels))
            .collect::<Result<Vec<_>, _>>()?;
        mats.push((name, rows * cols / elems * bytes, weights));
    }
    for (name, matrix_bytes, weights) in &mats {
        let (name, matrix_bytes) = (*name, *matrix_bytes);
        for &m in &options.ms {
            let x = input(m, cols);
            let mut outs = vec![vec![0f32; m * rows]; kernels.len()];
            let mut calls: Vec<Box<Call<'_>>> = outs
                .iter_mut()
                .zip(&kernels)
                .map(|(out, &kernel)| {
                    let (weights, x) = (&weights, &x);
                    Box::new(move |i: usize| {
                        weights[i]
                            .matmul_f32(x, m, out, kernel)
                            .map_err(|e| e.to_string())
                    }) as Box<Call<'_>>
                })
                .collect();
            let mut refs: Vec<&mut Call<'_>> = calls.iter_mut().map(|c| &mut **c as _).collect();
            let best = rates_of(2, options.seconds, &mut refs)?;
            let gbs: Vec<String> = best
                .iter()
                .map(|r| significant(r * matrix_bytes as f64 / 1e9))
                .collect();
            let ratio: Vec<String> = best[1..]
                .iter()
                .map(|r| format!("{:.2}", best[0] / r))
                .collect();
            println!(
                "| {name} | {m} | {} | {} |",
                gbs.join(" | "),
                ratio.join(" | ")
            );
        }
    }
    Ok(())
}

fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = info
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let flags: Vec<&str> = ["avx2", "fma", "f16c", "avx512f", "avx512_vnni"]
        .into_iter()
        .filter(|f| {
            info.lines()
                .find(|l| l.starts_with("flags"))
                .is_some_and(|l| l.split_whitespace().any(|w| w == *f))
        })
        .collect();
    format!("{name} ({})", flags.join(", "))
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    let kernel = kernel_named(&options.kernel)?;
    // Both pools size themselves from this on first use, which is below.
    std::env::set_var("RAYON_NUM_THREADS", options.threads.to_string());
    let (rows, cols) = (options.rows, options.cols);
    if cols % 256 != 0 {
        return Err(format!("--cols {cols} is not a multiple of 256"));
    }
    println!("CPU: {}", cpu_name());
    println!(
        "weights {rows} x {cols}, {} threads, {} MiB working set at m = 1, {} s per cell",
        options.threads, options.working_set_mib, options.seconds
    );
    if !options.kernels.is_empty() {
        return kernel_table(&options);
    }
    println!("ferry kernel: {kernel:?}");
    println!();
    println!("| type | m | ferry GB/s | candle GB/s | ferry / candle |");
    println!("|---|---|---|---|---|");
    for &(name, dtype, bytes, elems, scales) in &TYPES {
        if !options.types.is_empty() && !options.types.iter().any(|t| t == name) {
            continue;
        }
        let matrix_bytes = rows * cols / elems * bytes;
        let count = (options.working_set_mib << 20)
            .div_ceil(matrix_bytes)
            .clamp(1, 64);
        let weights = (0..count)
            .map(|i| weight(dtype, (bytes, elems, scales), (rows, cols), i as u64 + 1))
            .collect::<Result<Vec<_>, _>>()?;
        let ferry = weights
            .iter()
            .map(|w| ferry_weight(w.clone(), options.panels))
            .collect::<Result<Vec<_>, _>>()?;
        let candle = weights
            .iter()
            .map(|w| QMatMul::from_arc(w.clone()).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        for m in [1usize, 64] {
            let x = input(m, cols);
            let xt =
                Tensor::from_vec(x.clone(), (m, cols), &Device::Cpu).map_err(|e| e.to_string())?;
            let mut out = vec![0f32; m * rows];
            // m = 64 is compute bound: two weights are enough, and keep the warm-up short.
            let count = if m == 1 { count } else { count.min(2) };
            let (ferry_rate, candle_rate) = rates(
                count,
                options.seconds,
                |i| {
                    ferry[i]
                        .matmul_f32(&x, m, &mut out, kernel)
                        .map_err(|e| e.to_string())
                },
                |i| candle[i].forward(&xt).map(drop).map_err(|e| e.to_string()),
            )?;
            let gbs = |r: f64| r * matrix_bytes as f64 / 1e9;
            println!(
                "| {name} | {m} | {:.2} | {:.2} | {:.2} |",
                gbs(ferry_rate),
                gbs(candle_rate),
                ferry_rate / candle_rate
            );
        }
    }
    ferry_only(&options, kernel)
}

/// The table of the types only ferry computes: ferry's kernels alone (`kernel` against the
/// AVX2 path, which is `Auto` on CPUs without AVX-512, in one run).
fn ferry_only(options: &Options, kernel: Kernel) -> Result<(), String> {
    let (rows, cols) = (options.rows, options.cols);
    let wanted = |name: &str| options.types.is_empty() || options.types.iter().any(|t| t == name);
    if !FERRY_ONLY.iter().any(|t| wanted(t.0)) {
        return Ok(());
    }
    println!();
    println!("| type | m | ferry GB/s | ferry avx2 GB/s | ferry / avx2 |");
    println!("|---|---|---|---|---|");
    for &(name, ty, bytes, elems, at) in &FERRY_ONLY {
        if !wanted(name) {
            continue;
        }
        let matrix_bytes = rows * cols / elems * bytes;
        let count = (options.working_set_mib << 20)
            .div_ceil(matrix_bytes)
            .clamp(1, 64);
        let ferry = (0..count)
            .map(|i| {
                let seed = i as u64 + 1;
                ferry_only_weight((ty, bytes, elems, at), (rows, cols), seed, options.panels)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for m in [1usize, 64] {
            let x = input(m, cols);
            let (mut out, mut out2) = (vec![0f32; m * rows], vec![0f32; m * rows]);
            let count = if m == 1 { count } else { count.min(2) };
            let (ours, avx2) = rates(
                count,
                options.seconds,
                |i| {
                    ferry[i]
                        .matmul_f32(&x, m, &mut out, kernel)
                        .map_err(|e| e.to_string())
                },
                |i| {
                    ferry[i]
                        .matmul_f32(&x, m, &mut out2, Kernel::Avx2)
                        .map_err(|e| e.to_string())
                },
            )?;
            let gbs = |r: f64| r * matrix_bytes as f64 / 1e9;
            println!(
                "| {name} | {m} | {:.2} | {:.2} | {:.2} |",
                gbs(ours),
                gbs(avx2),
                ours / avx2
            );
        }
    }
    Ok(())
}
