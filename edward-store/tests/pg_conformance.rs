//! The `edward_core::testkit` conformance suites against [`PgStore`],
//! [`PgQueue`] and [`PgNotifier`] on a real Postgres
//! (`EDWARD_TEST_DATABASE_URL`, started by `scripts/test.sh` /
//! `scripts/pg.sh`). Each test works in a fresh schema, so tests running in
//! parallel (and other test binaries) never see each other's queue rows.
#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;

use edward_core::testkit::{lock, notifier, run_queue, run_store};
use edward_core::{Lock, Notifier, RunQueue, RunStore};
use edward_store::{PgLock, PgNotifier, PgOptions, PgQueue, PgStore, StoreOptions};

async fn pg_store() -> PgStore {
    let options = PgOptions::default()
        .schema(common::fresh_schema())
        .store(StoreOptions::default().max_connections(16));
    PgStore::connect_with(&common::database_url(), options)
        .await
        .expect("connect to EDWARD_TEST_DATABASE_URL")
}

async fn pg_queue() -> PgQueue {
    pg_store().await.queue()
}

async fn pg_notifier() -> PgNotifier {
    let store = pg_store().await;
    PgNotifier::from_pool(store.pool().clone(), &common::fresh_schema())
        .await
        .expect("notifier")
}

async fn pg_lock() -> PgLock {
    PgLock::from_pool(pg_store().await.pool().clone())
}

macro_rules! checks {
    ($make:ident as $tr:ident: $($name:ident => $check:path, $arg:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let adapter: Arc<dyn $tr> = Arc::new($make().await);
            checks!(@call $check, $arg, adapter);
        }
    )*};
    (@call $check:path, arc, $s:ident) => { $check(Arc::clone(&$s)).await };
    (@call $check:path, r#ref, $s:ident) => { $check(&*$s).await };
}

checks! { pg_store as RunStore:
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

checks! { pg_queue as RunQueue:
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

checks! { pg_notifier as Notifier:
    notifier_subscribe_then_notify => notifier::check_subscribe_then_notify, r#ref;
    notifier_per_run_isolation => notifier::check_per_run_isolation, r#ref;
    notifier_notify_without_subscribers => notifier::check_notify_without_subscribers, r#ref;
    notifier_cancel_broadcast => notifier::check_cancel_broadcast, r#ref;
    notifier_run_all => notifier::run_all, arc;
}

checks! { pg_lock as Lock:
    lock_acquire_renew_release => lock::check_acquire_renew_release, r#ref;
    lock_expiry => lock::check_expiry, r#ref;
    lock_renew_extends => lock::check_renew_extends, r#ref;
    lock_concurrent_acquire => lock::check_concurrent_acquire, arc;
    lock_run_all => lock::run_all, arc;
}

/// The suites also pass on the shared default schema (no isolation), as a
/// deployment would run them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_suite_on_default_schema() {
    let store = PgStore::connect(&common::database_url())
        .await
        .expect("connect");
    run_store::run_all(Arc::new(store)).await;
}

/// 1,000 concurrent submits for one user with `per_user = 2`: exactly 2 admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_admits_admit_exactly_two() {
    common::admit_storm(Arc::new(pg_store().await), 1000).await;
}

/// Two notifiers on one channel prefix (as two processes would have): a
/// cancel sent through one reaches the subscriber of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_cross_connections() {
    use futures::StreamExt;
    let prefix = common::fresh_schema();
    let store = pg_store().await;
    let a = PgNotifier::from_pool(store.pool().clone(), &prefix)
        .await
        .expect("a");
    let b = PgNotifier::connect(&common::database_url())
        .await
        .expect("b");
    // `b` uses the default prefix: it must not see `a`'s prefix.
    let c = PgNotifier::from_pool(store.pool().clone(), &prefix)
        .await
        .expect("c");
    let mut on_c = c.subscribe_cancels().await.expect("subscribe");
    let mut on_b = b.subscribe_cancels().await.expect("subscribe");
    let run = edward_core::RunId::new();
    a.notify_cancel(run).await.expect("notify");
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), on_c.next())
        .await
        .expect("cancel delivered");
    assert_eq!(got, Some(run));
    // Prove `b` is live, then that it never saw `a`'s cancel.
    let marker = edward_core::RunId::new();
    b.notify_cancel(marker).await.expect("notify b");
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match on_b.next().await {
                Some(id) if id == run => return Some(id),
                Some(id) if id == marker => return None,
                Some(_) => continue,
                None => panic!("stream ended"),
            }
        }
    })
    .await
    .expect("marker delivered");
    assert_eq!(first, None, "another prefix's cancel leaked through");
}

