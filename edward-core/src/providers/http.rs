//! What all providers share: the secret key type, timeouts, the HTTP call
//! with retry before the first byte, error classification, and the stream
//! driver that turns SSE events into [`ModelChunk`]s.
#![cfg_attr(
    not(all(feature = "openai", feature = "anthropic", feature = "gemini")),
    allow(dead_code)
)]

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::retry::{
    Failed, RetryPolicy, Verdict, parse_retry_after, report_model_attempt, with_retry,
};
use super::sse::{SseDecoder, SseEvent};
use super::tokens;
use crate::{FinishReason, ModelCall, ModelChunk, ModelError, ModelRequest, ModelStream, Usage};

/// An API key. Its `Debug` and `Display` never show the value, and it is
/// sent in a header marked sensitive.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wrap a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key from environment variable `var`, if set and not blank.
    pub fn from_env(var: &str) -> Option<Self> {
        std::env::var(var)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .map(ApiKey)
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Replace every occurrence of the key in `text` (providers sometimes
    /// echo it in error messages).
    pub(crate) fn scrub(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_owned();
        }
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Timeouts of one model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP + TLS connect (default 10 s).
    pub connect: Duration,
    /// From sending the request to the first byte of the response body
    /// (default 120 s; reasoning models can think long before answering).
    pub first_byte: Duration,
    /// Longest silence between two body chunks once streaming (default 90 s).
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(90),
        }
    }
}

/// Errors building a provider client from code or the environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderConfigError {
    /// A required environment variable is not set.
    #[error("environment variable {var} is not set")]
    MissingEnv {
        /// Its name.
        var: String,
    },
    /// `EDWARD_MODEL` is not `provider:model` or `scripted`.
    #[error(
        "invalid model spec `{spec}` (expected `openai:<model>`, `anthropic:<model>`, `gemini:<model>` or `scripted`)"
    )]
    InvalidModelSpec {
        /// The value.
        spec: String,
    },
    /// The provider is unknown or its cargo feature is off.
    #[error("provider `{provider}` is unknown or not compiled in (enable its cargo feature)")]
    UnsupportedProvider {
        /// The name.
        provider: String,
    },
    /// An extra header has an invalid name or value.
    #[error("invalid header `{name}`")]
    InvalidHeader {
        /// The header name (never the value).
        name: String,
    },
    /// The base URL does not parse.
    #[error("invalid base url `{url}`")]
    InvalidBaseUrl {
        /// The URL.
        url: String,
    },
    /// The HTTP client could not be built.
    #[error("http client: {message}")]
    Client {
        /// Why.
        message: String,
    },
}

/// Settings every provider builder has.
#[derive(Clone)]
pub(crate) struct CommonOptions {
    pub api_key: Option<ApiKey>,
    pub base_url: String,
    pub timeouts: Timeouts,
    pub retry: RetryPolicy,
    pub extra_headers: Vec<(String, String)>,
}

