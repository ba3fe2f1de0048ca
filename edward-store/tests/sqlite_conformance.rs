//! The `edward_core::testkit` conformance suites against [`SqliteStore`],
//! one test per check, each on its own database file.
#![cfg(feature = "sqlite")]

mod common;

use std::sync::Arc;

use edward_core::testkit::{run_queue, run_store};
use edward_core::{RunQueue, RunStore};
use edward_store::SqliteStore;
use tempfile::TempDir;

async fn open() -> (SqliteStore, TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("edward.db"))
        .await
        .expect("open sqlite store");
    (store, dir)
}

macro_rules! store_checks {
    ($($name:ident => $check:path, $arg:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (store, _dir) = open().await;
            let store: Arc<dyn RunStore> = Arc::new(store);
            store_checks!(@call $check, $arg, store);
        }
    )*};
    (@call $check:path, arc, $s:ident) => { $check(Arc::clone(&$s)).await };
    (@call $check:path, r#ref, $s:ident) => { $check(&*$s).await };
}

macro_rules! queue_checks {
    ($($name:ident => $check:path, $arg:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let (store, _dir) = open().await;
            let queue: Arc<dyn RunQueue> = Arc::new(store);
            queue_checks!(@call $check, $arg, queue);
        }
    )*};
    (@call $check:path, arc, $s:ident) => { $check(Arc::clone(&$s)).await };
    (@call $check:path, r#ref, $s:ident) => { $check(&*$s).await };
}

store_checks! {
    store_admit_inserts_queued_with_first_event => run_store::check_admit_inserts_queued_with_first_event, r#ref;
    store_admission_limits => run_store::check_admission_limits, r#ref;
    store_concurrent_admits_respect_user_limit => run_store::check_concurrent_admits_respect_user_limit, arc;
    store_start_run_fences => run_store::check_start_run_fences, r#ref;
    store_append_gap_free => run_store::check_append_gap_free, r#ref;
    store_concurrent_appends_gap_free => run_store::check_concurrent_appends_gap_free, arc;
    store_stale_fence_append_rejected => run_store::check_stale_fence_append_rejected, r#ref;
    store_finish_run_exactly_once => run_store::check_finish_run_exactly_once, r#ref;
    store_concurrent_finish_exactly_once => run_store::check_concurrent_finish_exactly_once, arc;
    store_finish_without_fence => run_store::check_finish_without_fence, r#ref;
    store_events_after_paging => run_store::check_events_after_paging, r#ref;
    store_checkpoint_round_trip => run_store::check_checkpoint_round_trip, r#ref;
    store_effects => run_store::check_effects, r#ref;
    store_unknown_run => run_store::check_unknown_run, r#ref;
    store_list_runs_by_status => run_store::check_list_runs_by_status, r#ref;
    store_request_cancel_idempotent => run_store::check_request_cancel_idempotent, r#ref;
    store_list_user_runs => run_store::check_list_user_runs, r#ref;
    store_run_all => run_store::run_all, arc;
}

queue_checks! {
    queue_enqueue_claim_ack => run_queue::check_enqueue_claim_ack, r#ref;
    queue_claim_order => run_queue::check_claim_order, r#ref;
    queue_claim_skips_leased => run_queue::check_claim_skips_leased, r#ref;
    queue_concurrent_claims_exclusive => run_queue::check_concurrent_claims_exclusive, arc;
    queue_claim_many => run_queue::check_claim_many, arc;
    queue_heartbeat_extends => run_queue::check_heartbeat_extends, r#ref;
    queue_expired_lease_reclaimed => run_queue::check_expired_lease_reclaimed, r#ref;
    queue_retry_backoff => run_queue::check_retry_backoff, r#ref;
    queue_dead_letter => run_queue::check_dead_letter, r#ref;
    queue_enqueue_idempotent => run_queue::check_enqueue_idempotent, r#ref;
    queue_run_all => run_queue::run_all, arc;
}

/// 1,000 concurrent submits for one user with `per_user = 2`: exactly 2 admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_admits_admit_exactly_two() {
    let (store, _dir) = open().await;
    common::admit_storm(Arc::new(store), 1000).await;
}

