//! The engine workload shared by the crash tests (`restart.rs`,
//! `redis_multiprocess.rs`, `redis_faults.rs`): a scripted model writing
//! three files, directory sandboxes all processes share, worker processes
//! that are the test binary itself, and the checks of a cleanly completed run.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use edward_core::engine::{Engine, RunRequest};
use edward_core::scripted::ScriptedModel;
use edward_core::{
    ExecOutput, ExecRequest, FileEntry, FileWrite, RUN_FINISHED, RunId, RunQueue, RunStatus,
    RunStore, Sandbox, SandboxError, SandboxKey, SandboxPath, SandboxProvider, SandboxSpec,
};
use tokio_util::sync::CancellationToken;

// ------------------------------------------------------------ the workload

/// The content of file `i` of the transcript (deterministic, ~3 KiB).
pub fn file_content(i: usize) -> String {
    (0..60)
        .map(|line| format!("file {i} line {line:02}: the quick brown fox jumps over\n"))
        .collect()
}

pub const FILES: usize = 3;

pub fn turn_one() -> String {
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

pub fn model() -> ScriptedModel {
    // ~9 KiB in 16-byte chunks, 4 ms apart: a few seconds of streaming.
    ScriptedModel::new([turn_one()])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(4))
}

// ------------------------------------------------- a directory sandbox

/// Sandboxes as plain directories under a root shared by all processes, so
/// the parent can check what the workers wrote.
#[derive(Debug)]
pub struct DirSandboxes {
    pub root: PathBuf,
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
pub struct Workers(pub Vec<(String, Child)>);

impl Workers {
    pub fn spawn(&mut self, id: &str, backend: &str, sandboxes: &Path) {
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
    pub fn kill(&mut self, id: &str) {
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

// ------------------------------------------------------------ checks

pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut probe: F)
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

pub async fn last_seq(store: &dyn RunStore, run: RunId) -> u64 {
    store
        .get_run(run)
        .await
        .expect("get_run")
        .map_or(0, |r| r.last_seq)
}

pub async fn is_finished(store: &dyn RunStore, run: RunId) -> bool {
    store
        .get_run(run)
        .await
        .expect("get_run")
        .is_some_and(|r| r.status.is_terminal())
}

/// The run completed with a gap-free log, one `run_started`, exactly one
/// terminal event (last), and every file whole and exactly as streamed.
pub async fn assert_completed_cleanly(
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
    let dir = sandboxes.join(Engine::sandbox_key(&stored).0);
    for i in 0..FILES {
        let got = std::fs::read_to_string(dir.join(format!("f{i}.txt"))).expect("file written");
        assert_eq!(got, file_content(i), "run {run}: file f{i}.txt whole, once");
    }
}

pub async fn submit(engine: &Engine, n: usize) -> Vec<RunId> {
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
pub fn submitter(store: Arc<dyn RunStore>, queue: Arc<dyn RunQueue>, sandboxes: &Path) -> Engine {
    Engine::builder()
        .backend(edward_core::engine::Backend::new(
            store,
            queue,
            Arc::new(edward_core::memory::MemoryNotifier::new()),
        ))
        .sandbox_provider(Arc::new(DirSandboxes {
            root: sandboxes.to_owned(),
        }))
        .model_client(Arc::new(model()))
        .build()
        .expect("engine")
}
