//! Issue 13: nothing silently wrong in the sandbox, commands that cannot leave
//! the workspace (engine side). Scenarios of recorded model output live in
//! `tests/replay/` and are replayed here as `examples/run --replay` does.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use common::{Harness, assert_log_ok, collect, kinds, terminal};
use edward::core::engine::{Budgets, CommandPolicy, EngineConfig, RunRequest};
use edward::core::scripted::ScriptedModel;
use edward::core::{
    Checkpoint, Fence, FinishReason, FlushPolicy, ModelChunk, ModelClient, ModelError,
    ModelRequest, ModelStream, PendingFile, RunEvent, RunId, RunStore, SandboxKey, SandboxPath,
    WriteBuffer,
};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

/// The responses of a scenario under `tests/replay/NAME/`, in turn order.
fn replay(name: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/replay")
        .join(name);
    let mut turns = Vec::new();
    for n in 1.. {
        match std::fs::read_to_string(dir.join(format!("{n}.txt"))) {
            Ok(t) => turns.push(t),
            Err(_) => break,
        }
    }
    assert!(!turns.is_empty(), "no scenario files in {}", dir.display());
    turns
}

/// A scripted model whose streams end with `finish` (a provider's reason)
/// and, optionally, an error after the text of turn `fail_turn`.
struct Provider {
    inner: ScriptedModel,
    finish: FinishReason,
    fail_turn: Option<usize>,
}

#[async_trait]
impl ModelClient for Provider {
    fn provider(&self) -> &str {
        "test"
    }

    async fn stream(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> Result<ModelStream, ModelError> {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == edward::core::Role::Assistant)
            .count()
            + 1;
        let fail = self.fail_turn == Some(turn);
        let finish = self.finish.clone();
        let s = self.inner.stream(request, cancel).await?;
        Ok(Box::pin(s.filter_map(move |item| {
            let finish = finish.clone();
            async move {
                match item {
                    Ok(ModelChunk::Finish(_)) if fail => Some(Err(ModelError::StreamInterrupted {
                        message: "connection reset".into(),
                    })),
                    Ok(ModelChunk::Finish(_)) => Some(Ok(ModelChunk::Finish(finish))),
                    other => Some(other),
                }
            }
        })))
    }
}

