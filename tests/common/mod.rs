//! Shared helpers of the engine's integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use edward::core::engine::{
    Backend, Budgets, Engine, EngineBuilder, EngineConfig, RunRequest, WorkerConfig,
};
use edward::core::memory::MemoryBackends;
use edward::core::scripted::ScriptedModel;
use edward::core::{RunEvent, RunId, SandboxProvider};
use edward::sandbox::LocalSandboxProvider;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// An engine over a temp dir plus running workers.
pub struct Harness {
    pub engine: Engine,
    pub backends: MemoryBackends,
    pub dir: tempfile::TempDir,
    pub provider: Arc<LocalSandboxProvider>,
    pub workers: Vec<(CancellationToken, JoinHandle<()>)>,
}

pub fn builder(backends: &MemoryBackends, provider: Arc<LocalSandboxProvider>) -> EngineBuilder {
    Engine::builder()
        .backend(Backend::new(
            backends.store.clone(),
            backends.queue.clone(),
            backends.notifier.clone(),
        ))
        .write_buffer(backends.write_buffer.clone())
        .sandbox_provider(provider as Arc<dyn SandboxProvider>)
}

impl Harness {
    /// Engine with `model`, `config` and `budgets`; no worker yet.
    pub fn new(model: ScriptedModel, config: EngineConfig, budgets: Budgets) -> Harness {
        Self::with(|b| {
            b.model_client(Arc::new(model))
                .config(config)
                .budgets(budgets)
        })
    }

    /// Engine from a customised builder.
    pub fn with(f: impl FnOnce(EngineBuilder) -> EngineBuilder) -> Harness {
        Self::with_backends(|b, _| f(b))
    }

    /// Engine from a builder customised with access to the memory backends.
    pub fn with_backends(
        f: impl FnOnce(EngineBuilder, &MemoryBackends) -> EngineBuilder,
    ) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let provider = Arc::new(LocalSandboxProvider::new(dir.path()));
        let backends = MemoryBackends::new();
        let engine = f(builder(&backends, provider.clone()), &backends)
            .build()
            .expect("engine builds");
        Harness {
            engine,
            backends,
            dir,
            provider,
            workers: Vec::new(),
        }
    }

    /// Start a worker with `concurrency` and `lease`.
    pub fn start_worker(&mut self, concurrency: usize, lease: Duration) -> usize {
        let shutdown = CancellationToken::new();
        let cfg = WorkerConfig::new(shutdown.clone())
            .with_id(format!("w{}", self.workers.len()))
            .with_concurrency(concurrency)
            .with_lease(lease);
        let engine = self.engine.clone();
        let handle = tokio::spawn(async move { engine.worker(cfg).await.expect("worker config") });
        self.workers.push((shutdown, handle));
        self.workers.len() - 1
    }

    /// Workspace directory of a run's sandbox.
    /// (The chat's workspace: runs of one chat share it.)
    pub async fn workspace(&self, id: RunId) -> std::path::PathBuf {
        match self.engine.get(id).await.expect("get run") {
            Some(run) => self.provider.workspace_path(&Engine::sandbox_key(&run)),
            None => self
                .provider
                .workspace_path(&edward::core::SandboxKey("no-such-run".into())),
        }
    }

    pub async fn submit(&self, prompt: &str) -> RunId {
        self.engine
            .submit(RunRequest::new(
                "user",
                format!("chat-{}", RunId::new()),
                prompt,
            ))
            .await
            .expect("submit")
    }

    pub async fn shutdown(self) {
        for (s, h) in self.workers {
            s.cancel();
            let _ = h.await;
        }
    }
}

/// Every event of a run, tailed until the terminal event (fails after 60 s).
pub async fn collect(engine: &Engine, id: RunId) -> Vec<RunEvent> {
    collect_after(engine, id, 0).await
}

pub async fn collect_after(engine: &Engine, id: RunId, after: u64) -> Vec<RunEvent> {
    let fut = async {
        let mut s = engine.raw_events(id, after);
        let mut out = Vec::new();
        while let Some(e) = s.next().await {
            out.push(e.expect("event"));
        }
        out
    };
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("run finished within 60 s")
}

/// Seqs are 1..=n with no gap and exactly one terminal event, last.
pub fn assert_log_ok(events: &[RunEvent]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "gap or duplicate at index {i}: {e:?}");
    }
    let terminals = events.iter().filter(|e| e.is_terminal()).count();
    assert_eq!(terminals, 1, "exactly one terminal event");
    assert!(
        events.last().unwrap().is_terminal(),
        "terminal event is last"
    );
}

pub fn terminal(events: &[RunEvent]) -> &serde_json::Value {
    &events.last().expect("events").payload
}

pub fn kinds<'a>(events: &'a [RunEvent], kind: &str) -> Vec<&'a RunEvent> {
    events.iter().filter(|e| e.kind == kind).collect()
}
