//! [`RedisQueue`]: the work queue as Lua scripts over one sorted set.
//!
//! Keys (under the prefix):
//! - `q:job:{run}`: hash of one job — its index member `m`, `attempts`,
//!   `owner`, `fence`, `expires` (ms);
//! - `q:idx`: sorted set of every job by the time it becomes claimable:
//!   enqueue or retry time while waiting, lease expiry while leased. The
//!   member is `{enqueue seq, 20 digits}:{run}`, so equal times keep enqueue
//!   order. A claim takes the first member due, so an expired lease is
//!   reclaimed exactly like a ready job — the same rule as `PgQueue` and
//!   `MemoryRunQueue`;
//! - `q:seq`: the enqueue counter; `fence`: the fence counter (shared with
//!   the lock), never below the server clock in microseconds;
//! - `q:dead`: a list of dead letters (JSON), newest first, capped.
//!
//! Times come from the Redis server (`TIME`), so worker clock skew does not
//! matter. Acked and dead-lettered jobs are deleted: the keys in use are
//! bounded by the jobs in flight plus the capped dead-letter list.
//!
//! **Data loss.** Each lease remembers the epoch (see [`super`]) it was
//! issued in. When Redis comes back empty, a heartbeat on a job that is gone
//! in a new epoch re-creates the lease (same owner, fence and attempt) so
//! the live run carries on; an ack finds the job gone with the data and
//! succeeds; a retry re-creates the job scheduled. A queue made with
//! [`super::RedisBackend::queue_with_recovery`] also re-enqueues the store's
//! queued runs, and its running runs after a grace period.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use edward_core::{
    DeadLetter, Fence, Lease, QueueError, RetryOutcome, RetryPolicy, RunId, RunQueue, RunStatus,
    RunStore,
};
use redis::{Script, Value};

use super::{LUA_PRELUDE, RedisBackend, foreign_queue, new_epoch, queue_err, reply};
use crate::common::{backoff_with_jitter, lease_lost};

/// At most this many lease epochs are remembered per process.
const MAX_TRACKED_LEASES: usize = 10_000;
/// At most this many runs of each status are re-enqueued after a data loss.
const RECOVERY_PAGE: usize = 100_000;

/// Redis [`RunQueue`]. Cloning is cheap; clones share their epoch records.
#[derive(Clone)]
pub struct RedisQueue {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue")
            .field("backend", &self.inner.backend)
            .field("recovery", &self.inner.store.is_some())
            .finish_non_exhaustive()
    }
}

struct Inner {
    backend: RedisBackend,
    enqueue: Script,
    claim: Script,
    heartbeat: Script,
    ack: Script,
    retry: Script,
    /// The newest epoch this process has seen.
    epoch: Mutex<String>,
    /// `(run, fence)` of leases this process holds → the epoch they came from.
    leases: Mutex<HashMap<(RunId, u64), String>>,
    store: Option<Arc<dyn RunStore>>,
    data_losses: std::sync::atomic::AtomicU64,
}

const ENQUEUE: &str = r"
local cur, lost = epoch()
local l = lost and 1 or 0
if redis.call('EXISTS', KEYS[3]) == 1 then return {cur, l, 0} end
local seq = redis.call('INCR', KEYS[4])
local m = string.format('%020d', seq) .. ':' .. ARGV[3]
redis.call('HSET', KEYS[3], 'm', m, 'attempts', 0, 'owner', '', 'fence', 0, 'expires', 0)
redis.call('ZADD', KEYS[2], now_ms(), m)
return {cur, l, 1}
";

const CLAIM: &str = r"
local cur, lost = epoch()
local l = lost and 1 or 0
local now = now_ms()
for _ = 1, 100 do
  local items = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
  if #items == 0 then return {cur, l} end
  local m = items[1]
  local run = string.sub(m, 22)
  local job = ARGV[5] .. run
  if redis.call('HGET', job, 'm') ~= m then
    redis.call('ZREM', KEYS[2], m)
  else
    local fence = next_fence(KEYS[3])
    local attempts = redis.call('HINCRBY', job, 'attempts', 1)
    local exp = now + tonumber(ARGV[4])
    redis.call('HSET', job, 'owner', ARGV[3], 'fence', string.format('%.0f', fence), 'expires', exp)
    redis.call('ZADD', KEYS[2], exp, m)
    return {cur, l, run, fence, attempts, exp}
  end
end
return {cur, l}
";

