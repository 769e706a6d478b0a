//! Tests that must not run beside each other: the hardening tests (hundreds of clients, kill -9
//! cycles, shutdown under load) and the replica tests (two real processes, delays and takeover
//! times measured), which share one test binary with the other suites. [`run`] holds one
//! process-wide lock for the whole test, so that two of them never overlap and their timings
//! do not disturb each other on a small machine.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static ALONE: Mutex<()> = Mutex::new(());

/// Runs one test body under the lock, on a two-worker runtime of its own, and prints how long
/// it took. A test that failed (a poisoned lock) does not stop the next one.
pub fn run<F: Future<Output = ()>>(name: &str, body: F) {
    let _guard: MutexGuard<'_, ()> = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the test runtime");
    let started = Instant::now();
    runtime.block_on(body);
    eprintln!("[{name}] done in {:.1} s", started.elapsed().as_secs_f64());
    runtime.shutdown_timeout(Duration::from_secs(2));
}
