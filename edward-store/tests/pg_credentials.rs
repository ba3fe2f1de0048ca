//! The credential-store conformance suite against [`PgStore`] on a real
//! Postgres (`EDWARD_TEST_DATABASE_URL`, started by `scripts/test.sh`).
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;

use edward_core::testkit::credential_store;
use edward_store::{PgOptions, PgStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_credential_store_conformance() {
    let options = PgOptions::default().schema(common::fresh_schema());
    let store = PgStore::connect_with(&common::database_url(), options)
        .await
        .expect("connect to EDWARD_TEST_DATABASE_URL");
    credential_store::run_all(Arc::new(store)).await;
}
