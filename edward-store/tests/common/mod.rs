//! Helpers shared by the adapter test binaries.
#![allow(dead_code)]

use std::sync::Arc;

use edward_core::testkit::run_store::{cleanup, new_run};
use edward_core::testkit::unique;
use edward_core::{AdmissionError, AdmissionLimits, AdmitError, RunStatus, RunStore};

/// The Postgres URL the tests use. Tests never skip: without it they fail
/// and say how to get one.
pub fn database_url() -> String {
    match std::env::var("EDWARD_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "EDWARD_TEST_DATABASE_URL is not set: run scripts/test.sh, or start Postgres with \
             `scripts/pg.sh start` and export EDWARD_TEST_DATABASE_URL=<the URL it prints>"
        ),
    }
}

/// A fresh schema name (`[a-z0-9_]`) for one test.
pub fn fresh_schema() -> String {
    unique("t").replace('-', "_")
}

/// `submits` concurrent admits for one user (each in its own chat) with
/// `per_user = 2`: exactly two are admitted, every other one is rejected
/// with `UserLimit { limit: 2 }`. Retryable backend errors are retried.
pub async fn admit_storm(store: Arc<dyn RunStore>, submits: usize) {
    let user = unique("storm-user");
    let limits = AdmissionLimits {
        global: u32::MAX,
        per_user: 2,
        per_chat: u32::MAX,
    };
    let mut tasks = Vec::with_capacity(submits);
    for _ in 0..submits {
        let store = Arc::clone(&store);
        let new = new_run(&user, &unique("chat"));
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                match store.admit(new.clone(), limits).await {
                    Err(AdmitError::Store(e)) if e.is_retryable() => tokio::task::yield_now().await,
                    other => return other,
                }
            }
            panic!("admit kept failing with retryable errors");
        }));
    }
    let mut admitted = Vec::new();
    let mut rejected = 0;
    for task in tasks {
        match task.await.expect("admit task") {
            Ok(run) => admitted.push(run.id),
            Err(AdmitError::Rejected(AdmissionError::UserLimit { limit: 2 })) => rejected += 1,
            Err(e) => panic!("unexpected admit result: {e:?}"),
        }
    }
    assert_eq!(admitted.len(), 2, "exactly per_user runs are admitted");
    assert_eq!(rejected, submits - 2);
    let queued = store
        .list_runs(RunStatus::Queued, 1_000_000)
        .await
        .expect("list_runs");
    let of_user = queued.iter().filter(|r| r.user_id == user).count();
    assert_eq!(of_user, 2, "rejected runs were not inserted");
    cleanup(&*store, &admitted).await;
}