async fn run_to_end(h: &Harness) -> (RunId, Vec<RunEvent>) {
    let id = h.submit("x").await;
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    (id, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_stream_keeps_the_complete_file() {
    let model = ScriptedModel::new(replay("truncated-file"));
    let provider = Arc::new(Provider {
        inner: model.clone(),
        finish: FinishReason::Length,
        fail_turn: None,
    });
    let mut h = Harness::with(|b| b.model_client(provider));
    h.start_worker(1, Duration::from_secs(5));
    let (id, events) = run_to_end(&h).await;
    assert_eq!(terminal(&events)["status"], "completed");
    // The complete turn-1 content is kept, not replaced by the prefix.
    let app = std::fs::read_to_string(h.workspace(id).await.join("app.js")).unwrap();
    assert_eq!(app, "console.log(\"complete version\");\n");
    let truncated = kinds(&events, "file_truncated");
    assert_eq!(truncated.len(), 1, "{events:#?}");
    assert_eq!(truncated[0].payload["path"], "app.js");
    assert_eq!(truncated[0].payload["finish_reason"], "length");
    // Only turn 1's write is a file_written.
    assert_eq!(kinds(&events, "file_written").len(), 1);
    // The model is told in the next request.
    let requests = model.requests();
    let told = &requests[2].messages.last().unwrap().content;
    assert!(told.contains("app.js: truncated, NOT written"), "{told}");
    assert!(told.contains("output token limit"), "{told}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_file_does_not_fail_its_batch() {
    let model = ScriptedModel::new(replay("partial-batch"));
    let mut h = Harness::new(model.clone(), EngineConfig::default(), Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let (id, events) = run_to_end(&h).await;
    let ws = h.workspace(id).await;
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(ws.join("z.txt")).unwrap(), "z\n");
    let written: Vec<_> = kinds(&events, "file_written")
        .iter()
        .map(|e| e.payload["path"].as_str().unwrap().to_string())
        .collect();
    assert!(written.contains(&"a.txt".to_string()), "{written:?}");
    assert!(written.contains(&"z.txt".to_string()), "{written:?}");
    let failed = kinds(&events, "file_write_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].payload["path"], "sub");
    let requests = model.requests();
    let told = &requests[2].messages.last().unwrap().content;
    assert!(
        told.contains("a.txt (2 bytes)") && told.contains("z.txt (2 bytes)"),
        "{told}"
    );
    assert!(told.contains("file sub: write failed"), "{told}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_leaves_nothing_pending() {
    // Slow flushes: the file is still pending when the stream fails.
    let config = EngineConfig {
        flush: FlushPolicy {
            debounce: Duration::from_secs(30),
            max_wait: Duration::from_secs(60),
        },
        ..EngineConfig::default()
    };
    let model = ScriptedModel::new(replay("truncated-file"));
    let provider = Arc::new(Provider {
        inner: model,
        finish: FinishReason::Stop,
        fail_turn: Some(1),
    });
    let mut h = Harness::with(|b| b.model_client(provider).config(config));
    h.start_worker(1, Duration::from_secs(5));
    let (id, events) = run_to_end(&h).await;
    assert_eq!(
        terminal(&events)["status"],
        "failed",
        "{:?}",
        terminal(&events)
    );
    let run = h.engine.get(id).await.unwrap().unwrap();
    let key = edward::core::engine::Engine::sandbox_key(&run);
    let far = Utc::now() + chrono::TimeDelta::hours(1);
    // The discard follows the terminal event on the worker: bounded wait.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut due = h.backends.write_buffer.due(far, 10_000).await.unwrap();
    while due.contains(&key) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        due = h.backends.write_buffer.due(far, 10_000).await.unwrap();
    }
    assert!(!due.contains(&key), "the failed run's writes are still due");
    assert!(h.backends.write_buffer.take(&key).await.unwrap().is_empty());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_keys_of_others_do_not_starve_live_flushes() {
    let config = EngineConfig {
        flush: FlushPolicy {
            debounce: Duration::from_millis(20),
            max_wait: Duration::from_millis(100),
        },
        ..EngineConfig::default()
    };
    let turn = format!(
        "<edward_sandbox>\n<file path=\"early.txt\">\nearly\n</file>\n</edward_sandbox>\n{}",
        "slow tail ".repeat(80)
    );
    let model = ScriptedModel::new([turn])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(10));
    let mut h = Harness::new(model, config, Budgets::default());
    // 300 keys nobody flushes, all due long ago (what leaked runs left).
    let past = Utc::now() - chrono::TimeDelta::hours(1);
    for i in 0..300 {
        let file = PendingFile {
            path: SandboxPath::new("x.txt").unwrap(),
            content: "x".into(),
        };
        h.backends
            .write_buffer
            .put(
                &SandboxKey(format!("leaked-{i}")),
                vec![file],
                past,
                FlushPolicy::default(),
            )
            .await
            .unwrap();
    }
    h.start_worker(1, Duration::from_secs(5));
    let (_, events) = run_to_end(&h).await;
    let written = kinds(&events, "file_written")[0].seq;
    let last_text = kinds(&events, "text_delta").last().unwrap().seq;
    assert!(
        written < last_text,
        "early.txt was flushed only at turn end (seq {written} after the text ended at {last_text})"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_rewrites_completed_files_the_workspace_lost() {
    // Turn 1: two files, then slow text; the worker dies during the text.
    let turn = format!(
        "<edward_sandbox>\n<file path=\"a.txt\">\na\n</file>\n<file path=\"b.txt\">\nb\n</file>\n</edward_sandbox>\n{}<edward_done/>",
        "slow text ".repeat(100)
    );
    let model = ScriptedModel::new([turn])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(10));
    let config = EngineConfig {
        flush: FlushPolicy {
            debounce: Duration::from_millis(10),
            max_wait: Duration::from_millis(50),
        },
        ..EngineConfig::default()
    };
    let mut h = Harness::new(model, config, Budgets::default());
    h.start_worker(1, Duration::from_millis(900));
    let id = h.submit("x").await;
    let mut s = h.engine.raw_events(id, 0);
    let mut written = 0;
    while written < 2 {
        let e = s.next().await.unwrap().unwrap();
        if e.kind == "file_written" {
            written += 1;
        }
    }
    drop(s);
    let (_, handle) = h.workers.remove(0);
    handle.abort();
    let _ = handle.await;
    // The workspace is wiped while nobody runs the run.
    let ws = h.workspace(id).await;
    std::fs::remove_file(ws.join("a.txt")).unwrap();
    std::fs::write(ws.join("b.txt"), "changed").unwrap();
    h.start_worker(1, Duration::from_secs(5));
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "b\n");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_checkpoint_fails_the_run_instead_of_resetting_budgets() {
    let mut h = Harness::new(
        ScriptedModel::new(["<edward_done/>"]),
        EngineConfig::default(),
        Budgets::default(),
    );
    let id = h
        .engine
        .submit(RunRequest::new("u", "c", "x"))
        .await
        .unwrap();
    h.backends
        .store
        .save_checkpoint(
            id,
            Fence(0),
            Checkpoint {
                turn: 7,
                state: serde_json::json!({ "version": 99, "budget": "??" }),
            },
        )
        .await
        .unwrap();
    h.start_worker(1, Duration::from_secs(5));
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    assert!(
        fin["reason"].as_str().unwrap().contains("checkpoint"),
        "{fin}"
    );
    assert!(kinds(&events, "turn_started").is_empty(), "no turn ran");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launchers_are_rejected_by_the_engine() {
    let cmd = |c: &str, a: &[&str]| {
        format!(
            "<edward_command command=\"{c}\" args='{}' />\n",
            serde_json::to_string(a).unwrap()
        )
    };
    let turn = [
        cmd("node", &["-e", "process.exit(0)"]),
        cmd("find", &[".", "-exec", "touch", "x", ";"]),
        cmd("git", &["-c", "alias.x=!touch x", "x"]),
        cmd("npx", &["-c", "touch x"]),
        cmd("npm", &["exec", "--", "touch", "x"]),
        cmd("cp", &["-t/tmp", "a"]),
        cmd("grep", &["-f/etc/hostname", "a"]),
    ]
    .concat();
    let model = ScriptedModel::new([turn]);
    let config = EngineConfig {
        commands: CommandPolicy::default(),
        ..EngineConfig::default()
    };
    let mut h = Harness::new(model, config, Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let (_, events) = run_to_end(&h).await;
    assert_eq!(kinds(&events, "command_rejected").len(), 7, "{events:#?}");
    assert!(kinds(&events, "command_started").is_empty());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_sandbox_says_so_and_refuses_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = edward::sandbox::LocalSandboxConfig::default();
    config.confinement = edward::sandbox::Confinement::Off;
    let provider = Arc::new(edward::sandbox::LocalSandboxProvider::with_config(
        dir.path(),
        config,
    ));
    let turn = "<edward_sandbox>\n<file path=\"app.js\">\nconsole.log(1)\n</file>\n</edward_sandbox>\n<edward_command command=\"node\" args='[\"app.js\"]' />\n";
    let backends = edward::core::memory::MemoryBackends::new();
    let engine = common::builder(&backends, provider)
        .model_client(Arc::new(ScriptedModel::new([turn])))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let engine = engine.clone();
        let cfg = edward::core::engine::WorkerConfig::new(shutdown.clone());
        async move { engine.worker(cfg).await.expect("worker config") }
    });
    let id = engine.submit(RunRequest::new("u", "c", "x")).await.unwrap();
    let events = collect(&engine, id).await;
    assert_log_ok(&events);
    let not_isolated = kinds(&events, "sandbox_not_isolated");
    assert_eq!(not_isolated.len(), 1, "{events:#?}");
    let rejected = kinds(&events, "command_rejected");
    assert_eq!(rejected.len(), 1, "{events:#?}");
    assert!(
        rejected[0].payload["reason"]
            .as_str()
            .unwrap()
            .contains("runs code written"),
        "{:?}",
        rejected[0].payload
    );
    shutdown.cancel();
    worker.await.unwrap();
}
