//! [`RedisLock`]: `SET NX PX` leases with an owner token and a fencing token.
//!
//! A lock is the key `lock:{name}` holding the acquisition's random token,
//! with a PX expiry (server time). Renew and release are compare-and-expire
//! / compare-and-delete scripts on the token, so a holder whose lease lapsed
//! can never extend or drop the next holder's. Every acquisition also gets
//! a fence from the prefix's counter (`fence`, shared with the queue):
//! strictly increasing, never below the server clock in microseconds, so it
//! keeps growing even across a Redis that lost its data. Downstream systems
//! compare fences to refuse a holder that paused past its lease.

use std::time::Duration;

use async_trait::async_trait;
use edward_core::{InfraError, Lock, LockGuard};
use rand::Rng;
use redis::Script;
use uuid::Uuid;

use super::{LUA_PRELUDE, RedisBackend, foreign_infra, infra_err};

/// Redis [`Lock`]. Cloning is cheap.
#[derive(Debug, Clone)]
pub struct RedisLock {
    backend: RedisBackend,
    acquire: Script,
    renew: Script,
    release: Script,
}

const ACQUIRE: &str = r"
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return next_fence(KEYS[3])
end
return false
";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisLock {
    pub(crate) fn new(backend: RedisBackend) -> Self {
        RedisLock {
            backend,
            acquire: Script::new(&format!("{LUA_PRELUDE}{ACQUIRE}")),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
        }
    }

    fn lock_key(&self, name: &str) -> String {
        self.backend.key(&format!("lock:{name}"))
    }

    /// Acquire `name`, retrying with exponential backoff (10 ms doubling up
    /// to 500 ms) and full jitter while it is held, for at most `wait`.
    /// `None` if it was still held when `wait` ran out.
    pub async fn acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<LockGuard>, InfraError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut backoff = Duration::from_millis(10);
        loop {
            if let Some(guard) = self.try_acquire(name, owner, ttl).await? {
                return Ok(Some(guard));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let jittered = rand::rng().random_range(Duration::ZERO..=backoff);
            tokio::time::sleep(jittered.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }
}

#[async_trait]
impl Lock for RedisLock {
    async fn try_acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, InfraError> {
        let token = Uuid::new_v4().simple().to_string();
        let mut conn = self.backend.conn();
        let fence: Option<i64> = self
            .acquire
            .key(self.backend.key("epoch"))
            .key(self.lock_key(name))
            .key(self.backend.key("fence"))
            .arg(&token)
            .arg(ttl_ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| infra_err(&self.backend.options.prefix, e))?;
        let Some(fence) = fence else {
            return Ok(None);
        };
        let fence =
            u64::try_from(fence).map_err(|_| foreign_infra(format!("lock fence {fence}")))?;
        Ok(Some(LockGuard {
            name: name.to_owned(),
            owner: owner.to_owned(),
            token,
            fence,
        }))
    }

    async fn renew(&self, guard: &LockGuard, ttl: Duration) -> Result<bool, InfraError> {
        let mut conn = self.backend.conn();
        let done: i64 = self
            .renew
            .key(self.lock_key(&guard.name))
            .arg(&guard.token)
            .arg(ttl_ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| infra_err(&self.backend.options.prefix, e))?;
        Ok(done == 1)
    }

    async fn release(&self, guard: &LockGuard) -> Result<bool, InfraError> {
        let mut conn = self.backend.conn();
        let done: i64 = self
            .release
            .key(self.lock_key(&guard.name))
            .arg(&guard.token)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| infra_err(&self.backend.options.prefix, e))?;
        Ok(done == 1)
    }
}
