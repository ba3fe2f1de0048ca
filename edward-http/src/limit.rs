//! Per-key request rate limit (a `governor` token bucket per key hash).

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::auth::KeyHash;
use crate::config::RateLimit;
use crate::error::{ApiError, ErrorCode};

/// `None` = unlimited. Only valid keys reach it, so its memory is bounded
/// by the number of configured keys.
pub(crate) struct Limiter {
    inner: Option<DefaultKeyedRateLimiter<KeyHash>>,
    clock: DefaultClock,
}

impl Limiter {
    pub(crate) fn new(config: Option<RateLimit>) -> Self {
        let inner = config.map(|r| {
            let per_second = NonZeroU32::new(r.per_second.max(1)).unwrap_or(NonZeroU32::MIN);
            let burst = NonZeroU32::new(r.burst.max(1)).unwrap_or(NonZeroU32::MIN);
            RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst))
        });
        Limiter {
            inner,
            clock: DefaultClock::default(),
        }
    }

    /// `429 rate_limited` with `Retry-After` when the key is over its rate.
    pub(crate) fn check(&self, key: &KeyHash) -> Result<(), ApiError> {
        let Some(limiter) = &self.inner else {
            return Ok(());
        };
        match limiter.check_key(key) {
            Ok(()) => Ok(()),
            Err(not_until) => Err(ApiError {
                retry_after: Some(not_until.wait_time_from(self.clock.now())),
                ..ApiError::new(
                    ErrorCode::RateLimited,
                    "too many requests with this API key; retry after the Retry-After delay",
                )
            }),
        }
    }
}
