//! Webhooks: run events POSTed to a URL, signed the Standard Webhooks way.
//!
//! Each delivery is one run event (the same JSON as SSE `data:`), sent with
//! `webhook-id: {run_id}_{seq}` (the seq is the id, so a receiver
//! deduplicates retries and resumes by it), `webhook-timestamp` (Unix
//! seconds) and `webhook-signature: v1,{base64 HMAC-SHA256(secret,
//! "{id}.{timestamp}.{body}")}`. Failures (transport errors, `408`, `429`,
//! `5xx`) are retried with exponential backoff; every attempt leaves a
//! [`DeliveryRecord`]. Targets resolving to loopback, private, link-local
//! or unspecified addresses are refused unless explicitly allowed, and the
//! checked address is the one connected to (no DNS rebinding in between).
//!
//! Events come from the durable event log (the engine's tail), in seq order
//! per run. This process delivers for the runs it admitted; a delivery in
//! flight when the process stops is not resumed by another one.

use std::collections::VecDeque;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Utc};
use edward_core::engine::Engine;
use edward_core::{RunEvent, RunId};
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

/// Delivery records kept in memory (oldest dropped first).
const RECORDS_KEPT: usize = 10_000;

/// Where and how to deliver webhooks.
#[derive(Clone)]
pub struct WebhookConfig {
    url: reqwest::Url,
    secret: Arc<[u8]>,
    /// Deliver every event, not only `run_finished` (default false).
    pub all_events: bool,
    /// Allow loopback/private targets (default false; for tests and
    /// deployments that deliver inside their own network).
    pub allow_private: bool,
    /// Attempts per event before giving up (default 6).
    pub max_attempts: u32,
    /// Delay before the first retry; doubles each time (default 1 s).
    pub base_delay: Duration,
    /// Timeout of one attempt (default 10 s).
    pub timeout: Duration,
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.url.as_str())
            .field("secret", &"<redacted>")
            .field("all_events", &self.all_events)
            .field("allow_private", &self.allow_private)
            .field("max_attempts", &self.max_attempts)
            .field("base_delay", &self.base_delay)
            .finish()
    }
}

/// Why a webhook could not be configured or delivered.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The URL is not an absolute `http(s)` URL.
    #[error("invalid webhook URL: {reason}")]
    InvalidUrl {
        /// Why.
        reason: String,
    },
    /// The secret is not `whsec_<base64>` (or is empty).
    #[error("invalid webhook secret: expected `whsec_<base64>` or a non-empty string")]
    InvalidSecret,
    /// The target resolves to a loopback/private address and those are not allowed.
    #[error("webhook target {host} resolves to the non-public address {addr}")]
    PrivateTarget {
        /// The URL's host.
        host: String,
        /// The address it resolved to.
        addr: IpAddr,
    },
    /// The host name did not resolve.
    #[error("webhook host {host} did not resolve: {message}")]
    Resolve {
        /// The host.
        host: String,
        /// The resolver's message.
        message: String,
    },
    /// The receiver answered with a non-2xx status.
    #[error("webhook receiver answered {status}")]
    Status {
        /// The status.
        status: u16,
    },
    /// The request failed (connect, timeout, …).
    #[error("webhook request failed: {message}")]
    Transport {
        /// What failed.
        message: String,
    },
}

impl WebhookError {
    /// Whether a retry of the same delivery can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            WebhookError::Status { status } => *status == 408 || *status == 429 || *status >= 500,
            WebhookError::Resolve { .. } | WebhookError::Transport { .. } => true,
            _ => false,
        }
    }
}

impl WebhookConfig {
    /// Deliver to `url`, signing with `secret` (`whsec_<base64>` as Standard
    /// Webhooks secrets are written, or any other non-empty string used as
    /// raw key bytes).
    pub fn new(url: &str, secret: &str) -> Result<Self, WebhookError> {
        let url = reqwest::Url::parse(url).map_err(|e| WebhookError::InvalidUrl {
            reason: e.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(WebhookError::InvalidUrl {
                reason: "expected an absolute http(s) URL with a host".to_string(),
            });
        }
        let secret: Vec<u8> = match secret.strip_prefix("whsec_") {
            Some(b64) => B64.decode(b64).map_err(|_| WebhookError::InvalidSecret)?,
            None => secret.as_bytes().to_vec(),
        };
        if secret.is_empty() {
            return Err(WebhookError::InvalidSecret);
        }
        Ok(WebhookConfig {
            url,
            secret: secret.into(),
            all_events: false,
            allow_private: false,
            max_attempts: 6,
            base_delay: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        })
    }

    /// Deliver every event (default: only `run_finished`).
    pub fn all_events(mut self, on: bool) -> Self {
        self.all_events = on;
        self
    }

    /// Allow loopback/private targets.
    pub fn allow_private(mut self, on: bool) -> Self {
        self.allow_private = on;
        self
    }

    /// Attempts per event and the first retry delay.
    pub fn retries(mut self, max_attempts: u32, base_delay: Duration) -> Self {
        self.max_attempts = max_attempts.max(1);
        self.base_delay = base_delay;
        self
    }
}

/// `v1,{base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")}`: the
/// Standard Webhooks signature (receivers compute the same to verify).
pub fn sign(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

/// One delivery attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryRecord {
    /// `{run_id}_{seq}`: the same on every attempt of one event.
    pub webhook_id: String,
    /// The run.
    pub run_id: RunId,
    /// The event's seq.
    pub seq: u64,
    /// The event's type.
    pub event_type: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// When the attempt ended.
    pub at: DateTime<Utc>,
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Whether this attempt delivered the event.
    pub delivered: bool,
}

pub(crate) struct Webhooks {
    config: WebhookConfig,
    client: reqwest::Client,
    engine: Engine,
    records: Mutex<VecDeque<DeliveryRecord>>,
    shutdown: CancellationToken,
}

impl Webhooks {
    pub(crate) fn new(config: WebhookConfig, engine: Engine, shutdown: CancellationToken) -> Self {
        Webhooks {
            client: reqwest::Client::builder()
                .timeout(config.timeout)
                .build()
                .unwrap_or_default(),
            config,
            engine,
            records: Mutex::new(VecDeque::new()),
            shutdown,
        }
    }

