//! The one retry policy shared by every provider and the web search.
//!
//! A call is retried only **before the first byte of output**: on 408, 409,
//! 429, 5xx, 529, connection errors and connect/first-byte timeouts. The
//! policy is a **deadline**, not just a count: rate limits (429, 529) are
//! retried for up to [`RetryPolicy::rate_limit_window`] (60 s by default),
//! other retryable failures for up to [`RetryPolicy::error_window`] (15 s),
//! both counted from the first attempt, within [`RetryPolicy::max_attempts`],
//! and never past the caller's deadline ([`crate::ModelCall::deadline`], the
//! run's deadline budget). Delays grow exponentially with equal jitter
//! (`cap/2 + uniform(0, cap/2)`, `cap = min(max_delay, base · 2^(attempt-1))`,
//! so every wait makes progress); a server's `Retry-After` /
//! `retry-after-ms` replaces the jittered delay when it is at most
//! [`RetryPolicy::max_retry_after`] and fits the window. Every failed attempt
//! is reported to the call's observer; every sleep is raced against the
//! cancel token.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{AttemptFailure, ModelCall, ModelError};

/// How often and how patiently to retry.
///
/// ```
/// use std::time::Duration;
/// use edward_core::providers::RetryPolicy;
/// // Wait up to two minutes for rate limits behind a busy gateway.
/// let p = RetryPolicy { rate_limit_window: Duration::from_secs(120), ..RetryPolicy::default() };
/// assert_eq!(p.max_attempts, 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first (default 10; 1 = no retry).
    pub max_attempts: u32,
    /// Backoff base (default 500 ms).
    pub base_delay: Duration,
    /// Backoff cap of one wait (default 20 s).
    pub max_delay: Duration,
    /// The longest server-requested `Retry-After` that is honoured (default
    /// 60 s); a longer one ends the retries.
    pub max_retry_after: Duration,
    /// How long after the first attempt 429 and 529 are still retried
    /// (default 60 s).
    pub rate_limit_window: Duration,
    /// How long after the first attempt other retryable failures (5xx,
    /// 408, 409, connection errors, timeouts) are still retried (default 15 s).
    pub error_window: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
            max_retry_after: Duration::from_secs(60),
            rate_limit_window: Duration::from_secs(60),
            error_window: Duration::from_secs(15),
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
    /// that just failed and the server's `Retry-After`, ignoring windows.
    /// `None` = give up.
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
        let half = cap_ms / 2;
        let jittered = half + rand::rng().random_range(0..=cap_ms - half);
        Some(Duration::from_millis(jittered))
    }

    /// The retry window of a failure class.
    pub(crate) fn window(&self, rate_limited: bool) -> Duration {
        if rate_limited {
            self.rate_limit_window
        } else {
            self.error_window
        }
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
        /// A rate limit (429/529): the longer window applies.
        rate_limited: bool,
    },
}

/// A failed attempt as the retry loop sees it: the error plus what the
/// provider said, for the observer.
#[derive(Debug)]
pub(crate) struct Failed<E> {
    pub error: E,
    pub status: Option<u16>,
    pub message: Option<String>,
}

impl<E> From<E> for Failed<E> {
    fn from(error: E) -> Self {
        Failed {
            error,
            status: None,
            message: None,
        }
    }
}

