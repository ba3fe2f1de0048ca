//! End-to-end runs of the engine with the scripted model and real local sandboxes.

mod common;

use std::time::Duration;

use common::*;
use edward::core::engine::{Budgets, EngineConfig, RunRequest};
use edward::core::scripted::ScriptedModel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_run_writes_the_app_runs_ls_and_completes() {
    let mut h = Harness::new(
        ScriptedModel::demo(),
        EngineConfig::default(),
        Budgets::default(),
    );
    h.start_worker(2, Duration::from_secs(10));
    let id = h.submit("build a todo app").await;
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    let fin = terminal(&events);
    assert_eq!(fin["status"], "completed", "{fin}");
    assert_eq!(fin["reason"], "done");
    assert_eq!(fin["turns"], 2);
    let ws = h.workspace(id).await;
    for f in ["index.html", "style.css", "app.js"] {
        let content = std::fs::read_to_string(ws.join(f)).expect(f);
        assert!(!content.is_empty());
        let w = kinds(&events, "file_written");
        assert!(
            w.iter()
                .any(|e| e.payload["path"] == f && e.payload["bytes"] == content.len() as u64)
        );
    }
    let cmd = kinds(&events, "command_finished");
    assert_eq!(cmd.len(), 1);
    assert_eq!(cmd[0].payload["exit_code"], 0);
    assert!(
        cmd[0].payload["stdout"]
            .as_str()
            .unwrap()
            .contains("index.html")
    );
    assert_eq!(kinds(&events, "turn_started").len(), 2);
    let last_write = kinds(&events, "file_written").last().unwrap().seq;
    assert!(
        last_write < kinds(&events, "command_started")[0].seq,
        "files land before the command"
    );
    assert_eq!(kinds(&events, "run_started").len(), 1);
    let run = h.engine.get(id).await.unwrap().unwrap();
    assert_eq!(run.status, edward::core::RunStatus::Completed);
    h.shutdown().await;
}

fn file_turn(name: &str) -> String {
    format!(
        "Writing {name}.\n<edward_sandbox>\n<file path=\"{name}\">\ncontent of {name}\n</file>\n</edward_sandbox>\n"
    )
}

fn command(cmd: &str, args: &[&str]) -> String {
    let args = serde_json::to_string(args).unwrap();
    format!("<edward_command command=\"{cmd}\" args='{args}' />\n")
}

async fn run_one(h: &mut Harness, req: RunRequest) -> Vec<edward::core::RunEvent> {
    if h.workers.is_empty() {
        h.start_worker(2, Duration::from_secs(10));
    }
    let id = h.engine.submit(req).await.expect("submit");
    let events = collect(&h.engine, id).await;
    assert_log_ok(&events);
    events
}

