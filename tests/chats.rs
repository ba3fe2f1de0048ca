//! Issue 10: chats. A follow-up run continues its chat's workspace and sees
//! its history; history is trimmed to fit; a resumed run writes each
//! message once; the double-texting policies under 200 concurrent submits;
//! a failed build gets exactly one autofix turn.

mod common;

use std::time::Duration;

use common::{Harness, assert_log_ok, collect, kinds, terminal};
use edward::core::engine::context::NEW_REQUEST;
use edward::core::engine::{
    Budgets, BuildConfig, ChatConfig, CommandPolicy, DoubleTexting, EngineConfig, RunRequest,
    SubmitError,
};
use edward::core::scripted::ScriptedModel;
use edward::core::{BuildStatus, MessageRole, Role, RunEvent, RunId};

fn seq_of(events: &[RunEvent], kind: &str) -> u64 {
    kinds(events, kind)
        .first()
        .unwrap_or_else(|| panic!("no {kind}"))
        .seq
}

async fn run(h: &Harness, user: &str, chat: &str, prompt: &str) -> (RunId, Vec<RunEvent>) {
    let id = h
        .engine
        .submit(RunRequest::new(user, chat, prompt))
        .await
        .expect("submit");
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    (id, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_continues_the_workspace_and_sees_the_history() {
    let model = ScriptedModel::demo().with_delay(Duration::ZERO);
    let mut h = Harness::new(model.clone(), EngineConfig::default(), Budgets::default());
    h.start_worker(2, Duration::from_secs(5));

    let (id1, ev1) = run(&h, "alice", "demo", "build a todo app").await;
    assert_eq!(terminal(&ev1)["status"], "completed", "{}", terminal(&ev1));
    let first = kinds(&ev1, "context_prepared")[0].payload.clone();
    assert_eq!(first["history_messages"], 0);
    assert_eq!(first["files_listed"], 0);
    assert_eq!(
        kinds(&ev1, "framework_detected")[0].payload["framework"],
        "none"
    );

    let (id2, ev2) = run(&h, "alice", "demo", "add a dark mode toggle").await;
    assert_eq!(terminal(&ev2)["status"], "completed", "{}", terminal(&ev2));
    // Same workspace: run 1's files are there, run 2 edited one of them.
    let ws = h.workspace(id1).await;
    assert_eq!(ws, h.workspace(id2).await);
    assert!(ws.join("app.js").exists(), "run 1's file is still there");
    assert!(ws.join("theme.js").exists(), "run 2 added a file");
    let index = std::fs::read_to_string(ws.join("index.html")).unwrap();
    assert!(
        index.contains("theme.js"),
        "run 2 rewrote run 1's index.html"
    );

    // The context: prepared before the first turn, with run 1's history.
    let ctx = kinds(&ev2, "context_prepared")[0].payload.clone();
    assert_eq!(ctx["history_messages"], 3, "{ctx}"); // prompt + 2 turns
    assert_eq!(ctx["history_dropped"], 0);
    assert_eq!(ctx["files_listed"], 3);
    assert!(ctx["files_included"].as_u64().unwrap() >= 1);
    assert!(seq_of(&ev2, "context_prepared") < seq_of(&ev2, "turn_started"));
    assert!(seq_of(&ev2, "framework_detected") < seq_of(&ev2, "turn_started"));
    let fw = kinds(&ev2, "framework_detected")[0].payload.clone();
    assert_eq!(fw["framework"], "static", "{fw}");

    // What the model saw: run 1's prompt, replies and tool results, the tree.
    let req = model
        .requests()
        .into_iter()
        .find(|r| r.messages.iter().any(|m| m.content.contains(NEW_REQUEST)))
        .expect("the follow-up's first request");
    let all: String = req.messages.iter().map(|m| m.content.as_str()).collect();
    assert!(all.contains("build a todo app"), "run 1's prompt");
    assert!(all.contains("I'll build a small todo app"), "run 1's reply");
    assert!(all.contains("- wrote app.js ("), "run 1's files");
    assert!(all.contains("- ran `ls -la`: exit 0"), "run 1's command");
    assert!(req.system.contains("- app.js ("), "the file tree");
    assert!(req.system.contains("Framework: static"));
    assert_eq!(req.messages[0].role, Role::User);
    assert!(
        req.messages
            .last()
            .unwrap()
            .content
            .ends_with("add a dark mode toggle")
    );

    // The chat's messages: prompt, replies with effects, twice.
    let msgs = h.engine.chat_messages("alice", "demo", 100).await.unwrap();
    let roles: Vec<MessageRole> = msgs.iter().map(|m| m.role).collect();
    use MessageRole::{Assistant as A, User as U};
    assert_eq!(roles, [U, A, A, U, A, A]);
    let fx = msgs[1].effects.as_ref().unwrap();
    assert!(fx.files.iter().any(|f| f.path == "app.js" && f.bytes > 0));
    assert!(
        fx.commands
            .iter()
            .any(|c| c.command == "ls -la" && c.exit_code == Some(0))
    );
    assert!(!msgs[1].text.contains("<file"), "the visible reply only");
    assert_eq!(
        h.engine
            .chat_runs("alice", "demo", None, 10)
            .await
            .unwrap()
            .len(),
        2
    );

    // Another user's chat of the same id is another chat and workspace.
    let (id3, ev3) = run(&h, "bob", "demo", "build a todo app").await;
    assert_ne!(h.workspace(id3).await, ws);
    assert_eq!(
        kinds(&ev3, "context_prepared")[0].payload["history_messages"],
        0
    );
    assert_eq!(
        kinds(&ev3, "context_prepared")[0].payload["files_listed"],
        0
    );
    assert_eq!(
        h.engine
            .chat_messages("bob", "demo", 100)
            .await
            .unwrap()
            .len(),
        3
    );
    assert!(
        h.engine
            .chat_messages("alice", "no-such-chat", 100)
            .await
            .unwrap()
            .is_empty()
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_trimmed_oldest_first_to_fit_the_input_budget() {
    let model = ScriptedModel::new(["Noted.\n<edward_done/>"]);
    let budgets = Budgets {
        max_input_tokens: 4_000,
        ..Budgets::default()
    };
    let mut h = Harness::new(model.clone(), EngineConfig::default(), budgets);
    h.start_worker(1, Duration::from_secs(5));
    let mut last = Vec::new();
    for i in 0..5 {
        // ~1,000 estimated tokens each.
        let prompt = format!("note {i}: {}", "x".repeat(4_000));
        let (_, events) = run(&h, "u", "long", &prompt).await;
        assert_eq!(
            terminal(&events)["status"],
            "completed",
            "{}",
            terminal(&events)
        );
        last = events;
    }
    let ctx = kinds(&last, "context_prepared")[0].payload.clone();
    let dropped = ctx["history_dropped"].as_u64().unwrap();
    assert!(dropped > 0, "{ctx}");
    assert_eq!(
        dropped + ctx["history_messages"].as_u64().unwrap(),
        8,
        "{ctx}"
    );
    assert!(ctx["estimated_tokens"].as_u64().unwrap() <= 4_000, "{ctx}");
    let req = model.requests().pop().unwrap();
    assert!(
        req.messages[0]
            .content
            .contains(&format!("[{dropped} earlier message")),
        "{}",
        &req.messages[0].content[..100]
    );
    // The newest history stays: the previous prompt is there, the first is not.
    let all: String = req.messages.iter().map(|m| m.content.as_str()).collect();
    assert!(all.contains("note 3:"));
    assert!(!all.contains("note 0:"));
    h.shutdown().await;
}

/// Turn 1 writes a file; turn 2 streams slowly (the worker dies in it).
fn resumable_model() -> ScriptedModel {
    ScriptedModel::new([
        "One.\n<edward_sandbox>\n<file path=\"a.txt\">\nalpha\n</file>\n</edward_sandbox>\n"
            .to_string(),
        format!("Two. {}<edward_done/>", "slow ".repeat(100)),
    ])
    .with_chunk_bytes(16)
    .with_delay(Duration::from_millis(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_writes_each_message_once() {
    let mut h = Harness::new(
        resumable_model(),
        EngineConfig::default(),
        Budgets::default(),
    );
    h.start_worker(1, Duration::from_millis(900));
    let id = h
        .engine
        .submit(RunRequest::new("u", "resume", "write a"))
        .await
        .unwrap();
    let mut s = h.engine.raw_events(id, 0);
    while let Some(e) = s.next().await {
        let e = e.unwrap();
        if e.kind == "text_delta" && e.payload["content"].as_str().unwrap().contains("slow") {
            break;
        }
    }
    // The worker dies mid-turn 2: no ack, no shutdown.
    let (_, handle) = h.workers.remove(0);
    handle.abort();
    let _ = handle.await;
    h.start_worker(1, Duration::from_secs(5));
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    assert_eq!(terminal(&events)["status"], "completed");
    assert_eq!(kinds(&events, "run_resumed").len(), 1);
    let msgs = h.engine.chat_messages("u", "resume", 100).await.unwrap();
    let shape: Vec<(u32, MessageRole)> = msgs.iter().map(|m| (m.turn, m.role)).collect();
    assert_eq!(
        shape,
        [
            (0, MessageRole::User),
            (1, MessageRole::Assistant),
            (2, MessageRole::Assistant)
        ]
    );
    assert_eq!(msgs[1].text, "One.");
    h.shutdown().await;
}

fn many_runs_config(policy: DoubleTexting) -> EngineConfig {
    EngineConfig {
        chat: ChatConfig {
            double_texting: policy,
            ..ChatConfig::default()
        },
        ..EngineConfig::default()
    }
}

fn wide_limits() -> edward::AdmissionLimits {
    edward::AdmissionLimits {
        global: 1_000,
        per_user: 1_000,
        per_chat: 1,
    }
}

async fn submit_200(h: &Harness, policy: Option<DoubleTexting>) -> Vec<Result<RunId, SubmitError>> {
    futures::future::join_all((0..200).map(|i| {
        let mut req = RunRequest::new("u", "busy", format!("message {i}"));
        req.double_texting = policy;
        h.engine.submit(req)
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_admits_one_of_200_concurrent_submits_and_names_it() {
    let h = Harness::with(|b| {
        b.model_client(std::sync::Arc::new(ScriptedModel::new(["<edward_done/>"])))
            .admission_limits(wide_limits())
    });
    let results = submit_200(&h, None).await;
    let ok: Vec<RunId> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    assert_eq!(ok.len(), 1, "exactly one admitted");
    for r in &results {
        match r {
            Ok(_) => {}
            Err(SubmitError::ChatBusy {
                chat_id,
                active_run,
            }) => {
                assert_eq!(chat_id, "busy");
                assert_eq!(*active_run, ok[0], "names the active run");
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    h.shutdown().await;
}

/// `(run_started.at, run_finished.at)` of each run, in id order.
async fn intervals(h: &Harness, ids: &[RunId]) -> Vec<(RunId, Vec<RunEvent>)> {
    let mut out = Vec::new();
    for &id in ids {
        let events = collect(&h.engine, id).await;
        assert_log_ok(&events);
        out.push((id, events));
    }
    out
}

/// No two runs of the chat overlap: each starts after the previous ended.
fn assert_one_at_a_time(runs: &[(RunId, Vec<RunEvent>)]) {
    let mut started: Vec<_> = runs
        .iter()
        .filter_map(|(id, ev)| {
            let s = kinds(ev, "run_started").first().map(|e| e.at)?;
            Some((s, ev.last().unwrap().at, *id))
        })
        .collect();
    started.sort();
    for pair in started.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "run {} started before run {} finished",
            pair[1].2,
            pair[0].2
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_runs_200_concurrent_submits_one_at_a_time_in_order() {
    let mut h = Harness::with(|b| {
        b.model_client(std::sync::Arc::new(ScriptedModel::new([
            "Done.\n<edward_done/>",
        ])))
        .admission_limits(wide_limits())
        .config(many_runs_config(DoubleTexting::Enqueue))
    });
    h.start_worker(4, Duration::from_secs(5));
    let results = submit_200(&h, None).await;
    let mut ids: Vec<RunId> = results
        .into_iter()
        .map(|r| r.expect("all admitted"))
        .collect();
    ids.sort();
    let runs = intervals(&h, &ids).await;
    for (_, ev) in &runs {
        assert_eq!(terminal(ev)["status"], "completed", "{}", terminal(ev));
    }
    assert_one_at_a_time(&runs);
    // In submission (id) order.
    let starts: Vec<_> = runs
        .iter()
        .map(|(_, ev)| kinds(ev, "run_started")[0].at)
        .collect();
    assert!(
        starts.windows(2).all(|w| w[0] <= w[1]),
        "started in id order"
    );
    assert!(
        runs.iter()
            .any(|(_, ev)| !kinds(ev, "run_waiting").is_empty()),
        "later runs waited for earlier ones"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_cancels_the_active_run_and_the_newest_of_200_completes() {
    let slow = ScriptedModel::new([format!("{}<edward_done/>", "thinking it over ".repeat(40))])
        .with_chunk_bytes(16)
        .with_delay(Duration::from_millis(5));
    let mut h = Harness::with(|b| {
        b.model_client(std::sync::Arc::new(slow))
            .admission_limits(wide_limits())
    });
    h.start_worker(4, Duration::from_secs(5));
    // One at a time first: the second message interrupts the first.
    let a = h
        .engine
        .submit(RunRequest::new("u", "busy", "first"))
        .await
        .unwrap();
    let mut s = h.engine.raw_events(a, 0);
    while let Some(e) = s.next().await {
        if e.unwrap().kind == "turn_started" {
            break;
        }
    }
    let b = h
        .engine
        .submit(
            RunRequest::new("u", "busy", "second").with_double_texting(DoubleTexting::Interrupt),
        )
        .await
        .expect("interrupt admits");
    let ea = collect(&h.engine, a).await;
    let eb = collect(&h.engine, b).await;
    assert_eq!(terminal(&ea)["status"], "cancelled");
    assert_eq!(terminal(&eb)["status"], "completed");
    assert_one_at_a_time(&[(a, ea), (b, eb)]);

    // Then 200 at once.
    let results = submit_200(&h, Some(DoubleTexting::Interrupt)).await;
    let mut ids: Vec<RunId> = results
        .into_iter()
        .map(|r| r.expect("all admitted"))
        .collect();
    ids.sort();
    let runs = intervals(&h, &ids).await;
    let newest = runs.last().unwrap();
    assert_eq!(
        terminal(&newest.1)["status"],
        "completed",
        "the newest survives"
    );
    let cancelled = runs
        .iter()
        .filter(|(_, ev)| terminal(ev)["status"] == "cancelled")
        .count();
    assert!(cancelled >= 150, "most were interrupted: {cancelled}");
    assert_one_at_a_time(&runs);
    h.shutdown().await;
}

fn build_config(autofix: bool) -> EngineConfig {
    EngineConfig {
        commands: CommandPolicy::default(),
        chat: ChatConfig {
            build: BuildConfig::enabled()
                .with_command(vec![
                    "sh".into(),
                    "-c".into(),
                    "test -f fixed.txt || { echo 'error: fixed.txt is missing' >&2; exit 1; }"
                        .into(),
                ])
                .with_autofix(autofix),
            ..ChatConfig::default()
        },
        ..EngineConfig::default()
    }
}

const WRITE_A: &str = "Writing.\n<edward_sandbox>\n<file path=\"a.txt\">\na\n</file>\n</edward_sandbox>\n<edward_done/>";
const WRITE_FIX: &str = "Fixing.\n<edward_sandbox>\n<file path=\"fixed.txt\">\nok\n</file>\n</edward_sandbox>\n<edward_done/>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_build_gets_exactly_one_autofix_turn() {
    let model = ScriptedModel::new([WRITE_A, WRITE_FIX]);
    let mut h = Harness::new(model.clone(), build_config(true), Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let (id, events) = run(&h, "u", "build", "write a").await;
    let fin = terminal(&events);
    assert_eq!(fin["status"], "completed", "{fin}");
    assert_eq!(fin["reason"], "done", "{fin}");
    let started = kinds(&events, "build_started");
    let finished = kinds(&events, "build_finished");
    assert_eq!(started.len(), 2);
    assert_eq!(finished[0].payload["status"], "failed");
    assert_eq!(finished[0].payload["autofix"], true);
    assert!(
        finished[0].payload["output"]
            .as_str()
            .unwrap()
            .contains("fixed.txt is missing")
    );
    assert_eq!(finished[1].payload["status"], "succeeded");
    assert_eq!(kinds(&events, "turn_started").len(), 2, "one autofix turn");
    assert!(finished[1].seq < events.last().unwrap().seq);
    // The autofix turn saw the build output.
    let req = model.requests().pop().unwrap();
    assert!(
        req.messages
            .last()
            .unwrap()
            .content
            .contains("fixed.txt is missing")
    );
    let builds = h.engine.builds(id).await.unwrap();
    assert_eq!(
        builds
            .iter()
            .map(|b| (b.number, b.status))
            .collect::<Vec<_>>(),
        [(1, BuildStatus::Failed), (2, BuildStatus::Succeeded)]
    );
    assert_eq!(builds[0].claimed_by.as_deref(), Some("w0"));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_that_stays_broken_ends_build_failed_after_one_autofix() {
    // The autofix turn writes the wrong file; no second autofix.
    let model = ScriptedModel::new([WRITE_A, WRITE_A, WRITE_FIX]);
    let mut h = Harness::new(model, build_config(true), Budgets::default());
    h.start_worker(1, Duration::from_secs(5));
    let (id, events) = run(&h, "u", "broken", "write a").await;
    assert_eq!(terminal(&events)["reason"], "build_failed");
    assert_eq!(kinds(&events, "turn_started").len(), 2);
    assert_eq!(kinds(&events, "build_finished").len(), 2);
    assert_eq!(
        kinds(&events, "build_finished")[1].payload["autofix"],
        serde_json::Value::Null
    );
    assert_eq!(h.engine.builds(id).await.unwrap().len(), 2);
    // Without autofix: one build, no second turn.
    let mut h2 = Harness::new(
        ScriptedModel::new([WRITE_A]),
        build_config(false),
        Budgets::default(),
    );
    h2.start_worker(1, Duration::from_secs(5));
    let (_, events) = run(&h2, "u", "broken", "write a").await;
    assert_eq!(terminal(&events)["reason"], "build_failed");
    assert_eq!(kinds(&events, "build_finished").len(), 1);
    assert_eq!(kinds(&events, "turn_started").len(), 1);
    h.shutdown().await;
    h2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_build_without_changed_files_or_when_off() {
    let mut h = Harness::new(
        ScriptedModel::new(["Nothing to change.\n<edward_done/>"]),
        build_config(true),
        Budgets::default(),
    );
    h.start_worker(1, Duration::from_secs(5));
    let (_, events) = run(&h, "u", "quiet", "look around").await;
    assert!(kinds(&events, "build_started").is_empty());
    let mut off = Harness::new(
        ScriptedModel::new([WRITE_A]),
        EngineConfig::default(),
        Budgets::default(),
    );
    off.start_worker(1, Duration::from_secs(5));
    let (_, events) = run(&off, "u", "off", "write a").await;
    assert!(kinds(&events, "build_started").is_empty());
    assert_eq!(terminal(&events)["reason"], "done");
    h.shutdown().await;
    off.shutdown().await;
}
