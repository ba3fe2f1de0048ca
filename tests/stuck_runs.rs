//! Issue 13: no run stays `running` forever — dead-lettering finishes the
//! run, non-retryable store errors are not retried, panicking attempts are
//! recorded and capped, and queued runs missing from the queue are enqueued
//! by the reconciler.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{assert_log_ok, collect, kinds, terminal};
use edward::core::engine::{Engine, EngineConfig, RunRequest, WorkerConfig};
use edward::core::memory::MemoryBackends;
use edward::core::scripted::ScriptedModel;
use edward::core::{
    AdmissionLimits, AdmitError, Checkpoint, EffectRecord, Fence, ModelClient, ModelError,
    ModelRequest, ModelStream, NewEvent, NewRun, RetryPolicy, Run, RunEvent, RunId, RunStatus,
    RunStore, StoreError,
};
use edward::sandbox::LocalSandboxProvider;
use tokio_util::sync::CancellationToken;

/// The memory store, except that `save_checkpoint` fails.
struct FailingCheckpoints {
    inner: Arc<dyn RunStore>,
    retryable: bool,
}

#[async_trait]
impl RunStore for FailingCheckpoints {
    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError> {
        self.inner.admit(run, limits).await
    }
    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        self.inner.get_run(run_id).await
    }
    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError> {
        self.inner.start_run(run_id, fence).await
    }
    async fn append_events(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        self.inner.append_events(run_id, fence, events).await
    }
    async fn finish_run(
        &self,
        run_id: RunId,
        fence: Option<Fence>,
        status: RunStatus,
        reason: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        self.inner
            .finish_run(run_id, fence, status, reason, events)
            .await
    }
    async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        self.inner.events_after(run_id, after_seq, limit).await
    }
    async fn save_checkpoint(
        &self,
        _run_id: RunId,
        _fence: Fence,
        _checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        Err(StoreError::Backend {
            message: "checkpoint table unavailable".into(),
            retryable: self.retryable,
        })
    }
    async fn load_checkpoint(&self, run_id: RunId) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load_checkpoint(run_id).await
    }
    async fn begin_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, StoreError> {
        self.inner.begin_effect(run_id, fence, key, request).await
    }
    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError> {
        self.inner.complete_effect(run_id, fence, key, result).await
    }
    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &edward::spi::RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        self.inner
            .list_user_runs(user_id, filter, before, limit)
            .await
    }

    fn durability(&self) -> edward::Durability {
        self.inner.durability()
    }

    async fn put_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<edward::core::NewMessage>,
    ) -> Result<(), StoreError> {
        self.inner.put_messages(run_id, fence, turn, messages).await
    }

    async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<edward::core::ChatMessage>, StoreError> {
        self.inner
            .chat_messages(user_id, chat_id, before_run, limit)
            .await
    }

    async fn create_build(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<edward::core::BuildJob, StoreError> {
        self.inner
            .create_build(run_id, fence, number, command)
            .await
    }

    async fn claim_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<edward::core::BuildJob>, StoreError> {
        self.inner.claim_build(run_id, number, fence, worker).await
    }

    async fn finish_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: edward::core::BuildResult,
    ) -> Result<edward::core::BuildJob, StoreError> {
        self.inner.finish_build(run_id, number, fence, result).await
    }

    async fn builds(&self, run_id: RunId) -> Result<Vec<edward::core::BuildJob>, StoreError> {
        self.inner.builds(run_id).await
    }

    async fn request_cancel(
        &self,
        run_id: RunId,
        event: edward::spi::NewEvent,
    ) -> Result<Run, StoreError> {
        self.inner.request_cancel(run_id, event).await
    }

    async fn list_runs(&self, status: RunStatus, limit: usize) -> Result<Vec<Run>, StoreError> {
        self.inner.list_runs(status, limit).await
    }
}

/// A model client that panics.
struct Panicking;

#[async_trait]
impl ModelClient for Panicking {
    fn provider(&self) -> &str {
        "panicking"
    }
    async fn stream(
        &self,
        _request: ModelRequest,
        _cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        panic!("model client bug");
    }
}

struct Setup {
    engine: Engine,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
    worker: Option<tokio::task::JoinHandle<()>>,
}

fn setup(
    store: Option<Arc<dyn RunStore>>,
    backends: &MemoryBackends,
    model: Arc<dyn ModelClient>,
    config: EngineConfig,
) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(LocalSandboxProvider::new(dir.path()));
    let mut b = common::builder(backends, provider)
        .model_client(model)
        .config(config);
    if let Some(s) = store {
        b = b.backend(edward::Backend::new(
            s,
            backends.queue.clone(),
            backends.notifier.clone(),
        ));
    }
    Setup {
        engine: b.build().unwrap(),
        _dir: dir,
        shutdown: CancellationToken::new(),
        worker: None,
    }
}

