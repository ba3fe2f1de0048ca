//! Redis SIGKILLed and restarted empty, against each adapter and against a
//! real engine run. Each test owns a private `redis-server` it can kill.
//!
//! What happens when Redis loses its data (see `docs/REDIS.md`):
//! - a held lease is restored by its next heartbeat (same fence), so the
//!   live run carries on; queued runs come back through
//!   `queue_with_recovery`;
//! - pending files are gone: `put`/`take` on that sandbox fail with a
//!   non-retryable error naming it, the engine ends the run `failed` with
//!   that reason, and no file is ever reported written unless the sandbox
//!   wrote it;
//! - fences stay monotonic; the notifier reconnects and tells tailers to
//!   re-read the store, so no event is missed or repeated.
#![cfg(all(feature = "redis", feature = "sqlite"))]

#[path = "common/engine_rig.rs"]
mod rig;
#[path = "common/redis.rs"]
mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use edward_core::engine::{Engine, EngineConfig, WorkerConfig};
use edward_core::memory::MemoryRunStore;
use edward_core::testkit::run_store::admit_fresh;
use edward_core::testkit::write_buffer::{file, fresh_key};
use edward_core::{
    FlushPolicy, Lock, Notifier, RUN_FINISHED, RunId, RunQueue, RunStatus, RunStore, WriteBuffer,
};
use edward_store::{RedisBackend, RedisOptions, SqliteStore};
use futures::StreamExt;
use support::PrivateRedis;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(30);

async fn connect(server: &PrivateRedis, options: RedisOptions) -> RedisBackend {
    RedisBackend::connect_with(&server.url(), options)
        .await
        .expect("connect to the private redis")
}

/// Retry `op` while it fails retryably (the connection manager is
/// reconnecting to the restarted server): the reconnect is the signal.
async fn after_reconnect<T, E, F, Fut>(what: &str, mut op: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Retryable,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match op().await {
            Err(e) if e.retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) if e.retryable() => panic!("{what}: still failing after 20 s: {e}"),
            other => return other,
        }
    }
}