/// Status 0 = lease lost, 1 = extended, 2 = restored after a data loss.
const HEARTBEAT: &str = r"
local cur, lost = epoch()
local exp = now_ms() + tonumber(ARGV[6])
if redis.call('EXISTS', KEYS[3]) == 0 then
  if not lost then return {cur, 0} end
  local seq = redis.call('INCR', KEYS[5])
  local m = string.format('%020d', seq) .. ':' .. ARGV[3]
  redis.call('HSET', KEYS[3], 'm', m, 'attempts', ARGV[7], 'owner', ARGV[4], 'fence', ARGV[5], 'expires', exp)
  redis.call('ZADD', KEYS[2], exp, m)
  local f = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
  if f < tonumber(ARGV[5]) then redis.call('SET', KEYS[4], ARGV[5]) end
  return {cur, 2, tonumber(ARGV[7]), exp}
end
local h = redis.call('HMGET', KEYS[3], 'owner', 'fence', 'attempts', 'm')
if h[1] ~= ARGV[4] or h[2] ~= ARGV[5] or not h[4] then return {cur, 0} end
redis.call('HSET', KEYS[3], 'expires', exp)
redis.call('ZADD', KEYS[2], exp, h[4])
return {cur, 1, tonumber(h[3]), exp}
";

/// Status 0 = lease lost, 1 = acked, 2 = the job went with lost data.
const ACK: &str = r"
local cur, lost = epoch()
if redis.call('EXISTS', KEYS[3]) == 0 then
  if lost then return {cur, 2} end
  return {cur, 0}
end
local h = redis.call('HMGET', KEYS[3], 'owner', 'fence', 'm')
if h[1] ~= ARGV[4] or h[2] ~= ARGV[5] or not h[3] then return {cur, 0} end
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[2], h[3])
return {cur, 1}
";

/// Status 0 = lease lost, 1 = scheduled (at), 3 = dead-lettered.
const RETRY: &str = r"
local cur, lost = epoch()
local now = now_ms()
local attempts, m
if redis.call('EXISTS', KEYS[3]) == 0 then
  if not lost then return {cur, 0} end
  attempts = tonumber(ARGV[9])
  m = string.format('%020d', redis.call('INCR', KEYS[5])) .. ':' .. ARGV[3]
else
  local h = redis.call('HMGET', KEYS[3], 'owner', 'fence', 'm', 'attempts')
  if h[1] ~= ARGV[4] or h[2] ~= ARGV[5] or not h[3] then return {cur, 0} end
  m = h[3]
  attempts = tonumber(h[4])
  if not attempts then return redis.error_reply('EDWARD foreign attempts in ' .. KEYS[3]) end
end
if attempts >= tonumber(ARGV[7]) then
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', KEYS[2], m)
  redis.call('LPUSH', KEYS[4], cjson.encode({run = ARGV[3], attempts = attempts,
    error = ARGV[6], at = string.format('%.0f', now)}))
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[10]) - 1)
  return {cur, 3}
end
local at = now + tonumber(ARGV[8])
redis.call('HSET', KEYS[3], 'm', m, 'attempts', attempts, 'owner', '', 'fence', 0, 'expires', 0)
redis.call('ZADD', KEYS[2], at, m)
return {cur, 1, at}
";

fn script(body: &str) -> Script {
    Script::new(&format!("{LUA_PRELUDE}{body}"))
}

fn ms_to_time(ms: i64) -> Result<DateTime<Utc>, QueueError> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| foreign_queue(format!("time {ms} ms")))
}