/// Two handles on one file (as two processes would have) share state, and
/// the second sees the first's runs, events and queue.
#[tokio::test]
async fn reopened_file_keeps_runs_events_and_jobs() {
    use edward_core::testkit::run_store::{admit_fresh, event};
    use edward_core::{Fence, RunQueue};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("edward.db");
    let first = SqliteStore::open(&path).await.expect("open");
    let run = admit_fresh(&first).await;
    first.start_run(run.id, Fence(1)).await.expect("start");
    first
        .append_events(run.id, Fence(1), vec![event("a", 1), event("b", 2)])
        .await
        .expect("append");
    first.enqueue(run.id).await.expect("enqueue");
    first.close().await;

    let second = SqliteStore::open(&path).await.expect("reopen");
    let events = second.events_after(run.id, 0, 100).await.expect("events");
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    let lease = second
        .claim("w", std::time::Duration::from_secs(5))
        .await
        .expect("claim")
        .expect("the job survived");
    assert_eq!(lease.run_id, run.id);
}

/// Chat messages and build jobs survive a reopen; the attempt resumed after
/// the "crash" supersedes the dead attempt's later turns (no duplicate or
/// orphan message) and takes over its half-done build.
#[tokio::test]
async fn reopened_file_keeps_chat_messages_and_builds() {
    use edward_core::testkit::run_store::admit_fresh;
    use edward_core::{BuildStatus, Fence, NewMessage, TurnEffects};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("edward.db");
    let first = SqliteStore::open(&path).await.expect("open");
    let run = admit_fresh(&first).await;
    first.start_run(run.id, Fence(1)).await.expect("start");
    for (turn, text) in [(0, "build a todo app"), (1, "turn 1"), (2, "turn 2")] {
        let message = if turn == 0 {
            NewMessage::user(text)
        } else {
            NewMessage::assistant(text, TurnEffects::default())
        };
        first
            .put_messages(run.id, Fence(1), turn, vec![message])
            .await
            .expect("put");
    }
    first
        .create_build(run.id, Fence(1), 1, vec!["npm".into(), "run".into()])
        .await
        .expect("create build");
    first
        .claim_build(run.id, 1, Fence(1), "dead worker")
        .await
        .expect("claim")
        .expect("claimed");
    first.close().await;

    let second = SqliteStore::open(&path).await.expect("reopen");
    second.start_run(run.id, Fence(2)).await.expect("resume");
    // The checkpoint said turn 1 was the last complete one: turn 2 is redone.
    second
        .put_messages(
            run.id,
            Fence(2),
            2,
            vec![NewMessage::assistant(
                "turn 2 again",
                TurnEffects::default(),
            )],
        )
        .await
        .expect("redo turn 2");
    let texts: Vec<_> = second
        .chat_messages(&run.user_id, &run.chat_id, None, 100)
        .await
        .expect("messages")
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(texts, ["build a todo app", "turn 1", "turn 2 again"]);
    let job = second
        .claim_build(run.id, 1, Fence(2), "new worker")
        .await
        .expect("claim")
        .expect("the resumed attempt takes over the build");
    assert_eq!(job.status, BuildStatus::Building);
    assert_eq!(job.command, ["npm", "run"]);
    second.close().await;
}

/// An in-memory store works for both traits.
#[tokio::test]
async fn in_memory_store_passes_basic_checks() {
    let store = SqliteStore::in_memory().await.expect("in memory");
    run_store::check_append_gap_free(&store).await;
    run_queue::check_enqueue_claim_ack(&store).await;
}

/// With migrations turned off, a fresh file has no tables and writes fail
/// with a permanent backend error.
#[tokio::test]
async fn migrations_can_be_turned_off() {
    use edward_core::testkit::run_store::new_run;
    use edward_core::{AdmissionLimits, AdmitError};
    use edward_store::StoreOptions;
    let dir = tempfile::tempdir().expect("tempdir");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("bare.db"))
        .create_if_missing(true);
    let store = SqliteStore::connect_with(options, StoreOptions::default().migrate(false))
        .await
        .expect("connect");
    match store
        .admit(new_run("u", "c"), AdmissionLimits::default())
        .await
    {
        Err(AdmitError::Store(e)) => assert!(!e.is_retryable(), "missing table is permanent: {e}"),
        other => panic!("admit without tables must fail, got {other:?}"),
    }
}
