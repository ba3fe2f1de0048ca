//! OpenAI-compatible provider against a local server speaking the Chat
//! Completions streaming wire format (fixtures in tests/fixtures/openai).
#![cfg(feature = "openai")]

#[macro_use]
mod providers_support;

use std::sync::Arc;

use edward_core::providers::openai::MaxTokensField;
use edward_core::providers::{OpenAiClient, RetryPolicy, Timeouts};
use edward_core::{FinishReason, ModelClient, ModelError, Usage};
use providers_support::*;

fn make(base_url: &str, retry: RetryPolicy, timeouts: Timeouts) -> Arc<dyn ModelClient> {
    Arc::new(
        OpenAiClient::builder()
            .api_key(KEY)
            .base_url(base_url)
            .retry(retry)
            .timeouts(timeouts)
            .header("x-gateway-tag", "edward-tests")
            .build()
            .unwrap(),
    )
}

const P: ProviderUnderTest = ProviderUnderTest {
    name: "openai",
    model: "gpt-4o-mini",
    key_header: "authorization",
    usage: (19, 10),
    make,
};

common_provider_tests!(P);

provider_tests! { P;
    tiny_chunks_split_lines_and_utf8 => tiny_chunks(),
    thinking_from_reasoning_content_and_reasoning => thinking("Let me think. Still thinking."),
    finish_length => finish_reason("length.sse", FinishReason::Length, "Hello"),
    finish_content_filter =>
        finish_reason("content_filter.sse", FinishReason::ContentFilter, "Hel"),
    retries_give_up_after_max_attempts => retries_exhausted(502),
    unauthorized_is_auth_without_key => unauthorized(401),
    bad_request_carries_provider_message => bad_request("Invalid value for 'temperature'"),
    context_length_exceeded => context_too_long(),
    eof_before_done_is_interrupted => eof_before_end(),
    error_object_mid_stream_is_typed =>
        error_mid_stream(|e| matches!(e, ModelError::Overloaded { status: 500, .. })),
    gateway_usage_chunk_and_rewritten_ids => gateway_usage(),
    json_reply_to_a_streaming_request => json_instead_of_sse(""),
    retries_are_reported_to_the_observer => retries_are_reported("Rate limit reached"),
}

#[tokio::test]
async fn request_has_wire_fields_and_headers() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai", "text.sse"))]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request("gpt-4o-mini"),
    )
    .await;
    assert_eq!(c.error, None);
    let r = &server.requests()[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.uri, "/chat/completions");
    assert_eq!(
        r.headers["authorization"].to_str().unwrap(),
        format!("Bearer {KEY}")
    );
    assert_eq!(r.headers["x-gateway-tag"], "edward-tests");
    assert_eq!(r.headers["content-type"], "application/json");
    let b = &r.body;
    assert_eq!(b["model"], "gpt-4o-mini");
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["max_tokens"], 256);
    assert!((b["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    let roles: Vec<&str> = b["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(b["messages"][0]["content"], "You are Edward.");
}

#[tokio::test]
async fn azure_style_key_header_and_max_completion_tokens() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai", "text.sse"))]).await;
    let client = OpenAiClient::builder()
        .api_key(KEY)
        .api_key_header("api-key")
        .max_tokens_field(MaxTokensField::MaxCompletionTokens)
        .base_url(format!("{}/openai/deployments/x", server.base_url))
        .build()
        .unwrap();
    let c = run(&client, request("gpt-4o")).await;
    assert_eq!(c.error, None);
    let r = &server.requests()[0];
    assert_eq!(r.uri, "/openai/deployments/x/chat/completions");
    assert_eq!(r.headers["api-key"].to_str().unwrap(), KEY);
    assert!(r.headers.get("authorization").is_none());
    assert_eq!(r.body["max_completion_tokens"], 256);
    assert!(r.body.get("max_tokens").is_none());
}

#[tokio::test]
async fn local_server_without_key_sends_no_auth() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai", "text.sse"))]).await;
    let client = OpenAiClient::builder()
        .base_url(&server.base_url)
        .build()
        .unwrap();
    let c = run(&client, request("llama3.1:8b")).await;
    assert_eq!(c.text, FIXTURE_TEXT);
    assert!(server.requests()[0].headers.get("authorization").is_none());
}

#[tokio::test]
async fn comments_ids_and_crlf() {
    let server = TestServer::start(vec![Reply::sse_tiny(&fixture(
        "openai",
        "comments_crlf.sse",
    ))])
    .await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request("m"),
    )
    .await;
    assert_eq!(c.error, None);
    assert_eq!(c.text, "AB");
    assert_eq!(c.finish, vec![FinishReason::Stop]);
}

#[tokio::test]
async fn missing_usage_is_estimated_with_tiktoken() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai", "no_usage.sse"))]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request("gpt-4o-mini"),
    )
    .await;
    assert_eq!(c.error, None);
    assert_eq!(c.text, "Hello world");
    let u: Usage = c.usage[0];
    assert!(u.estimated);
    // o200k: "Hello world" is 2 tokens.
    assert_eq!(u.output_tokens, 2);
    assert_eq!(
        u.input_tokens,
        edward_core::providers::estimate_request_tokens(&request("gpt-4o-mini"))
    );
}

#[tokio::test]
async fn unknown_model_404() {
    let body = r#"{"error":{"message":"The model `gpt-9` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
    let server = TestServer::start(vec![Reply::error(404, body)]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request("gpt-9"),
    )
    .await;
    assert_eq!(
        c.error,
        Some(ModelError::UnknownModel {
            model: "gpt-9".into()
        })
    );
}

#[test]
fn debug_output_never_shows_the_key() {
    let b = OpenAiClient::builder()
        .api_key(KEY)
        .header("x-secret-gateway", "gw-secret-value");
    let client = b.clone().build().unwrap();
    for shown in [format!("{b:?}"), format!("{client:?}")] {
        assert!(!shown.contains(KEY), "{shown}");
        assert!(!shown.contains("gw-secret-value"), "{shown}");
    }
}

/// The gateway ended a stream whose upstream died mid-file with `stop`, its
/// own usage and `[DONE]`: nothing on the wire tells, so the provider passes
/// every signal through (the cut text, `Stop`, the server's usage) and the
/// engine sees the open file scope (`tests/providers_engine.rs`).
#[tokio::test]
async fn gateway_stop_after_upstream_failure_passes_every_signal() {
    let server = TestServer::start(vec![Reply::sse(fixture(
        "openai",
        "gateway_stop_after_upstream_failure.sse",
    ))])
    .await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    assert_eq!(c.error, None);
    assert_eq!(c.text, GATEWAY_CUT);
    assert_eq!(c.finish, vec![FinishReason::Stop]);
    assert_eq!(
        c.usage,
        vec![Usage {
            input_tokens: 1312,
            output_tokens: 27,
            estimated: false
        }]
    );
}
