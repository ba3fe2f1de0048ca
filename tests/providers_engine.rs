//! One full engine run per HTTP provider: the engine streams a turn from a
//! local server speaking the provider's wire format, writes the file the
//! model emits into a real local sandbox, and finishes `completed` with the
//! provider-reported usage and a priced cost.

#[path = "../edward-core/tests/providers_support/mod.rs"]
mod providers_support;

use std::sync::Arc;
use std::time::Duration;

use edward::core::engine::{Budgets, Engine, EngineConfig, RunRequest, WorkerConfig};
use edward::core::providers::{AnthropicClient, GeminiClient, OpenAiClient, RetryPolicy};
use edward::core::{ModelClient, RunEvent, RunId, SandboxProvider};
use edward::sandbox::LocalSandboxProvider;
use providers_support::{
    GATEWAY_ANSWER, GATEWAY_CUT, KEY, Piece, Reply, TestServer, fast_retry, fixture, windowed_retry,
};
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
    run_engine_with(
        model,
        model_name,
        RunRequest::new("user", "chat", "write a greeting file"),
    )
    .await
}

async fn run_engine_with(
    model: Arc<dyn ModelClient>,
    model_name: &str,
    request: RunRequest,
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
    let id: RunId = engine.submit(request).await.expect("submit");
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
    let run = engine.get(id).await.expect("get").expect("run exists");
    let ws = sandboxes.workspace_path(&Engine::sandbox_key(&run));
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

// ------------------------------------------------- gateways (issue 15)

fn openai(base_url: &str, retry: RetryPolicy) -> Arc<dyn ModelClient> {
    Arc::new(
        OpenAiClient::builder()
            .api_key(KEY)
            .base_url(base_url)
            .retry(retry)
            .build()
            .unwrap(),
    )
}

fn anthropic(base_url: &str, retry: RetryPolicy) -> Arc<dyn ModelClient> {
    Arc::new(
        AnthropicClient::builder()
            .api_key(KEY)
            .base_url(base_url)
            .retry(retry)
            .build()
            .unwrap(),
    )
}

fn of_kind<'a>(events: &'a [RunEvent], kind: &str) -> Vec<&'a RunEvent> {
    events.iter().filter(|e| e.kind == kind).collect()
}

fn finished(events: &[RunEvent]) -> &serde_json::Value {
    let last = events.last().expect("events");
    assert_eq!(last.kind, "run_finished");
    &last.payload
}

