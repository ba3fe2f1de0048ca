//! The credential-store conformance suite against [`SqliteStore`].
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use edward_core::testkit::credential_store;
use edward_store::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_credential_store_conformance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("edward.db"))
        .await
        .expect("open sqlite store");
    credential_store::run_all(Arc::new(store)).await;
}
