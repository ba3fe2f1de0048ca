//! Cancellation and resume: cancel while queued, while streaming, during a
//! long command; a worker dropped mid-run and another resuming it.

mod common;

use std::time::Duration;

use common::*;
use edward::core::engine::{Budgets, CancelOutcome, CommandPolicy, EngineConfig, RunRequest};
use edward::core::scripted::ScriptedModel;
use edward::core::{RunEvent, RunId};

fn command(cmd: &str, args: &[&str]) -> String {
    let args = serde_json::to_string(args).unwrap();
    format!("<edward_command command=\"{cmd}\" args='{args}' />\n")
}

/// Tail `id` until an event matches `pred`; returns it.
async fn wait_for(h: &Harness, id: RunId, pred: impl Fn(&RunEvent) -> bool) -> RunEvent {
    let fut = async {
        let mut s = h.engine.raw_events(id, 0);
        while let Some(e) = s.next().await {
            let e = e.expect("event");
            if pred(&e) {
                return e;
            }
        }
        panic!("run ended before the awaited event");
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("awaited event within 30 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_queued_run_finishes_it_directly() {
    let mut h = Harness::new(
        ScriptedModel::demo(),
        EngineConfig::default(),
        Budgets::default(),
    );
    let id = h.submit("x").await;
    assert_eq!(h.engine.cancel(id).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        h.engine.cancel(id).await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    assert_eq!(
        events.len(),
        3,
        "run_queued, cancel_requested, run_finished"
    );
    assert_eq!(terminal(&events)["status"], "cancelled");
    // A worker that claims it later writes nothing.
    h.start_worker(1, Duration::from_secs(5));
    let id2 = h.submit("y").await;
    let done = collect(&h.engine, id2).await;
    assert_eq!(terminal(&done)["status"], "completed");
    assert_eq!(collect(&h.engine, id).await.len(), 3);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_streaming() {
    let model = ScriptedModel::new(["streaming text ".repeat(2000)])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(10));
    let mut h = Harness::new(model, EngineConfig::default(), Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("x").await;
    wait_for(&h, id, |e| e.kind == "text_delta").await;
    let started = std::time::Instant::now();
    assert_eq!(h.engine.cancel(id).await.unwrap(), CancelOutcome::Requested);
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "cancelled");
    assert_eq!(fin["reason"], "cancelled");
    assert!(started.elapsed() < Duration::from_secs(5));
    h.shutdown().await;
}

fn sleep_processes(marker: &str) -> usize {
    let mut n = 0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, r)| r.starts_with(['Z', 'X']))
            {
                continue; // killed, waiting to be reaped
            }
            if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                // `sleep` or `/usr/bin/sleep` (resolved); not bubblewrap's own argv.
                let cmd = cmd.trim();
                if cmd.ends_with(&format!("sleep {marker}")) && cmd.split(' ').count() == 2 {
                    n += 1;
                }
            }
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_long_command_kills_it() {
    let marker = "987.25";
    let model = ScriptedModel::new([command("sleep", &[marker])]);
    let config = EngineConfig {
        commands: CommandPolicy::default().allow("sleep"),
        ..EngineConfig::default()
    };
    let mut h = Harness::new(model, config, Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let id = h.submit("x").await;
    wait_for(&h, id, |e| e.kind == "command_started").await;
    // The process is really running.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sleep_processes(marker) == 0 && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(sleep_processes(marker), 1, "sleep is running");
    let started = std::time::Instant::now();
    h.engine.cancel(id).await.unwrap();
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "cancelled");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(kinds(&events, "command_finished").is_empty());
    // In a jail the kernel tears the pid namespace down just after bubblewrap
    // is reaped: bounded wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sleep_processes(marker) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sleep_processes(marker), 0, "the process is gone");
    h.shutdown().await;
}

/// Turn 1: a file, a command that appends a line to `log.txt`, then slow text.
/// Turn 2: another file (slow), then done.
fn resumable_model() -> ScriptedModel {
    let turn1 = format!(
        "<edward_sandbox>\n<file path=\"a.txt\">\nalpha\n</file>\n</edward_sandbox>\n{}{}",
        command("sh", &["-c", "echo line >> log.txt"]),
        "slow text ".repeat(60)
    );
    let turn2 = format!(
        "{}<edward_sandbox>\n<file path=\"b.txt\">\nbeta\n</file>\n</edward_sandbox>\n<edward_done/>",
        "more slow text ".repeat(40)
    );
    ScriptedModel::new([turn1, turn2])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(10))
}

fn resume_config() -> EngineConfig {
    EngineConfig {
        commands: CommandPolicy::default().allow("sh"),
        ..EngineConfig::default()
    }
}

