//! [`WeightStore`]: hands the forward loop each decoder layer's weights, resident or streamed,
//! behind the model's [`LayerSource`], so the model code is the same in every offload mode
//! (DESIGN.md section 3):
//!
//! ```text
//! store.prefetch_ahead()    // queue copies for the next streamed layers, never blocks
//! let w = store.layer(i)    // resident tensors, or a slot the copy engine filled
//! ... forward ...
//! store.release(i)          // slot reusable; queues the next copy
//! ```
//!
//! `layer(i)` calls `prefetch_ahead()` itself, so a loop that only knows `layer` / `release`
//! (the model's [`LayerSource`]) streams just as well.

use std::sync::Arc;

use candle_core::Device;

use super::accounting::Accounting;
use super::error::OffloadError;
use super::experts::ExpertStore;
use super::host::{HostStore, Result};
use super::stream::{StreamConfig, Streamer};
use crate::model::decoder::LayerSource;
use crate::model::weights::LayerWeights;

/// Every decoder layer's weights: a resident prefix and, when some layers are offloaded, a
/// streamer for the rest.
#[derive(Debug)]
pub struct WeightStore {
    resident: Vec<LayerWeights>,
    streamer: Option<Streamer>,
    /// A MoE model placed expert by expert: its offloaded experts, pool and host tier.
    experts: Option<Arc<ExpertStore>>,
    n_layers: usize,
    accounting: Arc<Accounting>,
}

impl WeightStore {
    /// All layers resident (mode `none`, or `auto` when everything fits).
    pub fn resident(layers: Vec<LayerWeights>, accounting: Arc<Accounting>) -> Self {
        for w in &layers {
            accounting.add_weights(w.size_in_bytes() as u64);
        }
        Self {
            n_layers: layers.len(),
            resident: layers,
            streamer: None,
            experts: None,
            accounting,
        }
    }

    /// Every layer's other parts resident (`layers`, without their experts), the experts
    /// handed out by `experts` (resident, pooled or computed on the host).
    pub fn with_experts(
        layers: Vec<LayerWeights>,
        experts: ExpertStore,
        accounting: Arc<Accounting>,
    ) -> Self {
        let mut store = Self::resident(layers, accounting);
        store.experts = Some(Arc::new(experts));
        store
    }

    /// The expert store of a MoE model placed expert by expert.
    pub fn experts(&self) -> Option<&Arc<ExpertStore>> {
        self.experts.as_ref()
    }

    /// Layers `0..resident.len()` resident, the layers of `host` (which must be the rest, in
    /// order) streamed through a ring of `config.prefetch + 1` slots on `device`.
    pub fn streaming(
        resident: Vec<LayerWeights>,
        host: Arc<HostStore>,
        config: StreamConfig,
        device: &Device,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        let first = resident.len();
        let expected: Vec<usize> = (first..first + host.layers().len()).collect();
        let streamed: Vec<usize> = host.layers().iter().map(|l| l.index).collect();
        if streamed != expected {
            return Err(OffloadError::Weights(format!(
                "offloaded layers {streamed:?} do not follow the {first} resident ones"
            )));
        }
        for w in &resident {
            accounting.add_weights(w.size_in_bytes() as u64);
        }
        let streamer = Streamer::start(host, config, device, accounting.clone())?;
        Ok(Self {
            n_layers: first + streamed.len(),
            resident,
            streamer: Some(streamer),
            experts: None,
            accounting,
        })
    }

    /// Number of decoder layers.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// Number of resident layers (a prefix).
    pub fn resident_layers(&self) -> usize {
        self.resident.len()
    }

    /// Slots in the ring (0 when nothing streams).
    pub fn slots(&self) -> usize {
        self.streamer.as_ref().map_or(0, Streamer::slots)
    }

    /// The device-memory and streaming counters.
    pub fn accounting(&self) -> &Arc<Accounting> {
        &self.accounting
    }

    /// Queues copies of the next streamed layers, up to the prefetch depth beyond the next one
    /// the forward loop takes (wrapping to the next step); never waits for a copy.
    pub fn prefetch_ahead(&mut self) -> Result<()> {
        if let Some(streamer) = self.streamer.as_mut() {
            streamer.prefetch()?;
        }
        Ok(())
    }

    fn get(&mut self, index: usize) -> Result<LayerWeights> {
        if let Some(w) = self.resident.get(index) {
            return Ok(match &self.experts {
                Some(experts) if experts.has_layer(index) => {
                    w.clone().with_routed(experts.layer(index))
                }
                _ => w.clone(),
            });
        }
        match self.streamer.as_mut() {
            Some(s) if s.streams(index) => s.acquire(index),
            _ => Err(OffloadError::NoSuchLayer {
                index,
                n_layers: self.n_layers,
            }),
        }
    }
}

impl LayerSource for WeightStore {
    fn layer(&mut self, index: usize) -> crate::model::Result<LayerWeights> {
        self.prefetch_ahead()?;
        Ok(self.get(index)?)
    }

    fn release(&mut self, index: usize) -> crate::model::Result<()> {
        if let Some(experts) = &self.experts {
            experts.release(index);
        }
        if index >= self.resident.len() {
            if let Some(streamer) = self.streamer.as_mut() {
                streamer.release(index)?;
            }
        }
        Ok(())
    }
}