impl fmt::Debug for CommonOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommonOptions")
            .field("api_key", &self.api_key)
            .field("base_url", &self.base_url)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            // Extra headers can carry gateway secrets: names only.
            .field(
                "extra_headers",
                &self
                    .extra_headers
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl CommonOptions {
    pub(crate) fn new(base_url: &str) -> Self {
        CommonOptions {
            api_key: None,
            base_url: base_url.to_owned(),
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            extra_headers: Vec::new(),
        }
    }

    /// Take the key from environment variable `key_var` (an error when unset
    /// or blank) and the base URL from `base_var` when that is set.
    pub(crate) fn read_env(
        &mut self,
        key_var: &str,
        base_var: &str,
    ) -> Result<(), ProviderConfigError> {
        let key = ApiKey::from_env(key_var).ok_or_else(|| ProviderConfigError::MissingEnv {
            var: key_var.into(),
        })?;
        self.api_key = Some(key);
        if let Some(base) = base_url_from_env(base_var) {
            self.base_url = base;
        }
        Ok(())
    }
}

/// The trimmed value of environment variable `var`, if set and not blank.
pub(crate) fn base_url_from_env(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Builder methods shared by every provider builder (expects a field `common: CommonOptions`).
#[allow(unused_macros)]
macro_rules! common_builder_methods {
    () => {
        /// The API key.
        pub fn api_key(mut self, key: impl Into<String>) -> Self {
            self.common.api_key = Some($crate::providers::ApiKey::new(key));
            self
        }

        /// The base URL (scheme, host and path prefix).
        pub fn base_url(mut self, url: impl Into<String>) -> Self {
            self.common.base_url = url.into();
            self
        }

        /// All timeouts.
        pub fn timeouts(mut self, timeouts: $crate::providers::Timeouts) -> Self {
            self.common.timeouts = timeouts;
            self
        }

        /// The connect timeout.
        pub fn connect_timeout(mut self, t: std::time::Duration) -> Self {
            self.common.timeouts.connect = t;
            self
        }

        /// The first-byte timeout.
        pub fn first_byte_timeout(mut self, t: std::time::Duration) -> Self {
            self.common.timeouts.first_byte = t;
            self
        }

        /// The idle timeout between chunks.
        pub fn idle_timeout(mut self, t: std::time::Duration) -> Self {
            self.common.timeouts.idle = t;
            self
        }

        /// The retry policy.
        pub fn retry(mut self, policy: $crate::providers::RetryPolicy) -> Self {
            self.common.retry = policy;
            self
        }

        /// An extra header sent with every request (its value is treated as
        /// sensitive and never logged).
        pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
            self.common.extra_headers.push((name.into(), value.into()));
            self
        }
    };
}
#[allow(unused_imports)]
pub(crate) use common_builder_methods;

/// The `ModelClient` methods every HTTP provider implements the same way
/// (expects a field `core: HttpCore`): the shared token estimate and context
/// windows, and retries done inside `stream` when the policy allows any.
#[allow(unused_macros)]
macro_rules! common_client_methods {
    () => {
        fn estimate_input_tokens(&self, request: &ModelRequest) -> u64 {
            super::tokens::estimate_request_tokens(request)
        }

        fn context_window(&self, model: &str) -> Option<u64> {
            super::tokens::context_window(model)
        }

        fn retries_internally(&self) -> bool {
            self.core.retry.max_attempts > 1
        }
    };
}
#[allow(unused_imports)]
pub(crate) use common_client_methods;

/// The shared HTTP machinery of one provider client.
#[derive(Clone)]
pub(crate) struct HttpCore {
    pub provider: &'static str,
    pub client: reqwest::Client,
    pub base_url: String,
    pub key: Option<ApiKey>,
    pub timeouts: Timeouts,
    pub retry: RetryPolicy,
    pub headers: HeaderMap,
}

impl fmt::Debug for HttpCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpCore")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("key", &self.key)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// How to read a provider's error body.
pub(crate) struct ProviderError {
    /// `error.message` or the raw body.
    pub message: String,
    /// `error.type`, `error.code` or `error.status`, lowercased.
    pub kinds: Vec<String>,
}

impl HttpCore {
    pub(crate) fn new(
        provider: &'static str,
        common: CommonOptions,
        auth: Option<(&str, String)>,
    ) -> Result<Self, ProviderConfigError> {
        let base_url = common.base_url.trim_end_matches('/').to_owned();
        reqwest::Url::parse(&base_url).map_err(|_| ProviderConfigError::InvalidBaseUrl {
            url: base_url.clone(),
        })?;
        let mut headers = HeaderMap::new();
        let mut all: Vec<(String, String)> = Vec::new();
        if let Some((name, value)) = auth {
            all.push((name.to_owned(), value));
        }
        all.extend(common.extra_headers.iter().cloned());
        for (name, value) in all {
            let invalid = || ProviderConfigError::InvalidHeader { name: name.clone() };
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
            let mut v = HeaderValue::from_str(&value).map_err(|_| invalid())?;
            v.set_sensitive(true);
            headers.insert(n, v);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(common.timeouts.connect)
            .build()
            .map_err(|e| ProviderConfigError::Client {
                message: e.without_url().to_string(),
            })?;
        Ok(HttpCore {
            provider,
            client,
            base_url,
            key: common.api_key,
            timeouts: common.timeouts,
            retry: common.retry,
            headers,
        })
    }

    fn scrub(&self, text: &str) -> String {
        let text = truncate(text, 2048);
        match &self.key {
            Some(k) => k.scrub(&text),
            None => text,
        }
    }

    /// The body of every provider's `ModelClient::stream_call`: open `url`
    /// with `body` (retrying per the policy, bounded by `call.deadline`,
    /// reporting every failed attempt to `call.observer`) inside a
    /// `model_call` span, then decode the response with `parser`: an event
    /// stream as it arrives, or a complete `application/json` reply (a
    /// server that ignored `stream: true`) as one answer.
    pub(crate) async fn stream<P: WireParser>(
        &self,
        url: &str,
        body: &serde_json::Value,
        parser: P,
        request: ModelRequest,
        cancel: CancellationToken,
        call: ModelCall,
    ) -> Result<ModelStream, ModelError> {
        let span =
            tracing::info_span!("model_call", provider = self.provider, model = %request.model);
        let opened = self
            .open(url, body, &request.model, &cancel, &call)
            .instrument(span.clone())
            .await?;
        let mut parser = parser;
        let mut acc = StreamAcc::default();
        let mut pending_err = None;
        let kind = sniff(opened.kind, &opened.first);
        let (first, rest) = match kind {
            BodyKind::EventStream => (opened.first, opened.rest),
            BodyKind::Json => {
                let text = self
                    .read_rest(opened.first, opened.rest, &cancel)
                    .instrument(span.clone())
                    .await?;
                let parsed = serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|_| self.unexpected_body(&opened.content_type, &text))
                    .and_then(|v| parser.on_complete(self, &v, &mut acc));
                match parsed {
                    Ok(()) if acc.finish.is_some() || !acc.output_text.is_empty() => {
                        acc.done = true
                    }
                    Ok(()) => pending_err = Some(self.unexpected_body(&opened.content_type, &text)),
                    Err(e) => pending_err = Some(e),
                }
                (Bytes::new(), futures::stream::empty().boxed())
            }
            BodyKind::Other => {
                let text = self
                    .read_rest(opened.first, opened.rest, &cancel)
                    .instrument(span.clone())
                    .await?;
                return Err(self.unexpected_body(&opened.content_type, &text));
            }
        };
        let mut driver = Driver {
            core: self.clone(),
            parser,
            acc,
            decoder: SseDecoder::new(),
            first: Some(first),
            body: rest,
            cancel,
            request,
            pending_err,
            final_err: None,
            finished: false,
            span,
        };
        if driver.pending_err.is_some() {
            // Nothing usable came back: fail the call itself.
            return Err(driver.pending_err.take().unwrap_or(ModelError::Cancelled));
        }
        Ok(futures::stream::unfold(driver, |mut d| async move {
            let span = d.span.clone();
            let item = d.next_item().instrument(span).await?;
            Some((item, d))
        })
        .boxed())
    }

    /// Read the rest of a body that is not an event stream (capped at 16 MiB,
    /// idle timeout and cancel raced against every read).
    async fn read_rest(
        &self,
        first: Bytes,
        mut rest: BoxStream<'static, reqwest::Result<Bytes>>,
        cancel: &CancellationToken,
    ) -> Result<String, ModelError> {
        const CAP: usize = 16 << 20;
        let mut buf = first.to_vec();
        loop {
            let read = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                r = tokio::time::timeout(self.timeouts.idle, rest.next()) => r,
            };
            match read {
                Err(_) => {
                    return Err(ModelError::Timeout {
                        phase: "idle",
                        after: self.timeouts.idle,
                    });
                }
                Ok(None) => break,
                Ok(Some(Ok(b))) => {
                    buf.extend_from_slice(&b);
                    if buf.len() > CAP {
                        return Err(ModelError::Transport {
                            message: format!(
                                "{} reply is larger than {} MiB",
                                self.provider,
                                CAP >> 20
                            ),
                        });
                    }
                }
                Ok(Some(Err(e))) => return Err(self.map_reqwest(e)),
            }
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// A 2xx reply that is neither an event stream nor a usable JSON answer.
    fn unexpected_body(&self, content_type: &str, text: &str) -> ModelError {
        let ct = if content_type.is_empty() {
            "no content type"
        } else {
            content_type
        };
        ModelError::Transport {
            message: format!(
                "{} answered a streaming request with {ct}, which is neither an event stream \
                 nor a complete {} reply: {}",
                self.provider,
                self.provider,
                self.scrub(&truncate(text.trim(), 200))
            ),
        }
    }

    /// POST `body` to `url` and wait for the first body byte, retrying
    /// before it per the policy.
    pub(crate) async fn open(
        &self,
        url: &str,
        body: &serde_json::Value,
        model: &str,
        cancel: &CancellationToken,
        call: &ModelCall,
    ) -> Result<Opened, ModelError> {
        with_retry(
            &self.retry,
            cancel,
            call.deadline,
            || ModelError::Cancelled,
            |e: &ModelError| match e {
                ModelError::RateLimited { retry_after } => Verdict::Retry {
                    after: *retry_after,
                    rate_limited: true,
                },
                ModelError::Overloaded {
                    retry_after,
                    status,
                } => Verdict::Retry {
                    after: *retry_after,
                    rate_limited: *status == 529,
                },
                ModelError::Transport { .. } | ModelError::Timeout { .. } => Verdict::Retry {
                    after: None,
                    rate_limited: false,
                },
                _ => Verdict::Fatal,
            },
            |attempt, failed, delay| report_model_attempt(call, attempt, failed, delay),
            |attempt| self.attempt(url, body, model, attempt),
        )
        .await
    }

    async fn attempt(
        &self,
        url: &str,
        body: &serde_json::Value,
        model: &str,
        attempt: u32,
    ) -> Result<Opened, Failed<ModelError>> {
        tracing::debug!(provider = self.provider, attempt, "model request");
        let first_byte = self.timeouts.first_byte;
        let fut = async {
            let response = self
                .client
                .post(url)
                .headers(self.headers.clone())
                .json(body)
                .send()
                .await
                .map_err(|e| Failed::from(self.map_reqwest(e)))?;
            let status = response.status();
            if !status.is_success() {
                let retry_after = parse_retry_after(response.headers());
                let text = read_capped(response, 64 * 1024).await;
                let err = parse_error_body(&text);
                let message = Some(self.scrub(&err.message)).filter(|m| !m.is_empty());
                return Err(Failed {
                    error: self.classify(status.as_u16(), retry_after, err, model),
                    status: Some(status.as_u16()),
                    message,
                });
            }
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase();
            let kind = body_kind(&content_type);
            let mut stream = response.bytes_stream().boxed();
            let first = match stream.next().await {
                None => Bytes::new(),
                Some(Ok(b)) => b,
                Some(Err(e)) => return Err(Failed::from(self.map_reqwest(e))),
            };
            Ok(Opened {
                first,
                rest: stream,
                kind,
                content_type,
            })
        };
        match tokio::time::timeout(first_byte, fut).await {
            Ok(r) => r,
            Err(_) => Err(Failed::from(ModelError::Timeout {
                phase: "first_byte",
                after: first_byte,
            })),
        }
    }

    pub(crate) fn map_reqwest(&self, e: reqwest::Error) -> ModelError {
        if e.is_connect() && e.is_timeout() {
            return ModelError::Timeout {
                phase: "connect",
                after: self.timeouts.connect,
            };
        }
        ModelError::Transport {
            message: self.scrub(&error_chain(&e.without_url())),
        }
    }

    /// An HTTP error status with the provider's error body.
    pub(crate) fn classify(
        &self,
        status: u16,
        retry_after: Option<Duration>,
        err: ProviderError,
        model: &str,
    ) -> ModelError {
        let message = self.scrub(&err.message);
        match status {
            401 | 403 => ModelError::Auth { status },
            429 => ModelError::RateLimited { retry_after },
            408 | 409 | 500..=599 => ModelError::Overloaded {
                status,
                retry_after,
            },
            _ if is_context_too_long(&message, &err.kinds) => {
                ModelError::ContextTooLong { message }
            }
            404 if err.kinds.iter().any(|k| k.contains("model_not_found"))
                || message.to_ascii_lowercase().contains("model") =>
            {
                ModelError::UnknownModel {
                    model: model.to_owned(),
                }
            }
            _ => ModelError::BadRequest { message },
        }
    }

    /// An error object inside the stream (no HTTP status): typed by its kind.
    pub(crate) fn classify_in_stream(&self, err: ProviderError) -> ModelError {
        let message = self.scrub(&err.message);
        if is_context_too_long(&message, &err.kinds) {
            return ModelError::ContextTooLong { message };
        }
        for kind in &err.kinds {
            let e = match kind.as_str() {
                "overloaded_error" | "overloaded" => Some(ModelError::Overloaded {
                    status: 529,
                    retry_after: None,
                }),
                "api_error" | "server_error" | "internal_error" | "internal" | "500" => {
                    Some(ModelError::Overloaded {
                        status: 500,
                        retry_after: None,
                    })
                }
                "unavailable" | "503" => Some(ModelError::Overloaded {
                    status: 503,
                    retry_after: None,
                }),
                "rate_limit_error" | "rate_limit_exceeded" | "resource_exhausted" | "429" => {
                    Some(ModelError::RateLimited { retry_after: None })
                }
                "authentication_error" | "unauthenticated" | "invalid_api_key" | "401" => {
                    Some(ModelError::Auth { status: 401 })
                }
                "permission_error" | "permission_denied" | "403" => {
                    Some(ModelError::Auth { status: 403 })
                }
                "invalid_request_error" | "invalid_argument" | "bad_request" | "400" => {
                    Some(ModelError::BadRequest {
                        message: message.clone(),
                    })
                }
                _ => None,
            };
            if let Some(e) = e {
                return e;
            }
        }
        ModelError::StreamInterrupted { message }
    }

    pub(crate) fn malformed(&self, what: &str, data: &str) -> ModelError {
        ModelError::Transport {
            message: format!(
                "malformed {} {what}: {}",
                self.provider,
                self.scrub(&truncate(data, 200))
            ),
        }
    }
}

/// What kind of body a 2xx reply carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// `text/event-stream`, or no content type (many local servers send none).
    EventStream,
    /// `application/json` (or `+json`): a complete, non-streaming answer.
    Json,
    /// Anything else (an HTML error page from a proxy, plain text …).
    Other,
}

fn body_kind(content_type: &str) -> BodyKind {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if mime.is_empty() || mime == "text/event-stream" {
        BodyKind::EventStream
    } else if mime == "application/json" || mime.ends_with("+json") {
        BodyKind::Json
    } else {
        BodyKind::Other
    }
}

/// Correct the declared kind by the first bytes: SSE sent as `text/plain`
/// or JSON sent with another type is still read for what it is.
fn sniff(kind: BodyKind, first: &[u8]) -> BodyKind {
    let head = String::from_utf8_lossy(&first[..first.len().min(64)]);
    let head = head.trim_start_matches('\u{feff}').trim_start();
    if head.starts_with("data:") || head.starts_with("event:") || head.starts_with(':') {
        BodyKind::EventStream
    } else if kind == BodyKind::Other && (head.starts_with('{') || head.starts_with('[')) {
        BodyKind::Json
    } else {
        kind
    }
}

/// An opened reply: its first body bytes and the rest.
pub(crate) struct Opened {
    first: Bytes,
    rest: BoxStream<'static, reqwest::Result<Bytes>>,
    kind: BodyKind,
    content_type: String,
}

/// Read at most `cap` bytes of an error body (best effort).
async fn read_capped(response: reqwest::Response, cap: usize) -> String {
    let mut stream = response.bytes_stream();
    let mut buf = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= cap {
            break;
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Pull `message` and the kind fields out of the error shapes of OpenAI
/// (`{"error":{"message","type","code"}}`), Anthropic
/// (`{"type":"error","error":{"type","message"}}`) and Gemini
/// (`{"error":{"code","message","status"}}`, sometimes inside an array).
pub(crate) fn parse_error_body(text: &str) -> ProviderError {
    let fallback = || ProviderError {
        message: text.trim().to_owned(),
        kinds: Vec::new(),
    };
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(text) else {
        return fallback();
    };
    if let Some(first) = v.as_array().and_then(|a| a.first()) {
        v = first.clone();
    }
    match v.get("error") {
        Some(serde_json::Value::Object(_)) => provider_error_from_object(&v["error"]),
        Some(serde_json::Value::String(s)) => ProviderError {
            message: s.clone(),
            kinds: Vec::new(),
        },
        _ => fallback(),
    }
}

/// `message` and the kinds of one error object.
pub(crate) fn provider_error_from_object(e: &serde_json::Value) -> ProviderError {
    let message = e
        .get("message")
        .and_then(|m| m.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| e.to_string());
    let kinds = ["type", "code", "status"]
        .iter()
        .filter_map(|k| e.get(*k))
        .filter_map(|v| match v {
            serde_json::Value::String(s) => Some(s.to_ascii_lowercase()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect();
    ProviderError { message, kinds }
}

/// Whether an error is the provider saying the prompt does not fit.
pub(crate) fn is_context_too_long(message: &str, kinds: &[String]) -> bool {
    if kinds
        .iter()
        .any(|k| k == "context_length_exceeded" || k == "exceed_context_size_error")
    {
        return true;
    }
    let m = message.to_ascii_lowercase();
    [
        "maximum context length",
        "context_length_exceeded",
        "prompt is too long",
        "exceeds the maximum number of tokens",
        "input token count",
        "context window",
        "context size",
        "too many tokens",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

// ---------------------------------------------------------------- stream driver

/// State a wire parser fills in while events arrive.
#[derive(Debug, Default)]
pub(crate) struct StreamAcc {
    out: VecDeque<ModelChunk>,
    output_text: String,
    /// Input tokens the provider reported (see [`StreamAcc::report_input`]).
    pub input_tokens: Option<u64>,
    /// Output tokens the provider reported (see [`StreamAcc::report_output`]).
    pub output_tokens: Option<u64>,
    /// The finish reason, once seen.
    pub finish: Option<FinishReason>,
    /// The provider's end marker was seen: stop reading.
    pub done: bool,
}

impl StreamAcc {
    pub(crate) fn text(&mut self, s: &str) {
        if !s.is_empty() {
            self.output_text.push_str(s);
            self.out.push_back(ModelChunk::Text(s.to_owned()));
        }
    }

    /// A reported input count. Counters are cumulative and gateways report
    /// `0` early and the real count later, so the largest wins and `0` is
    /// never taken as a real count (no request has zero input tokens).
    pub(crate) fn report_input(&mut self, n: Option<u64>) {
        if let Some(n) = n.filter(|n| *n > 0) {
            self.input_tokens = Some(self.input_tokens.unwrap_or(0).max(n));
        }
    }

    /// A reported (cumulative) output count: the largest wins.
    pub(crate) fn report_output(&mut self, n: Option<u64>) {
        if let Some(n) = n {
            self.output_tokens = Some(self.output_tokens.unwrap_or(0).max(n));
        }
    }

    pub(crate) fn thinking(&mut self, s: &str) {
        if !s.is_empty() {
            self.output_text.push_str(s);
            self.out.push_back(ModelChunk::Thinking(s.to_owned()));
        }
    }
}

/// A provider's interpretation of its SSE events.
pub(crate) trait WireParser: Send + 'static {
    /// Handle one event; an error ends the stream with it.
    fn on_event(
        &mut self,
        core: &HttpCore,
        event: &SseEvent,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError>;

    /// Handle a complete non-streaming JSON reply (the server ignored
    /// `stream: true`): fill `acc` as the whole stream would have.
    fn on_complete(
        &mut self,
        core: &HttpCore,
        reply: &serde_json::Value,
        acc: &mut StreamAcc,
    ) -> Result<(), ModelError>;
}

struct Driver<P> {
    core: HttpCore,
    parser: P,
    acc: StreamAcc,
    decoder: SseDecoder,
    first: Option<Bytes>,
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    cancel: CancellationToken,
    request: ModelRequest,
    pending_err: Option<ModelError>,
    /// The error to yield after the partial usage.
    final_err: Option<ModelError>,
    finished: bool,
    span: tracing::Span,
}

/// Turns an opened event stream into [`ModelChunk`]s: text and thinking as
/// they arrive, then exactly one `Usage` (the provider's, or an estimate
/// marked `estimated`) and one `Finish`. Cancel and the idle timeout are
/// raced against every read. A stream that fails after output started
/// yields one `Usage` for what was streamed (see [`Driver::partial_usage`])
/// before its error.
impl<P: WireParser> Driver<P> {
    async fn next_item(&mut self) -> Option<Result<ModelChunk, ModelError>> {
        loop {
            if let Some(c) = self.acc.out.pop_front() {
                return Some(Ok(c));
            }
            if self.finished {
                return self.final_err.take().map(Err);
            }
            if let Some(e) = self.pending_err.take() {
                tracing::warn!(error = %e, "model stream failed");
                self.finished = true;
                if matches!(e, ModelError::Cancelled) {
                    return Some(Err(e));
                }
                // What was streamed counts: usage first, then the error.
                let usage = self.partial_usage();
                self.acc.out.push_back(ModelChunk::Usage(usage));
                self.final_err = Some(e);
                continue;
            }
            if self.acc.done {
                self.finalize();
                continue;
            }
            let bytes = match self.first.take() {
                Some(b) => b,
                None => {
                    let idle = self.core.timeouts.idle;
                    let read = tokio::select! {
                        biased;
                        _ = self.cancel.cancelled() => {
                            self.finished = true;
                            return Some(Err(ModelError::Cancelled));
                        }
                        r = tokio::time::timeout(idle, self.body.next()) => r,
                    };
                    match read {
                        Err(_) => {
                            self.pending_err = Some(ModelError::Timeout {
                                phase: "idle",
                                after: idle,
                            });
                            continue;
                        }
                        Ok(Some(Ok(b))) => b,
                        Ok(Some(Err(e))) => {
                            let message = match self.core.map_reqwest(e) {
                                ModelError::Transport { message } => message,
                                other => other.to_string(),
                            };
                            self.pending_err = Some(ModelError::StreamInterrupted { message });
                            continue;
                        }
                        Ok(None) => {
                            self.on_eof();
                            continue;
                        }
                    }
                }
            };
            match self.decoder.feed(&bytes) {
                Ok(events) => {
                    for ev in events {
                        self.handle(&ev);
                        if self.pending_err.is_some() || self.acc.done {
                            break;
                        }
                    }
                }
                Err(e) => {
                    self.pending_err = Some(ModelError::Transport {
                        message: e.to_string(),
                    })
                }
            }
        }
    }

    fn handle(&mut self, ev: &SseEvent) {
        if let Err(e) = self.parser.on_event(&self.core, ev, &mut self.acc) {
            self.pending_err = Some(e);
        }
    }

    fn on_eof(&mut self) {
        if let Some(ev) = self.decoder.finish() {
            self.handle(&ev);
        }
        if self.pending_err.is_some() || self.acc.done {
            return;
        }
        if self.acc.finish.is_some() {
            self.acc.done = true;
        } else {
            self.pending_err = Some(ModelError::StreamInterrupted {
                message: format!(
                    "{} stream ended before the end of the message",
                    self.core.provider
                ),
            });
        }
    }

    /// Usage of a stream that ended normally: the provider's counts, each
    /// one estimated when it sent none (`estimated: true` then).
    fn final_usage(&self) -> Usage {
        let model = &self.request.model;
        let estimated = self.acc.input_tokens.is_none() || self.acc.output_tokens.is_none();
        Usage {
            input_tokens: self
                .acc
                .input_tokens
                .unwrap_or_else(|| tokens::estimate_request_tokens(&self.request)),
            output_tokens: self
                .acc
                .output_tokens
                .unwrap_or_else(|| tokens::estimate_text_tokens(model, &self.acc.output_text)),
            estimated,
        }
    }

    /// Usage of a stream that broke: the request's input (reported or
    /// estimated) and the output streamed so far — the provider's count
    /// when it is at least the estimate of the streamed text (counters seen
    /// mid-stream lag behind), else that estimate.
    fn partial_usage(&self) -> Usage {
        let streamed = tokens::estimate_text_tokens(&self.request.model, &self.acc.output_text);
        let mut usage = self.final_usage();
        match self.acc.output_tokens {
            Some(n) if n >= streamed => {}
            _ => {
                usage.output_tokens = streamed;
                usage.estimated = true;
            }
        }
        usage
    }

    fn finalize(&mut self) {
        let usage = self.final_usage();
        let finish = self
            .acc
            .finish
            .take()
            .unwrap_or_else(|| FinishReason::Other("unspecified".into()));
        tracing::debug!(
            input_tokens = usage.input_tokens,
            output_tokens = usage.output_tokens,
            estimated = usage.estimated,
            finish = ?finish,
            "model stream finished"
        );
        self.acc.out.push_back(ModelChunk::Usage(usage));
        self.acc.out.push_back(ModelChunk::Finish(finish));
        self.finished = true;
    }
}
