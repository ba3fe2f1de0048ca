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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use edward_core::engine::{Backend, Engine, RunRequest, WorkerConfig};
use edward_core::memory::MemoryNotifier;
use edward_core::scripted::ScriptedModel;
use edward_core::{
    ExecOutput, ExecRequest, FileEntry, FileWrite, RUN_FINISHED, RunId, RunQueue, RunStatus,
    RunStore, Sandbox, SandboxError, SandboxKey, SandboxPath, SandboxProvider, SandboxSpec,
};
use edward_store::{PgOptions, PgStore, SqliteStore};
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(2);

// ------------------------------------------------------------ the workload

/// The content of file `i` of the transcript (deterministic, ~3 KiB).
fn file_content(i: usize) -> String {
    (0..60)
        .map(|line| format!("file {i} line {line:02}: the quick brown fox jumps over\n"))
        .collect()
}

const FILES: usize = 3;

fn turn_one() -> String {
    let mut t = String::from("Writing three files.\n<edward_sandbox project=\"restart\">\n");
    for i in 0..FILES {
        t.push_str(&format!(
            "<file path=\"f{i}.txt\">\n{}</file>\n",
            file_content(i)
        ));
    }
    t.push_str("</edward_sandbox>\nDone writing.\n");
    t
}

fn model() -> ScriptedModel {
    // ~9 KiB in 16-byte chunks, 4 ms apart: a few seconds of streaming.
    ScriptedModel::new([turn_one()])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(4))
}

// ------------------------------------------------- a directory sandbox

/// Sandboxes as plain directories under a root shared by all processes, so
/// the parent can check what the workers wrote.
#[derive(Debug)]
struct DirSandboxes {
    root: PathBuf,
}

#[derive(Debug)]
struct DirSandbox {
    key: SandboxKey,
    dir: PathBuf,
}

fn io_err(e: std::io::Error) -> SandboxError {
    SandboxError::Backend {
        message: e.to_string(),
        retryable: false,
    }
}

#[async_trait]
impl SandboxProvider for DirSandboxes {
    async fn provision(
        &self,
        key: &SandboxKey,
        _spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let dir = self.root.join(&key.0);
        tokio::fs::create_dir_all(&dir).await.map_err(io_err)?;
        Ok(Arc::new(DirSandbox {
            key: key.clone(),
            dir,
        }))
    }

    async fn attach(&self, key: &SandboxKey) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let dir = self.root.join(&key.0);
        if !tokio::fs::try_exists(&dir).await.map_err(io_err)? {
            return Ok(None);
        }
        Ok(Some(Arc::new(DirSandbox {
            key: key.clone(),
            dir,
        })))
    }

    async fn destroy(&self, key: &SandboxKey) -> Result<(), SandboxError> {
        let _ = tokio::fs::remove_dir_all(self.root.join(&key.0)).await;
        Ok(())
    }
}

#[async_trait]
impl Sandbox for DirSandbox {
    fn key(&self) -> &SandboxKey {
        &self.key
    }

    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    async fn write_files(&self, files: Vec<FileWrite>) -> Result<(), SandboxError> {
        for file in files {
            let path = self.dir.join(file.path.as_str());
            if let Some(parent) = path.parent() {
                tokio::fs::create_dir_all(parent).await.map_err(io_err)?;
            }
            let tmp = path.with_extension("edward-tmp");
            tokio::fs::write(&tmp, &file.content)
                .await
                .map_err(io_err)?;
            tokio::fs::rename(&tmp, &path).await.map_err(io_err)?;
        }
        Ok(())
    }

    async fn read_file(&self, path: &SandboxPath) -> Result<Bytes, SandboxError> {
        tokio::fs::read(self.dir.join(path.as_str()))
            .await
            .map(Bytes::from)
            .map_err(|_| SandboxError::NotFound {
                path: path.to_string(),
            })
    }