/// The run completed `done` with the file of [`GATEWAY_ANSWER`] written and
/// the server's 1312/41 tokens.
fn check_gateway_answer(events: &[RunEvent], workspace: &std::path::Path) {
    let end = finished(events);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["reason"], "done");
    assert_eq!(end["usage"]["input_tokens"], 1312);
    assert_eq!(end["usage"]["output_tokens"], 41);
    assert_eq!(end["usage"]["estimated"], false);
    let ended = of_kind(events, "model_finished");
    assert_eq!(ended.len(), 1);
    assert_eq!(
        ended[0].payload,
        json!({"turn": 1, "finish_reason": "stop", "usage_reported": true})
    );
    let content = std::fs::read_to_string(workspace.join("hello.txt")).expect("hello.txt");
    assert!(content.contains("héllo through a gateway ✓"), "{content:?}");
    assert!(GATEWAY_ANSWER.contains(content.trim()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_gateway_stream_with_quirks_completes() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai", "gateway_usage.sse"))]).await;
    let (events, ws, _dir) =
        run_engine(openai(&server.base_url, fast_retry()), "gpt-4o-mini").await;
    check_gateway_answer(&events, &ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_gateway_stream_with_late_input_count_completes() {
    let server =
        TestServer::start(vec![Reply::sse(fixture("anthropic", "gateway_usage.sse"))]).await;
    let (events, ws, _dir) = run_engine(
        anthropic(&server.base_url, fast_retry()),
        "claude-sonnet-4-20250514",
    )
    .await;
    check_gateway_answer(&events, &ws);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_reply_to_a_streaming_request_is_one_answer() {
    for (provider, client_for, model) in [
        (
            "openai",
            openai as fn(&str, RetryPolicy) -> Arc<dyn ModelClient>,
            "gpt-4o-mini",
        ),
        ("anthropic", anthropic, "claude-sonnet-4-20250514"),
    ] {
        let server =
            TestServer::start(vec![Reply::json(fixture(provider, "nonstream.json"))]).await;
        let (events, ws, _dir) =
            run_engine(client_for(&server.base_url, fast_retry()), model).await;
        check_gateway_answer(&events, &ws);
    }
}

/// The gateway's `stop` + usage + `[DONE]` after its upstream died mid-file:
/// `model_finished` shows the finish reason, that usage came from the
/// server, and the file scope the stream ended in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_stop_inside_an_open_file_is_surfaced() {
    let server = TestServer::start(vec![Reply::sse(fixture(
        "openai",
        "gateway_stop_after_upstream_failure.sse",
    ))])
    .await;
    let request = RunRequest::new("user", "chat", "write the big file").with_budgets(Budgets {
        max_turns: 1,
        ..Budgets::default()
    });
    let (events, _ws, _dir) = run_engine_with(
        openai(&server.base_url, fast_retry()),
        "gpt-4o-mini",
        request,
    )
    .await;
    let ended = of_kind(&events, "model_finished");
    assert_eq!(ended.len(), 1);
    assert_eq!(
        ended[0].payload,
        json!({"turn": 1, "finish_reason": "stop", "usage_reported": true, "open_scope": "file big.txt"})
    );
    let streamed: String = of_kind(&events, "file_delta")
        .iter()
        .map(|e| e.payload["content"].as_str().unwrap_or(""))
        .collect();
    assert!(GATEWAY_CUT.ends_with(&streamed), "{streamed:?}");
    let end = finished(&events);
    assert_eq!(end["status"], "completed", "{end}");
    assert_eq!(end["reason"], "budget_exhausted:turns");
    assert_eq!(end["usage"]["input_tokens"], 1312);
    assert_eq!(end["usage"]["output_tokens"], 27);
}

/// Anthropic's form (`end_turn` + `message_stop` inside an open content
/// block) is an interrupted stream: the run fails naming it, and the turn's
/// input and streamed output still count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_gateway_end_turn_inside_a_block_fails_and_counts_usage() {
    let server = TestServer::start(vec![Reply::sse(fixture(
        "anthropic",
        "gateway_end_turn_after_upstream_failure.sse",
    ))])
    .await;
    let (events, _ws, _dir) = run_engine(
        anthropic(&server.base_url, fast_retry()),
        "claude-sonnet-4-20250514",
    )
    .await;
    let end = finished(&events);
    assert_eq!(end["status"], "failed", "{end}");
    let reason = end["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("error: model: model stream interrupted"),
        "{reason}"
    );
    assert!(reason.contains("content block 0"), "{reason}");
    assert_eq!(end["turns"], 1);
    assert!(
        end["usage"]["input_tokens"].as_u64().unwrap_or(0) > 100,
        "{end}"
    );
    assert!(
        end["usage"]["output_tokens"].as_u64().unwrap_or(0) >= 27,
        "{end}"
    );
    assert_eq!(end["usage"]["estimated"], true);
    assert!(of_kind(&events, "model_finished").is_empty());
    assert!(of_kind(&events, "file_written").is_empty());
}

/// A connection cut after output: the run fails, and the turn's usage
/// (estimated input, estimated streamed output) is in `run_finished`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_turn_counts_input_and_streamed_output() {
    let body = openai_body();
    // Cut after the first dozen events, inside the answer.
    let cut = body.match_indices("data: ").nth(12).expect("events").0;
    let reply = Reply::sse(body.as_bytes()[..cut].to_vec())
        .then(Piece::Sleep(Duration::from_millis(100)))
        .then(Piece::Cut);
    let server = TestServer::start(vec![reply]).await;
    let (events, _ws, _dir) =
        run_engine(openai(&server.base_url, fast_retry()), "gpt-4o-mini").await;
    let end = finished(&events);
    assert_eq!(end["status"], "failed", "{end}");
    assert!(
        end["reason"].as_str().unwrap_or("").contains("interrupted"),
        "{end}"
    );
    assert!(
        end["usage"]["input_tokens"].as_u64().unwrap_or(0) > 100,
        "{end}"
    );
    assert!(
        end["usage"]["output_tokens"].as_u64().unwrap_or(0) > 5,
        "{end}"
    );
    assert_eq!(end["usage"]["estimated"], true);
    assert!(end["cost_usd"].as_f64().unwrap_or(0.0) > 0.0, "{end}");
}

fn check_retries(events: &[RunEvent], n: usize) {
    let retries = of_kind(events, "model_retry");
    assert_eq!(retries.len(), n, "{retries:?}");
    for (i, r) in retries.iter().enumerate() {
        let p = &r.payload;
        assert_eq!(p["turn"], 1);
        assert_eq!(p["attempt"], i as u64 + 1);
        assert_eq!(p["status"], 429);
        assert!(p["delay_ms"].as_u64().is_some(), "{p}");
        assert!(
            p["message"]
                .as_str()
                .unwrap_or("")
                .contains("Rate limit reached"),
            "{p}"
        );
        assert_eq!(p["error"], "rate limited by the model provider");
    }
    // Every retry is between the turn's start and its end.
    let seq = |kind: &str| events.iter().find(|e| e.kind == kind).map(|e| e.seq);
    if let (Some(first), Some(start)) = (retries.first(), seq("turn_started")) {
        assert!(first.seq > start);
    }
}

/// A model that succeeds on the 4th attempt after three 429s: three
/// `model_retry` events, each with its delay, then a completed run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fourth_attempt_succeeds_after_three_visible_retries() {
    let mut replies = vec![Reply::error(429, fixture("openai", "error_429.json")); 3];
    replies.push(Reply::sse(fixture("openai", "gateway_usage.sse")));
    let server = TestServer::start(replies).await;
    let (events, ws, _dir) =
        run_engine(openai(&server.base_url, fast_retry()), "gpt-4o-mini").await;
    check_retries(&events, 3);
    check_gateway_answer(&events, &ws);
    assert_eq!(server.requests().len(), 4);
}