async fn assert_resumed_correctly(h: &Harness, id: RunId, events: &[RunEvent]) {
    assert_log_ok(events);
    let fin = terminal(events);
    assert_eq!(fin["status"], "completed", "{fin}");
    assert_eq!(fin["reason"], "done");
    assert_eq!(kinds(events, "run_resumed").len(), 1);
    assert_eq!(kinds(events, "turn_restarted").len(), 1);
    let ws = h.workspace(id).await;
    let log = std::fs::read_to_string(ws.join("log.txt")).unwrap();
    assert_eq!(log, "line\n", "the command ran exactly once");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "alpha\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "beta\n");
    let executed = kinds(events, "command_finished")
        .into_iter()
        .filter(|e| e.payload.get("reused").is_none())
        .count();
    assert_eq!(executed, 1);
    // The run_finished seq is the run's last_seq: nothing was appended after it.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_aborted_mid_turn_is_resumed_without_repeating_effects() {
    let mut h = Harness::new(resumable_model(), resume_config(), Budgets::default());
    h.start_worker(1, Duration::from_millis(900));
    let id = h.submit("x").await;
    wait_for(&h, id, |e| e.kind == "command_finished").await;
    // Drop worker 0 on the floor: no ack, no shutdown.
    let (_, handle) = h.workers.remove(0);
    handle.abort();
    let _ = handle.await;
    h.start_worker(1, Duration::from_secs(5));
    let events = collect(&h.engine, id).await;
    assert_resumed_correctly(&h, id, &events).await;
    let restarted = kinds(&events, "turn_restarted")[0];
    assert_eq!(restarted.payload["turn"], 1);
    let reused = kinds(&events, "command_finished")
        .into_iter()
        .filter(|e| e.payload["reused"] == true)
        .count();
    assert_eq!(reused, 1, "the replayed turn reused the recorded result");
    let run = h.engine.get(id).await.unwrap().unwrap();
    assert_eq!(run.last_seq, events.last().unwrap().seq);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_shut_down_between_turns_is_resumed_from_the_checkpoint() {
    let model = resumable_model();
    let mut h = Harness::new(model.clone(), resume_config(), Budgets::default());
    h.start_worker(1, Duration::from_millis(900));
    let id = h.submit("x").await;
    wait_for(&h, id, |e| {
        e.kind == "turn_started" && e.payload["turn"] == 2
    })
    .await;
    let (shutdown, handle) = h.workers.remove(0);
    shutdown.cancel();
    handle.await.unwrap();
    h.start_worker(1, Duration::from_secs(5));
    let events = collect(&h.engine, id).await;
    assert_resumed_correctly(&h, id, &events).await;
    let resumed = kinds(&events, "run_resumed")[0];
    assert_eq!(resumed.payload["from_turn"], 1);
    assert_eq!(kinds(&events, "turn_restarted")[0].payload["turn"], 2);
    // Turn 1 was not replayed: the model saw turn 1 once and turn 2 twice.
    let turn_of = |r: &edward::core::ModelRequest| {
        r.messages
            .iter()
            .filter(|m| m.role == edward::core::Role::Assistant)
            .count()
    };
    let turns: Vec<usize> = model.requests().iter().map(turn_of).collect();
    assert_eq!(turns, vec![0, 1, 1]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_a_run_on_any_worker_of_the_engine() {
    let model = ScriptedModel::new(["z".repeat(50_000)])
        .with_chunk_bytes(8)
        .with_delay(Duration::from_millis(5));
    let mut h = Harness::new(model, EngineConfig::default(), Budgets::default());
    h.start_worker(2, Duration::from_secs(5));
    h.start_worker(2, Duration::from_secs(5));
    let ids: Vec<RunId> = futures::future::join_all((0..4).map(|i| {
        h.engine
            .submit(RunRequest::new(format!("u{i}"), format!("c{i}"), "x"))
    }))
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    for id in &ids {
        wait_for(&h, *id, |e| e.kind == "text_delta").await;
    }
    for id in &ids {
        h.engine.cancel(*id).await.unwrap();
    }
    for id in &ids {
        let events = collect(&h.engine, *id).await;
        assert_log_ok(&events);
        assert_eq!(terminal(&events)["status"], "cancelled");
    }
    h.shutdown().await;
}

/// A notifier that loses every cancel signal.
struct DeafNotifier(edward::core::memory::MemoryNotifier);

#[async_trait::async_trait]
impl edward::core::Notifier for DeafNotifier {
    async fn notify_events(
        &self,
        run_id: RunId,
        last_seq: u64,
    ) -> Result<(), edward::core::InfraError> {
        self.0.notify_events(run_id, last_seq).await
    }
    async fn subscribe_events(
        &self,
        run_id: RunId,
    ) -> Result<futures::stream::BoxStream<'static, u64>, edward::core::InfraError> {
        self.0.subscribe_events(run_id).await
    }
    async fn notify_cancel(&self, _run_id: RunId) -> Result<(), edward::core::InfraError> {
        Ok(())
    }
    async fn subscribe_cancels(
        &self,
    ) -> Result<futures::stream::BoxStream<'static, RunId>, edward::core::InfraError> {
        self.0.subscribe_cancels().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cancel_signal_is_backed_up_by_the_durable_request_and_status_check() {
    let model = ScriptedModel::new(["slow ".repeat(5000)])
        .with_chunk_bytes(8)
        .with_delay(Duration::from_millis(5));
    let mut h = Harness::with_backends(|b, backends| {
        b.model_client(std::sync::Arc::new(model))
            .backend(edward::core::engine::Backend::new(
                backends.store.clone(),
                backends.queue.clone(),
                std::sync::Arc::new(DeafNotifier(edward::core::memory::MemoryNotifier::new())),
            ))
    });
    let shutdown = tokio_util::sync::CancellationToken::new();
    let cfg = edward::core::engine::WorkerConfig::new(shutdown.clone())
        .with_status_check(Duration::from_millis(100));
    let engine = h.engine.clone();
    let worker = tokio::spawn(async move { engine.worker(cfg).await.expect("worker config") });
    let id = h.submit("x").await;
    wait_for(&h, id, |e| e.kind == "text_delta").await;
    assert_eq!(h.engine.cancel(id).await.unwrap(), CancelOutcome::Requested);
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "cancelled");
    // The worker notices and drops the run; shutting down does not hang.
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("worker stops")
        .unwrap();
    let after = collect(&h.engine, id).await;
    assert_eq!(
        after.len(),
        events.len(),
        "nothing written after the terminal event"
    );
    h.workers.clear();
}
