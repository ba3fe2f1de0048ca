//! [`RedisWriteBuffer`]: pending files per sandbox in a hash, due times in
//! one sorted set.
//!
//! Keys (under the prefix):
//! - `wb:files:{sandbox}`: hash path → whole content (expires after
//!   [`super::RedisOptions::pending_ttl`] if nobody takes it);
//! - `wb:due`: sorted set sandbox → due time (ms), the index `due` reads
//!   with `ZRANGEBYSCORE` (never `SCAN`/`KEYS`);
//! - `wb:first`: hash sandbox → time (ms) of its oldest pending write,
//!   which bounds the wait by `max_wait`.
//!
//! `put` and `take` are Lua scripts, so each is atomic. `take` removes the
//! files and both index entries. `due` drops index entries whose files
//! expired, so the index never outgrows the pending sandboxes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use edward_core::{FlushPolicy, InfraError, PendingFile, SandboxKey, SandboxPath, WriteBuffer};
use redis::Script;

use super::{LUA_PRELUDE, RedisBackend, foreign_infra, infra_err, new_epoch, reply};

/// Redis [`WriteBuffer`]. Cloning is cheap; clones share the record of which
/// sandboxes this process has pending files for (used to detect that Redis
/// lost them).
#[derive(Debug, Clone)]
pub struct RedisWriteBuffer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: RedisBackend,
    put: Script,
    take: Script,
    due: Script,
    /// Sandbox → the epoch in which this process first put files still pending.
    mine: Mutex<HashMap<SandboxKey, String>>,
}

const PUT: &str = r"
local cur, lost = epoch()
if lost then return {cur, 1} end
local now = tonumber(ARGV[4])
local first = redis.call('HGET', KEYS[3], ARGV[3])
if first and redis.call('EXISTS', KEYS[4]) == 0 then first = false end
if first then
  first = tonumber(first)
  if not first then return redis.error_reply('EDWARD foreign value in ' .. KEYS[3]) end
else
  first = now
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
end
local set = ARGV[8] == '1' and 'HSETNX' or 'HSET'
for i = 9, #ARGV, 2 do redis.call(set, KEYS[4], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[4], ARGV[7])
local due = math.min(first + tonumber(ARGV[6]), now + tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], string.format('%.0f', due), ARGV[3])
return {cur, 0}
";

const TAKE: &str = r"
local cur, lost = epoch()
local files = redis.call('HGETALL', KEYS[4])
redis.call('DEL', KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[3])
if lost then return {cur, 1, {}} end
return {cur, 0, files}
";

const DUE: &str = r"
local limit = tonumber(ARGV[2])
local out = {}
while #out < limit do
  local batch = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', #out, limit - #out)
  if #batch == 0 then break end
  for _, m in ipairs(batch) do
    if redis.call('EXISTS', ARGV[3] .. m) == 1 then
      table.insert(out, m)
    else
      redis.call('ZREM', KEYS[1], m)
      redis.call('HDEL', KEYS[2], m)
    end
  end
end
return out
";

