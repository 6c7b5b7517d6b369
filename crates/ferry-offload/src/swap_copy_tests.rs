//! A swap-in that fails part-way drains its copies before it frees any buffer: a CPU swap target
//! whose allocator fails at layer k (the out-of-memory a tight budget gives) or whose copies fail
//! at layer k logs every allocation, queued copy, drain and free; every buffer outlives the
//! drain, on the error paths as on success.

use std::sync::{Arc, Mutex};

use candle_core::Device;

use super::*;
use crate::buffer::HostMemory;
use crate::error::OffloadError;
use crate::layout::tests::{holding, open, q4_k_m, write_gguf, K_QUANT};
use ferry_gpu::GpuError;
use ferry_model::loader::DtypeChoice;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Alloc(usize),
    Queue(usize),
    Drain,
    Free(usize),
}

type Log = Arc<Mutex<Vec<Event>>>;

/// One layer's CPU buffers that log when the swap-in lets go of them.
struct Tracked {
    index: usize,
    buffers: SlotBuffers,
    log: Log,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.log.lock().unwrap().push(Event::Free(self.index));
    }
}

/// The CPU swap target with an allocator (or a copy) that fails at one layer.
struct Failing {
    inner: CpuSwap,
    log: Log,
    alloc_fails_at: Option<usize>,
    copy_fails_at: Option<usize>,
}

fn out_of_memory() -> OffloadError {
    OffloadError::Gpu(GpuError::Driver(
        "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
    ))
}

impl SwapTarget for Failing {
    type Buffers = Tracked;

    fn allocate(&mut self, layer: &HostLayer) -> Result<Tracked> {
        if self.alloc_fails_at == Some(layer.index) {
            return Err(out_of_memory());
        }
        let buffers = self.inner.allocate(layer)?;
        self.log.lock().unwrap().push(Event::Alloc(layer.index));
        Ok(Tracked {
            index: layer.index,
            buffers,
            log: self.log.clone(),
        })
    }

    fn allocated(&mut self) -> Result<()> {
        self.inner.allocated()
    }

    fn enqueue(&mut self, b: &Tracked, layer: &HostLayer) -> Result<u64> {
        if self.copy_fails_at == Some(layer.index) {
            return Err(OffloadError::Gpu(GpuError::Driver(
                "DriverError(CUDA_ERROR_ILLEGAL_ADDRESS)".into(),
            )));
        }
        self.log.lock().unwrap().push(Event::Queue(layer.index));
        self.inner.enqueue(&b.buffers, layer)
    }

    fn drain(&mut self) -> Result<()> {
        self.log.lock().unwrap().push(Event::Drain);
        self.inner.drain()
    }

    fn views(&self, b: &Tracked, layer: &HostLayer) -> Result<LayerWeights> {
        self.inner.views(&b.buffers, layer)
    }
}

/// Swaps a 4-layer Q4_K_M-shaped model in through `Failing` and returns the result and the log.
fn run(alloc_fails_at: Option<usize>, copy_fails_at: Option<usize>) -> (bool, Vec<Event>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("q4_k_m.gguf");
    write_gguf(&path, K_QUANT, &q4_k_m);
    let checkpoint = open(&path);
    let holding = holding(&checkpoint, DtypeChoice::Auto);
    let host =
        HostStore::fill(&checkpoint, &holding, &[0, 1, 2, 3], &HostMemory::Heap).expect("slabs");
    let log = Log::default();
    let mut target = Failing {
        inner: CpuSwap::new(&Device::Cpu, host.dense_dtype(), None),
        log: log.clone(),
        alloc_fails_at,
        copy_fails_at,
    };
    let result = swap_in(&mut target, &host);
    let ok = match &result {
        Ok(layers) => {
            assert_eq!(layers.len(), 4);
            true
        }
        Err(err) => {
            if alloc_fails_at.is_some() {
                assert!(ferry_gpu::is_out_of_memory(&err.to_string()), "{err}");
            }
            false
        }
    };
    drop(result);
    let events = log.lock().unwrap().clone();
    (ok, events)
}

/// Every buffer allocated is freed, and only after the one drain.
fn assert_drained_before_freed(events: &[Event]) {
    let drain = events
        .iter()
        .position(|e| *e == Event::Drain)
        .unwrap_or_else(|| panic!("no drain: {events:?}"));
    assert_eq!(events.iter().filter(|e| **e == Event::Drain).count(), 1);
    for (i, e) in events.iter().enumerate() {
        if let Event::Free(layer) = e {
            assert!(
                i > drain,
                "layer {layer} freed before the drain: {events:?}"
            );
        }
    }
    let allocated = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(_)))
        .count();
    let freed = events
        .iter()
        .filter(|e| matches!(e, Event::Free(_)))
        .count();
    assert_eq!(allocated, freed, "{events:?}");
}

#[test]
fn out_of_memory_at_layer_k_frees_the_earlier_buffers_after_the_drain() {
    use Event::*;
    let (ok, events) = run(Some(2), None);
    assert!(!ok);
    assert_drained_before_freed(&events);
    // Allocation comes first for every layer: nothing was queued when layer 2 failed.
    assert_eq!(events, [Alloc(0), Alloc(1), Drain, Free(0), Free(1)]);
}

#[test]
fn a_copy_failing_at_layer_k_drains_the_queued_copies_before_any_free() {
    use Event::*;
    let (ok, events) = run(None, Some(2));
    assert!(!ok);
    assert_drained_before_freed(&events);
    assert_eq!(
        events,
        [
            Alloc(0),
            Alloc(1),
            Alloc(2),
            Alloc(3),
            Queue(0),
            Queue(1),
            Drain,
            Free(0),
            Free(1),
            Free(2),
            Free(3)
        ]
    );
}

#[test]
fn a_whole_swap_in_allocates_all_then_copies_all_then_drains_once() {
    use Event::*;
    let (ok, events) = run(None, None);
    assert!(ok);
    assert_drained_before_freed(&events);
    assert_eq!(
        &events[..9],
        [
            Alloc(0),
            Alloc(1),
            Alloc(2),
            Alloc(3),
            Queue(0),
            Queue(1),
            Queue(2),
            Queue(3),
            Drain
        ]
    );
}