/// Run `op(attempt)` until it succeeds, fails fatally, runs out of attempts
/// or of its retry window, or `cancel` fires (then `cancelled()` is
/// returned). Cancel is raced against every attempt and every sleep. Every
/// failed attempt is reported through `report` with the delay before the
/// next one (`None` for the last).
pub(crate) async fn with_retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    cancelled: impl Fn() -> E,
    classify: impl Fn(&E) -> Verdict,
    report: impl Fn(u32, &Failed<E>, Option<Duration>),
    mut op: F,
) -> Result<T, E>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Failed<E>>>,
    E: std::fmt::Display,
{
    let started = Instant::now();
    let mut attempt = 1u32;
    loop {
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(cancelled()),
            r = op(attempt) => r,
        };
        let failed = match result {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let delay = match classify(&failed.error) {
            Verdict::Fatal => None,
            Verdict::Retry {
                after,
                rate_limited,
            } => policy.delay(attempt, after).filter(|d| {
                let resume = Instant::now() + *d;
                resume <= started + policy.window(rate_limited)
                    && deadline.is_none_or(|end| resume < end)
            }),
        };
        report(attempt, &failed, delay);
        let Some(delay) = delay else {
            return Err(failed.error);
        };
        tracing::warn!(attempt, delay_ms = delay.as_millis() as u64, error = %failed.error, "retrying");
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(cancelled()),
            _ = tokio::time::sleep(delay) => {}
        }
        attempt += 1;
    }
}

/// Report one failed model attempt to `call`'s observer.
pub(crate) fn report_model_attempt(
    call: &ModelCall,
    attempt: u32,
    failed: &Failed<ModelError>,
    retry_in: Option<Duration>,
) {
    if matches!(failed.error, ModelError::Cancelled) {
        return;
    }
    call.report(&AttemptFailure {
        attempt,
        status: failed.status,
        message: failed.message.clone(),
        error: failed.error.clone(),
        retry_in,
    });
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
            ..RetryPolicy::default()
        };
        for attempt in 1..4 {
            for _ in 0..50 {
                let d = p.delay(attempt, None).unwrap();
                let cap = (100u64 << (attempt - 1)).min(250);
                assert!(d <= Duration::from_millis(cap), "{d:?} > {cap}");
                assert!(d >= Duration::from_millis(cap / 2), "{d:?} < {cap}/2");
            }
        }
        assert_eq!(p.delay(4, None), None);
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(p.delay(1, Some(Duration::from_secs(6))), None);
    }

    /// The defaults keep retrying a 429 without `Retry-After` well past the
    /// few seconds an upstream typically asks for (the shortest possible
    /// sum of waits within `max_attempts` exceeds 30 s), yet within the window.
    #[test]
    fn defaults_retry_rate_limits_for_tens_of_seconds() {
        let p = RetryPolicy::default();
        let min_total: Duration = (1..p.max_attempts)
            .map(|a| {
                let cap = p.base_delay.saturating_mul(1 << (a - 1)).min(p.max_delay);
                cap / 2
            })
            .sum();
        assert!(min_total >= Duration::from_secs(30), "{min_total:?}");
        assert_eq!(p.rate_limit_window, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn windows_and_deadline_end_the_retries() {
        use std::sync::Mutex;
        let p = RetryPolicy {
            max_attempts: 100,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(100),
            rate_limit_window: Duration::from_secs(1),
            error_window: Duration::from_millis(300),
            ..RetryPolicy::default()
        };
        let cancel = CancellationToken::new();
        for (rate_limited, deadline, most) in [
            (true, None, 22),
            (false, None, 7),
            (true, Some(Duration::from_millis(400)), 9),
        ] {
            let deadline = deadline.map(|d| Instant::now() + d);
            let reports = Mutex::new(Vec::new());
            let r: Result<(), String> = with_retry(
                &p,
                &cancel,
                deadline,
                || "cancelled".to_string(),
                |_| Verdict::Retry {
                    after: None,
                    rate_limited,
                },
                |a, _, d| reports.lock().unwrap().push((a, d)),
                |_| async { Err(Failed::from("busy".to_string())) },
            )
            .await;
            assert_eq!(r, Err("busy".into()));
            let reports = reports.into_inner().unwrap();
            let n = reports.len();
            assert!(n >= 2 && n <= most, "{rate_limited} {deadline:?}: {n}");
            assert!(reports[..n - 1].iter().all(|(_, d)| d.is_some()));
            assert_eq!(reports[n - 1].1, None, "the last report says no retry");
        }
    }
}
