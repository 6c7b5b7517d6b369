//! The machine's memory read bandwidth, as decode sees it: `--threads` threads each read a
//! buffer of their own, larger than the caches, from start to end, all at once, `--rounds`
//! times; the rate of a round is the bytes of all buffers over the time from the common start to
//! the last thread's end. Decode of a model that does not fit in the caches reads every weight
//! once per token, so its tokens per second times the bytes read per token against this rate
//! says how close it comes to the memory's limit (`benches/compare-llama-cpp.sh` prints both).
//!
//! Usage: cargo bench --bench read_bandwidth -- [--threads 2] [--mib 256] [--rounds 7]
//! Prints one JSON line: the threads, the bytes per thread, every round's GB/s, the median and
//! the best.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

/// `cargo bench --bench read_bandwidth -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    /// Threads reading at once (decode's: RAYON_NUM_THREADS).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Each thread's buffer, in MiB (well past the last-level cache).
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Rounds measured (after one that is not).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Passed by `cargo bench`.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// The wrapping sum of `words`, in eight independent lanes so that the loads, not the adds, set
/// the pace (the compiler turns the lanes into vector adds).
fn read_all(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail: u64 = chunks.remainder().iter().fold(0, |s, &w| s.wrapping_add(w));
    for chunk in chunks {
        for (lane, &w) in lanes.iter_mut().zip(chunk) {
            *lane = lane.wrapping_add(w);
        }
    }
    lanes.iter().fold(tail, |s, &l| s.wrapping_add(l))
}

fn main() {
    let o = Options::parse();
    let threads = o.threads.max(1);
    let words_per_thread = (o.mib.max(1) << 20) / 8;
    let rounds = o.rounds.max(1);
    // Each round: every thread waits at `start`, reads, waits at `done`; the main thread times
    // from the first barrier to the second.
    let start = Arc::new(Barrier::new(threads + 1));
    let done = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (start, done) = (Arc::clone(&start), Arc::clone(&done));
            thread::spawn(move || {
                // Distinct values, written by the thread that reads them (its pages, faulted in
                // before any round).
                let words: Vec<u64> = (0..words_per_thread as u64)
                    .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t as u64)
                    .collect();
                for _ in 0..=rounds {
                    start.wait();
                    black_box(read_all(black_box(&words)));
                    done.wait();
                }
            })
        })
        .collect();
    let bytes = (threads * words_per_thread * 8) as f64;
    let mut rates = Vec::with_capacity(rounds);
    for round in 0..=rounds {
        start.wait();
        let started = Instant::now();
        done.wait();
        let took = started.elapsed().max(Duration::from_nanos(1));
        // Round 0 warms the TLB and the prefetchers; it is not counted.
        if round > 0 {
            rates.push(bytes / took.as_secs_f64() / 1e9);
        }
    }
    for worker in workers {
        worker.join().expect("a reading thread panicked");
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let best = sorted[sorted.len() - 1];
    let listed: Vec<String> = rates.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "{{\"threads\":{threads},\"bytes_per_thread\":{},\"read_gb_s\":[{}],\"read_gb_s_median\":{median:.2},\"read_gb_s_best\":{best:.2}}}",
        words_per_thread * 8,
        listed.join(",")
    );
}