/// An upstream rate limited for a while with `Retry-After` stripped (5 s in
/// the field; 500 ms here with a proportionally short policy): retried
/// until it answers, every retry visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_without_retry_after_is_outlasted() {
    let server = TestServer::start_gated(
        Reply::error(429, fixture("openai", "error_429.json")),
        Duration::from_millis(500),
        vec![Reply::sse(fixture("openai", "gateway_usage.sse"))],
    )
    .await;
    let (events, ws, _dir) = run_engine(
        openai(&server.base_url, windowed_retry(Duration::from_secs(10))),
        "gpt-4o-mini",
    )
    .await;
    let n = server.requests().len();
    assert!(n >= 3, "{n}");
    check_retries(&events, n - 1);
    check_gateway_answer(&events, &ws);
}

/// Retries used up: the run fails with the attempt count and the
/// provider's message in the terminal reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_name_attempts_and_provider_message() {
    let server = TestServer::start(vec![
        Reply::error(429, fixture("openai", "error_429.json"));
        4
    ])
    .await;
    let (events, _ws, _dir) =
        run_engine(openai(&server.base_url, fast_retry()), "gpt-4o-mini").await;
    check_retries(&events, 3);
    let end = finished(&events);
    assert_eq!(end["status"], "failed", "{end}");
    let reason = end["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("error: model: rate limited by the model provider after 4 attempts"),
        "{reason}"
    );
    assert!(
        reason.contains("Rate limit reached for gpt-4o-mini"),
        "{reason}"
    );
    // Rejected attempts never reached the model: no usage.
    assert_eq!(end["usage"]["input_tokens"], 0);
}
