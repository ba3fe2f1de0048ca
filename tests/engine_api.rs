//! The library's public shape, as a user meets it: one backend handle, typed
//! `Unpin` event streams, durable cancel across engines, the files API,
//! settings validated at build, budgets that cannot silently do nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Harness, assert_log_ok, collect, kinds, terminal};
use edward::core::engine::{
    Backend, Budgets, BuildError, CancelOutcome, Engine, EngineConfig, EngineEvent, FilesError,
    RunRequest, SubmitError, WorkerConfig,
};
use edward::core::memory::MemoryRunQueue;
use edward::core::scripted::ScriptedModel;
use edward::core::{RunId, RunStatus, SandboxProvider};
use edward::sandbox::LocalSandboxProvider;
use edward::store::SqliteStore;
use tokio_util::sync::CancellationToken;

/// A model that streams for ~15 s unless stopped.
fn slow_model() -> ScriptedModel {
    ScriptedModel::new(["slow ".repeat(5000)])
        .with_chunk_bytes(8)
        .with_delay(Duration::from_millis(5))
}

fn sandboxes(dir: &std::path::Path) -> Arc<dyn SandboxProvider> {
    Arc::new(LocalSandboxProvider::new(dir.join("sandboxes")))
}

async fn wait_until_running(engine: &Engine, id: RunId) {
    let mut events = engine.events(id, 0);
    while let Some(e) = events.next().await {
        if matches!(e.expect("event").event, EngineEvent::TurnStarted { .. }) {
            return;
        }
    }
    panic!("run {id} ended before its first turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_another_engine_on_one_sqlite_file_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edward.db");
    // Two engines, two pools, two in-process notifiers: engine B's cancel
    // signal never reaches engine A's worker; only the durable request does.
    let a = Engine::builder()
        .backend(SqliteStore::open(&db).await.unwrap())
        .sandbox_provider(sandboxes(dir.path()))
        .model_client(Arc::new(slow_model()))
        .build()
        .unwrap();
    let b = Engine::builder()
        .backend(SqliteStore::open(&db).await.unwrap())
        .sandbox_provider(sandboxes(dir.path()))
        .config(EngineConfig {
            tail_backstop: Duration::from_millis(50),
            ..EngineConfig::default()
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let a = a.clone();
        let cfg = WorkerConfig::new(shutdown.clone()).with_status_check(Duration::from_millis(100));
        async move { a.worker(cfg).await }
    });
    let id = a
        .submit(RunRequest::new("u", "c", "stream slowly"))
        .await
        .unwrap();
    // B tails A's run live through its store re-reads.
    wait_until_running(&b, id).await;
    assert_eq!(b.cancel(id).await.unwrap(), CancelOutcome::Requested);
    assert_eq!(
        b.cancel(id).await.unwrap(),
        CancelOutcome::Requested,
        "a second cancel is accepted and records nothing new"
    );
    let events = tokio::time::timeout(Duration::from_secs(10), collect(&b, id))
        .await
        .expect("cancel honoured within the status-check period, not after the run");
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "cancelled");
    assert_eq!(kinds(&events, "cancel_requested").len(), 1);
    assert_eq!(
        terminal(&events)["turns"],
        1,
        "the turn cut short by the cancel counts"
    );
    assert_eq!(b.cancel(id).await.unwrap(), CancelOutcome::AlreadyFinished);
    shutdown.cancel();
    worker.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_recorded_before_a_worker_claims_the_run_is_honoured_on_claim() {
    let mut h = Harness::new(slow_model(), EngineConfig::default(), Budgets::default());
    let id = h.submit("never runs").await;
    // The request is recorded but the out-of-band finish never happened
    // (the canceller crashed between the two): the claiming worker ends it.
    h.engine
        .store()
        .request_cancel(id, EngineEvent::CancelRequested {}.into_new_event())
        .await
        .unwrap();
    h.start_worker(1, Duration::from_secs(5));
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "cancelled");
    assert!(kinds(&events, "turn_started").is_empty(), "no model call");
    assert_eq!(terminal(&events)["turns"], 0);
    h.shutdown().await;
}

#[tokio::test]
async fn a_queued_run_cancelled_from_another_engine_never_starts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edward.db");
    let engine = |store| {
        Engine::builder()
            .backend(store)
            .sandbox_provider(sandboxes(dir.path()))
            .build()
            .unwrap()
    };
    let a = engine(SqliteStore::open(&db).await.unwrap());
    let b = engine(SqliteStore::open(&db).await.unwrap());
    let id = a.submit(RunRequest::new("u", "c", "x")).await.unwrap();
    assert_eq!(b.cancel(id).await.unwrap(), CancelOutcome::Cancelled);
    let run = a.get(id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert!(run.cancel_requested_at.is_some());
    let events = collect(&a, id).await;
    assert_log_ok(&events);
    let types: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(types, ["run_queued", "cancel_requested", "run_finished"]);
}

