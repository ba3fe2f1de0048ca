//! In-memory adapters of every trait: the embedded defaults for tests and
//! single-process use.
//!
//! Each adapter keeps its state behind a `std::sync::Mutex` that is never
//! held across an `.await`, which makes every trait call atomic — the same
//! guarantees a transactional backend gives, so the conformance suites in
//! `edward_core::testkit` pass against these and the durable adapters alike.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

mod credentials;
mod lock;
mod notifier;
mod run_queue;
mod run_store;
mod web_search;
mod write_buffer;

pub use credentials::MemoryCredentialStore;
pub use lock::MemoryLock;
pub use notifier::MemoryNotifier;
pub use run_queue::MemoryRunQueue;
pub use run_store::{MemoryRetention, MemoryRunStore};
pub use web_search::NoWebSearch;
pub use write_buffer::MemoryWriteBuffer;

/// One of each in-memory adapter, shared through `Arc`s: the engine
/// builder's defaults. Each field coerces to the trait object the engine
/// takes (`Arc<MemoryRunStore>` → `Arc<dyn RunStore>`).
#[derive(Debug, Clone, Default)]
pub struct MemoryBackends {
    /// Runs, events, checkpoints, effects.
    pub store: Arc<MemoryRunStore>,
    /// The work queue.
    pub queue: Arc<MemoryRunQueue>,
    /// Pending sandbox file writes.
    pub write_buffer: Arc<MemoryWriteBuffer>,
    /// Event hints and cancel signals.
    pub notifier: Arc<MemoryNotifier>,
    /// Lease locks.
    pub lock: Arc<MemoryLock>,
    /// The unconfigured web search.
    pub web_search: Arc<NoWebSearch>,
}

impl MemoryBackends {
    /// Fresh, empty adapters.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Lock `mutex`, ignoring poisoning: every critical section leaves the state
/// consistent before anything that could panic, and a panic elsewhere must
/// not wedge the adapter.
pub(crate) fn lock_state<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `at + d`, saturating at the largest representable time.
pub(crate) fn add_duration(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