/// A stale worker racing a take-over: appends from the old fence fail with
/// `StaleFence` once the new fence started, and the log stays gap-free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_worker_racing_takeover_keeps_log_gap_free() {
    use edward_core::testkit::run_store::{admit_fresh, all_events, cleanup, event};
    use edward_core::{Fence, StoreError};
    let store = Arc::new(pg_store().await);
    let run = admit_fresh(&*store).await;
    store.start_run(run.id, Fence(1)).await.expect("start");
    let old = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let mut ok = 0u32;
            for i in 0..200 {
                match store
                    .append_events(run.id, Fence(1), vec![event("old", i)])
                    .await
                {
                    Ok(_) => ok += 1,
                    Err(StoreError::StaleFence { .. }) => return ok,
                    Err(e) => panic!("unexpected: {e}"),
                }
            }
            ok
        })
    };
    tokio::task::yield_now().await;
    store.start_run(run.id, Fence(2)).await.expect("take over");
    for i in 0..20 {
        store
            .append_events(run.id, Fence(2), vec![event("new", i)])
            .await
            .expect("new owner appends");
    }
    let old_ok = old.await.expect("old task");
    let events = all_events(&*store, run.id).await;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
    }
    assert_eq!(events.len() as u32, 1 + old_ok + 20);
    // No old event after the first new one.
    let first_new = events
        .iter()
        .position(|e| e.kind == "new")
        .expect("new events");
    assert!(events[first_new..].iter().all(|e| e.kind == "new"));
    cleanup(&*store, &[run.id]).await;
}

/// Group commit: appends of many runs made at once share ticks, and a run
/// whose append is refused (stale fence) or whose events make the tick's
/// statement fail (a NUL byte in a kind, which Postgres text refuses) gets
/// its own error while every other run's append commits, gap-free, in the
/// order each run made them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_isolates_refused_and_failing_appends() {
    use edward_core::testkit::run_store::{admit_fresh, all_events, cleanup, event};
    use edward_core::{Fence, NewEvent, StoreError};
    let store = Arc::new(pg_store().await);
    let mut runs = Vec::new();
    for _ in 0..40 {
        let run = admit_fresh(&*store).await;
        store.start_run(run.id, Fence(1)).await.expect("start");
        runs.push(run.id);
    }
    let (stale, failing) = (runs[0], runs[1]);
    store.start_run(stale, Fence(2)).await.expect("take over");
    let rounds = 25u64;
    let start = Arc::new(tokio::sync::Barrier::new(runs.len()));
    let mut tasks = Vec::new();
    for &run_id in &runs {
        let (store, start) = (Arc::clone(&store), Arc::clone(&start));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut results = Vec::new();
            for i in 0..rounds {
                let events = if run_id == failing && i % 5 == 2 {
                    vec![NewEvent::new("bad\0kind", serde_json::json!({}))]
                } else {
                    vec![event("a", i), event("b", i)]
                };
                results.push(store.append_events(run_id, Fence(1), events).await);
            }
            (run_id, results)
        }));
    }
    for task in tasks {
        let (run_id, results) = task.await.expect("task");
        for (i, result) in results.into_iter().enumerate() {
            match result {
                _ if run_id == stale => assert!(
                    matches!(result, Err(StoreError::StaleFence { .. })),
                    "stale fence: {result:?}"
                ),
                Err(e) if run_id == failing && i % 5 == 2 => {
                    assert!(!e.to_string().is_empty());
                }
                Ok(events) => {
                    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
                    assert_eq!(seqs.len(), 2, "run {run_id} round {i}");
                    assert_eq!(seqs[1], seqs[0] + 1);
                }
                Err(e) => panic!("run {run_id} round {i}: {e}"),
            }
        }
        let events = all_events(&*store, run_id).await;
        let good_rounds = if run_id == stale {
            0
        } else if run_id == failing {
            rounds - rounds / 5
        } else {
            rounds
        };
        // Seq 1 is admission's `run_queued`.
        assert_eq!(events.len() as u64, 1 + 2 * good_rounds, "run {run_id}");
        let mut expected = (0..rounds)
            .filter(|i| run_id != failing || i % 5 != 2)
            .flat_map(|i| [("a", i), ("b", i)]);
        for (k, e) in events.iter().enumerate().skip(1) {
            assert_eq!(e.seq, k as u64 + 1, "gap-free");
            let (kind, n) = expected.next().expect("expected event");
            assert_eq!((e.kind.as_str(), e.payload["n"].as_u64()), (kind, Some(n)));
        }
    }
    cleanup(&*store, &runs).await;
}

