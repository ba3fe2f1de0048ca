//! The credential-store conformance suite against the in-memory adapter.
#![cfg(feature = "testkit")]

use std::sync::Arc;

use edward_core::memory::MemoryCredentialStore;
use edward_core::testkit;

#[tokio::test]
async fn memory_credential_store_conformance() {
    testkit::credential_store::run_all(Arc::new(MemoryCredentialStore::new())).await;
}
