//! Gemini provider against a local server speaking the
//! `streamGenerateContent?alt=sse` wire format (fixtures in
//! tests/fixtures/gemini, with Gemini's CRLF line endings).
#![cfg(feature = "gemini")]

#[macro_use]
mod providers_support;

use std::sync::Arc;

use edward_core::providers::{GeminiClient, RetryPolicy, Timeouts};
use edward_core::{FinishReason, ModelClient, ModelError, Usage};
use providers_support::*;

fn make(base_url: &str, retry: RetryPolicy, timeouts: Timeouts) -> Arc<dyn ModelClient> {
    Arc::new(
        GeminiClient::builder()
            .api_key(KEY)
            .base_url(base_url)
            .retry(retry)
            .timeouts(timeouts)
            .build()
            .unwrap(),
    )
}

const P: ProviderUnderTest = ProviderUnderTest {
    name: "gemini",
    model: "gemini-2.5-flash",
    key_header: "x-goog-api-key",
    usage: (19, 10),
    make,
};

common_provider_tests!(P);

provider_tests! { P;
    tiny_chunks_split_lines_crlf_and_utf8 => tiny_chunks(),
    thought_parts_are_thinking => thinking("**Planning** Let me think."),
    finish_max_tokens => finish_reason("max_tokens.sse", FinishReason::Length, "Hello"),
    safety_finish_is_content_filter_after_the_text =>
        finish_reason("safety.sse", FinishReason::ContentFilter, "Hel"),
    retries_give_up_after_max_attempts => retries_exhausted(503),
    forbidden_is_auth_without_key => unauthorized(403),
    bad_request_carries_provider_message => bad_request("contents is not specified"),
    input_token_count_exceeded => context_too_long(),
    eof_before_finish_reason_is_interrupted => eof_before_end(),
    error_object_mid_stream_is_typed =>
        error_mid_stream(|e| matches!(e, ModelError::Overloaded { status: 503, .. })),
    json_reply_to_a_streaming_request => json_instead_of_sse(""),
    retries_are_reported_to_the_observer => retries_are_reported("Resource has been exhausted"),
}

#[tokio::test]
async fn request_has_wire_fields_and_key_only_in_header() {
    let server = TestServer::start(vec![Reply::sse(fixture("gemini", "text.sse"))]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    assert_eq!(c.error, None);
    let r = &server.requests()[0];
    assert_eq!(
        r.uri,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert!(!r.uri.contains(KEY));
    assert_eq!(r.headers["x-goog-api-key"].to_str().unwrap(), KEY);
    let b = &r.body;
    assert_eq!(
        b["systemInstruction"]["parts"][0]["text"],
        "You are Edward."
    );
    let roles: Vec<&str> = b["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "model", "user"]);
    assert_eq!(b["contents"][0]["parts"][0]["text"], "Write a.txt");
    assert_eq!(b["generationConfig"]["maxOutputTokens"], 256);
}

#[tokio::test]
async fn include_thoughts_is_requested() {
    let server = TestServer::start(vec![Reply::sse(fixture("gemini", "thinking.sse"))]).await;
    let client = GeminiClient::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .include_thoughts(true)
        .build()
        .unwrap();
    let c = run(&client, request(P.model)).await;
    assert_eq!(c.error, None);
    let b = &server.requests()[0].body;
    assert_eq!(
        b["generationConfig"]["thinkingConfig"]["includeThoughts"],
        true
    );
    // Thought tokens count as output.
    assert_eq!(
        c.usage,
        vec![Usage {
            input_tokens: 19,
            output_tokens: 41,
            estimated: false
        }]
    );
}

#[tokio::test]
async fn blocked_prompt_is_content_filtered_error() {
    let server = TestServer::start(vec![Reply::sse(fixture("gemini", "prompt_blocked.sse"))]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    match c.error {
        Some(ModelError::ContentFiltered { ref message }) => {
            assert!(message.contains("PROHIBITED_CONTENT"), "{message}")
        }
        ref other => panic!("{other:?}"),
    }
    assert!(c.text.is_empty());
}

#[tokio::test]
async fn missing_usage_is_estimated() {
    let server = TestServer::start(vec![Reply::sse(fixture("gemini", "no_usage.sse"))]).await;
    let c = run(
        &*make(&server.base_url, fast_retry(), Timeouts::default()),
        request(P.model),
    )
    .await;
    assert_eq!(c.error, None);
    assert_eq!(c.text, "Hello world");
    assert!(c.usage[0].estimated);
    // bytes / 4, rounded up.
    assert_eq!(c.usage[0].output_tokens, 3);
}

#[test]
fn debug_output_never_shows_the_key() {
    let b = GeminiClient::builder().api_key(KEY);
    let client = b.clone().build().unwrap();
    for shown in [format!("{b:?}"), format!("{client:?}")] {
        assert!(!shown.contains(KEY), "{shown}");
    }
}