/// Grouped reads: a second store on the same database (another process's,
/// as the submitter of `--workers` runs is) finds none of the events in its
/// recent-events cache, so its tailers' reads go through the grouped
/// reader. Many reads at once — of different runs, the same run from
/// different seqs, with limits, of an unknown run, past the end — each get
/// exactly their own page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_reads_answer_each_read_its_own_page() {
    use edward_core::testkit::run_store::{admit_fresh, cleanup, event};
    use edward_core::{Fence, RunId, StoreError};
    let schema = common::fresh_schema();
    let url = common::database_url();
    let connect = || {
        let options = PgOptions::default()
            .schema(schema.clone())
            .store(StoreOptions::default().max_connections(8));
        PgStore::connect_with(&url, options)
    };
    let writer = connect().await.expect("writer store");
    let reader = Arc::new(connect().await.expect("reader store"));
    let mut runs = Vec::new();
    for r in 0..30u64 {
        let run = admit_fresh(&writer).await;
        writer.start_run(run.id, Fence(1)).await.expect("start");
        let events = (0..20 + r).map(|i| event("e", i)).collect();
        writer
            .append_events(run.id, Fence(1), events)
            .await
            .expect("append");
        runs.push((run.id, 21 + r)); // + admission's `run_queued`
    }
    let reads: Vec<(RunId, u64, usize)> = runs
        .iter()
        .flat_map(|&(id, _)| [(id, 0, 512), (id, 5, 3), (id, 19, 512), (id, 1_000, 10)])
        .collect();
    let start = Arc::new(tokio::sync::Barrier::new(reads.len() + 1));
    let mut tasks = Vec::new();
    for &(run_id, after, limit) in &reads {
        let (reader, start) = (Arc::clone(&reader), Arc::clone(&start));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            reader.events_after(run_id, after, limit).await
        }));
    }
    let unknown = {
        let (reader, start) = (Arc::clone(&reader), Arc::clone(&start));
        tokio::spawn(async move {
            start.wait().await;
            reader.events_after(RunId::new(), 0, 10).await
        })
    };
    for (task, &(run_id, after, limit)) in tasks.into_iter().zip(&reads) {
        let page = task.await.expect("task").expect("read");
        let last = runs.iter().find(|r| r.0 == run_id).expect("run").1;
        let expected: Vec<u64> = (after + 1..=last).take(limit).collect();
        let seqs: Vec<u64> = page.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, expected, "run {run_id} after {after} limit {limit}");
        assert!(page.iter().all(|e| e.run_id == run_id));
        for e in page.iter().filter(|e| e.seq > 1) {
            assert_eq!(
                e.payload["n"].as_u64(),
                Some(e.seq - 2),
                "payload of seq {}",
                e.seq
            );
        }
    }
    assert!(matches!(
        unknown.await.expect("task"),
        Err(StoreError::NotFound { .. })
    ));
    let ids: Vec<RunId> = runs.iter().map(|r| r.0).collect();
    cleanup(&writer, &ids).await;
}
