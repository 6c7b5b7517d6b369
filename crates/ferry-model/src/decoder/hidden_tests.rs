//! [`Model::forward_hidden`] against the logits path on the default model (SmolLM2-135M GGUF):
//! the last position's hidden state through the output head is the logits `forward` returns,
//! for a prompt at once and for a continuation after cached positions.

use candle_core::{Device, Tensor};

use super::{Model, ResidentLayers};
use crate::loader::{load_model, LoadOptions};
use crate::source::ModelFiles;

fn default_model() -> (Model, ResidentLayers) {
    let path = ferry_testkit::repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: Default::default(),
    };
    let loaded = load_model(&ModelFiles::Gguf { path }, &options, &mut |_| {}).expect("load");
    (loaded.model, loaded.layers)
}

/// The head's logits of the last row of `hidden` `[n, hidden]`.
fn head_of_last(model: &Model, hidden: &Tensor) -> Vec<f32> {
    let n = hidden.dim(0).unwrap();
    let last = hidden.narrow(0, n - 1, 1).unwrap();
    let logits = model.fixed().lm_head.forward(&last).unwrap();
    logits.squeeze(0).unwrap().to_vec1::<f32>().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn hidden_states_through_the_head_are_the_logits() {
    let (model, mut layers) = default_model();
    let hidden_size = model.spec().hidden_size;
    let prompt: Vec<u32> = vec![1, 504, 3575, 282, 4649, 314, 253, 1345];

    let mut cache = model.new_cache();
    let hidden = model
        .forward_hidden(&prompt, &mut cache, &mut layers)
        .unwrap();
    assert_eq!(hidden.dims(), &[prompt.len(), hidden_size]);
    assert_eq!(cache.len(), prompt.len());
    let mut cache = model.new_cache();
    let logits = model.forward(&prompt, &mut cache, &mut layers).unwrap();
    let logits = logits.to_vec1::<f32>().unwrap();
    let diff = max_diff(&head_of_last(&model, &hidden), &logits);
    assert!(diff < 1e-3, "the hidden path's logits differ by {diff}");

    // A continuation after cached positions: its rows are the positions after them.
    let (head, tail) = prompt.split_at(5);
    let mut cache = model.new_cache();
    let first = model.forward_hidden(head, &mut cache, &mut layers).unwrap();
    let rest = model.forward_hidden(tail, &mut cache, &mut layers).unwrap();
    assert_eq!(rest.dims(), &[tail.len(), hidden_size]);
    let diff = max_diff(&head_of_last(&model, &rest), &logits);
    assert!(
        diff < 1e-3,
        "the continued hidden path's logits differ by {diff}"
    );
    // The rows of the first chunk are the whole prompt's first rows.
    let whole = hidden
        .narrow(0, 0, head.len())
        .unwrap()
        .flatten_all()
        .unwrap();
    let diff = max_diff(
        &whole.to_vec1::<f32>().unwrap(),
        &first.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    assert!(diff < 1e-3, "the first chunk's rows differ by {diff}");
}
