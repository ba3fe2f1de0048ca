//! [`MemoryRunQueue`]: a lease-based work queue of run ids in memory.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rand::Rng;

use super::{add_duration, lock_state};
use crate::error::QueueError;
use crate::traits::RunQueue;
use crate::types::{DeadLetter, Fence, Lease, RetryOutcome, RetryPolicy, RunId};

/// An in-memory [`RunQueue`].
///
/// Every job sits in one ordered index keyed by the time it becomes
/// claimable: its enqueue or retry time while waiting, its lease expiry while
/// leased. A claim takes the first index entry that is due, so an expired
/// lease is reclaimed exactly like a ready job, without a scan.
///
/// Fences come from one counter for the whole queue (so they increase per
/// run across claims) that starts at the wall clock in microseconds: a
/// process restart never issues a fence older than one a durable
/// [`crate::RunStore`] already recorded, which matters when this queue is
/// paired with a persistent store.
///
/// Lease expiry uses `chrono::Utc::now()`.
#[derive(Debug)]
pub struct MemoryRunQueue {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    jobs: HashMap<RunId, Job>,
    /// `(claimable_at, enqueue order, run)` of every job.
    index: BTreeSet<(DateTime<Utc>, u64, RunId)>,
    next_order: u64,
    next_fence: u64,
    /// Oldest first.
    dead: Vec<DeadLetter>,
}

#[derive(Debug)]
struct Job {
    claimable_at: DateTime<Utc>,
    order: u64,
    attempts: u32,
    held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    owner: String,
    fence: Fence,
}

impl Default for MemoryRunQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRunQueue {
    /// An empty queue.
    pub fn new() -> Self {
        let start = u64::try_from(Utc::now().timestamp_micros()).unwrap_or(0);
        MemoryRunQueue {
            state: Mutex::new(State {
                jobs: HashMap::new(),
                index: BTreeSet::new(),
                next_order: 0,
                next_fence: start.max(1),
                dead: Vec::new(),
            }),
        }
    }
}

impl State {
    /// The job of `lease` if `lease` still holds it (same owner and fence).
    fn held_job(&mut self, lease: &Lease) -> Result<&mut Job, QueueError> {
        let lost = || QueueError::LeaseLost {
            run_id: lease.run_id,
            fence: lease.fence,
        };
        let job = self.jobs.get_mut(&lease.run_id).ok_or_else(lost)?;
        match &job.held {
            Some(h) if h.owner == lease.owner && h.fence == lease.fence => Ok(job),
            _ => {
                tracing::debug!(run_id = %lease.run_id, fence = %lease.fence, "lease lost");
                Err(lost())
            }
        }
    }

    fn reindex(&mut self, run_id: RunId, old: DateTime<Utc>, order: u64, new: DateTime<Utc>) {
        self.index.remove(&(old, order, run_id));
        self.index.insert((new, order, run_id));
    }
}

/// Up to 10% of `delay`, at most one second: spreads retries of jobs that
/// failed together.
fn jitter(delay: Duration) -> Duration {
    let max_ms = (delay.as_millis() / 10).min(1000) as u64;
    if max_ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rand::rng().random_range(0..=max_ms))
}

#[async_trait]
impl RunQueue for MemoryRunQueue {
    fn durability(&self) -> crate::types::Durability {
        crate::types::Durability::InProcess
    }

    async fn enqueue(&self, run_id: RunId) -> Result<(), QueueError> {
        let mut state = lock_state(&self.state);
        if state.jobs.contains_key(&run_id) {
            return Ok(());
        }
        let now = Utc::now();
        let order = state.next_order;
        state.next_order += 1;
        state.jobs.insert(
            run_id,
            Job {
                claimable_at: now,
                order,
                attempts: 0,
                held: None,
            },
        );
        state.index.insert((now, order, run_id));
        Ok(())
    }

