//! Web search through Tavily (`POST {base}/search`).
//!
//! The result count is clamped to 1..=8, snippets are capped at
//! [`TavilySearch::DEFAULT_SNIPPET_CHARS`] characters, each attempt has a
//! timeout, and failures use the shared [`RetryPolicy`] (429/5xx and
//! connection errors are retried, honouring `Retry-After`).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::ApiKey;
use super::http::{ProviderConfigError, parse_error_body, truncate};
use super::retry::{Failed, RetryPolicy, Verdict, parse_retry_after, with_retry};
use crate::{InfraError, SearchResult, WebSearch};

/// The default base URL.
pub const TAVILY_DEFAULT_BASE_URL: &str = "https://api.tavily.com";

/// Builder of [`TavilySearch`].
#[derive(Debug, Clone)]
pub struct TavilyBuilder {
    api_key: Option<ApiKey>,
    base_url: String,
    timeout: Duration,
    retry: RetryPolicy,
    snippet_chars: usize,
}

impl TavilyBuilder {
    /// The API key (`tvly-…`).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    /// The base URL.
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// Timeout of one attempt, connect to last byte (default 20 s).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Cap of each snippet in characters (default 500).
    pub fn snippet_chars(mut self, n: usize) -> Self {
        self.snippet_chars = n;
        self
    }

    /// Build; the key is required.
    pub fn build(self) -> Result<TavilySearch, ProviderConfigError> {
        let key = self
            .api_key
            .ok_or_else(|| ProviderConfigError::MissingEnv {
                var: "TAVILY_API_KEY".into(),
            })?;
        let base_url = self.base_url.trim_end_matches('/').to_owned();
        reqwest::Url::parse(&base_url).map_err(|_| ProviderConfigError::InvalidBaseUrl {
            url: base_url.clone(),
        })?;
        let mut auth =
            HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                ProviderConfigError::InvalidHeader {
                    name: "authorization".into(),
                }
            })?;
        auth.set_sensitive(true);
        let client = reqwest::Client::builder()
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .build()
            .map_err(|e| ProviderConfigError::Client {
                message: e.without_url().to_string(),
            })?;
        Ok(TavilySearch {
            client,
            key,
            auth,
            base_url,
            retry: self.retry,
            snippet_chars: self.snippet_chars,
        })
    }
}

/// [`WebSearch`] backed by Tavily.
#[derive(Clone)]
pub struct TavilySearch {
    client: reqwest::Client,
    key: ApiKey,
    auth: HeaderValue,
    base_url: String,
    retry: RetryPolicy,
    snippet_chars: usize,
}

impl fmt::Debug for TavilySearch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TavilySearch")
            .field("key", &self.key)
            .field("base_url", &self.base_url)
            .field("retry", &self.retry)
            .field("snippet_chars", &self.snippet_chars)
            .finish()
    }
}

/// One failed attempt, with the server's `Retry-After`.
#[derive(Debug)]
struct AttemptError {
    error: InfraError,
    retry_after: Option<Duration>,
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl TavilySearch {
    /// Default snippet cap in characters.
    pub const DEFAULT_SNIPPET_CHARS: usize = 500;

    /// A builder with the default base URL.
    pub fn builder() -> TavilyBuilder {
        TavilyBuilder {
            api_key: None,
            base_url: TAVILY_DEFAULT_BASE_URL.into(),
            timeout: Duration::from_secs(20),
            retry: RetryPolicy::default(),
            snippet_chars: Self::DEFAULT_SNIPPET_CHARS,
        }
    }

    /// From `TAVILY_API_KEY` and optional `TAVILY_BASE_URL`.
    pub fn from_env() -> Result<Self, ProviderConfigError> {
        let key =
            ApiKey::from_env("TAVILY_API_KEY").ok_or_else(|| ProviderConfigError::MissingEnv {
                var: "TAVILY_API_KEY".into(),
            })?;
        let mut b = Self::builder();
        b.api_key = Some(key);
        if let Ok(base) = std::env::var("TAVILY_BASE_URL") {
            if !base.trim().is_empty() {
                b = b.base_url(base.trim());
            }
        }
        b.build()
    }

    async fn attempt(&self, body: &Value) -> Result<Vec<SearchResult>, AttemptError> {
        let transport = |e: reqwest::Error| AttemptError {
            error: InfraError::Backend {
                message: format!("web search transport: {}", e.without_url()),
                retryable: true,
            },
            retry_after: None,
        };
        let response = self
            .client
            .post(format!("{}/search", self.base_url))
            .header(AUTHORIZATION, self.auth.clone())
            .json(body)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let retry_after = parse_retry_after(response.headers());
        let text = response.text().await.map_err(transport)?;
        if !status.is_success() {
            let code = status.as_u16();
            let retryable = matches!(code, 408 | 409 | 429 | 500..=599);
            let message = self
                .key
                .scrub(&truncate(&parse_error_body(&text).message, 500));
            let error = match code {
                401 | 403 => InfraError::Backend {
                    message: format!("web search rejected the credentials ({code})"),
                    retryable: false,
                },
                _ => InfraError::Backend {
                    message: format!("web search failed ({code}): {message}"),
                    retryable,
                },
            };
            return Err(AttemptError { error, retry_after });
        }
        let v: Value = serde_json::from_str(&text).map_err(|_| AttemptError {
            error: InfraError::Backend {
                message: format!("malformed web search response: {}", truncate(&text, 200)),
                retryable: false,
            },
            retry_after: None,
        })?;
        let results = v
            .get("results")
            .and_then(|r| r.as_array())
            .map(|a| a.as_slice())
            .unwrap_or(&[]);
        Ok(results
            .iter()
            .map(|r| SearchResult {
                title: r["title"].as_str().unwrap_or("").to_owned(),
                url: r["url"].as_str().unwrap_or("").to_owned(),
                snippet: cap_chars(r["content"].as_str().unwrap_or(""), self.snippet_chars),
            })
            .collect())
    }
}

fn cap_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[async_trait]
impl WebSearch for TavilySearch {
    async fn search(
        &self,
        query: &str,
        max_results: u8,
        cancel: CancellationToken,
    ) -> Result<Vec<SearchResult>, InfraError> {
        let max_results = max_results.clamp(1, 8);
        let body = json!({
            "query": query,
            "max_results": max_results,
            "search_depth": "basic",
            "include_answer": false,
        });
        let span = tracing::info_span!("web_search", provider = "tavily", max_results);
        let mut results = with_retry(
            &self.retry,
            &cancel,
            None,
            || AttemptError {
                error: InfraError::Cancelled,
                retry_after: None,
            },
            |e: &AttemptError| {
                if e.error.is_retryable() {
                    Verdict::Retry {
                        after: e.retry_after,
                        rate_limited: false,
                    }
                } else {
                    Verdict::Fatal
                }
            },
            |_, _, _| {},
            |_| async { self.attempt(&body).await.map_err(Failed::from) },
        )
        .instrument(span)
        .await
        .map_err(|e| e.error)?;
        results.truncate(max_results as usize);
        Ok(results)
    }
}
