//! Server tuning: limits, timeouts, stream settings, CORS.

use std::time::Duration;

use crate::webhooks::WebhookConfig;

/// Tuning of the HTTP API. `HttpConfig::default()` is a sensible production
/// setting; tests shorten the intervals.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpConfig {
    /// Largest accepted request body (default 256 KiB); larger is `413`.
    pub body_limit: usize,
    /// Non-streaming requests taking longer are answered `408` (default 30 s).
    pub request_timeout: Duration,
    /// A comment line is sent on a quiet SSE stream this often (default 15 s),
    /// so proxies with idle timeouts keep the connection.
    pub heartbeat: Duration,
    /// The `retry:` hint sent at the start of every SSE stream (default 2 s).
    pub retry_hint: Duration,
    /// An SSE stream older than this ends with a `reconnect` event
    /// (default 30 min), so connections are rebalanced and proxies' maximum
    /// connection ages are never hit mid-event.
    pub max_stream_age: Duration,
    /// Longest `wait` of a long-poll and of `cancel?wait=true` (default 60 s).
    pub max_wait: Duration,
    /// Per-key request rate (default 20/s, burst 40); `None` = unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Origins allowed by CORS (default none: the page is same-origin).
    /// `["*"]` allows any origin.
    pub cors_origins: Vec<String>,
    /// Serve the web page at `/` (default true).
    pub serve_page: bool,
    /// Largest file served by `GET /v1/runs/{id}/files/{path}` (default 8 MiB).
    pub max_file_bytes: u64,
    /// How long an `Idempotency-Key` is remembered (default 24 h).
    pub idempotency_ttl: Duration,
    /// Deliver run events of the runs this server admits to a webhook
    /// (default none).
    pub webhook: Option<WebhookConfig>,
    /// Recent SSE frames each watched run's shared tail keeps (default 256,
    /// allocated as they arrive). A client resuming within them, or slowed
    /// down by less than that, is served from memory; one further behind
    /// replays the gap from the store.
    pub sse_hub_ring: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            body_limit: 256 * 1024,
            request_timeout: Duration::from_secs(30),
            heartbeat: Duration::from_secs(15),
            retry_hint: Duration::from_secs(2),
            max_stream_age: Duration::from_secs(30 * 60),
            max_wait: Duration::from_secs(60),
            rate_limit: Some(RateLimit::default()),
            cors_origins: Vec::new(),
            serve_page: true,
            max_file_bytes: 8 * 1024 * 1024,
            idempotency_ttl: Duration::from_secs(24 * 3600),
            webhook: None,
            sse_hub_ring: 256,
        }
    }
}

impl HttpConfig {
    /// Set the body limit.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }
    /// Set the request timeout of non-streaming routes.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
    /// Set the SSE heartbeat interval.
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = d;
        self
    }
    /// Set the SSE `retry:` hint.
    pub fn retry_hint(mut self, d: Duration) -> Self {
        self.retry_hint = d;
        self
    }
    /// Set the maximum SSE stream age.
    pub fn max_stream_age(mut self, d: Duration) -> Self {
        self.max_stream_age = d;
        self
    }
    /// Set the longest long-poll / cancel wait.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }
    /// Set (or with `None` remove) the per-key rate limit.
    pub fn rate_limit(mut self, r: Option<RateLimit>) -> Self {
        self.rate_limit = r;
        self
    }
    /// Set the CORS origins.
    pub fn cors_origins<I: IntoIterator<Item = S>, S: Into<String>>(mut self, origins: I) -> Self {
        self.cors_origins = origins.into_iter().map(Into::into).collect();
        self
    }
    /// Deliver events to a webhook.
    pub fn webhook(mut self, w: WebhookConfig) -> Self {
        self.webhook = Some(w);
        self
    }
    /// Set [`HttpConfig::sse_hub_ring`].
    pub fn sse_hub_ring(mut self, frames: usize) -> Self {
        self.sse_hub_ring = frames;
        self
    }
    /// Serve (or not) the web page at `/`.
    pub fn serve_page(mut self, on: bool) -> Self {
        self.serve_page = on;
        self
    }
}

/// A per-key token bucket: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests per second, sustained (≥ 1).
    pub per_second: u32,
    /// Requests allowed at once (≥ 1).
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_second: 20,
            burst: 40,
        }
    }
}
