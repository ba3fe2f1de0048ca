//! Tavily web search against a local server speaking its JSON API.
#![cfg(feature = "tavily")]

mod providers_support;

use std::time::{Duration, Instant};

use edward_core::providers::{RetryPolicy, TavilySearch};
use edward_core::{InfraError, WebSearch};
use providers_support::*;
use tokio_util::sync::CancellationToken;

fn client(base_url: &str) -> TavilySearch {
    TavilySearch::builder()
        .api_key(KEY)
        .base_url(base_url)
        .retry(fast_retry())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn ok_reply() -> Reply {
    Reply::error(200, fixture("tavily", "search.json"))
}

#[tokio::test]
async fn results_are_clamped_and_snippets_capped() {
    let server = TestServer::start(vec![ok_reply(), ok_reply()]).await;
    let search = client(&server.base_url);
    let results = search
        .search("rust sse", 20, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(results.len(), 8);
    assert_eq!(results[0].title, "Result 0");
    assert_eq!(results[0].url, "https://example.com/0");
    assert_eq!(
        results[0].snippet.chars().count(),
        TavilySearch::DEFAULT_SNIPPET_CHARS + 1
    );
    assert!(results[0].snippet.ends_with('…'));
    assert_eq!(results[1].snippet, "snippet 1 snippet 1 snippet 1 ");

    let r = &server.requests()[0];
    assert_eq!(r.uri, "/search");
    assert_eq!(r.body["query"], "rust sse");
    assert_eq!(r.body["max_results"], 8);
    assert_eq!(
        r.headers["authorization"].to_str().unwrap(),
        format!("Bearer {KEY}")
    );

    let one = search
        .search("rust sse", 0, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(server.requests()[1].body["max_results"], 1);
}

#[tokio::test]
async fn rate_limit_then_success_honours_retry_after() {
    let server = TestServer::start(vec![
        Reply::error(429, r#"{"detail":{"error":"rate limited"}}"#).header("retry-after", "1"),
        ok_reply(),
    ])
    .await;
    let results = client(&server.base_url)
        .search("q", 3, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(results.len(), 3);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[1].at - reqs[0].at >= Duration::from_millis(950));
}

#[tokio::test]
async fn unauthorized_is_not_retried_and_hides_the_key() {
    let server = TestServer::start(vec![Reply::error(
        401,
        r#"{"detail":{"error":"Unauthorized"}}"#,
    )])
    .await;
    let err = client(&server.base_url)
        .search("q", 3, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    assert!(!format!("{err} {err:?}").contains(KEY));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn timeout_is_retried_then_reported() {
    let mut slow = ok_reply();
    slow.delay_headers = Some(Duration::from_secs(5));
    let server = TestServer::start(vec![slow.clone(), slow]).await;
    let search = TavilySearch::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .retry(RetryPolicy {
            max_attempts: 2,
            ..fast_retry()
        })
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = search
        .search("q", 3, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            InfraError::Backend {
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(server.requests().len(), 2);
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn cancel_interrupts_the_request() {
    let mut slow = ok_reply();
    slow.delay_headers = Some(Duration::from_secs(5));
    let server = TestServer::start(vec![slow]).await;
    let search = TavilySearch::builder()
        .api_key(KEY)
        .base_url(&server.base_url)
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let task = tokio::spawn(async move { search.search("q", 3, c2).await });
    while server.requests().is_empty() {
        tokio::task::yield_now().await;
    }
    let start = Instant::now();
    cancel.cancel();
    assert_eq!(task.await.unwrap(), Err(InfraError::Cancelled));
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn debug_never_shows_the_key() {
    let s = TavilySearch::builder().api_key(KEY).build().unwrap();
    assert!(!format!("{s:?}").contains(KEY));
    assert!(TavilySearch::builder().build().is_err());
}
