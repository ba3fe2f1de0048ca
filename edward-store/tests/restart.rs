//! Crash and resume across processes, with the real engine.
//!
//! The test binary re-executes itself as worker processes (the
//! `child_worker` test, which does nothing unless `EDWARD_STORE_CHILD` is
//! set). A worker is SIGKILLed mid-run; another process resumes the run from
//! the durable store and finishes it, and the event log stays gap-free with
//! exactly one terminal event, last.
//!
//! - SQLite: one worker killed, a fresh worker started on the same file.
//! - Postgres: three workers share six runs; one is killed; the other two
//!   finish its runs.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

mod common;
#[path = "common/engine_rig.rs"]
mod rig;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edward_core::engine::{Backend, Engine, WorkerConfig};
use edward_core::memory::MemoryNotifier;
use edward_core::{RunId, RunQueue, RunStatus, RunStore};
use edward_store::{PgOptions, PgStore, SqliteStore};
use rig::{
    DirSandboxes, Workers, assert_completed_cleanly, is_finished, last_seq, model, submit,
    submitter, wait_for,
};
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(2);

/// The worker process: runs an engine worker against the backend named in
/// the environment until killed (or two minutes pass). A no-op otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_worker() {
    let Ok(backend) = std::env::var("EDWARD_STORE_CHILD") else {
        return;
    };
    let id = std::env::var("EDWARD_STORE_CHILD_ID").expect("worker id");
    let sandboxes = PathBuf::from(std::env::var("EDWARD_STORE_CHILD_SANDBOXES").expect("dir"));
    let (store, queue) = open_backend(&backend).await;
    let engine = Engine::builder()
        .backend(Backend::new(store, queue, Arc::new(MemoryNotifier::new())))
        .sandbox_provider(Arc::new(DirSandboxes { root: sandboxes }))
        .model_client(Arc::new(model()))
        .build()
        .expect("engine");
    let stop = CancellationToken::new();
    let cfg = WorkerConfig::new(stop.clone())
        .with_id(id)
        .with_lease(LEASE)
        .with_concurrency(2);
    let _ = tokio::time::timeout(Duration::from_secs(120), engine.worker(cfg)).await;
}

/// `sqlite:<path>` or `postgres:<schema>`.
async fn open_backend(backend: &str) -> (Arc<dyn RunStore>, Arc<dyn RunQueue>) {
    if let Some(path) = backend.strip_prefix("sqlite:") {
        let store = SqliteStore::open(path).await.expect("open sqlite");
        (Arc::new(store.clone()), Arc::new(store))
    } else if let Some(schema) = backend.strip_prefix("postgres:") {
        let store = pg(schema).await;
        (Arc::new(store.clone()), Arc::new(store.queue()))
    } else {
        panic!("unknown backend {backend}")
    }
}

async fn pg(schema: &str) -> PgStore {
    PgStore::connect_with(
        &common::database_url(),
        PgOptions::default().schema(schema.to_owned()),
    )
    .await
    .expect("connect to EDWARD_TEST_DATABASE_URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_worker_resumes_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("edward.db");
    let sandboxes = dir.path().join("sandboxes");
    let store = SqliteStore::open(&db).await.expect("open");
    let engine = submitter(Arc::new(store.clone()), Arc::new(store.clone()), &sandboxes);
    let run = submit(&engine, 1).await[0];
    let backend = format!("sqlite:{}", db.display());

    let mut workers = Workers(Vec::new());
    workers.spawn("first", &backend, &sandboxes);
    wait_for(
        "the first worker to stream events",
        Duration::from_secs(60),
        || async { last_seq(&store, run).await >= 12 },
    )
    .await;
    workers.kill("first");
    let at_kill = store.get_run(run).await.expect("get").expect("run");
    assert_eq!(at_kill.status, RunStatus::Running, "killed mid-run");
    let seq_at_kill = at_kill.last_seq;

    workers.spawn("second", &backend, &sandboxes);
    wait_for(
        "the restarted worker to finish the run",
        Duration::from_secs(90),
        || async { is_finished(&store, run).await },
    )
    .await;
    drop(workers);

    assert_completed_cleanly(&store, run, &sandboxes, true).await;
    let after = store.get_run(run).await.expect("get").expect("run");
    assert!(
        after.fence > at_kill.fence,
        "the restart took over with a newer fence"
    );
    assert!(
        after.last_seq > seq_at_kill,
        "the log continued after the kill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_three_workers_one_killed_others_finish_its_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandboxes = dir.path().join("sandboxes");
    let schema = common::fresh_schema();
    let store = pg(&schema).await;
    let engine = submitter(Arc::new(store.clone()), Arc::new(store.queue()), &sandboxes);
    let runs = submit(&engine, 6).await;
    let backend = format!("postgres:{schema}");

    let mut workers = Workers(Vec::new());
    for id in ["w0", "w1", "w2"] {
        workers.spawn(id, &backend, &sandboxes);
    }
    // Kill w0 once a run it holds has streamed a while.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victims: Vec<RunId> = loop {
        let held: Vec<uuid::Uuid> =
            sqlx::query_scalar("SELECT run_id FROM edward_queue WHERE owner = 'w0'")
                .fetch_all(store.pool())
                .await
                .expect("query leases");
        let mut deep = false;
        for id in &held {
            deep |= last_seq(&store, RunId(*id)).await >= 12;
        }
        if deep {
            break held.into_iter().map(RunId).collect();
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for w0 to be mid-run"
        );
        // Another process does the work: polling the shared store is the signal.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    workers.kill("w0");
    // Runs w0 held that were not finished when it died must be resumed.
    let mut interrupted = Vec::new();
    for run in &victims {
        if !is_finished(&store, *run).await {
            interrupted.push(*run);
        }
    }
    assert!(!interrupted.is_empty(), "w0 died holding an unfinished run");

    // Every run finished, and every job acked — including one w0 may have
    // finished but died before acking: a survivor claims it after the lease
    // lapses, sees `Finished` and acks it.
    wait_for(
        "w1 and w2 to finish every run and ack every job",
        Duration::from_secs(120),
        || async {
            for run in &runs {
                if !is_finished(&store, *run).await {
                    return false;
                }
            }
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM edward_queue")
                .fetch_one(store.pool())
                .await
                .expect("count queue");
            left == 0
        },
    )
    .await;
    drop(workers);

    for run in &runs {
        assert_completed_cleanly(&store, *run, &sandboxes, interrupted.contains(run)).await;
        let events = store
            .events_after(*run, 0, 1_000_000)
            .await
            .expect("events");
        if interrupted.contains(run) {
            let resumed_by = events
                .iter()
                .find(|e| e.kind == "run_resumed")
                .map(|e| e.payload["worker"].clone());
            assert!(
                matches!(
                    resumed_by.as_ref().and_then(|w| w.as_str()),
                    Some("w1" | "w2")
                ),
                "run {run} resumed by a survivor, got {resumed_by:?}"
            );
        }
    }
}
