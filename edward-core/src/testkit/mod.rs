//! Conformance suites: the same assertions for every adapter of a trait.
//! Each adapter's tests call these functions (memory, SQLite, Postgres, Redis, local, Docker).
//!
//! In the style of `object_store`'s `integration` module: one module per
//! trait, each with individual `check_*` functions and a `run_all` that calls
//! them all. The functions panic on a failed expectation, like assertions in
//! a test, and wrap every wait in a timeout so a broken adapter fails instead
//! of hanging.
//!
//! **Shared backends.** The suites run against persistent backends reused
//! between test runs (one Postgres database, one Redis): every check uses
//! fresh random run ids, user ids, chat ids, lock names and sandbox keys,
//! never assumes an empty store or queue, and asserts only on what it
//! created. Runs a check admits are finished before it returns, so they stop
//! counting against admission limits; queue jobs it enqueues are acked or
//! dead-lettered.
//!
//! ```no_run
//! # async fn f() {
//! use std::sync::Arc;
//! use edward_core::memory::MemoryRunStore;
//! edward_core::testkit::run_store::run_all(Arc::new(MemoryRunStore::new())).await;
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

pub mod chat_store;
pub mod credential_store;
pub mod lock;
pub mod notifier;
pub mod run_queue;
pub mod run_store;
pub mod sandbox;
pub mod write_buffer;

/// How long a suite waits for anything that should happen promptly.
pub const PROMPT: Duration = Duration::from_secs(10);

/// `fut`, or a panic naming `what` after [`PROMPT`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PROMPT, fut).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {PROMPT:?} waiting for {what}"),
    }
}

/// A fresh name with `prefix`, unique across test runs.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}
