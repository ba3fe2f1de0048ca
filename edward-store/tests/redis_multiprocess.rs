//! The Edward-TS topology across processes: runs in Postgres; the queue,
//! write buffer and notifier in Redis. The test binary re-executes itself as
//! worker processes (`child_worker`, a no-op unless `EDWARD_STORE_CHILD` is
//! set).
//!
//! - Three workers share six runs; one is SIGKILLed mid-run; the survivors
//!   finish its runs: gap-free logs, one terminal event each, files whole,
//!   no side effect repeated, every job acked (no job key left in Redis).
//! - 50 cancels sent from the parent process reach the worker processes
//!   over pub/sub; the delay until the run is `cancelled` in the store is
//!   printed as p50/p99 (the workers' status-check backup is set to a
//!   minute, so the delay is the notifier's).
#![cfg(all(feature = "redis", feature = "postgres"))]

mod common;
#[path = "common/engine_rig.rs"]
mod rig;
#[path = "common/redis.rs"]
mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edward_core::engine::{Engine, EngineConfig, WorkerConfig};
use edward_core::scripted::ScriptedModel;
use edward_core::{RunId, RunStatus, RunStore};
use edward_store::{PgOptions, PgStore, RedisBackend, RedisOptions};
use rig::{Workers, assert_completed_cleanly, is_finished, last_seq, submit, wait_for};
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(2);

/// `<schema> <prefix> <fast|slow>`.
struct Setup {
    schema: String,
    prefix: String,
    slow: bool,
}

impl Setup {
    fn encode(&self) -> String {
        let speed = if self.slow { "slow" } else { "fast" };
        format!("{} {} {speed}", self.schema, self.prefix)
    }

    fn decode(s: &str) -> Setup {
        let mut parts = s.split(' ');
        let (Some(schema), Some(prefix), Some(speed)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("bad child setup `{s}`");
        };
        Setup {
            schema: schema.to_owned(),
            prefix: prefix.to_owned(),
            slow: speed == "slow",
        }
    }

    fn model(&self) -> ScriptedModel {
        if self.slow {
            // About a minute of streaming: the run is still going when cancelled.
            ScriptedModel::new([rig::turn_one()])
                .with_chunk_bytes(16)
                .with_delay(Duration::from_millis(100))
        } else {
            rig::model()
        }
    }

    async fn store(&self) -> PgStore {
        PgStore::connect_with(
            &common::database_url(),
            PgOptions::default().schema(self.schema.clone()),
        )
        .await
        .expect("connect to EDWARD_TEST_DATABASE_URL")
    }

    async fn redis(&self) -> RedisBackend {
        support::backend_with(RedisOptions::default().prefix(&self.prefix)).await
    }

    /// An engine on this setup; `status_check` is the workers' backup.
    async fn engine(&self, sandboxes: PathBuf, config: EngineConfig) -> (Engine, PgStore) {
        let store = self.store().await;
        let shared: Arc<dyn RunStore> = Arc::new(store.clone());
        let redis = self.redis().await;
        let engine = Engine::builder()
            .backend(edward_core::engine::Backend::new(
                shared.clone(),
                Arc::new(redis.queue_with_recovery(shared)),
                Arc::new(redis.notifier().await.expect("notifier")),
            ))
            .write_buffer(Arc::new(redis.write_buffer()))
            .sandbox_provider(Arc::new(rig::DirSandboxes { root: sandboxes }))
            .model_client(Arc::new(self.model()))
            .config(config)
            .build()
            .expect("engine");
        (engine, store)
    }
}

/// The worker process. A no-op unless `EDWARD_STORE_CHILD` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_worker() {
    let Ok(setup) = std::env::var("EDWARD_STORE_CHILD") else {
        return;
    };
    let setup = Setup::decode(&setup);
    let id = std::env::var("EDWARD_STORE_CHILD_ID").expect("worker id");
    let sandboxes = PathBuf::from(std::env::var("EDWARD_STORE_CHILD_SANDBOXES").expect("dir"));
    let (engine, _) = setup.engine(sandboxes, EngineConfig::default()).await;
    let stop = CancellationToken::new();
    let cfg = WorkerConfig::new(stop.clone())
        .with_id(id)
        .with_lease(LEASE)
        .with_concurrency(if setup.slow { 8 } else { 2 })
        .with_status_check(if setup.slow {
            Duration::from_secs(60)
        } else {
            Duration::from_secs(2)
        });
    let _ = tokio::time::timeout(Duration::from_secs(180), engine.worker(cfg)).await;
}

fn fresh_setup(slow: bool) -> Setup {
    Setup {
        schema: common::fresh_schema(),
        prefix: support::fresh_prefix(),
        slow,
    }
}

