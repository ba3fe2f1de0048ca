//! The one retry policy shared by every provider and the web search.
//!
//! A call is retried only **before the first byte of output**: on 408, 409,
//! 429, 5xx, 529, connection errors and connect/first-byte timeouts. Delays
//! grow exponentially with full jitter (`uniform(0, min(max_delay, base ·
//! 2^(attempt-1)))`); a server's `Retry-After` / `retry-after-ms` replaces the
//! jittered delay when it is at most [`RetryPolicy::max_retry_after`] (a
//! longer one ends the retries: waiting minutes inside a turn helps no one).
//! Every sleep is raced against the cancel token.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first (default 4; 1 = no retry).
    pub max_attempts: u32,
    /// Backoff base (default 500 ms).
    pub base_delay: Duration,
    /// Backoff cap (default 20 s).
    pub max_delay: Duration,
    /// The longest server-requested `Retry-After` that is honoured (default 60 s).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The delay before attempt `attempt + 1`, given the attempt (1-based)
    /// that just failed and the server's `Retry-After`. `None` = give up.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        if let Some(after) = retry_after {
            return (after <= self.max_retry_after).then_some(after);
        }
        let exp = attempt.saturating_sub(1).min(30);
        let cap = self
            .base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay);
        let cap_ms = cap.as_millis() as u64;
        let jittered = if cap_ms == 0 {
            0
        } else {
            rand::rng().random_range(0..=cap_ms)
        };
        Some(Duration::from_millis(jittered))
    }
}

/// What the retry loop should do with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Give up: retrying cannot help.
    Fatal,
    /// Retry, after the server's delay if it gave one.
    Retry {
        /// `Retry-After`, if any.
        after: Option<Duration>,
    },
}

/// Run `op(attempt)` until it succeeds, fails fatally, runs out of attempts
/// or `cancel` fires (then `cancelled()` is returned). Cancel is raced
/// against every attempt and every sleep.
pub(crate) async fn with_retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    cancel: &CancellationToken,
    cancelled: impl Fn() -> E,
    classify: impl Fn(&E) -> Verdict,
    mut op: F,
) -> Result<T, E>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut attempt = 1u32;
    loop {
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(cancelled()),
            r = op(attempt) => r,
        };
        let err = match result {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Verdict::Retry { after } = classify(&err) else {
            return Err(err);
        };
        let Some(delay) = policy.delay(attempt, after) else {
            return Err(err);
        };
        tracing::warn!(attempt, delay_ms = delay.as_millis() as u64, error = %err, "retrying");
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(cancelled()),
            _ = tokio::time::sleep(delay) => {}
        }
        attempt += 1;
    }
}

/// Parse `retry-after-ms` (milliseconds, may be fractional) or `Retry-After`
/// (delta seconds, or an HTTP date) from response headers.
pub(crate) fn parse_retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after_value(value, chrono::Utc::now())
}

/// `Retry-After` value: delta seconds or an HTTP date (relative to `now`).
pub(crate) fn parse_retry_after_value(
    value: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = at.with_timezone(&chrono::Utc) - now;
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = chrono::DateTime::parse_from_rfc2822("Sun, 06 Nov 1994 08:49:37 GMT")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            parse_retry_after_value("3", now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after_value("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after_value("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after_value("soon", now), None);
        assert_eq!(parse_retry_after_value("-1", now), None);
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        use reqwest::header::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(parse_retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("retry-after-ms", HeaderValue::from_static("1500.5"));
        assert_eq!(
            parse_retry_after(&h),
            Some(Duration::from_micros(1_500_500))
        );
        let date = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
        let d = parse_retry_after(&h).unwrap();
        assert!(
            d > Duration::from_secs(25) && d <= Duration::from_secs(30),
            "{d:?}"
        );
    }

    #[test]
    fn backoff_is_bounded_and_attempts_are_capped() {
        let p = RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(250),
            max_retry_after: Duration::from_secs(5),
        };
        for attempt in 1..4 {
            for _ in 0..50 {
                let d = p.delay(attempt, None).unwrap();
                let cap = (100u64 << (attempt - 1)).min(250);
                assert!(d <= Duration::from_millis(cap), "{d:?} > {cap}");
            }
        }
        assert_eq!(p.delay(4, None), None);
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(p.delay(1, Some(Duration::from_secs(6))), None);
    }
}
