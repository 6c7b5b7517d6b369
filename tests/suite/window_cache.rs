//! Sliding-window layers keep only their window (`kv_cache::window_positions`): a tiny Gemma 3
//! GGUF (window 8 on every other layer) decoded far past the window with the model's own cache,
//! whose window layers forget old positions, gives exactly the logits of a cache that keeps
//! every position, while its window layers' buffers stop growing; a fork continues the same;
//! positions a window layer forgot cannot be copied out for the prefix cache.

use candle_core::quantized::gguf_file::Value;
use candle_core::{DType, Device};

use ferry::config::DtypeChoice;
use ferry::model::kv_cache::{window_positions, KvCache, KvShape};
use ferry::model::kv_format::KvFormat;
use ferry::model::loader::{load_model, LoadOptions, LoadedModel};
use ferry::model::source::ModelFiles;

use crate::tiny::Tiny;

const WINDOW: usize = 8;
const CONTEXT: usize = 2048;

/// A tiny Gemma 3 GGUF with a window of [`WINDOW`] on layers 0 and 2, loaded.
fn gemma3(dir: &std::path::Path) -> LoadedModel {
    let mut tiny = Tiny::llama();
    tiny.rope_theta = 1_000_000.0;
    tiny.gguf_meta = vec![
        ("attention.sliding_window", Value::U32(WINDOW as u32)),
        ("attention.sliding_window_pattern", Value::U32(2)),
    ];
    let weights = tiny.gemma_weights(true);
    let path = dir.join("gemma3-window.gguf");
    tiny.write_gguf_context(&path, "gemma3", &weights, CONTEXT);
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    load_model(&ModelFiles::Gguf { path }, &options, &mut |_| {}).expect("loads")
}

/// A cache of the same shape that keeps every position of every layer.
fn full_cache(loaded: &LoadedModel) -> KvCache {
    let spec = loaded.model.spec();
    let shape = KvShape::gqa(spec.n_kv_heads, spec.head_dim);
    KvCache::new(
        spec.n_layers,
        shape,
        CONTEXT,
        KvFormat::Dense(DType::F16),
        &Device::Cpu,
    )
}

#[test]
fn window_layers_forget_old_positions_and_the_logits_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut loaded = gemma3(dir.path());
    assert_eq!(loaded.model.spec().layer_window(0), Some(WINDOW));
    assert_eq!(loaded.model.spec().layer_window(1), None);
    loaded.model.set_kv_dtype(KvFormat::Dense(DType::F16));
    let mut windowed = loaded.model.new_cache_with_limit(CONTEXT);
    let mut full = full_cache(&loaded);
    let vocab = loaded.model.spec().vocab_size as u32;
    // A 300-token prompt in chunks of 100, then 900 decode steps: far past the window and past
    // the window layers' buffers, which forget several times.
    let prompt: Vec<u32> = (0..300).map(|i| (i * 7 + 3) % vocab).collect();
    let mut layers = loaded.layers;
    let mut fork = None;
    // The tokens fed after the fork and the logits they gave, for the fork to replay.
    let mut after_fork: Vec<(u32, Vec<f32>)> = Vec::new();
    let mut next = 0;
    for chunk in prompt.chunks(100) {
        let a = loaded
            .model
            .forward(chunk, &mut windowed, &mut layers)
            .unwrap();
        let b = loaded.model.forward(chunk, &mut full, &mut layers).unwrap();
        let (a, b) = (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        assert_eq!(a, b, "prefill logits at position {}", full.len());
        next = argmax(&a);
    }
    for step in 0..900 {
        if step == 450 {
            fork = Some(windowed.fork().unwrap());
        }
        let a = loaded
            .model
            .forward(&[next], &mut windowed, &mut layers)
            .unwrap();
        let b = loaded
            .model
            .forward(&[next], &mut full, &mut layers)
            .unwrap();
        let (a, b) = (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
        assert_eq!(a, b, "decode logits at position {}", full.len());
        if (450..470).contains(&step) {
            after_fork.push((next, a.clone()));
        }
        // Not always the top token, so the sequence does not settle into a loop.
        next = (argmax(&a) + step as u32) % vocab;
    }
    assert_eq!(windowed.len(), 1200);
    // The window layers (2 of 4) hold at most their window, the slack and a step; the global
    // ones every position, as all layers of the full cache do.
    let spec = loaded.model.spec();
    let row = 2 * spec.n_kv_heads * spec.head_dim * 2;
    let bound = window_positions(WINDOW, 100);
    let (windowed_bytes, full_bytes) = (windowed.allocated_bytes(), full.allocated_bytes());
    assert!(
        windowed_bytes <= full_bytes / 2 + 2 * bound * row,
        "{windowed_bytes} bytes against {full_bytes} for the full cache"
    );
    assert!(
        windowed_bytes * 10 < full_bytes * 7,
        "{windowed_bytes} vs {full_bytes}"
    );

    // A fork taken half-way continues exactly as the original did.
    let mut fork = fork.unwrap();
    for (token, expected) in &after_fork {
        let a = loaded
            .model
            .forward(&[*token], &mut fork, &mut layers)
            .unwrap();
        assert_eq!(
            &a.to_vec1::<f32>().unwrap(),
            expected,
            "the fork at {}",
            fork.len()
        );
    }

    // Positions a window layer forgot cannot be copied for the prefix cache; recent ones can.
    let err = windowed.copy_span(0, 64).unwrap_err().to_string();
    assert!(err.contains("sliding-window layer"), "{err}");
    assert!(windowed.copy_span(1200 - 16, 16).is_ok());
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(0, |best, (i, x)| if *x > v[best] { i } else { best }) as u32
}
