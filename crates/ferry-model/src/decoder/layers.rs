//! Where a step's decoder layers come from: the [`LayerSource`] seam the forward loop pulls
//! each layer's weights through, and [`ResidentLayers`], the source for layers already in
//! memory (owned, as the loader returns them, or borrowed, as a swap lease holds them). The
//! offload engine's `WeightStore` is the other source (a resident prefix plus streamed slots).
//!
//! A MoE layer's experts can come separately: the weights a source hands out may carry a
//! [`RoutedExperts`] handle ([`LayerWeights::with_routed`]), which the MoE forward asks for the
//! experts its router picked, after routing. Sources without one (such as [`ResidentLayers`])
//! need nothing: the layer's own expert parts serve. The handle lives in the weights rather
//! than in this trait because blocks run on the CPU worker pool, where the `&mut` source is
//! not reachable.

use crate::error::{ModelError, Result};
use crate::weights::LayerWeights;
pub use crate::weights::{ExpertWeights, RoutedExperts};

/// The shape of one forward pass, as a [`LayerSource`] sees it before the first layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRows {
    /// Rows (tokens) of the pass, all sequences together.
    pub rows: usize,
    /// Rows of its longest sequence (1 for a plain decode step; a prompt chunk's length).
    pub longest: usize,
}

/// Hands out the weights of decoder layer `index` for one forward pass.
pub trait LayerSource: Send {
    /// Called once at the start of a forward pass with its shape, before any
    /// [`LayerSource::layer`]: a source that chooses per step where a layer runs (the offload
    /// engine's tiers) decides here.
    fn begin_step(&mut self, step: StepRows) -> Result<()> {
        let _ = step;
        Ok(())
    }
    /// The weights of layer `index` (called once per layer per step, in order).
    fn layer(&mut self, index: usize) -> Result<LayerWeights>;
    /// Called when layer `index` has been computed and its weights may be reused.
    fn release(&mut self, index: usize) -> Result<()> {
        let _ = index;
        Ok(())
    }
    /// Whether [`LayerSource::layer`] and [`LayerSource::release`] return without waiting on
    /// another thread (every layer already in place, nothing streamed): a CPU step then runs
    /// whole on a thread of rayon's pool (one hand-over per step instead of one per layer).
    /// A source that may wait says `false` (the default), so no pool thread blocks on a copy.
    fn never_waits(&self) -> bool {
        false
    }
}

/// Every layer already on the compute device: `ResidentLayers(Vec<LayerWeights>)` owns them,
/// `ResidentLayers(&[LayerWeights])` borrows them (a swap lease's resident copy, without
/// cloning the list every step).
#[derive(Debug, Clone)]
pub struct ResidentLayers<L = Vec<LayerWeights>>(pub L);

impl<L: AsRef<[LayerWeights]> + Send> LayerSource for ResidentLayers<L> {
    fn layer(&mut self, index: usize) -> Result<LayerWeights> {
        let layers = self.0.as_ref();
        layers.get(index).cloned().ok_or_else(|| {
            ModelError::MissingTensor(format!("layer {index} (of {})", layers.len()))
        })
    }

    fn never_waits(&self) -> bool {
        true
    }
}
