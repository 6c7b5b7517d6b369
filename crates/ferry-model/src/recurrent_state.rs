//! One sequence's state in a recurrent (linear-attention) layer: what a Gated DeltaNet layer
//! (Qwen3.5) keeps instead of keys and values. It has a fixed size whatever the context: the
//! last `conv_kernel - 1` inputs of the layer's short causal convolution, and one
//! `head_v_dim x head_k_dim` f32 matrix per value head. Both live on the compute device
//! (also under `kv_offload`, which moves attention caches only: the state is small and every
//! step reads and rewrites all of it).
//!
//! A step's new state is staged ([`RecurrentState::stage`]) and becomes the state only when
//! the cache commits the step ([`RecurrentState::commit`]), so a forward pass that fails
//! half-way leaves every layer as it was, as the attention caches do. A state cannot be taken
//! back to an earlier position (it keeps no history), which is why the cache refuses to cut a
//! model with such layers back ([`crate::kv_cache::KvCache::truncate`]) or to copy its
//! positions out for the prefix cache.

use candle_core::{DType, Device, Tensor};

use super::error::{ModelError, Result};
use super::spec::DeltaNetSpec;

/// The shape of one layer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentShape {
    /// Inputs the convolution keeps (`conv_kernel - 1`).
    pub conv_window: usize,
    /// Channels of the convolution (queries, keys and values).
    pub conv_channels: usize,
    /// Value heads (one state matrix each).
    pub n_heads: usize,
    /// Rows of a state matrix (a value head's width).
    pub head_v_dim: usize,
    /// Columns of a state matrix (a key head's width).
    pub head_k_dim: usize,
}

impl RecurrentShape {
    /// The state of a Gated DeltaNet layer of shape `spec`.
    pub fn of(spec: &DeltaNetSpec) -> Self {
        Self {
            conv_window: spec.conv_kernel - 1,
            conv_channels: spec.conv_channels(),
            n_heads: spec.n_v_heads,
            head_v_dim: spec.head_v_dim,
            head_k_dim: spec.head_k_dim,
        }
    }

    /// Bytes of one sequence's state (f32), the same at any context length.
    pub fn bytes(&self) -> usize {
        let elems = self.conv_window * self.conv_channels
            + self.n_heads * self.head_v_dim * self.head_k_dim;
        elems * DType::F32.size_in_bytes()
    }

    fn conv_dims(&self) -> (usize, usize) {
        (self.conv_window, self.conv_channels)
    }

    fn ssm_dims(&self) -> (usize, usize, usize) {
        (self.n_heads, self.head_v_dim, self.head_k_dim)
    }
}

/// One sequence's state in one recurrent layer.
#[derive(Debug, Clone)]
pub struct RecurrentState {
    shape: RecurrentShape,
    device: Device,
    /// The committed state: convolution window `[conv_window, channels]` (oldest input first)
    /// and state matrices `[heads, head_v_dim, head_k_dim]`; `None` before the first step (all
    /// zeros).
    state: Option<(Tensor, Tensor)>,
    /// The state after the step being computed, until the cache commits it.
    staged: Option<(Tensor, Tensor)>,
}

impl RecurrentState {
    /// An empty state (zeros, allocated at the first step) on `device`.
    pub fn new(shape: RecurrentShape, device: &Device) -> Self {
        Self {
            shape,
            device: device.clone(),
            state: None,
            staged: None,
        }
    }

    /// The layer's shape.
    pub fn shape(&self) -> RecurrentShape {
        self.shape
    }

    /// The committed convolution window `[conv_window, channels]` and state matrices
    /// `[heads, head_v_dim, head_k_dim]` (f32, zeros before the first step).
    pub fn current(&self) -> Result<(Tensor, Tensor)> {
        match &self.state {
            Some((conv, ssm)) => Ok((conv.clone(), ssm.clone())),
            None => Ok((
                Tensor::zeros(self.shape.conv_dims(), DType::F32, &self.device)?,
                Tensor::zeros(self.shape.ssm_dims(), DType::F32, &self.device)?,
            )),
        }
    }

    /// Stages the state after this step (it replaces the committed one at
    /// [`RecurrentState::commit`]).
    pub fn stage(&mut self, conv: Tensor, ssm: Tensor) -> Result<()> {
        let (w, c) = self.shape.conv_dims();
        let (h, v, k) = self.shape.ssm_dims();
        if conv.dims() != [w, c] || ssm.dims() != [h, v, k] {
            return Err(ModelError::Config(format!(
                "recurrent state {:?} / {:?} for a layer of {:?} / {:?}",
                conv.dims(),
                ssm.dims(),
                [w, c],
                [h, v, k]
            )));
        }
        self.staged = Some((conv.to_dtype(DType::F32)?, ssm.to_dtype(DType::F32)?));
        Ok(())
    }

    /// Makes the staged state the state (the cache committed the step).
    pub fn commit(&mut self) {
        if let Some(staged) = self.staged.take() {
            self.state = Some(staged);
        }
    }

    /// Forgets everything: the state of an empty sequence.
    pub fn clear(&mut self) {
        self.state = None;
        self.staged = None;
    }

    /// Bytes held (the committed and any staged state).
    pub fn allocated_bytes(&self) -> usize {
        let held = usize::from(self.state.is_some()) + usize::from(self.staged.is_some());
        held * self.shape.bytes()
    }

    /// Bytes of the committed state.
    pub fn stored_bytes(&self) -> usize {
        match self.state {
            Some(_) => self.shape.bytes(),
            None => 0,
        }
    }

    /// An independent copy of the committed state (its own buffers).
    pub fn fork(&self) -> Result<Self> {
        let state = match &self.state {
            Some((conv, ssm)) => Some((conv.copy()?, ssm.copy()?)),
            None => None,
        };
        Ok(Self {
            shape: self.shape,
            device: self.device.clone(),
            state,
            staged: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> RecurrentShape {
        RecurrentShape {
            conv_window: 3,
            conv_channels: 8,
            n_heads: 2,
            head_v_dim: 4,
            head_k_dim: 4,
        }
    }

    #[test]
    fn a_state_starts_at_zero_and_changes_only_when_committed() {
        let mut state = RecurrentState::new(shape(), &Device::Cpu);
        assert_eq!(state.allocated_bytes(), 0);
        let (conv, ssm) = state.current().unwrap();
        assert_eq!((conv.dims(), ssm.dims()), (&[3, 8][..], &[2, 4, 4][..]));
        let ones = |dims: &[usize]| Tensor::ones(dims, DType::F32, &Device::Cpu).unwrap();
        state.stage(ones(&[3, 8]), ones(&[2, 4, 4])).unwrap();
        let sum = |t: Tensor| t.sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(
            sum(state.current().unwrap().1),
            0.0,
            "staged, not committed"
        );
        state.commit();
        assert_eq!(sum(state.current().unwrap().1), 32.0);
        // (3 * 8 + 2 * 4 * 4) f32.
        assert_eq!(state.stored_bytes(), 56 * 4);
        assert!(state.stage(ones(&[2, 8]), ones(&[2, 4, 4])).is_err());
        let fork = state.fork().unwrap();
        state
            .stage(ones(&[3, 8]), (ones(&[2, 4, 4]) * 3.0).unwrap())
            .unwrap();
        state.commit();
        assert_eq!(sum(fork.current().unwrap().1), 32.0, "the fork is its own");
        state.clear();
        assert_eq!(state.allocated_bytes(), 0);
    }
}
