//! `Model::forward_batch` on the real default model: several sequences at different positions
//! (prefill, chunked prefill, decode) in one step give the logits each gets alone, and every
//! layer's weights are fetched once per step whatever the batch size. A step of a source that
//! never waits runs whole on rayon's pool; one that may wait is asked for its layers on the
//! calling thread.

use crate::real_model;

use candle_core::Device;
use ferry::model::decoder::{LayerSource, ResidentLayers, SeqInput};
use ferry::model::loader::{load_model, DtypeChoice, LoadOptions};
use ferry::model::source::ModelFiles;
use ferry::model::weights::LayerWeights;
use ferry::model::ModelError;

/// Resident layers that count how often each is asked for.
struct Counting {
    inner: ResidentLayers,
    fetched: usize,
}

impl LayerSource for Counting {
    fn layer(&mut self, index: usize) -> Result<LayerWeights, ModelError> {
        self.fetched += 1;
        self.inner.layer(index)
    }
}

/// Resident layers that record, per fetch, whether it came from a thread of rayon's pool, and
/// say they never wait (or not) as told.
struct WhereFetched {
    inner: ResidentLayers,
    never_waits: bool,
    on_pool: Vec<bool>,
}

impl LayerSource for WhereFetched {
    fn layer(&mut self, index: usize) -> Result<LayerWeights, ModelError> {
        self.on_pool.push(rayon::current_thread_index().is_some());
        self.inner.layer(index)
    }

    fn never_waits(&self) -> bool {
        self.never_waits
    }
}

/// The default model loaded for the CPU, every layer resident.
fn load_default_model() -> ferry::model::loader::LoadedModel {
    let files = ModelFiles::Gguf {
        path: real_model::model_path(),
    };
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    load_model(&files, &options, &mut |_| {}).expect("loads")
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0
}

#[test]
fn a_batched_step_equals_each_sequence_alone() {
    let loaded = load_default_model();
    let model = loaded.model;
    let n_layers = model.spec().n_layers;
    let mut layers = Counting {
        inner: loaded.layers,
        fetched: 0,
    };
    // Per sequence, the tokens of each step: A and B prefill then decode, C prefills in two
    // chunks then decodes.
    let a: [&[u32]; 3] = [&[1, 504, 3458, 282, 4649], &[314], &[2701]];
    let b: [&[u32]; 3] = [&[1, 9148, 28], &[30], &[1123]];
    let c: [&[u32]; 3] = [&[1, 2, 3, 4], &[40, 50, 60], &[70]];
    let seqs = [a, b, c];

    let mut solo = Vec::new();
    for steps in &seqs {
        let mut cache = model.new_cache();
        let logits: Vec<Vec<f32>> = steps
            .iter()
            .map(|tokens| {
                let l = model
                    .forward(tokens, &mut cache, &mut layers)
                    .expect("solo");
                l.to_vec1().expect("f32")
            })
            .collect();
        solo.push(logits);
    }

    let mut caches: Vec<_> = seqs.iter().map(|_| model.new_cache()).collect();
    for step in 0..3 {
        let before = layers.fetched;
        let mut batch: Vec<SeqInput> = seqs
            .iter()
            .zip(caches.iter_mut())
            .map(|(steps, cache)| SeqInput {
                tokens: steps[step],
                cache,
            })
            .collect();
        let logits = model
            .forward_batch(&mut batch, &mut layers)
            .expect("batched");
        assert_eq!(
            layers.fetched - before,
            n_layers,
            "one fetch per layer per step"
        );
        let rows: Vec<Vec<f32>> = logits.to_vec2().expect("rows");
        assert_eq!(rows.len(), 3);
        for (s, row) in rows.iter().enumerate() {
            let alone = &solo[s][step];
            let diff = row
                .iter()
                .zip(alone)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-3, "sequence {s} step {step}: max diff {diff}");
            assert_eq!(argmax(row), argmax(alone), "sequence {s} step {step}");
        }
    }
    let lens: Vec<usize> = caches.iter().map(|c| c.len()).collect();
    assert_eq!(lens, [7, 5, 8]);
}

#[test]
fn a_source_that_never_waits_runs_its_step_on_the_pool_and_one_that_may_wait_does_not() {
    let loaded = load_default_model();
    let model = loaded.model;
    let n_layers = model.spec().n_layers;
    assert!(
        rayon::current_thread_index().is_none(),
        "the test thread is not one of the pool's"
    );
    let tokens: [&[u32]; 2] = [&[1, 504, 3458, 282], &[314]];
    let mut logits = Vec::new();
    for never_waits in [true, false] {
        let mut layers = WhereFetched {
            inner: loaded.layers.clone(),
            never_waits,
            on_pool: Vec::new(),
        };
        let mut cache = model.new_cache();
        let steps: Vec<Vec<f32>> = tokens
            .iter()
            .map(|t| {
                let l = model.forward(t, &mut cache, &mut layers).expect("step");
                l.to_vec1().expect("f32")
            })
            .collect();
        // The embedding output of a sequence goes through the same path as `forward`.
        let mut hidden_cache = model.new_cache();
        model
            .forward_hidden(tokens[0], &mut hidden_cache, &mut layers)
            .expect("hidden");
        assert_eq!(
            layers.on_pool.len(),
            3 * n_layers,
            "one fetch per layer per step"
        );
        assert!(
            layers.on_pool.iter().all(|&p| p == never_waits),
            "never_waits {never_waits}: fetched on the pool {:?}",
            layers.on_pool
        );
        logits.push(steps);
    }
    assert_eq!(logits[0], logits[1], "where the step runs changes no logit");
}