#[tokio::test]
async fn the_builder_refuses_a_durable_store_with_an_in_memory_queue() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("edward.db"))
        .await
        .unwrap();
    let mixed = store.backend().with_queue(Arc::new(MemoryRunQueue::new()));
    let err = Engine::builder()
        .backend(mixed)
        .sandbox_provider(sandboxes(dir.path()))
        .build()
        .expect_err("mixed durability");
    assert!(matches!(err, BuildError::MixedDurability(_)), "{err}");
    assert!(err.to_string().contains("queue"), "{err}");
    // The store's own backend, and the memory default, build.
    assert!(
        Engine::builder()
            .backend(store.backend())
            .sandbox_provider(sandboxes(dir.path()))
            .build()
            .is_ok()
    );
    assert!(
        Engine::builder()
            .backend(Backend::memory())
            .sandbox_provider(sandboxes(dir.path()))
            .build()
            .is_ok()
    );
}

#[tokio::test]
async fn settings_are_validated_at_build_and_worker_start() {
    let dir = tempfile::tempdir().unwrap();
    let build = |config: EngineConfig| {
        Engine::builder()
            .sandbox_provider(sandboxes(dir.path()))
            .config(config)
            .build()
    };
    for (config, field) in [
        (
            EngineConfig {
                effect_channel: 0,
                ..EngineConfig::default()
            },
            "config.effect_channel",
        ),
        (
            EngineConfig {
                flush_poll: Duration::ZERO,
                ..EngineConfig::default()
            },
            "config.flush_poll",
        ),
        (
            EngineConfig {
                tail_backstop: Duration::ZERO,
                ..EngineConfig::default()
            },
            "config.tail_backstop",
        ),
    ] {
        match build(config) {
            Err(BuildError::InvalidSetting { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidSetting, got {other:?}"),
        }
    }
    let engine = build(EngineConfig::default()).unwrap();
    let cfg = WorkerConfig::new(CancellationToken::new()).with_lease(Duration::ZERO);
    match tokio::time::timeout(Duration::from_secs(5), engine.worker(cfg)).await {
        Ok(Err(BuildError::InvalidSetting { field, .. })) => assert_eq!(field, "worker.lease"),
        other => panic!("a zero lease must be refused at once, got {other:?}"),
    }
    assert!(matches!(
        Engine::builder().build(),
        Err(BuildError::MissingSandboxProvider)
    ));
}

#[tokio::test]
async fn a_cost_budget_on_an_unpriced_model_is_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::builder()
        .sandbox_provider(sandboxes(dir.path()))
        .default_model("my-local-model")
        .build()
        .unwrap();
    match engine.submit(RunRequest::new("u", "c", "x")).await {
        Err(SubmitError::Invalid { field, reason }) => {
            assert_eq!(field, "budgets.max_cost_usd");
            assert!(reason.contains("my-local-model"), "{reason}");
        }
        other => panic!("expected a typed refusal, got {other:?}"),
    }
    // Without a cost budget the same model is accepted.
    let no_cost = Budgets {
        max_cost_usd: 0.0,
        ..Budgets::default()
    };
    engine
        .submit(RunRequest::new("u", "c", "x").with_budgets(no_cost))
        .await
        .expect("no cost budget, no price needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_read_through_the_engine_without_creating_sandboxes() {
    let mut h = Harness::new(
        ScriptedModel::demo(),
        EngineConfig::default(),
        Budgets::default(),
    );
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("build a todo app").await;
    let events = collect(&h.engine, id).await;
    assert_eq!(terminal(&events)["status"], "completed");

    let files = h.engine.files(id).await.expect("files");
    let written: Vec<String> = kinds(&events, "file_written")
        .iter()
        .map(|e| e.payload["path"].as_str().unwrap().to_string())
        .collect();
    assert!(!files.is_empty());
    for path in &written {
        let entry = files.iter().find(|f| &f.path == path).expect("listed");
        let content = h.engine.read_file(id, path).await.expect("read");
        assert_eq!(content.len() as u64, entry.size);
    }
    assert!(matches!(
        h.engine.read_file(id, "../escape").await,
        Err(FilesError::Sandbox(_))
    ));

    // Unknown run: typed, and no sandbox directory appears.
    let unknown = RunId::new();
    assert!(matches!(
        h.engine.files(unknown).await,
        Err(FilesError::RunNotFound { .. })
    ));
    assert!(!h.workspace(unknown).await.exists());
    // A run that never wrote: no sandbox, and none is created by asking.
    let idle = h
        .engine
        .submit(RunRequest::new("user", "other-chat", "x"))
        .await
        .unwrap();
    h.engine.cancel(idle).await.unwrap();
    assert!(matches!(
        h.engine.files(idle).await,
        Err(FilesError::NoSandbox { .. })
    ));
    assert!(!h.workspace(idle).await.exists());

    h.engine.destroy_sandbox(id).await.expect("destroy");
    h.engine
        .destroy_sandbox(id)
        .await
        .expect("destroy is idempotent");
    assert!(!h.workspace(id).await.exists());
    assert!(matches!(
        h.engine.files(id).await,
        Err(FilesError::NoSandbox { .. })
    ));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_events_carry_the_raw_json() {
    let mut h = Harness::new(
        ScriptedModel::demo(),
        EngineConfig::default(),
        Budgets::default(),
    );
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("build a todo app").await;
    let raw = collect(&h.engine, id).await;
    let mut typed = Vec::new();
    let mut events = h.engine.events(id, 0);
    while let Some(e) = events.next().await {
        typed.push(e.expect("every stored event decodes"));
    }
    assert_eq!(typed.len(), raw.len());
    for (t, r) in typed.iter().zip(&raw) {
        assert_eq!(t.raw(), r);
        assert_eq!(t.seq, r.seq);
        assert_eq!(t.event.kind(), r.kind);
        assert_eq!(
            serde_json::to_value(t).unwrap(),
            serde_json::to_value(r).unwrap()
        );
    }
    assert!(matches!(
        typed.last().unwrap().event,
        EngineEvent::RunFinished {
            status: RunStatus::Completed,
            ..
        }
    ));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_of_finished_runs_are_destroyed_after_the_retention_time() {
    let mut h = Harness::new(
        ScriptedModel::demo(),
        EngineConfig {
            sandbox_retention: Some(Duration::from_millis(300)),
            ..EngineConfig::default()
        },
        Budgets::default(),
    );
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("build a todo app").await;
    let events = collect(&h.engine, id).await;
    assert_eq!(terminal(&events)["status"], "completed");
    assert!(
        h.engine.files(id).await.is_ok(),
        "kept right after the run finished"
    );
    // No signal exists for "destroyed"; poll the filesystem with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.workspace(id).await.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "sandbox not destroyed after its retention time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        h.engine.files(id).await,
        Err(FilesError::NoSandbox { .. })
    ));
    assert!(
        h.engine.get(id).await.unwrap().is_some(),
        "the run's record stays"
    );
    h.shutdown().await;
}

/// A model that streams 40 KB of text and ignores `max_output_tokens`.
fn verbose_model() -> ScriptedModel {
    ScriptedModel::new(["word ".repeat(8000)]).with_chunk_bytes(64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_token_cap_stops_the_stream_mid_turn() {
    let budgets = Budgets {
        max_output_tokens: 1000,
        ..Budgets::default()
    };
    let mut h = Harness::new(verbose_model(), EngineConfig::default(), budgets);
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("talk a lot").await;
    let events = collect(&h.engine, id).await;
    let t = terminal(&events);
    assert_eq!(t["reason"], "budget_exhausted:output_tokens");
    let out = t["usage"]["output_tokens"].as_u64().unwrap();
    // Documented bound: one streamed chunk (64 bytes = 16 tokens) past the cap.
    assert!(
        (1000..=1016).contains(&out),
        "output tokens {out} for a cap of 1000"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_cap_stops_the_stream_mid_turn() {
    let mut prices = edward::PriceTable::empty();
    prices.set(
        "priced-model",
        edward::ModelPrice {
            input_per_mtok: 1.0,
            output_per_mtok: 10.0,
        },
    );
    let budgets = Budgets {
        max_cost_usd: 0.01,
        ..Budgets::default()
    };
    let mut h = Harness::with(|b| {
        b.model_client(Arc::new(verbose_model()))
            .default_model("priced-model")
            .prices(prices)
            .budgets(budgets)
    });
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("talk a lot").await;
    let events = collect(&h.engine, id).await;
    let t = terminal(&events);
    assert_eq!(t["reason"], "budget_exhausted:cost");
    let cost = t["cost_usd"].as_f64().unwrap();
    // Documented bound: one streamed chunk (16 tokens at $10/Mtok = $0.00016).
    assert!(
        cost <= 0.01 + 0.00016 + 1e-9,
        "cost {cost} for a cap of $0.01"
    );
    assert!(cost > 0.009, "the cap was used, not refused early: {cost}");
    h.shutdown().await;
}