impl RedisWriteBuffer {
    pub(crate) fn new(backend: RedisBackend) -> Self {
        RedisWriteBuffer {
            inner: Arc::new(Inner {
                backend,
                put: Script::new(&format!("{LUA_PRELUDE}{PUT}")),
                take: Script::new(&format!("{LUA_PRELUDE}{TAKE}")),
                due: Script::new(DUE),
                mine: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn files_key(&self, key: &SandboxKey) -> String {
        self.inner.backend.key(&format!("wb:files:{}", key.0))
    }

    fn mine(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxKey, String>> {
        self.inner
            .mine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn prefix(&self) -> &str {
        &self.inner.backend.options.prefix
    }
}

fn lost(key: &SandboxKey) -> InfraError {
    InfraError::Backend {
        message: format!(
            "redis lost the pending files of sandbox {} (the server restarted without its data); \
             they were never written to the sandbox",
            key.0
        ),
        retryable: false,
    }
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl WriteBuffer for RedisWriteBuffer {
    async fn put(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
    ) -> Result<(), InfraError> {
        self.insert(key, files, now, policy, false).await
    }

    async fn put_back(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
    ) -> Result<(), InfraError> {
        self.insert(key, files, now, policy, true).await
    }

    async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<SandboxKey>, InfraError> {
        self.due_keys(now, limit).await
    }

    async fn take(&self, key: &SandboxKey) -> Result<Vec<PendingFile>, InfraError> {
        self.take_files(key).await
    }
}

impl RedisWriteBuffer {
    /// `put` (`keep_existing` = false) or `put_back` (true).
    async fn insert(
        &self,
        key: &SandboxKey,
        files: Vec<PendingFile>,
        now: DateTime<Utc>,
        policy: FlushPolicy,
        keep_existing: bool,
    ) -> Result<(), InfraError> {
        if files.is_empty() {
            return Ok(());
        }
        let backend = &self.inner.backend;
        let expected = self.mine().get(key).cloned().unwrap_or_default();
        let mut call = self.inner.put.prepare_invoke();
        call.key(backend.key("epoch"))
            .key(backend.key("wb:due"))
            .key(backend.key("wb:first"))
            .key(self.files_key(key))
            .arg(&expected)
            .arg(new_epoch())
            .arg(&key.0)
            .arg(ms(now))
            .arg(duration_ms(policy.debounce))
            .arg(duration_ms(policy.max_wait))
            .arg(duration_ms(backend.options.pending_ttl).max(1))
            .arg(if keep_existing { "1" } else { "0" });
        for file in &files {
            call.arg(file.path.as_str()).arg(file.content.as_ref());
        }
        let mut conn = backend.conn();
        let value: redis::Value = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| infra_err(self.prefix(), e))?;
        let items = reply::array(value).map_err(foreign_infra)?;
        let (epoch, was_lost) = epoch_reply(&items)?;
        if was_lost {
            self.mine().remove(key);
            tracing::error!(sandbox = %key.0, "redis lost pending files");
            return Err(lost(key));
        }
        self.mine().entry(key.clone()).or_insert(epoch);
        Ok(())
    }

    async fn due_keys(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<SandboxKey>, InfraError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let backend = &self.inner.backend;
        let mut conn = backend.conn();
        let keys: Vec<String> = self
            .inner
            .due
            .key(backend.key("wb:due"))
            .key(backend.key("wb:first"))
            .arg(ms(now))
            .arg(limit)
            .arg(backend.key("wb:files:"))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| infra_err(self.prefix(), e))?;
        Ok(keys.into_iter().map(SandboxKey).collect())
    }

    async fn take_files(&self, key: &SandboxKey) -> Result<Vec<PendingFile>, InfraError> {
        let backend = &self.inner.backend;
        let expected = self.mine().get(key).cloned().unwrap_or_default();
        let mut conn = backend.conn();
        let value: redis::Value = self
            .inner
            .take
            .key(backend.key("epoch"))
            .key(backend.key("wb:due"))
            .key(backend.key("wb:first"))
            .key(self.files_key(key))
            .arg(&expected)
            .arg(new_epoch())
            .arg(&key.0)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| infra_err(self.prefix(), e))?;
        // Whatever the reply, the server removed everything pending.
        self.mine().remove(key);
        let mut items = reply::array(value).map_err(foreign_infra)?;
        let (_, was_lost) = epoch_reply(&items)?;
        if was_lost {
            tracing::error!(sandbox = %key.0, "redis lost pending files");
            return Err(lost(key));
        }
        let files = match items.pop() {
            Some(v) => reply::array(v).map_err(foreign_infra)?,
            None => return Err(foreign_infra("a take reply without files")),
        };
        let mut out = Vec::with_capacity(files.len() / 2);
        let mut it = files.into_iter();
        while let (Some(path), Some(content)) = (it.next(), it.next()) {
            let path = reply::string(&path).map_err(foreign_infra)?;
            let path = SandboxPath::new(&path).map_err(|e| {
                foreign_infra(format!("pending path `{path}` of sandbox {}: {e}", key.0))
            })?;
            let content = match content {
                redis::Value::BulkString(b) => Bytes::from(b),
                other => return Err(foreign_infra(format!("pending content {other:?}"))),
            };
            out.push(PendingFile { path, content });
        }
        Ok(out)
    }
}

/// `(epoch, lost)` from the first two items of a script reply.
fn epoch_reply(items: &[redis::Value]) -> Result<(String, bool), InfraError> {
    match items {
        [epoch, lost, ..] => Ok((
            reply::string(epoch).map_err(foreign_infra)?,
            reply::int(lost).map_err(foreign_infra)? != 0,
        )),
        _ => Err(foreign_infra("a short script reply")),
    }
}