    async fn claim(&self, owner: &str, lease_for: Duration) -> Result<Option<Lease>, QueueError> {
        let mut state = lock_state(&self.state);
        let now = Utc::now();
        let Some(&(at, order, run_id)) = state.index.first() else {
            return Ok(None);
        };
        if at > now {
            return Ok(None);
        }
        let fence = Fence(state.next_fence);
        state.next_fence += 1;
        let expires_at = add_duration(now, lease_for);
        let job = state
            .jobs
            .get_mut(&run_id)
            .ok_or_else(|| QueueError::Backend {
                message: format!("queue index names missing job {run_id}"),
                retryable: false,
            })?;
        job.attempts = job.attempts.saturating_add(1);
        job.held = Some(Held {
            owner: owner.to_owned(),
            fence,
        });
        job.claimable_at = expires_at;
        let attempt = job.attempts;
        state.reindex(run_id, at, order, expires_at);
        tracing::debug!(run_id = %run_id, %fence, attempt, owner, "claimed");
        Ok(Some(Lease {
            run_id,
            owner: owner.to_owned(),
            fence,
            attempt,
            expires_at,
        }))
    }

    async fn heartbeat(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, QueueError> {
        let mut state = lock_state(&self.state);
        let job = state.held_job(lease)?;
        let expires_at = add_duration(Utc::now(), lease_for);
        let (old, order, attempt) = (job.claimable_at, job.order, job.attempts);
        job.claimable_at = expires_at;
        state.reindex(lease.run_id, old, order, expires_at);
        Ok(Lease {
            expires_at,
            attempt,
            ..lease.clone()
        })
    }

    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        let mut state = lock_state(&self.state);
        let job = state.held_job(lease)?;
        let key = (job.claimable_at, job.order, lease.run_id);
        state.index.remove(&key);
        state.jobs.remove(&lease.run_id);
        Ok(())
    }

    async fn retry(
        &self,
        lease: &Lease,
        error: &str,
        policy: RetryPolicy,
    ) -> Result<RetryOutcome, QueueError> {
        let mut state = lock_state(&self.state);
        let job = state.held_job(lease)?;
        let now = Utc::now();
        let (old, order, attempts) = (job.claimable_at, job.order, job.attempts);
        if attempts >= policy.max_attempts {
            state.index.remove(&(old, order, lease.run_id));
            state.jobs.remove(&lease.run_id);
            state.dead.push(DeadLetter {
                run_id: lease.run_id,
                attempts,
                last_error: Some(error.to_owned()),
                at: now,
            });
            tracing::warn!(run_id = %lease.run_id, attempts, error, "dead-lettered");
            return Ok(RetryOutcome::DeadLettered);
        }
        let delay = policy.delay_after(attempts);
        let at = add_duration(now, delay + jitter(delay));
        job.held = None;
        job.claimable_at = at;
        state.reindex(lease.run_id, old, order, at);
        tracing::debug!(run_id = %lease.run_id, attempts, %at, error, "retry scheduled");
        Ok(RetryOutcome::Scheduled { at })
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let state = lock_state(&self.state);
        Ok(state.dead.iter().rev().take(limit).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fences_start_from_the_clock_so_restarts_never_go_back() {
        let before = u64::try_from(Utc::now().timestamp_micros()).unwrap();
        let first = MemoryRunQueue::new();
        let run = RunId::new();
        first.enqueue(run).await.unwrap();
        let a = first
            .claim("w", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert!(a.fence.0 >= before);
        // A "restarted" process builds a new queue; its fences must be newer.
        let second = MemoryRunQueue::new();
        second.enqueue(run).await.unwrap();
        let b = second
            .claim("w", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert!(b.fence > a.fence, "{} then {}", a.fence, b.fence);
    }

    #[tokio::test]
    async fn an_expired_lease_is_claimed_before_a_later_ready_job() {
        let queue = MemoryRunQueue::new();
        let (stuck, fresh) = (RunId::new(), RunId::new());
        queue.enqueue(stuck).await.unwrap();
        let lost = queue.claim("w1", Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(lost.run_id, stuck);
        queue.enqueue(fresh).await.unwrap();
        let next = queue
            .claim("w2", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            next.run_id, stuck,
            "the lease expired before `fresh` was enqueued"
        );
        assert_eq!(next.attempt, 2);
        let after = queue
            .claim("w2", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after.run_id, fresh);
        assert!(
            queue
                .claim("w3", Duration::from_secs(30))
                .await
                .unwrap()
                .is_none()
        );
        let state = lock_state(&queue.state);
        assert_eq!(
            state.index.len(),
            state.jobs.len(),
            "one index entry per job"
        );
    }

    #[test]
    fn jitter_is_small() {
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
        for _ in 0..100 {
            assert!(jitter(Duration::from_millis(500)) <= Duration::from_millis(50));
            assert!(jitter(Duration::from_secs(3600)) <= Duration::from_secs(1));
        }
    }
}
