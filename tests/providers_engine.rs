//! One full engine run per HTTP provider: the engine streams a turn from a
//! local server speaking the provider's wire format, writes the file the
//! model emits into a real local sandbox, and finishes `completed` with the
//! provider-reported usage and a priced cost.

#[path = "../edward-core/tests/providers_support/mod.rs"]
mod providers_support;

use std::sync::Arc;
use std::time::Duration;

use edward::core::engine::{Engine, EngineConfig, RunRequest, WorkerConfig};
use edward::core::providers::{AnthropicClient, GeminiClient, OpenAiClient, RetryPolicy};
use edward::core::{ModelClient, RunEvent, RunId, SandboxProvider};
use edward::sandbox::LocalSandboxProvider;
use providers_support::{KEY, Reply, TestServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The model's whole answer: one file, then done.
const ANSWER: &str = "I'll write the greeting.\n<edward_sandbox project=\"hello\">\n<file path=\"hello.txt\">\nhéllo from a real wire format ✓\n</file>\n</edward_sandbox>\n<edward_done/>";

/// Pieces of `ANSWER` the way a provider streams it: a few bytes at a time.
fn pieces() -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in ANSWER.chars() {
        cur.push(ch);
        if cur.len() >= 7 {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn data(v: serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

fn openai_body() -> String {
    let mut s = String::new();
    for p in pieces() {
        s += &data(
            json!({"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":p},"finish_reason":null}]}),
        );
    }
    s += &data(
        json!({"object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
    );
    s += &data(
        json!({"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":60,"total_tokens":1260}}),
    );
    s + "data: [DONE]\n\n"
}

fn anthropic_body() -> String {
    let ev = |name: &str, v: serde_json::Value| format!("event: {name}\ndata: {v}\n\n");
    let mut s = ev(
        "message_start",
        json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","usage":{"input_tokens":1200,"output_tokens":1}}}),
    );
    s += &ev(
        "content_block_start",
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
    );
    for p in pieces() {
        s += &ev(
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":p}}),
        );
    }
    s += &ev(
        "content_block_stop",
        json!({"type":"content_block_stop","index":0}),
    );
    s += &ev(
        "message_delta",
        json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":60}}),
    );
    s + &ev("message_stop", json!({"type":"message_stop"}))
}

fn gemini_body() -> String {
    let ps = pieces();
    let n = ps.len();
    let mut s = String::new();
    for (i, p) in ps.into_iter().enumerate() {
        let mut cand = json!({"content":{"parts":[{"text":p}],"role":"model"},"index":0});
        let mut v = json!({"candidates":[]});
        if i + 1 == n {
            cand["finishReason"] = json!("STOP");
            v["usageMetadata"] =
                json!({"promptTokenCount":1200,"candidatesTokenCount":60,"totalTokenCount":1260});
        }
        v["candidates"] = json!([cand]);
        s += &format!("data: {v}\r\n\r\n");
    }
    s
}

async fn run_engine(
    model: Arc<dyn ModelClient>,
    model_name: &str,
) -> (Vec<RunEvent>, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandboxes = Arc::new(LocalSandboxProvider::new(dir.path()));
    let engine = Engine::builder()
        .sandbox_provider(sandboxes.clone() as Arc<dyn SandboxProvider>)
        .model_client(model)
        .default_model(model_name)
        .config(EngineConfig::default())
        .build()
        .expect("engine builds");
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn({
        let engine = engine.clone();
        let cfg = WorkerConfig::new(shutdown.clone());
        async move { engine.worker(cfg).await.expect("worker config") }
    });
    let id: RunId = engine
        .submit(RunRequest::new("user", "chat", "write a greeting file"))
        .await
        .expect("submit");
    let events = tokio::time::timeout(Duration::from_secs(60), async {
        let mut s = engine.raw_events(id, 0);
        let mut out = Vec::new();
        while let Some(e) = s.next().await {
            out.push(e.expect("event"));
        }
        out
    })
    .await
    .expect("run finishes within 60 s");
    shutdown.cancel();
    let _ = worker.await;
    let ws = sandboxes.workspace_path(&Engine::sandbox_key(id));
    (events, ws, dir)
}

fn check_run(events: &[RunEvent], workspace: &std::path::Path, priced: bool) {
    let last = events.last().expect("events");
    assert_eq!(last.kind, "run_finished");
    assert_eq!(last.payload["status"], "completed", "{}", last.payload);
    assert_eq!(last.payload["usage"]["input_tokens"], 1200);
    assert_eq!(last.payload["usage"]["output_tokens"], 60);
    assert_eq!(last.payload["usage"]["estimated"], false);
    let cost = last.payload["cost_usd"].as_f64().expect("cost");
    assert_eq!(cost > 0.0, priced, "cost {cost}");
    let turn = events
        .iter()
        .find(|e| e.kind == "turn_finished")
        .expect("turn_finished");
    assert_eq!(turn.payload["usage"]["output_tokens"], 60);
    let content = std::fs::read_to_string(workspace.join("hello.txt")).expect("hello.txt");
    assert!(
        content.contains("héllo from a real wire format ✓"),
        "{content:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == "file_written" && e.payload["path"] == "hello.txt")
    );
}

fn assert_prompt_sent(body: &serde_json::Value) {
    let text = body.to_string();
    assert!(text.contains("write a greeting file"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_full_run() {
    let server = TestServer::start(vec![Reply::sse(openai_body())]).await;
    let client = OpenAiClient::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    let (events, ws, _dir) = run_engine(Arc::new(client), "gpt-4o-mini").await;
    check_run(&events, &ws, true);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].body["model"], "gpt-4o-mini");
    assert_eq!(reqs[0].body["messages"][0]["role"], "system");
    assert_prompt_sent(&reqs[0].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_full_run() {
    let server = TestServer::start(vec![Reply::sse_tiny(anthropic_body().as_bytes())]).await;
    let client = AnthropicClient::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .build()
        .unwrap();
    let (events, ws, _dir) = run_engine(Arc::new(client), "claude-sonnet-4-20250514").await;
    check_run(&events, &ws, true);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert!(
        reqs[0].body["system"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert_prompt_sent(&reqs[0].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_full_run() {
    let server = TestServer::start(vec![Reply::sse(gemini_body())]).await;
    let client = GeminiClient::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .build()
        .unwrap();
    let (events, ws, _dir) = run_engine(Arc::new(client), "gemini-2.5-flash").await;
    check_run(&events, &ws, true);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].uri,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert_prompt_sent(&reqs[0].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_error_fails_the_run_with_a_typed_reason() {
    let body =
        r#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error"}}"#;
    let server = TestServer::start(vec![Reply::error(400, body)]).await;
    let client = OpenAiClient::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .build()
        .unwrap();
    let (events, _ws, _dir) = run_engine(Arc::new(client), "gpt-4o-mini").await;
    let last = events.last().expect("events");
    assert_eq!(last.kind, "run_finished");
    assert_eq!(last.payload["status"], "failed", "{}", last.payload);
    let reason = last.payload["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("Invalid value for 'temperature'"),
        "{reason}"
    );
    assert!(!serde_json::to_string(&events).unwrap().contains(KEY));
    assert_eq!(server.requests().len(), 1);
}
