//! Every conformance suite against the in-memory adapters.
#![cfg(feature = "testkit")]

use std::sync::Arc;

use edward_core::memory::{
    MemoryLock, MemoryNotifier, MemoryRunQueue, MemoryRunStore, MemoryWriteBuffer,
};
use edward_core::testkit;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_run_store_conformance() {
    testkit::run_store::run_all(Arc::new(MemoryRunStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_run_queue_conformance() {
    testkit::run_queue::run_all(Arc::new(MemoryRunQueue::new())).await;
}

#[tokio::test]
async fn memory_write_buffer_conformance() {
    testkit::write_buffer::run_all(Arc::new(MemoryWriteBuffer::new())).await;
}

#[tokio::test]
async fn memory_notifier_conformance() {
    testkit::notifier::run_all(Arc::new(MemoryNotifier::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_lock_conformance() {
    testkit::lock::run_all(Arc::new(MemoryLock::new())).await;
}

/// The suites hold against one shared set of adapters used concurrently, as
/// they must against a shared Postgres or Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_suites_share_backends() {
    let b = edward_core::memory::MemoryBackends::new();
    tokio::join!(
        testkit::run_store::run_all(b.store.clone()),
        testkit::run_store::run_all(b.store.clone()),
        testkit::run_queue::run_all(b.queue.clone()),
        testkit::write_buffer::run_all(b.write_buffer.clone()),
        testkit::write_buffer::run_all(b.write_buffer.clone()),
        testkit::notifier::run_all(b.notifier.clone()),
        testkit::lock::run_all(b.lock.clone()),
    );
}