impl RedisQueue {
    pub(crate) fn new(backend: RedisBackend, store: Option<Arc<dyn RunStore>>) -> Self {
        RedisQueue {
            inner: Arc::new(Inner {
                backend,
                enqueue: script(ENQUEUE),
                claim: script(CLAIM),
                heartbeat: script(HEARTBEAT),
                ack: script(ACK),
                retry: script(RETRY),
                epoch: Mutex::new(String::new()),
                leases: Mutex::new(HashMap::new()),
                store,
                data_losses: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// How many times this queue found that Redis had lost its data.
    pub fn data_losses(&self) -> u64 {
        self.inner
            .data_losses
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn key(&self, name: &str) -> String {
        self.inner.backend.key(name)
    }

    fn job_key(&self, run: RunId) -> String {
        self.key(&format!("q:job:{run}"))
    }

    fn err(&self, e: redis::RedisError) -> QueueError {
        queue_err(&self.inner.backend.options.prefix, e)
    }

    fn known_epoch(&self) -> String {
        self.inner
            .epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<(RunId, u64), String>> {
        self.inner
            .leases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The epoch `lease` was issued in, as far as this process knows.
    fn lease_epoch(&self, lease: &Lease) -> String {
        self.leases()
            .get(&(lease.run_id, lease.fence.0))
            .cloned()
            .unwrap_or_else(|| self.known_epoch())
    }

    fn track(&self, lease: &Lease, epoch: &str) {
        let mut leases = self.leases();
        if leases.len() >= MAX_TRACKED_LEASES {
            // Abandoned leases are never acked: forget them all rather than
            // grow; the forgotten ones default to the newest epoch.
            leases.clear();
        }
        leases.insert((lease.run_id, lease.fence.0), epoch.to_owned());
    }

    fn untrack(&self, lease: &Lease) {
        self.leases().remove(&(lease.run_id, lease.fence.0));
    }

    /// Record the epoch a script saw; on a newly seen data loss, recover.
    fn observe(&self, items: &[Value]) -> Result<(), QueueError> {
        let [cur, lost, ..] = items else {
            return Err(foreign_queue("a short script reply"));
        };
        let cur = reply::string(cur).map_err(foreign_queue)?;
        // `lost` says the caller's expected epoch differed; the process-wide
        // record below decides whether this loss is news.
        reply::int(lost).map_err(foreign_queue)?;
        let mut known = self
            .inner
            .epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *known != cur {
            let seen_before = !known.is_empty();
            *known = cur;
            drop(known);
            if seen_before {
                self.on_data_loss();
            }
        }
        Ok(())
    }

    fn on_data_loss(&self) {
        self.inner
            .data_losses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            prefix = %self.inner.backend.options.prefix,
            "redis lost the queue's data (restarted empty?); live leases are restored by heartbeat"
        );
        let Some(store) = self.inner.store.clone() else {
            return;
        };
        let queue = self.clone();
        let grace = self.inner.backend.options.recovery_grace;
        tokio::spawn(async move {
            queue.requeue(&*store, RunStatus::Queued).await;
            tokio::time::sleep(grace).await;
            queue.requeue(&*store, RunStatus::Running).await;
        });
    }

    /// Enqueue every run of `store` in `status` (a no-op for jobs that exist).
    async fn requeue(&self, store: &dyn RunStore, status: RunStatus) {
        match store.list_runs(status, RECOVERY_PAGE).await {
            Ok(runs) => {
                let mut done = 0usize;
                for run in runs {
                    match self.enqueue(run.id).await {
                        Ok(()) => done += 1,
                        Err(e) => tracing::warn!(run_id = %run.id, error = %e, "re-enqueue failed"),
                    }
                }
                tracing::warn!(%status, runs = done, "re-enqueued runs after redis data loss");
            }
            Err(e) => tracing::error!(%status, error = %e, "cannot list runs to re-enqueue"),
        }
    }

    async fn invoke(&self, call: &redis::ScriptInvocation<'_>) -> Result<Vec<Value>, QueueError> {
        let mut conn = self.inner.backend.conn();
        let value: Value = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(e))?;
        let items = reply::array(value).map_err(foreign_queue)?;
        self.observe(&items)?;
        Ok(items)
    }

    fn status(items: &[Value]) -> Result<i64, QueueError> {
        items
            .get(1)
            .ok_or_else(|| foreign_queue("a reply without status"))
            .and_then(|v| reply::int(v).map_err(foreign_queue))
    }
}

fn int_at(items: &[Value], i: usize) -> Result<i64, QueueError> {
    items
        .get(i)
        .ok_or_else(|| foreign_queue("a short script reply"))
        .and_then(|v| reply::int(v).map_err(foreign_queue))
}

fn u32_of(n: i64, what: &str) -> Result<u32, QueueError> {
    u32::try_from(n).map_err(|_| foreign_queue(format!("{what} {n}")))
}

#[async_trait]
impl RunQueue for RedisQueue {
    async fn enqueue(&self, run_id: RunId) -> Result<(), QueueError> {
        let mut call = self.inner.enqueue.prepare_invoke();
        call.key(self.key("epoch"))
            .key(self.key("q:idx"))
            .key(self.job_key(run_id))
            .key(self.key("q:seq"))
            .arg(self.known_epoch())
            .arg(new_epoch())
            .arg(run_id.to_string());
        self.invoke(&call).await?;
        Ok(())
    }

    async fn claim(&self, owner: &str, lease_for: Duration) -> Result<Option<Lease>, QueueError> {
        let mut call = self.inner.claim.prepare_invoke();
        call.key(self.key("epoch"))
            .key(self.key("q:idx"))
            .key(self.key("fence"))
            .arg(self.known_epoch())
            .arg(new_epoch())
            .arg(owner)
            .arg(lease_for.as_millis().min(i64::MAX as u128) as i64)
            .arg(self.key("q:job:"));
        let items = self.invoke(&call).await?;
        if items.len() < 6 {
            return Ok(None);
        }
        let run = reply::string(&items[2]).map_err(foreign_queue)?;
        let run_id: RunId = run
            .parse()
            .map_err(|_| foreign_queue(format!("queued run id `{run}`")))?;
        let fence = int_at(&items, 3)?;
        let lease = Lease {
            run_id,
            owner: owner.to_owned(),
            fence: Fence(
                u64::try_from(fence).map_err(|_| foreign_queue(format!("fence {fence}")))?,
            ),
            attempt: u32_of(int_at(&items, 4)?, "attempts")?,
            expires_at: ms_to_time(int_at(&items, 5)?)?,
        };
        let epoch = reply::string(&items[0]).map_err(foreign_queue)?;
        self.track(&lease, &epoch);
        tracing::debug!(run_id = %lease.run_id, fence = %lease.fence, attempt = lease.attempt, "claimed");
        Ok(Some(lease))
    }

    async fn heartbeat(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, QueueError> {
        let mut call = self.inner.heartbeat.prepare_invoke();
        call.key(self.key("epoch"))
            .key(self.key("q:idx"))
            .key(self.job_key(lease.run_id))
            .key(self.key("fence"))
            .key(self.key("q:seq"))
            .arg(self.lease_epoch(lease))
            .arg(new_epoch())
            .arg(lease.run_id.to_string())
            .arg(&lease.owner)
            .arg(lease.fence.0.to_string())
            .arg(lease_for.as_millis().min(i64::MAX as u128) as i64)
            .arg(lease.attempt);
        let items = self.invoke(&call).await?;
        match Self::status(&items)? {
            0 => {
                self.untrack(lease);
                Err(lease_lost(lease.run_id, lease.fence))
            }
            status => {
                if status == 2 {
                    tracing::warn!(run_id = %lease.run_id, fence = %lease.fence, "lease restored after redis data loss");
                }
                let epoch = reply::string(&items[0]).map_err(foreign_queue)?;
                let renewed = Lease {
                    attempt: u32_of(int_at(&items, 2)?, "attempts")?,
                    expires_at: ms_to_time(int_at(&items, 3)?)?,
                    ..lease.clone()
                };
                self.track(&renewed, &epoch);
                Ok(renewed)
            }
        }
    }

    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        let mut call = self.inner.ack.prepare_invoke();
        call.key(self.key("epoch"))
            .key(self.key("q:idx"))
            .key(self.job_key(lease.run_id))
            .arg(self.lease_epoch(lease))
            .arg(new_epoch())
            .arg(lease.run_id.to_string())
            .arg(&lease.owner)
            .arg(lease.fence.0.to_string());
        let items = self.invoke(&call).await?;
        self.untrack(lease);
        match Self::status(&items)? {
            0 => Err(lease_lost(lease.run_id, lease.fence)),
            _ => Ok(()),
        }
    }

    async fn retry(
        &self,
        lease: &Lease,
        error: &str,
        policy: RetryPolicy,
    ) -> Result<RetryOutcome, QueueError> {
        let delay = backoff_with_jitter(&policy, lease.attempt);
        let mut call = self.inner.retry.prepare_invoke();
        call.key(self.key("epoch"))
            .key(self.key("q:idx"))
            .key(self.job_key(lease.run_id))
            .key(self.key("q:dead"))
            .key(self.key("q:seq"))
            .arg(self.lease_epoch(lease))
            .arg(new_epoch())
            .arg(lease.run_id.to_string())
            .arg(&lease.owner)
            .arg(lease.fence.0.to_string())
            .arg(error)
            .arg(policy.max_attempts)
            .arg(delay.as_millis().min(i64::MAX as u128) as i64)
            .arg(lease.attempt)
            .arg(self.inner.backend.options.dead_letter_cap.max(1));
        let items = self.invoke(&call).await?;
        self.untrack(lease);
        match Self::status(&items)? {
            0 => Err(lease_lost(lease.run_id, lease.fence)),
            3 => {
                tracing::warn!(run_id = %lease.run_id, attempts = lease.attempt, error, "job dead-lettered");
                Ok(RetryOutcome::DeadLettered)
            }
            _ => Ok(RetryOutcome::Scheduled {
                at: ms_to_time(int_at(&items, 2)?)?,
            }),
        }
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.inner.backend.conn();
        let end = isize::try_from(limit).unwrap_or(isize::MAX) - 1;
        let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(self.key("q:dead"))
            .arg(0)
            .arg(end)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err(e))?;
        raw.iter().map(|bytes| parse_dead_letter(bytes)).collect()
    }
}

fn parse_dead_letter(bytes: &[u8]) -> Result<DeadLetter, QueueError> {
    let bad = || foreign_queue(format!("dead letter `{}`", String::from_utf8_lossy(bytes)));
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| bad())?;
    let run_id: RunId = v["run"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let attempts = v["attempts"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(bad)?;
    let at_ms: i64 = v["at"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    Ok(DeadLetter {
        run_id,
        attempts,
        last_error: v["error"].as_str().map(str::to_owned),
        at: ms_to_time(at_ms)?,
    })
}