impl Setup {
    fn start(&mut self, retry: RetryPolicy, reconcile: Duration) {
        let mut cfg = WorkerConfig::new(self.shutdown.clone()).with_lease(Duration::from_secs(5));
        cfg.retry = retry;
        cfg.reconcile_interval = reconcile;
        cfg.poll_interval = Duration::from_millis(10);
        let engine = self.engine.clone();
        self.worker = Some(tokio::spawn(async move {
            engine.worker(cfg).await.expect("worker config")
        }));
    }

    async fn stop(self) {
        self.shutdown.cancel();
        if let Some(w) = self.worker {
            w.await.unwrap();
        }
    }
}

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay_ms: 10,
        max_delay_ms: 20,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_end_failed_not_running_forever() {
    let backends = MemoryBackends::new();
    let store: Arc<dyn RunStore> = Arc::new(FailingCheckpoints {
        inner: backends.store.clone(),
        retryable: true,
    });
    let model = Arc::new(ScriptedModel::new(["<edward_done/>"]));
    let mut s = setup(Some(store), &backends, model, EngineConfig::default());
    s.start(fast_retry(3), Duration::ZERO);
    let id = s
        .engine
        .submit(RunRequest::new("u", "chat", "x"))
        .await
        .unwrap();
    let events = collect(&s.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    let reason = fin["reason"].as_str().unwrap();
    assert!(
        reason.contains("dead-lettered") || reason.contains("gave up"),
        "{reason}"
    );
    assert!(reason.contains("checkpoint table unavailable"), "{reason}");
    // The admission slot is free again (per-chat limit 1).
    s.engine
        .submit(RunRequest::new("u", "chat", "again"))
        .await
        .expect("the failed run no longer holds its slot");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_retryable_store_errors_fail_at_once() {
    let backends = MemoryBackends::new();
    let store: Arc<dyn RunStore> = Arc::new(FailingCheckpoints {
        inner: backends.store.clone(),
        retryable: false,
    });
    let model = Arc::new(ScriptedModel::new(["<edward_done/>"]));
    let mut s = setup(Some(store), &backends, model, EngineConfig::default());
    s.start(fast_retry(5), Duration::ZERO);
    let id = s
        .engine
        .submit(RunRequest::new("u", "c", "x"))
        .await
        .unwrap();
    let events = collect(&s.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    assert!(fin["reason"].as_str().unwrap().contains("store:"), "{fin}");
    assert!(
        kinds(&events, "run_resumed").is_empty(),
        "it was retried: {events:#?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_model_is_recorded_and_capped() {
    let backends = MemoryBackends::new();
    let config = EngineConfig {
        max_abnormal_attempts: 2,
        ..EngineConfig::default()
    };
    let mut s = setup(None, &backends, Arc::new(Panicking), config);
    s.start(fast_retry(10), Duration::ZERO);
    let id = s
        .engine
        .submit(RunRequest::new("u", "c", "x"))
        .await
        .unwrap();
    let events = collect(&s.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    assert!(
        fin["reason"].as_str().unwrap().contains("ended abnormally"),
        "{fin}"
    );
    let failed = kinds(&events, "attempt_failed");
    assert_eq!(failed.len(), 2, "{events:#?}");
    assert_eq!(failed[0].payload["cause"], "panic");
    assert!(
        failed[0].payload["error"]
            .as_str()
            .unwrap()
            .contains("model client bug")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_enqueues_admitted_runs_missing_from_the_queue() {
    let backends = MemoryBackends::new();
    let model = Arc::new(ScriptedModel::new(["<edward_done/>"]));
    let mut s = setup(None, &backends, model, EngineConfig::default());
    // Admitted, then the submitter died before enqueue (the memory store
    // does not hold the queue).
    let run = backends
        .store
        .admit(
            NewRun {
                id: RunId::new(),
                user_id: "u".into(),
                chat_id: "c".into(),
                request: serde_json::to_value(RunRequest::new("u", "c", "x")).unwrap(),
                first_event: NewEvent::new(
                    "run_queued",
                    serde_json::json!({"model": "scripted", "prompt_bytes": 1}),
                ),
            },
            AdmissionLimits::default(),
        )
        .await
        .unwrap();
    s.start(fast_retry(3), Duration::from_millis(100));
    let events = collect(&s.engine, run.id).await;
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "completed");
    s.stop().await;
}
