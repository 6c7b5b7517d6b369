//! The threads a decode step's short parallel loops run on: candle's barrier pool
//! (`candle_core::utils::barrier_pool`), the pool candle's own CPU ops (norms, element-wise maps)
//! already run on, instead of rayon's.
//!
//! A decode step is a chain of short loops: per layer a few matmuls of one activation row and
//! an attention call, each about 0.05-0.3 ms, with candle's ops between them. On rayon's pool
//! the thread that is not running the step sleeps after each loop and is woken for the next
//! (a futex wake, tens of microseconds on a VM: measured on the 2-vCPU Zen 3 of
//! docs/BENCHMARKS.md, 16 context switches a token and 1.85 CPUs busy in a memory-bound decode).
//! Candle's pool spins between calls (`CANDLE_BARRIER_POOL_SPIN_LIMIT` rounds, then parks), so
//! the step's loops and the candle ops between them run on the same threads without sleeping.
//! Prompt-sized work (a GEMM) stays on rayon: there the hand-over is small beside the call.
//! The pool has `CANDLE_NUM_THREADS` (default: rayon's count, `RAYON_NUM_THREADS`) threads, the
//! calling one included, and runs one call at a time (a second caller waits for the first). A
//! call made inside a loop runs inline on the pool's own threads but would wait on itself on the
//! calling one: the loops handed to it here (kernels) never call back into it.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Threads a [`for_each_mut`] call spreads over (the caller's included).
pub fn threads() -> usize {
    candle_core::utils::barrier_pool().n_workers() + 1
}

/// Calls `f(i, &mut items[i])` once for every item, spread over the pool's threads, and returns
/// when all have returned. A panic in `f` is raised again on the calling thread.
pub fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
    let n = items.len();
    if n <= 1 || threads() == 1 {
        for (i, item) in items.iter_mut().enumerate() {
            f(i, item);
        }
        return;
    }
    let base = SharedItems(items.as_mut_ptr());
    // The items are handed out by this cursor (one index to one thread, whatever ranges the
    // pool gives its threads): every thread the pool starts takes items until none are left.
    let next = AtomicUsize::new(0);
    // A panic is caught here and raised again after the call: unwinding through the pool
    // would poison its call lock and fail every later candle op of the process.
    let panicked: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
    candle_core::utils::barrier_pool().execute_chunked(threads(), |_| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        // SAFETY: `i < n` indexes `items`, which outlives this call (the pool returns only
        // when every thread has finished), and the cursor hands each index out once, so no
        // two `&mut` to one item exist.
        let item = unsafe { &mut *base.at(i) };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i, item))) {
            let mut first = panicked.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert(payload);
        }
    });
    if let Some(payload) = panicked.into_inner().unwrap_or_else(|e| e.into_inner()) {
        resume_unwind(payload);
    }
}

/// The items' base pointer, shared by the pool's threads (each takes only the items the
/// cursor hands it).
struct SharedItems<T>(*mut T);

impl<T> SharedItems<T> {
    /// Item `i`'s pointer (a method, so closures capture the wrapper, not the raw pointer).
    fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

// SAFETY: the pointer is only dereferenced for distinct items, each handed out once (see
// `for_each_mut`);
// sending `&mut T` between threads needs `T: Send`.
unsafe impl<T: Send> Sync for SharedItems<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_visited_once_with_its_index() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let mut items: Vec<(usize, u32)> = (0..n).map(|i| (i, 0)).collect();
            for_each_mut(&mut items, |i, item| {
                assert_eq!(item.0, i, "item {i} handed the wrong index");
                item.1 += 1;
            });
            assert!(
                items.iter().all(|&(_, visits)| visits == 1),
                "n = {n}: {items:?}"
            );
        }
    }

    #[test]
    fn a_panic_in_the_loop_reaches_the_caller() {
        let mut items = vec![0u8; 64];
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each_mut(&mut items, |i, _| {
                if i == 40 {
                    panic!("item 40 failed");
                }
            })
        }));
        assert!(outcome.is_err(), "the panic was lost");
        // The pool (candle's, shared with its own ops) still works afterwards.
        let mut again = vec![0u8; 8];
        for_each_mut(&mut again, |_, x| *x = 1);
        assert_eq!(again, vec![1; 8]);
    }
}
