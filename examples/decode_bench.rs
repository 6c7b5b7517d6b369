//! Decode speed of ferry's model vs candle-transformers' `quantized_llama` on one GGUF, measured
//! in the same run: a short prefill, then N greedy single-token steps each.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release --example decode_bench -- [model.gguf] [steps]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama;
use ferry::model::loader::{load_model, DTypeChoice, LoadOptions};
use ferry::model::source::ModelFiles;

const PROMPT: &[u32] = &[504, 3575, 282, 4649, 314];

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(0, |best, (i, x)| if *x > v[best] { i } else { best }) as u32
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(100);
    println!("threads: {}", candle_core::utils::get_num_threads());

    // ferry
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DTypeChoice::Auto,
    };
    let loaded = load_model(
        &ModelFiles::Gguf { path: path.clone() },
        &options,
        &mut |_| {},
    )?;
    let mut layers = loaded.layers;
    let mut cache = loaded.model.new_cache();
    let first = argmax(
        &loaded
            .model
            .forward(PROMPT, &mut cache, &mut layers)?
            .to_vec1()?,
    );
    let mut ours_tokens = vec![first];

    // candle-transformers
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut model = quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?;
    let ids = Tensor::new(PROMPT, &Device::Cpu)?.unsqueeze(0)?;
    let first = argmax(&model.forward(&ids, 0)?.flatten_all()?.to_vec1()?);
    let mut theirs_tokens = vec![first];

    // Alternate rounds of 10 steps so both see the same machine load.
    let (mut ours_s, mut theirs_s) = (0f64, 0f64);
    let (mut ours_best, mut theirs_best) = (0f64, 0f64);
    let mut done = 0;
    // BENCH_ONLY=ferry|candle runs one side only (for `perf stat` instruction counts).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let (run_ours, run_theirs) = (only != "candle", only != "ferry");
    while done < steps {
        let round = (steps - done).min(10);
        let start = Instant::now();
        for _ in 0..round * run_ours as usize {
            let next = *ours_tokens.last().unwrap_or(&0);
            let logits = loaded.model.forward(&[next], &mut cache, &mut layers)?;
            ours_tokens.push(argmax(&logits.to_vec1()?));
        }
        let t = start.elapsed().as_secs_f64();
        ours_s += t;
        ours_best = ours_best.max(round as f64 / t);
        let start = Instant::now();
        for i in 0..round * run_theirs as usize {
            let next = *theirs_tokens.last().unwrap_or(&0);
            let ids = Tensor::new(&[next], &Device::Cpu)?.unsqueeze(0)?;
            let logits = model.forward(&ids, PROMPT.len() + done + i)?;
            theirs_tokens.push(argmax(&logits.flatten_all()?.to_vec1()?));
        }
        let t = start.elapsed().as_secs_f64();
        theirs_s += t;
        theirs_best = theirs_best.max(round as f64 / t);
        done += round;
    }
    let ours = steps as f64 / ours_s;
    let theirs = steps as f64 / theirs_s;

    let same = ours_tokens
        .iter()
        .zip(&theirs_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    println!("ferry:              {ours:.1} tok/s (best round {ours_best:.1})");
    println!("candle quantized:   {theirs:.1} tok/s (best round {theirs_best:.1})");
    println!(
        "ratio ferry/candle: {:.2} (best rounds {:.2})",
        ours / theirs,
        ours_best / theirs_best
    );
    println!(
        "greedy tokens identical for the first {same} of {}",
        ours_tokens.len()
    );
    Ok(())
}
