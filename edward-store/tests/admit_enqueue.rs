//! Admission and enqueue are one transaction where the store holds the queue:
//! a run admitted by `RunStore::admit` alone (the process died before
//! `RunQueue::enqueue`) is claimable, so it can never hold an admission slot
//! while no worker will ever run it.

mod common;

use std::time::Duration;

use edward_core::testkit::run_store::new_run;
use edward_core::testkit::unique;
use edward_core::{AdmissionLimits, RunQueue, RunStore};

async fn admitted_run_is_claimable(store: &dyn RunStore, queue: &dyn RunQueue) {
    let limits = AdmissionLimits {
        global: u32::MAX,
        per_user: u32::MAX,
        per_chat: u32::MAX,
    };
    let run = store
        .admit(new_run(&unique("u"), &unique("c")), limits)
        .await
        .expect("admit");
    // No enqueue: as if the submitting process crashed right here.
    let lease = queue
        .claim("w", Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("the admitted run is in the queue");
    assert_eq!(lease.run_id, run.id);
    // A later enqueue (the engine's, or the reconciler's) is a no-op.
    queue.enqueue(run.id).await.expect("enqueue");
    assert!(
        queue
            .claim("w2", Duration::from_secs(30))
            .await
            .expect("claim")
            .is_none(),
        "enqueue after admit must not create a second job"
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_admit_enqueues_atomically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = edward_store::SqliteStore::open(dir.path().join("e.db"))
        .await
        .expect("open");
    admitted_run_is_claimable(&store, &store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_admit_enqueues_atomically() {
    let options = edward_store::PgOptions::default().schema(common::fresh_schema());
    let store = edward_store::PgStore::connect_with(&common::database_url(), options)
        .await
        .expect("connect to EDWARD_TEST_DATABASE_URL");
    admitted_run_is_claimable(&store, &store.queue()).await;
}