trait Retryable {
    fn retryable(&self) -> bool;
}
impl Retryable for edward_core::QueueError {
    fn retryable(&self) -> bool {
        self.is_retryable()
    }
}
impl Retryable for edward_core::InfraError {
    fn retryable(&self) -> bool {
        self.is_retryable()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_survives_a_wipe_and_queued_runs_are_recovered() {
    let mut server = PrivateRedis::start(&[]);
    let store = Arc::new(MemoryRunStore::new());
    let redis = connect(
        &server,
        RedisOptions::default().recovery_grace(Duration::from_millis(300)),
    )
    .await;
    let queue = redis.queue_with_recovery(store.clone());
    let (running, waiting) = (admit_fresh(&*store).await.id, admit_fresh(&*store).await.id);
    queue.enqueue(running).await.expect("enqueue");
    let lease = queue.claim("w1", LEASE).await.expect("claim").expect("job");
    assert_eq!(lease.run_id, running);
    store.start_run(running, lease.fence).await.expect("start");
    queue.enqueue(waiting).await.expect("enqueue");

    server.restart_empty();

    let renewed = after_reconnect("heartbeat", || queue.heartbeat(&lease, LEASE))
        .await
        .expect("the lease is restored after the wipe");
    assert_eq!(renewed.fence, lease.fence, "same fence");
    assert_eq!(renewed.attempt, lease.attempt);
    assert_eq!(queue.data_losses(), 1);

    // The queued run comes back (recovery), the restored one is held.
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        if let Some(l) = queue.claim("w2", LEASE).await.expect("claim") {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "the queued run was not recovered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(next.run_id, waiting, "the held run is not claimable");
    assert!(
        next.fence > lease.fence,
        "fences stay monotonic across the wipe"
    );
    // After the grace the running run is enqueued too: a no-op, it is held.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(queue.claim("w3", LEASE).await.expect("claim").is_none());
    queue.ack(&renewed).await.expect("ack the restored lease");
    queue.ack(&next).await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_or_retry_after_a_wipe_is_not_lease_lost() {
    let mut server = PrivateRedis::start(&[]);
    let queue = connect(&server, RedisOptions::default()).await.queue();
    let (a, b) = (RunId::new(), RunId::new());
    queue.enqueue(a).await.expect("enqueue");
    queue.enqueue(b).await.expect("enqueue");
    let la = queue.claim("w", LEASE).await.expect("claim").expect("a");
    let lb = queue.claim("w", LEASE).await.expect("claim").expect("b");
    server.restart_empty();
    after_reconnect("ack", || queue.ack(&la))
        .await
        .expect("the job went with the data: the ack's work is done");
    let outcome = queue
        .retry(&lb, "failed", edward_core::RetryPolicy::default())
        .await
        .expect("a retry re-creates the job");
    assert!(matches!(
        outcome,
        edward_core::RetryOutcome::Scheduled { .. }
    ));
    // A stale lease in the *same* epoch is still refused.
    assert!(matches!(
        queue.ack(&la).await,
        Err(edward_core::QueueError::LeaseLost { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_files_lost_with_redis_are_a_clear_error() {
    let mut server = PrivateRedis::start(&[]);
    let buffer = connect(&server, RedisOptions::default())
        .await
        .write_buffer();
    let (lost, later) = (fresh_key(), fresh_key());
    let policy = FlushPolicy::default();
    buffer
        .put(&lost, vec![file("a.txt", "1")], Utc::now(), policy)
        .await
        .expect("put");
    buffer
        .put(&later, vec![file("b.txt", "2")], Utc::now(), policy)
        .await
        .expect("put");
    server.restart_empty();

    let err = after_reconnect("take", || buffer.take(&lost))
        .await
        .expect_err("the pending files are gone");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("lost the pending files"), "{err}");
    assert!(
        err.to_string().contains(&lost.0),
        "names the sandbox: {err}"
    );
    let err = buffer
        .put(&later, vec![file("b.txt", "3")], Utc::now(), policy)
        .await
        .expect_err("a put on top of lost files");
    assert!(err.to_string().contains(&later.0), "{err}");
    // The sandbox starts afresh after the error.
    buffer
        .put(&later, vec![file("b.txt", "4")], Utc::now(), policy)
        .await
        .expect("put");
    let taken = buffer.take(&later).await.expect("take");
    assert_eq!(taken, vec![file("b.txt", "4")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_fences_stay_monotonic_across_a_wipe() {
    let mut server = PrivateRedis::start(&[]);
    let lock = connect(&server, RedisOptions::default()).await.lock();
    let old = lock
        .try_acquire("l", "a", LEASE)
        .await
        .expect("acquire")
        .expect("free");
    server.restart_empty();
    let new = after_reconnect("acquire", || lock.try_acquire("l", "b", LEASE))
        .await
        .expect("acquire")
        .expect("the wiped lock is free");
    assert!(new.fence > old.fence, "{} then {}", old.fence, new.fence);
    assert!(
        !lock.release(&old).await.expect("release"),
        "the old guard holds nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notifier_reconnects_and_tells_tailers_to_resync() {
    let mut server = PrivateRedis::start(&[]);
    let redis = connect(&server, RedisOptions::default()).await;
    let notifier = redis.notifier().await.expect("notifier");
    let run = RunId::new();
    let mut hints = notifier.subscribe_events(run).await.expect("subscribe");
    let mut cancels = notifier.subscribe_cancels().await.expect("subscribe");
    notifier.notify_events(run, 1).await.expect("notify");
    assert_eq!(hints.next().await, Some(1));

    server.restart_empty();
    let resync = tokio::time::timeout(Duration::from_secs(20), hints.next())
        .await
        .expect("a resync hint after the reconnect");
    assert_eq!(resync, Some(edward_store::RedisNotifier::RESYNC_HINT));
    assert_eq!(notifier.reconnects(), 1);
    after_reconnect("notify", || notifier.notify_events(run, 2))
        .await
        .expect("notify");
    let got = tokio::time::timeout(Duration::from_secs(10), hints.next()).await;
    assert_eq!(got.expect("hint after reconnect"), Some(2));
    notifier.notify_cancel(run).await.expect("cancel");
    let got = tokio::time::timeout(Duration::from_secs(10), cancels.next()).await;
    assert_eq!(got.expect("cancel after reconnect"), Some(run));
}

/// A real run with the Redis queue, write buffer and notifier (runs in
/// SQLite); Redis is SIGKILLed mid-run and restarted empty. The run
/// completes, or fails with a reason naming Redis; its log is gap-free with
/// one terminal event, a tailer saw exactly the stored events, and every
/// file reported written is in the sandbox whole. A run submitted after the
/// wipe completes normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_survives_or_fails_clearly_when_redis_is_wiped_mid_run() {
    wiped_mid_run(false).await;
}

/// The same with a long debounce, the wipe made while a file is pending:
/// the run must fail naming the lost files, and that file is not reported
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_pending_files_fails_clearly_when_redis_is_wiped() {
    wiped_mid_run(true).await;
}

async fn wiped_mid_run(while_pending: bool) {
    let mut server = PrivateRedis::start(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let sandboxes = dir.path().join("sandboxes");
    let store: Arc<dyn RunStore> = Arc::new(
        SqliteStore::open(dir.path().join("e.db"))
            .await
            .expect("sqlite"),
    );
    let redis = connect(
        &server,
        RedisOptions::default().recovery_grace(Duration::from_secs(2)),
    )
    .await;
    let mut config = EngineConfig {
        tail_backstop: Duration::from_millis(500),
        ..EngineConfig::default()
    };
    if while_pending {
        config.flush = FlushPolicy {
            debounce: Duration::from_secs(60),
            max_wait: Duration::from_secs(60),
        };
    }
    let engine = Engine::builder()
        .backend(edward_core::engine::Backend::new(
            store.clone(),
            Arc::new(redis.queue_with_recovery(store.clone())),
            Arc::new(redis.notifier().await.expect("notifier")),
        ))
        .write_buffer(Arc::new(redis.write_buffer()))
        .sandbox_provider(Arc::new(rig::DirSandboxes {
            root: sandboxes.clone(),
        }))
        .model_client(Arc::new(rig::model()))
        .config(config)
        .build()
        .expect("engine");
    let stop = CancellationToken::new();
    let worker = {
        let engine = engine.clone();
        let cfg = WorkerConfig::new(stop.clone())
            .with_id("w")
            .with_lease(Duration::from_secs(2));
        tokio::spawn(async move { engine.worker(cfg).await })
    };

    let run = rig::submit(&engine, 1).await[0];
    let tail = {
        let events = engine.events(run, 0);
        tokio::spawn(async move { events.collect::<Vec<_>>().await })
    };
    if while_pending {
        let files = format!(
            "{}wb:files:{}",
            redis.options().prefix,
            Engine::sandbox_key(&engine.get(run).await.unwrap().unwrap()).0
        );
        let url = server.url();
        rig::wait_for("a pending file", Duration::from_secs(60), || {
            let (files, url) = (files.clone(), url.clone());
            async move {
                let mut conn = support::raw(&url).await;
                let n: i64 = redis::cmd("EXISTS")
                    .arg(&files)
                    .query_async(&mut conn)
                    .await
                    .expect("exists");
                n == 1
            }
        })
        .await;
    } else {
        rig::wait_for("the run to stream", Duration::from_secs(60), || async {
            rig::last_seq(&*store, run).await >= 12
        })
        .await;
    }
    server.restart_empty();
    rig::wait_for("the run to end", Duration::from_secs(90), || async {
        rig::is_finished(&*store, run).await
    })
    .await;

    let stored = store.get_run(run).await.expect("get").expect("run");
    let events = store.events_after(run, 0, 1_000_000).await.expect("events");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "gap-free");
    }
    assert_eq!(events.iter().filter(|e| e.kind == RUN_FINISHED).count(), 1);
    assert_eq!(events.last().map(|e| e.kind.as_str()), Some(RUN_FINISHED));
    let reason = stored.terminal_reason.clone().unwrap_or_default();
    if while_pending {
        assert_eq!(stored.status, RunStatus::Failed, "{reason}");
        assert!(reason.contains("lost the pending files"), "{reason}");
    }
    match stored.status {
        RunStatus::Completed => {
            let sandbox = sandboxes.join(Engine::sandbox_key(&stored).0);
            for i in 0..rig::FILES {
                let got = std::fs::read_to_string(sandbox.join(format!("f{i}.txt")))
                    .expect("a completed run wrote every file");
                assert_eq!(got, rig::file_content(i));
            }
        }
        RunStatus::Failed => {
            let reason = stored.terminal_reason.clone().unwrap_or_default();
            assert!(reason.contains("redis"), "a clear reason: {reason}");
        }
        other => panic!("unexpected status {other}: {:?}", stored.terminal_reason),
    }
    eprintln!(
        "wiped mid-run: {} after {} events ({:?})",
        stored.status,
        events.len(),
        stored.terminal_reason
    );
    // Every file reported written is in the sandbox, whole.
    let sandbox = sandboxes.join(Engine::sandbox_key(&stored).0);
    for e in events.iter().filter(|e| e.kind == "file_written") {
        let path = e.payload["path"].as_str().expect("path");
        let i: usize = path[1..2].parse().expect("f<i>.txt");
        let got = std::fs::read_to_string(sandbox.join(path)).expect("reported file exists");
        assert_eq!(got, rig::file_content(i), "{path} whole");
    }
    // The tailer saw exactly the stored log: nothing missed, nothing twice.
    let tailed = tokio::time::timeout(Duration::from_secs(30), tail)
        .await
        .expect("the tail ends after the terminal event")
        .expect("tail task");
    let tailed: Vec<u64> = tailed.into_iter().map(|e| e.expect("event").seq).collect();
    let want: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(tailed, want, "the tailer saw every event once");

    // Redis is usable again: a new run completes.
    let next = rig::submit(&engine, 1).await[0];
    rig::wait_for("the next run to end", Duration::from_secs(90), || async {
        rig::is_finished(&*store, next).await
    })
    .await;
    rig::assert_completed_cleanly(&*store, next, &sandboxes, false).await;
    stop.cancel();
    worker.await.expect("worker").expect("worker config");
}
