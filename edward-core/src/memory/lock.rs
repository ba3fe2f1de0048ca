//! [`MemoryLock`]: owner-checked lease locks in memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{add_duration, lock_state};
use crate::error::InfraError;
use crate::traits::{Lock, LockGuard};

/// An in-memory [`Lock`]: each acquisition gets a fresh UUID token; a lock
/// whose ttl passed is free (and its old guard can neither renew nor
/// release it), like a Redis key with a PX expiry.
///
/// Fencing tokens come from one counter that starts at the wall clock in
/// microseconds, so a restarted process never hands out an older fence.
#[derive(Debug)]
pub struct MemoryLock {
    held: Mutex<HashMap<String, Held>>,
    next_fence: AtomicU64,
}

impl Default for MemoryLock {
    fn default() -> Self {
        let start = u64::try_from(Utc::now().timestamp_micros()).unwrap_or(0);
        MemoryLock {
            held: Mutex::new(HashMap::new()),
            next_fence: AtomicU64::new(start.max(1)),
        }
    }
}

#[derive(Debug)]
struct Held {
    token: String,
    expires_at: DateTime<Utc>,
}

impl MemoryLock {
    /// No locks held.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Whether `guard` currently holds its lock in `held`.
fn holds(held: &HashMap<String, Held>, guard: &LockGuard, now: DateTime<Utc>) -> bool {
    held.get(&guard.name)
        .is_some_and(|h| h.token == guard.token && h.expires_at > now)
}

#[async_trait]
impl Lock for MemoryLock {
    async fn try_acquire(
        &self,
        name: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, InfraError> {
        let mut held = lock_state(&self.held);
        let now = Utc::now();
        if held.get(name).is_some_and(|h| h.expires_at > now) {
            return Ok(None);
        }
        let token = Uuid::new_v4().to_string();
        held.insert(
            name.to_owned(),
            Held {
                token: token.clone(),
                expires_at: add_duration(now, ttl),
            },
        );
        let fence = self.next_fence.fetch_add(1, Ordering::Relaxed);
        Ok(Some(LockGuard {
            name: name.to_owned(),
            owner: owner.to_owned(),
            token,
            fence,
        }))
    }

    async fn renew(&self, guard: &LockGuard, ttl: Duration) -> Result<bool, InfraError> {
        let mut held = lock_state(&self.held);
        let now = Utc::now();
        if !holds(&held, guard, now) {
            return Ok(false);
        }
        if let Some(h) = held.get_mut(&guard.name) {
            h.expires_at = add_duration(now, ttl);
        }
        Ok(true)
    }

    async fn release(&self, guard: &LockGuard) -> Result<bool, InfraError> {
        let mut held = lock_state(&self.held);
        if !holds(&held, guard, Utc::now()) {
            return Ok(false);
        }
        held.remove(&guard.name);
        Ok(true)
    }
}
