//! Anthropic Messages provider against a local server speaking its streaming
//! wire format (fixtures in tests/fixtures/anthropic).
#![cfg(feature = "anthropic")]

#[macro_use]
mod providers_support;

use std::sync::Arc;

use edward_core::providers::{AnthropicClient, RetryPolicy, Timeouts};
use edward_core::{FinishReason, ModelClient, ModelError};
use providers_support::*;

fn make(base_url: &str, retry: RetryPolicy, timeouts: Timeouts) -> Arc<dyn ModelClient> {
    Arc::new(
        AnthropicClient::builder()
            .api_key(KEY)
            .base_url(base_url)
            .retry(retry)
            .timeouts(timeouts)
            .build()
            .unwrap(),
    )
}

const P: ProviderUnderTest = ProviderUnderTest {
    name: "anthropic",
    model: "claude-sonnet-4-20250514",
    key_header: "x-api-key",
    usage: (25, 15),
    make,
};

common_provider_tests!(P);

provider_tests! { P;
    tiny_chunks_split_lines_and_utf8 => tiny_chunks(),
    thinking_deltas => thinking("Let me think. Still thinking."),
    finish_max_tokens => finish_reason("max_tokens.sse", FinishReason::Length, "Hello"),
    finish_refusal => finish_reason("refusal.sse", FinishReason::ContentFilter, "I can"),
    retries_give_up_after_max_attempts => retries_exhausted(529),
    unauthorized_is_auth_without_key => unauthorized(401),
    bad_request_carries_provider_message =>
        bad_request("messages.0.content: Input should be a valid list"),
    prompt_too_long => context_too_long(),
    eof_before_message_stop_is_interrupted => eof_before_end(),
    overloaded_error_event_mid_stream =>
        error_mid_stream(|e| matches!(e, ModelError::Overloaded { status: 529, .. })),
    gateway_usage_input_zero_then_real => gateway_usage(),
    json_reply_to_a_streaming_request => json_instead_of_sse("Short plan."),
    retries_are_reported_to_the_observer => retries_are_reported("per-minute rate limit"),
}

#[tokio::test]
async fn request_has_wire_fields_and_headers() {
    let server = TestServer::start(vec![Reply::sse(fixture("anthropic", "text.sse"))]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    assert_eq!(c.error, None);
    let r = &server.requests()[0];
    assert_eq!(r.uri, "/v1/messages");
    assert_eq!(r.headers["x-api-key"].to_str().unwrap(), KEY);
    assert_eq!(r.headers["anthropic-version"], "2023-06-01");
    assert!(r.headers.get("authorization").is_none());
    let b = &r.body;
    assert_eq!(b["model"], P.model);
    assert_eq!(b["stream"], true);
    assert_eq!(b["max_tokens"], 256);
    assert_eq!(b["system"], "You are Edward.");
    let roles: Vec<&str> = b["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
}

#[tokio::test]
async fn thinking_budget_is_requested() {
    let server = TestServer::start(vec![Reply::sse(fixture("anthropic", "thinking.sse"))]).await;
    let client = AnthropicClient::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .thinking_budget(2048)
        .build()
        .unwrap();
    let c = run(&client, request(P.model)).await;
    assert_eq!(c.error, None);
    let b = &server.requests()[0].body;
    assert_eq!(b["thinking"]["type"], "enabled");
    assert_eq!(b["thinking"]["budget_tokens"], 2048);
    assert!(b.get("temperature").is_none());
}

#[tokio::test]
async fn overloaded_529_is_retried() {
    let server = TestServer::start(vec![
        Reply::error(529, fixture("anthropic", "error_529.json")),
        Reply::sse(fixture("anthropic", "text.sse")),
    ])
    .await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    assert_eq!(c.error, None);
    assert_eq!(c.text, FIXTURE_TEXT);
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn missing_key_is_a_config_error() {
    assert!(AnthropicClient::builder().build().is_err());
}

#[test]
fn debug_output_never_shows_the_key() {
    let b = AnthropicClient::builder().api_key(KEY);
    let client = b.clone().build().unwrap();
    for shown in [format!("{b:?}"), format!("{client:?}")] {
        assert!(!shown.contains(KEY), "{shown}");
    }
}

/// The Anthropic form of a gateway closing a dead upstream's stream:
/// `end_turn` and `message_stop` while the content block is still open.
/// That is an interrupted stream: the text so far, the usage of what was
/// streamed, then `StreamInterrupted` naming the open block.
#[tokio::test]
async fn gateway_end_turn_inside_an_open_block_is_interrupted() {
    let server = TestServer::start(vec![Reply::sse(fixture(
        "anthropic",
        "gateway_end_turn_after_upstream_failure.sse",
    ))])
    .await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    assert_eq!(c.text, GATEWAY_CUT);
    match &c.error {
        Some(ModelError::StreamInterrupted { message }) => {
            assert!(message.contains("content block 0"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(c.finish.is_empty());
    assert_eq!(c.usage.len(), 1);
    // Output: at least the gateway's 27 tokens (the estimate of the
    // streamed text when larger); input: `0` is no count, so estimated.
    assert!(c.usage[0].output_tokens >= 27, "{:?}", c.usage);
    assert!(c.usage[0].input_tokens > 0);
    assert!(c.usage[0].estimated);
}
