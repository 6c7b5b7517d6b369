//! The expert pool on a CUDA device: the CUDA twin of the pool's copy thread
//! ([`super::experts_copy`]) for [`super::experts::ExpertStore`]. Its slots are [`GpuSlot`]s,
//! allocated once at start from the plan's expert slot layout (a [`SlotKind::Cuda`] layout:
//! one quantized buffer per (part, type, shape) an offloaded expert uses, and a dense region);
//! an offloaded expert lives in a pinned host slab of its own ([`HostLayer::expert`]).
//!
//! Filling slot `s` queues, on the link's copy stream: wait for everything queued on the
//! compute stream so far (the kernels that read the slot's previous expert were queued before
//! the slot was picked as a victim), the slab's copies, record `loaded[s]`. Handing the
//! expert out makes the compute stream wait for `loaded[s]` ([`GpuExpertPool::ready`]). None
//! of it blocks the host, so a prefetched expert's copy runs while the layer's attention
//! computes and a miss's copy while the experts already on the device compute.
//!
//! The copy time is not measured (that would need a host wait); the accounting counts the bytes
//! and copies as misses or prefetches. The device work goes through [`ferry_gpu`], so this
//! file is the same in every build: without the `cuda` feature [`GpuExpertPool::new`] fails
//! with [`ferry_gpu::GpuError::NotBuilt`].

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};

use super::accounting::Accounting;
use super::error::OffloadError;
use super::experts_copy::CopyKind;
use super::host::{HostLayer, Result};
use super::layout::{SlotKind, SlotLayout};
use super::slot_gpu::GpuSlot;
use ferry_gpu::{CopyLink, GpuError};
use ferry_model::weights::ExpertWeights;

/// The device slots of the expert pool and their copy stream.
#[derive(Debug)]
pub(super) struct GpuExpertPool {
    /// First field: dropped first, it drains the copy stream before the slots are freed.
    link: CopyLink,
    slots: Vec<GpuSlot>,
    accounting: Arc<Accounting>,
}

impl GpuExpertPool {
    /// Allocates `n` slots of `layout` (the plan's expert slot layout) on `device` with dense
    /// regions in `dense_dtype`, counted in the accounting, and creates the copy stream.
    pub fn new(
        device: &Device,
        layout: &SlotLayout,
        dense_dtype: DType,
        n: usize,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        if layout.kind != SlotKind::Cuda {
            return Err(GpuError::Layout(format!(
                "the expert pool on a CUDA device needs a cuda slot layout, got {} (plan for \
                 the CUDA device)",
                layout.kind.as_str()
            ))
            .into());
        }
        let slots = (0..n)
            .map(|_| GpuSlot::new(device, layout, dense_dtype))
            .collect::<Result<Vec<_>>>()?;
        for slot in &slots {
            accounting.add_slots(slot.allocated_bytes());
        }
        let link = CopyLink::new(device, n.max(1))?;
        // Once for the whole pool: no copy overtakes the zeroing of the slots.
        link.copy_after_compute()?;
        Ok(Self {
            link,
            slots,
            accounting,
        })
    }

    /// Slots of the pool.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Queues the copy of `expert`'s pinned slab into slot `s` behind the compute queued so
    /// far, counted as `kind`, and returns the expert as the slot's tensors (valid for the
    /// compute stream after [`GpuExpertPool::ready`]). The slab must stay alive until the copy
    /// stream passes it (the store keeps its slabs for its lifetime).
    pub fn fill(&self, s: usize, expert: &HostLayer, kind: CopyKind) -> Result<ExpertWeights> {
        let slot = self
            .slots
            .get(s)
            .ok_or_else(|| OffloadError::Weights(format!("no expert slot {s}")))?;
        self.link.copy_after_compute()?;
        let bytes = slot.enqueue_fill(&self.link, expert)?;
        self.link.mark_loaded(s)?;
        match kind {
            CopyKind::Routed => self.accounting.record_expert_miss(bytes, Duration::ZERO),
            CopyKind::Predicted => self
                .accounting
                .record_expert_prefetch(bytes, Duration::ZERO),
        }
        super::experts::experts_of(slot.views(expert)?)
    }

    /// Makes the compute stream wait until slot `s`'s last fill has landed (no host wait).
    pub fn ready(&self, s: usize) -> Result<()> {
        Ok(self.link.compute_after_loaded(s)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan, PlanInput};
    use ferry_config::OffloadMode;

    fn accounting() -> Arc<Accounting> {
        let input = PlanInput::new(OffloadMode::Sequential, vec![100; 4], 50, 10_000);
        Arc::new(Accounting::new(&plan(&input).expect("plans")))
    }

    #[test]
    fn a_cpu_layout_is_refused_with_the_reason() {
        let layout = SlotLayout::new(SlotKind::Cpu);
        let err = GpuExpertPool::new(&Device::Cpu, &layout, DType::F32, 2, accounting())
            .expect_err("cpu layout");
        assert!(err.to_string().contains("cuda slot layout"), "{err}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_cuda_the_pool_cannot_be_made() {
        let layout = SlotLayout::new(SlotKind::Cuda);
        let err = GpuExpertPool::new(&Device::Cpu, &layout, DType::F32, 2, accounting())
            .expect_err("no CUDA");
        assert!(
            matches!(err, OffloadError::Gpu(GpuError::NotBuilt)),
            "{err}"
        );
    }
}