    async fn list_files(&self) -> Result<Vec<FileEntry>, SandboxError> {
        let mut out = Vec::new();
        let mut dir = tokio::fs::read_dir(&self.dir).await.map_err(io_err)?;
        while let Some(entry) = dir.next_entry().await.map_err(io_err)? {
            let meta = entry.metadata().await.map_err(io_err)?;
            if meta.is_file() {
                out.push(FileEntry {
                    path: entry.file_name().to_string_lossy().into_owned(),
                    size: meta.len(),
                });
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    async fn exec(
        &self,
        _request: ExecRequest,
        _cancel: CancellationToken,
    ) -> Result<ExecOutput, SandboxError> {
        Ok(ExecOutput {
            exit_code: Some(0),
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: 0,
            stderr_truncated: 0,
            timed_out: false,
            duration_ms: 0,
        })
    }
}

// ------------------------------------------------------------ processes

/// Kills the children it holds when dropped (a failing test leaks none).
struct Workers(Vec<(String, Child)>);

impl Workers {
    fn spawn(&mut self, id: &str, backend: &str, sandboxes: &Path) {
        let exe = std::env::current_exe().expect("current test binary");
        let child = Command::new(exe)
            .args(["child_worker", "--exact", "--nocapture", "--test-threads=1"])
            .env("EDWARD_STORE_CHILD", backend)
            .env("EDWARD_STORE_CHILD_ID", id)
            .env("EDWARD_STORE_CHILD_SANDBOXES", sandboxes)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn worker process");
        self.0.push((id.to_owned(), child));
    }

    /// SIGKILL the worker `id` and reap it.
    fn kill(&mut self, id: &str) {
        let pos = self.0.iter().position(|(i, _)| i == id).expect("worker");
        let (_, mut child) = self.0.remove(pos);
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

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

// ------------------------------------------------------------ checks

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    // Another process does the work: polling the shared store is the only
    // signal there is.
    while !probe().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn last_seq(store: &dyn RunStore, run: RunId) -> u64 {
    store
        .get_run(run)
        .await
        .expect("get_run")
        .map_or(0, |r| r.last_seq)
}

async fn is_finished(store: &dyn RunStore, run: RunId) -> bool {
    store
        .get_run(run)
        .await
        .expect("get_run")
        .is_some_and(|r| r.status.is_terminal())
}

/// The run completed with a gap-free log, one `run_started`, exactly one
/// terminal event (last), and every file whole and exactly as streamed.
async fn assert_completed_cleanly(
    store: &dyn RunStore,
    run: RunId,
    sandboxes: &Path,
    resumed: bool,
) {
    let stored = store.get_run(run).await.expect("get").expect("run");
    let events = store.events_after(run, 0, 1_000_000).await.expect("events");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "run {run}: gap-free seqs");
    }
    assert_eq!(stored.last_seq, events.len() as u64);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == RUN_FINISHED).count(),
        1,
        "run {run}: exactly one terminal event"
    );
    assert_eq!(kinds.last(), Some(&RUN_FINISHED), "terminal event is last");
    assert_eq!(
        stored.status,
        RunStatus::Completed,
        "run {run} finished {:?}: {:?}",
        stored.terminal_reason,
        events.last().map(|e| &e.payload)
    );
    assert_eq!(kinds.iter().filter(|k| **k == "run_started").count(), 1);
    assert_eq!(
        kinds.contains(&"run_resumed"),
        resumed,
        "run {run}: resumed iff its worker was killed; kinds {kinds:?}"
    );
    let dir = sandboxes.join(Engine::sandbox_key(run).0);
    for i in 0..FILES {
        let got = std::fs::read_to_string(dir.join(format!("f{i}.txt"))).expect("file written");
        assert_eq!(got, file_content(i), "run {run}: file f{i}.txt whole, once");
    }
}

async fn submit(engine: &Engine, n: usize) -> Vec<RunId> {
    let mut runs = Vec::new();
    for i in 0..n {
        let id = engine
            .submit(RunRequest::new(
                format!("user-{i}-{}", RunId::new()),
                format!("chat-{i}-{}", RunId::new()),
                "write three files",
            ))
            .await
            .expect("submit");
        runs.push(id);
    }
    runs
}

/// An engine used only to submit (it runs no worker).
fn submitter(store: Arc<dyn RunStore>, queue: Arc<dyn RunQueue>, sandboxes: &Path) -> Engine {
    Engine::builder()
        .backend(Backend::new(store, queue, Arc::new(MemoryNotifier::new())))
        .sandbox_provider(Arc::new(DirSandboxes {
            root: sandboxes.to_owned(),
        }))
        .model_client(Arc::new(model()))
        .build()
        .expect("engine")
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
