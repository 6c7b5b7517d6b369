//! Process resources the server manages: the open-file limit and the connection cap it allows
//! (every connection is a file descriptor; at the default soft limit of many systems, 1024, a
//! flood of idle connections would exhaust it and every `accept` would fail with "too many open
//! files"), and giving freed memory back to the OS after large request bodies.

/// File descriptors kept free for everything that is not a connection (model files, the
/// listener, logs, the tokenizer's and runtime's own).
pub const RESERVED_DESCRIPTORS: u64 = 128;

/// Raises the soft limit on open files to the hard limit (once per process is enough; later
/// calls change nothing) and returns the soft limit in force, `None` where it cannot be read.
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(limit) => Some(limit),
            Err(err) => {
                tracing::warn!(error = %err, "cannot raise the open-files limit");
                open_files_limit()
            }
        }
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The soft limit on open files, `None` where it cannot be read.
pub fn open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _hard)| soft)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// `configured` lowered so that connections cannot use the descriptors the process needs for
/// anything else (at least 1).
pub fn connection_cap(configured: usize) -> usize {
    let Some(limit) = open_files_limit() else {
        return configured.max(1);
    };
    let room = limit.saturating_sub(RESERVED_DESCRIPTORS).max(1);
    let cap = configured
        .min(usize::try_from(room).unwrap_or(usize::MAX))
        .max(1);
    if cap < configured {
        tracing::warn!(
            configured,
            cap,
            open_files_limit = limit,
            "the open-files limit allows fewer connections than server.max_connections"
        );
    }
    cap
}

/// Largest allocation glibc serves from its heap rather than a fresh mapping (its dynamic
/// threshold's own upper bound): the model's activations stay on the fast heap path.
pub const MMAP_THRESHOLD_BYTES: usize = 32 * 1024 * 1024;

/// Free memory at the top of a glibc heap beyond which it is returned to the OS on `free`.
/// High enough that a prompt's step reuses the pages its earlier layers freed (at 4 MiB each
/// freed activation was unmapped and the next one faulted in again: a tenth of a 512-token
/// prefill's time went to page faults and page clearing); the runtime and the server give the
/// memory back after the steps and requests that free a lot ([`release_freed_memory`]).
pub const TRIM_THRESHOLD_BYTES: usize = 256 * 1024 * 1024;

/// Heaps (glibc arenas) the process's threads share: one. The kernels' worker threads free
/// what other threads allocated and the other way round; in one heap each freed block is
/// reused by whichever thread asks next, and [`release_freed_memory`] can give back the free
/// top of it (glibc's `malloc_trim` leaves the tops of per-thread heaps alone, so with several
/// heaps and a high [`TRIM_THRESHOLD_BYTES`] a 512-token request left 30-50 MiB resident).
/// Small allocations go through glibc's per-thread caches without the heap's lock. Measured
/// (2 threads, 512-token prompts): prefill as fast or faster than with per-thread heaps.
pub const ARENAS: usize = 1;

/// Fixes glibc's allocation thresholds ([`MMAP_THRESHOLD_BYTES`], [`TRIM_THRESHOLD_BYTES`])
/// and its heap count ([`ARENAS`]). By default glibc raises its trim threshold to twice the
/// largest block freed so far, so after a burst of 10 MB request bodies each thread's heap
/// keeps tens of megabytes it no longer uses; a fixed threshold and [`release_freed_memory`]
/// after the steps and requests that free a lot keep the resident set to what is in use.
/// Call once at process start, before other threads; a no-op where the allocator is not glibc's.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES as libc::c_int);
        libc::mallopt(libc::M_ARENA_MAX, ARENAS as libc::c_int);
    }
}

/// Gives memory the allocator holds but does not use back to the OS. glibc keeps the freed
/// memory of large allocations (a 10 MB request body, its parsed copy, a prompt's activations)
/// in its heap, so without this a burst of large requests leaves the resident size at its
/// peak. A no-op where the allocator is not glibc's.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; any pad value is valid.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_limit() {
        let raised = raise_open_files_limit().expect("readable on unix");
        let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        assert_eq!(raised, soft);
        // macOS caps the soft limit below an unlimited hard limit; Linux reaches it.
        #[cfg(target_os = "linux")]
        assert_eq!(soft, hard);
        assert!(connection_cap(usize::MAX) as u64 <= soft);
        assert_eq!(connection_cap(3), 3);
    }
}
