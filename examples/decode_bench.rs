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
    let mut next = argmax(
        &loaded
            .model
            .forward(PROMPT, &mut cache, &mut layers)?
            .to_vec1()?,
    );
    let mut ours_tokens = vec![next];
    let start = Instant::now();
    for _ in 0..steps {
        next = argmax(
            &loaded
                .model
                .forward(&[next], &mut cache, &mut layers)?
                .to_vec1()?,
        );
        ours_tokens.push(next);
    }
    let ours = steps as f64 / start.elapsed().as_secs_f64();
    drop(layers);

    // candle-transformers
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut model = quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?;
    let ids = Tensor::new(PROMPT, &Device::Cpu)?.unsqueeze(0)?;
    let mut next = argmax(&model.forward(&ids, 0)?.flatten_all()?.to_vec1()?);
    let mut theirs_tokens = vec![next];
    let start = Instant::now();
    for i in 0..steps {
        let ids = Tensor::new(&[next], &Device::Cpu)?.unsqueeze(0)?;
        next = argmax(
            &model
                .forward(&ids, PROMPT.len() + i)?
                .flatten_all()?
                .to_vec1()?,
        );
        theirs_tokens.push(next);
    }
    let theirs = steps as f64 / start.elapsed().as_secs_f64();

    let same = ours_tokens
        .iter()
        .zip(&theirs_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    println!("ferry:              {ours:.1} tok/s");
    println!("candle quantized:   {theirs:.1} tok/s");
    println!("ratio ferry/candle: {:.2}", ours / theirs);
    println!(
        "greedy tokens identical for the first {same} of {}",
        ours_tokens.len()
    );
    Ok(())
}