    pub(crate) fn records(&self, run_id: Option<RunId>) -> Vec<DeliveryRecord> {
        self.lock()
            .iter()
            .filter(|r| run_id.is_none_or(|id| r.run_id == id))
            .cloned()
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<DeliveryRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follow `run_id`'s events from the log and deliver them.
    pub(crate) fn watch(self: &Arc<Self>, run_id: RunId) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut events = this.engine.raw_events(run_id, 0);
            loop {
                let next = tokio::select! {
                    e = events.next() => e,
                    _ = this.shutdown.cancelled() => None,
                };
                match next {
                    Some(Ok(e)) => {
                        if this.config.all_events || e.is_terminal() {
                            this.deliver(&e).await;
                        }
                    }
                    Some(Err(err)) => {
                        tracing::warn!(%run_id, error = %err, "webhooks: reading events failed");
                        break;
                    }
                    None => break,
                }
            }
        });
    }

    async fn deliver(&self, e: &RunEvent) {
        let id = format!("{}_{}", e.run_id, e.seq);
        for attempt in 1..=self.config.max_attempts {
            let result = self.send(&id, e).await;
            let (status, error, retryable) = match &result {
                Ok(status) => (Some(*status), None, false),
                Err(err) => (
                    match err {
                        WebhookError::Status { status } => Some(*status),
                        _ => None,
                    },
                    Some(err.to_string()),
                    err.is_retryable(),
                ),
            };
            let record = DeliveryRecord {
                webhook_id: id.clone(),
                run_id: e.run_id,
                seq: e.seq,
                event_type: e.kind.clone(),
                attempt,
                at: Utc::now(),
                status,
                error,
                delivered: result.is_ok(),
            };
            {
                let mut records = self.lock();
                if records.len() >= RECORDS_KEPT {
                    records.pop_front();
                }
                records.push_back(record);
            }
            if result.is_ok() || !retryable || attempt == self.config.max_attempts {
                if let Err(err) = result {
                    tracing::warn!(webhook_id = %id, attempt, error = %err, "webhook not delivered");
                }
                return;
            }
            let delay = self
                .config
                .base_delay
                .saturating_mul(1u32 << (attempt - 1).min(16));
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    async fn send(&self, id: &str, e: &RunEvent) -> Result<u16, WebhookError> {
        let client = self.client_for_target().await?;
        let body = serde_json::to_vec(e).map_err(|err| WebhookError::Transport {
            message: err.to_string(),
        })?;
        let timestamp = Utc::now().timestamp();
        let signature = sign(&self.config.secret, id, timestamp, &body);
        let res = client
            .post(self.config.url.clone())
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|err| WebhookError::Transport {
                message: err.without_url().to_string(),
            })?;
        let status = res.status().as_u16();
        if res.status().is_success() {
            Ok(status)
        } else {
            Err(WebhookError::Status { status })
        }
    }

    /// The shared client when private targets are allowed; otherwise one
    /// pinned to the checked public address.
    async fn client_for_target(&self) -> Result<reqwest::Client, WebhookError> {
        if self.config.allow_private {
            return Ok(self.client.clone());
        }
        let url = &self.config.url;
        let host = url.host_str().unwrap_or_default().to_string();
        let port = url.port_or_known_default().unwrap_or(443);
        let host_for_lookup = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host_for_lookup.as_str(), port))
            .await
            .map_err(|err| WebhookError::Resolve {
                host: host.clone(),
                message: err.to_string(),
            })?
            .collect();
        let first = *addrs.first().ok_or_else(|| WebhookError::Resolve {
            host: host.clone(),
            message: "no addresses".to_string(),
        })?;
        if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
            return Err(WebhookError::PrivateTarget {
                host,
                addr: bad.ip(),
            });
        }
        reqwest::Client::builder()
            .timeout(self.config.timeout)
            .resolve(&host_for_lookup, first)
            .build()
            .map_err(|err| WebhookError::Transport {
                message: err.to_string(),
            })
    }
}

/// Whether `ip` is a public unicast address.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s0 = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s0 & 0xfe00) == 0xfc00
                || (s0 & 0xffc0) == 0xfe80)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_public_addresses() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.0.1",
            "169.254.1.1",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // The example from the Standard Webhooks specification.
        let secret = B64.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = sign(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn config_validation() {
        assert!(WebhookConfig::new("ftp://x", "s").is_err());
        assert!(WebhookConfig::new("not a url", "s").is_err());
        assert!(WebhookConfig::new("https://example.com/h", "").is_err());
        assert!(WebhookConfig::new("https://example.com/h", "whsec_!!!").is_err());
        let c = WebhookConfig::new(
            "https://example.com/h",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
        .unwrap();
        assert!(
            !format!("{c:?}").contains("MfKQ"),
            "the secret is never printed"
        );
    }
}