/// The owner of `run`'s job in Redis, if leased.
async fn owner_of(prefix: &str, run: RunId) -> Option<String> {
    let mut conn = support::raw(&support::redis_url()).await;
    let owner: Option<String> = redis::cmd("HGET")
        .arg(format!("{prefix}q:job:{run}"))
        .arg("owner")
        .query_async(&mut conn)
        .await
        .expect("hget");
    owner.filter(|o| !o.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_one_killed_survivors_finish_its_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandboxes = dir.path().join("sandboxes");
    let setup = fresh_setup(false);
    let (engine, store) = setup
        .engine(sandboxes.clone(), EngineConfig::default())
        .await;
    let runs = submit(&engine, 6).await;

    let mut workers = Workers(Vec::new());
    for id in ["w0", "w1", "w2"] {
        workers.spawn(id, &setup.encode(), &sandboxes);
    }
    // Kill w0 once a run it holds has streamed a while.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victims: Vec<RunId> = loop {
        let mut held = Vec::new();
        let mut deep = false;
        for run in &runs {
            if owner_of(&setup.prefix, *run).await.as_deref() == Some("w0") {
                held.push(*run);
                deep |= last_seq(&store, *run).await >= 12;
            }
        }
        if deep {
            break held;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for w0 to be mid-run"
        );
        // Other processes do the work: polling Redis and the store is the signal.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    workers.kill("w0");
    let mut interrupted = Vec::new();
    for run in &victims {
        if !is_finished(&store, *run).await {
            interrupted.push(*run);
        }
    }
    assert!(!interrupted.is_empty(), "w0 died holding an unfinished run");

    let url = support::redis_url();
    let jobs = format!("{}q:job:", setup.prefix);
    wait_for(
        "w1 and w2 to finish every run and ack every job",
        Duration::from_secs(120),
        || async {
            for run in &runs {
                if !is_finished(&store, *run).await {
                    return false;
                }
            }
            support::keys_under(&url, &jobs).await.is_empty()
        },
    )
    .await;
    drop(workers);

    for run in &runs {
        assert_completed_cleanly(&store, *run, &sandboxes, interrupted.contains(run)).await;
        if interrupted.contains(run) {
            let events = store
                .events_after(*run, 0, 1_000_000)
                .await
                .expect("events");
            let resumed_by = events
                .iter()
                .find(|e| e.kind == "run_resumed")
                .and_then(|e| e.payload["worker"].as_str().map(str::to_owned));
            assert!(
                matches!(resumed_by.as_deref(), Some("w1" | "w2")),
                "run {run} resumed by a survivor, got {resumed_by:?}"
            );
        }
    }
    // Nothing pending is left behind for these sandboxes either.
    let pending = support::keys_under(&url, &format!("{}wb:files:", setup.prefix)).await;
    assert!(pending.is_empty(), "pending files left: {pending:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_cancels_reach_other_processes() {
    const CANCELS: usize = 50;
    let dir = tempfile::tempdir().expect("tempdir");
    let sandboxes = dir.path().join("sandboxes");
    let setup = fresh_setup(true);
    // The parent never finishes a running run itself: the worker must end it.
    let config = EngineConfig::default();
    let (engine, store) = setup.engine(sandboxes.clone(), config).await;
    let mut workers = Workers(Vec::new());
    for id in ["c0", "c1"] {
        workers.spawn(id, &setup.encode(), &sandboxes);
    }
    let runs = submit(&engine, CANCELS).await;
    let mut delays = Vec::with_capacity(CANCELS);
    let mut pending: Vec<RunId> = runs.clone();
    let deadline = Instant::now() + Duration::from_secs(150);
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "timed out: {} runs never ran",
            pending.len()
        );
        let mut next = None;
        for (i, run) in pending.iter().enumerate() {
            let r = store.get_run(*run).await.expect("get").expect("run");
            // Running with its first events: its worker holds the control.
            if r.status == RunStatus::Running && r.last_seq >= 3 {
                next = Some(i);
                break;
            }
        }
        let Some(i) = next else {
            // Workers claim on their own schedule: polling is the signal.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let run = pending.swap_remove(i);
        let start = Instant::now();
        engine.cancel(run).await.expect("cancel");
        loop {
            let r = store.get_run(run).await.expect("get").expect("run");
            if r.status.is_terminal() {
                assert_eq!(r.status, RunStatus::Cancelled, "run {run}");
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "cancel never arrived"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        delays.push(start.elapsed());
    }
    drop(workers);
    delays.sort();
    let pct = |p: usize| delays[(delays.len() * p / 100).min(delays.len() - 1)];
    let (p50, p99) = (pct(50), pct(99));
    println!(
        "cross-process cancel delay over {CANCELS}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        delays[delays.len() - 1].as_secs_f64() * 1e3
    );
    // The status check is a minute: anything near it means a lost cancel.
    assert!(p99 < Duration::from_secs(5), "p99 {p99:?}");
    for run in &runs {
        let events = store
            .events_after(*run, 0, 1_000_000)
            .await
            .expect("events");
        assert_eq!(
            events
                .iter()
                .filter(|e| e.kind == edward_core::RUN_FINISHED)
                .count(),
            1
        );
    }
}