fn req() -> RunRequest {
    RunRequest::new("u", format!("c-{}", edward::core::RunId::new()), "do it")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_output_reaches_the_next_model_request() {
    let model = ScriptedModel::new([
        format!(
            "{}{}",
            file_turn("a.txt"),
            command("echo", &["marker-from-echo-42"])
        ),
        "ok <edward_done/>".to_string(),
    ]);
    let mut h = Harness::new(model.clone(), EngineConfig::default(), Budgets::default());
    let events = run_one(&mut h, req()).await;
    assert_eq!(terminal(&events)["reason"], "done");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let second = &requests[1];
    let last = second.messages.last().unwrap();
    assert!(
        last.content.contains("marker-from-echo-42"),
        "{}",
        last.content
    );
    assert!(last.content.contains("exit code 0"), "{}", last.content);
    assert!(last.content.contains("a.txt"), "{}", last.content);
    // The model's own previous output is in the conversation too.
    assert!(second.messages[1].content.contains("content of a.txt"));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_budget_ends_the_run_and_warns_once() {
    let model = ScriptedModel::new(Vec::<String>::new()).with_final_reply(file_turn("x.txt"));
    let budgets = Budgets {
        max_turns: 5,
        ..Budgets::default()
    };
    let mut h = Harness::new(model, EngineConfig::default(), budgets);
    let events = run_one(&mut h, req()).await;
    let fin = terminal(&events);
    assert_eq!(fin["status"], "completed");
    assert_eq!(fin["reason"], "budget_exhausted:turns");
    assert_eq!(fin["turns"], 5);
    let warnings: Vec<_> = kinds(&events, "budget_warning")
        .into_iter()
        .filter(|e| e.payload["budget"] == "turns")
        .collect();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].payload["used"], 4.0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_per_turn_budget_skips_before_running() {
    let t = format!(
        "{}{}{}",
        command("echo", &["one"]),
        command("echo", &["two"]),
        command("echo", &["three"])
    );
    let model = ScriptedModel::new([t]);
    let budgets = Budgets {
        max_tool_calls_per_turn: 2,
        ..Budgets::default()
    };
    let mut h = Harness::new(model, EngineConfig::default(), budgets);
    let events = run_one(&mut h, req()).await;
    assert_eq!(
        terminal(&events)["reason"],
        "budget_exhausted:tool_calls_per_turn"
    );
    assert_eq!(kinds(&events, "command_finished").len(), 2);
    let skipped = kinds(&events, "tool_skipped");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].payload["budget"], "tool_calls_per_turn");
    assert!(
        skipped[0].payload["detail"]
            .as_str()
            .unwrap()
            .contains("three")
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_per_run_budget() {
    let two = format!("{}{}", command("echo", &["a"]), command("echo", &["b"]));
    let model = ScriptedModel::new([two.clone(), two]);
    let budgets = Budgets {
        max_tool_calls_per_turn: 5,
        max_tool_calls_per_run: 3,
        ..Budgets::default()
    };
    let mut h = Harness::new(model, EngineConfig::default(), budgets);
    let events = run_one(&mut h, req()).await;
    let fin = terminal(&events);
    assert_eq!(fin["reason"], "budget_exhausted:tool_calls_per_run");
    assert_eq!(fin["tool_calls"], 3);
    assert_eq!(kinds(&events, "command_finished").len(), 3);
    assert_eq!(
        kinds(&events, "tool_skipped")[0].payload["budget"],
        "tool_calls_per_run"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_token_budget_cuts_the_stream() {
    let long = format!("{}{}", "blah ".repeat(2000), file_turn("late.txt"));
    let model = ScriptedModel::new([long]);
    let budgets = Budgets {
        max_output_tokens: 200,
        ..Budgets::default()
    };
    let mut h = Harness::new(model, EngineConfig::default(), budgets);
    let events = run_one(&mut h, req()).await;
    let fin = terminal(&events);
    assert_eq!(fin["reason"], "budget_exhausted:output_tokens");
    assert!(
        kinds(&events, "file_written").is_empty(),
        "the stream was cut before the file"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_token_budget_is_checked_before_the_call() {
    let model = ScriptedModel::new([file_turn("a.txt")]);
    let budgets = Budgets {
        max_input_tokens: 50,
        ..Budgets::default()
    };
    let mut h = Harness::new(model.clone(), EngineConfig::default(), budgets);
    let events = run_one(&mut h, req()).await;
    let fin = terminal(&events);
    assert_eq!(fin["reason"], "budget_exhausted:input_tokens");
    assert_eq!(fin["turns"], 0);
    assert!(model.requests().is_empty(), "the model was never called");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_budget_uses_the_price_table() {
    // gpt-4o costs $2.50 / $10 per Mtok: ~700 input tokens + output ≈ $0.0025 per turn.
    let model = ScriptedModel::new([file_turn("a.txt"), file_turn("b.txt"), file_turn("c.txt")]);
    let budgets = Budgets {
        max_cost_usd: 0.004,
        ..Budgets::default()
    };
    let mut h = Harness::with(|b| {
        b.model_client(std::sync::Arc::new(model))
            .budgets(budgets)
            .known_models(["gpt-4o"])
    });
    let events = run_one(&mut h, req().with_model("gpt-4o")).await;
    let fin = terminal(&events);
    assert_eq!(fin["reason"], "budget_exhausted:cost", "{fin}");
    assert!(fin["cost_usd"].as_f64().unwrap() > 0.0);
    assert!(fin["turns"].as_u64().unwrap() >= 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_budget_stops_mid_stream() {
    let model = ScriptedModel::new(["x".repeat(10_000)])
        .with_chunk_bytes(10)
        .with_delay(Duration::from_millis(20));
    let budgets = Budgets {
        deadline_ms: 400,
        ..Budgets::default()
    };
    let mut h = Harness::new(model, EngineConfig::default(), budgets);
    let started = std::time::Instant::now();
    let events = run_one(&mut h, req()).await;
    assert_eq!(terminal(&events)["reason"], "budget_exhausted:deadline");
    assert!(started.elapsed() < Duration::from_secs(10));
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_become_parse_error_events() {
    let t = "<edward_sandbox>\n<file path=\"../escape.txt\">secret</file>\n<file path=\"ok.txt\">fine</file>\n</edward_sandbox>\n<edward_command command=\"ls\" args='not json' />\n<file path=\"outside.txt\">x</file>\n<edward_done/>";
    let model = ScriptedModel::new([t]);
    let mut h = Harness::new(model, EngineConfig::default(), Budgets::default());
    let events = run_one(&mut h, req()).await;
    let codes: Vec<_> = kinds(&events, "parse_error")
        .iter()
        .map(|e| e.payload["code"].as_str().unwrap().to_string())
        .collect();
    assert!(
        codes.contains(&"invalid_file_path".to_string()),
        "{codes:?}"
    );
    assert!(
        codes.contains(&"malformed_command".to_string()),
        "{codes:?}"
    );
    assert!(
        codes.contains(&"file_outside_sandbox".to_string()),
        "{codes:?}"
    );
    let bad = kinds(&events, "parse_error")
        .into_iter()
        .find(|e| e.payload["code"] == "invalid_file_path")
        .unwrap();
    assert_eq!(bad.payload["skipped_bytes"], 6);
    let written = kinds(&events, "file_written");
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].payload["path"], "ok.txt");
    assert!(kinds(&events, "command_started").is_empty());
    assert_eq!(terminal(&events)["reason"], "done");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_commands_are_events_and_reach_the_model() {
    let t = format!(
        "{}{}{}",
        command("cat", &["/etc/passwd"]),
        command("cat", &["../x"]),
        command("bash", &["-c", "true"])
    );
    let model = ScriptedModel::new([t, "<edward_done/>".to_string()]);
    let mut h = Harness::new(model.clone(), EngineConfig::default(), Budgets::default());
    let events = run_one(&mut h, req()).await;
    let rejected = kinds(&events, "command_rejected");
    assert_eq!(rejected.len(), 3);
    assert!(kinds(&events, "command_started").is_empty());
    let second = &model.requests()[1];
    let msg = &second.messages.last().unwrap().content;
    assert!(msg.contains("outside the workspace"), "{msg}");
    assert!(msg.contains("allowlist"), "{msg}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_progress_nudges_once_then_stops() {
    let model = ScriptedModel::new(["just talking", "still talking", "more talk"]);
    let mut h = Harness::new(model.clone(), EngineConfig::default(), Budgets::default());
    let events = run_one(&mut h, req()).await;
    assert_eq!(terminal(&events)["reason"], "no_progress");
    assert_eq!(terminal(&events)["turns"], 2);
    let second = &model.requests()[1];
    assert_eq!(
        second.messages.last().unwrap().content,
        edward::core::engine::unstable::NUDGE_MESSAGE
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_with_package_manager_none_are_events_not_failures() {
    let t = "<edward_install>\npackages: left-pad\n</edward_install>\n<edward_done/>";
    let model = ScriptedModel::new([t]);
    let config = EngineConfig {
        package_manager: edward::core::engine::PackageManager::None,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(model, config, Budgets::default());
    let events = run_one(&mut h, req()).await;
    assert_eq!(kinds(&events, "install_started").len(), 1);
    let fin = kinds(&events, "install_finished");
    assert_eq!(fin.len(), 1);
    assert!(
        fin[0].payload["error"]
            .as_str()
            .unwrap()
            .contains("disabled")
    );
    assert_eq!(terminal(&events)["status"], "completed");
    h.shutdown().await;
}

#[tokio::test]
async fn bad_requests_are_typed_errors_naming_the_field() {
    use edward::core::engine::SubmitError;
    let h = Harness::new(
        ScriptedModel::demo(),
        EngineConfig::default(),
        Budgets::default(),
    );
    let cases: Vec<(RunRequest, &str)> = vec![
        (RunRequest::new("u", "c", ""), "prompt"),
        (RunRequest::new("u", "c", "   "), "prompt"),
        (
            RunRequest::new("u", "c", "x".repeat(100 * 1024 + 1)),
            "prompt",
        ),
        (RunRequest::new("", "c", "p"), "user_id"),
        (RunRequest::new("u", "c".repeat(200), "p"), "chat_id"),
        (RunRequest::new("u\n", "c", "p"), "user_id"),
        (
            RunRequest::new("u", "c", "p").with_model("nope-9000"),
            "model",
        ),
        (
            RunRequest::new("u", "c", "p").with_budgets(Budgets {
                max_turns: 0,
                ..Budgets::default()
            }),
            "budgets.max_turns",
        ),
        (
            RunRequest::new("u", "c", "p").with_budgets(Budgets {
                max_cost_usd: -1.0,
                ..Budgets::default()
            }),
            "budgets.max_cost_usd",
        ),
    ];
    for (req, field) in cases {
        match h.engine.submit(req).await {
            Err(SubmitError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected Invalid {{ {field} }}, got {other:?}"),
        }
    }
    // Exactly at the cap is fine.
    assert!(
        h.engine
            .submit(RunRequest::new("u", "c", "x".repeat(100 * 1024)))
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_search_without_a_provider_is_reported_not_fatal() {
    let model = ScriptedModel::new([
        "<edward_web_search query=\"vite template\" max_results=\"3\" />",
        "<edward_done/>",
    ]);
    let mut h = Harness::new(model.clone(), EngineConfig::default(), Budgets::default());
    let events = run_one(&mut h, req()).await;
    assert_eq!(kinds(&events, "web_search_started").len(), 1);
    let fin = kinds(&events, "web_search_finished");
    assert_eq!(fin[0].payload["results"], 0);
    assert!(fin[0].payload["error"].is_string());
    assert_eq!(terminal(&events)["reason"], "done");
    let requests = model.requests();
    let msg = &requests[1].messages.last().unwrap().content;
    assert!(msg.contains("web search `vite template`"), "{msg}");
    h.shutdown().await;
}

/// A model client with a small context window and its own retries, wrapping
/// the scripted model: the engine must refuse a turn that cannot fit.
struct SmallWindow {
    inner: ScriptedModel,
    window: u64,
}

#[async_trait::async_trait]
impl edward::core::ModelClient for SmallWindow {
    fn provider(&self) -> &str {
        "small-window"
    }

    async fn stream(
        &self,
        request: edward::core::ModelRequest,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<edward::core::ModelStream, edward::core::ModelError> {
        self.inner.stream(request, cancel).await
    }

    fn context_window(&self, _model: &str) -> Option<u64> {
        Some(self.window)
    }

    fn retries_internally(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_cannot_fit_the_context_window_is_refused_before_the_call() {
    let model = ScriptedModel::new([file_turn("a.txt")]);
    let client = std::sync::Arc::new(SmallWindow {
        inner: model.clone(),
        window: 100,
    });
    let mut h = Harness::with(|b| b.model_client(client));
    let events = run_one(&mut h, req()).await;
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    assert!(
        fin["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("error: context too long")),
        "{fin}"
    );
    assert!(model.requests().is_empty(), "the model was never called");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_retries_internally_is_not_retried_again() {
    // Turn 1 fails with a retryable error; the engine would normally retry
    // (model_attempts = 3), but this client says it already retried.
    let model = ScriptedModel::new([file_turn("a.txt")]);
    let client = std::sync::Arc::new(FailingOnce {
        inner: model.clone(),
        failed: std::sync::atomic::AtomicBool::new(false),
    });
    let mut h = Harness::with(|b| b.model_client(client));
    let events = run_one(&mut h, req()).await;
    let fin = terminal(&events);
    assert_eq!(fin["status"], "failed", "{fin}");
    assert!(kinds(&events, "model_retry").is_empty(), "no engine retry");
    assert!(model.requests().is_empty());
    h.shutdown().await;
}

struct FailingOnce {
    inner: ScriptedModel,
    failed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl edward::core::ModelClient for FailingOnce {
    fn provider(&self) -> &str {
        "failing-once"
    }

    async fn stream(
        &self,
        request: edward::core::ModelRequest,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<edward::core::ModelStream, edward::core::ModelError> {
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(edward::core::ModelError::Overloaded {
                status: 503,
                retry_after: None,
            });
        }
        self.inner.stream(request, cancel).await
    }

    fn retries_internally(&self) -> bool {
        true
    }
}
