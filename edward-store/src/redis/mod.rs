//! Redis adapters: [`RedisWriteBuffer`] ([`edward_core::WriteBuffer`]),
//! [`RedisLock`] ([`edward_core::Lock`]), [`RedisNotifier`]
//! ([`edward_core::Notifier`]) and [`RedisQueue`] ([`edward_core::RunQueue`]),
//! all made from one [`RedisBackend`] handle.
//!
//! Every multi-key change is one Lua script, so it is atomic on the server.
//! All keys live under a configurable prefix (default `edward:`), so two
//! deployments can share one Redis. Redis Cluster is not supported (the
//! scripts compute key names).
//!
//! **Data loss.** Every script first checks an *epoch* key
//! (`{prefix}epoch`, a random id written once). A Redis restarted empty has
//! no epoch: the first script to run writes a new one, and each adapter
//! compares it with the epoch it saw when it wrote its own data. That is how
//! the adapters tell "Redis lost my data" from "someone else removed it":
//! - the write buffer refuses a `put`/`take` on a sandbox whose pending
//!   files were lost, with a non-retryable error naming the sandbox (the
//!   engine then ends the run `failed` with that reason; a file is only
//!   ever reported written after the sandbox wrote it);
//! - the queue re-creates the lease of a running job on its next heartbeat
//!   (same owner and fence), so live runs carry on; with
//!   [`RedisBackend::queue_with_recovery`] it also re-enqueues the store's
//!   queued runs at once and its running runs after a grace period;
//! - fences (queue and lock) come from a counter that never goes below the
//!   server clock in microseconds, so fences stay monotonic across a wipe.
//!
//! See `docs/REDIS.md`.

mod lock;
mod notifier;
mod queue;
mod write_buffer;

use std::time::Duration;

use edward_core::{InfraError, QueueError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError};
use uuid::Uuid;

pub use lock::RedisLock;
pub use notifier::RedisNotifier;
pub use queue::RedisQueue;
pub use write_buffer::RedisWriteBuffer;

/// Options of the Redis adapters.
///
/// ```
/// let options = edward_store::RedisOptions::default().prefix("tenant-a:");
/// assert_eq!(options.prefix, "tenant-a:");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Every key starts with this (default `edward:`).
    pub prefix: String,
    /// Give up connecting after this long (default 2 s).
    pub connect_timeout: Duration,
    /// Give up waiting for a reply after this long (default 30 s; a 20 MB
    /// file must fit in it).
    pub response_timeout: Duration,
    /// Pending files of a sandbox nobody flushes expire after this long
    /// (default 1 day), so abandoned sandboxes cannot grow Redis forever.
    pub pending_ttl: Duration,
    /// Keep at most this many dead letters (default 10,000; oldest dropped).
    pub dead_letter_cap: usize,
    /// After Redis lost its data, [`RedisBackend::queue_with_recovery`]
    /// re-enqueues the store's running runs after this long (default 30 s,
    /// one lease), giving live workers the time to restore their leases
    /// by heartbeat first.
    pub recovery_grace: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "edward:".to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(30),
            pending_ttl: Duration::from_secs(24 * 3600),
            dead_letter_cap: 10_000,
            recovery_grace: Duration::from_secs(30),
        }
    }
}

impl RedisOptions {
    /// Use `prefix` for every key.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Set the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Set the reply timeout.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Set the expiry of unflushed pending files.
    pub fn pending_ttl(mut self, ttl: Duration) -> Self {
        self.pending_ttl = ttl;
        self
    }

    /// Set the dead-letter cap (at least 1).
    pub fn dead_letter_cap(mut self, cap: usize) -> Self {
        self.dead_letter_cap = cap.max(1);
        self
    }

    /// Set the grace period before running runs are re-enqueued after a
    /// data loss.
    pub fn recovery_grace(mut self, grace: Duration) -> Self {
        self.recovery_grace = grace;
        self
    }
}

/// Failure to open the Redis adapters.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConnectError {
    /// The URL or options were refused.
    #[error("invalid Redis configuration: {0}")]
    Config(String),
    /// Nothing answered (refused, timed out, DNS).
    #[error("Redis at {url} is unavailable: {source}")]
    Unavailable {
        /// The URL, password removed.
        url: String,
        /// What failed.
        #[source]
        source: RedisError,
    },
    /// The server refused the credentials (wrong password or user).
    #[error("Redis at {url} refused the credentials: {source}")]
    Auth {
        /// The URL, password removed.
        url: String,
        /// What the server said.
        #[source]
        source: RedisError,
    },
    /// The TLS handshake failed, or one side speaks TLS and the other does
    /// not (`rediss://` against a plain server or the reverse).
    #[error(
        "TLS with Redis at {url} failed (does the server speak TLS? rediss:// vs redis://): {source}"
    )]
    Tls {
        /// The URL, password removed.
        url: String,
        /// What failed.
        #[source]
        source: RedisError,
    },
    /// The server answered something else than Redis would.
    #[error("unexpected reply from Redis at {url}: {source}")]
    Protocol {
        /// The URL, password removed.
        url: String,
        /// What failed.
        #[source]
        source: RedisError,
    },
    /// A key Edward owns holds a value Edward did not write.
    #[error("Redis key `{key}` holds a value Edward did not write: {detail}")]
    Foreign {
        /// The key.
        key: String,
        /// What was found.
        detail: String,
    },
}

impl RedisConnectError {
    /// Whether trying again later can help (the server may come up).
    pub fn is_retryable(&self) -> bool {
        matches!(self, RedisConnectError::Unavailable { .. })
    }
}

/// One connection to Redis (a reconnecting [`ConnectionManager`]) and the
/// key prefix; makes every Redis adapter. Cloning is cheap.
///
/// ```no_run
/// # async fn f() -> Result<(), edward_store::RedisConnectError> {
/// let redis = edward_store::RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let buffer = redis.write_buffer();
/// let lock = redis.lock();
/// let queue = redis.queue();
/// let notifier = redis.notifier().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) client: redis::Client,
    pub(crate) conn: ConnectionManager,
    pub(crate) options: RedisOptions,
    pub(crate) url: String,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.url)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connect to `url` (`redis://[:password@]host:port[/db]`, or
    /// `rediss://` for TLS) with default options.
    pub async fn connect(url: &str) -> Result<Self, RedisConnectError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connect with `options`. Fails with a typed error when Redis is not
    /// there, refuses the password, speaks TLS or not against the URL, or
    /// holds something else than Edward's data under the epoch key.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self, RedisConnectError> {
        if options.prefix.is_empty() || options.prefix.chars().any(char::is_whitespace) {
            return Err(RedisConnectError::Config(format!(
                "key prefix `{}` must be non-empty and have no whitespace",
                options.prefix
            )));
        }
        let shown = redact(url);
        let client = redis::Client::open(url)
            .map_err(|e| RedisConnectError::Config(format!("{shown}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let tls = url.starts_with("rediss:");
        let opened = async {
            let mut conn = ConnectionManager::new_with_config(client.clone(), config).await?;
            let _: String = redis::cmd("PING").query_async(&mut conn).await?;
            Ok::<_, RedisError>(conn)
        };
        let conn = match opened.await {
            Ok(conn) => conn,
            Err(e) => {
                let mut err = classify_connect(&shown, tls, e);
                if let RedisConnectError::Unavailable { source, .. } = err {
                    // A plain server never answers a TLS hello: the handshake
                    // times out although TCP connects.
                    err = if tls && source.is_timeout() && tcp_reachable(&client).await {
                        RedisConnectError::Tls { url: shown, source }
                    } else {
                        RedisConnectError::Unavailable { url: shown, source }
                    };
                }
                return Err(err);
            }
        };
        let backend = RedisBackend {
            client,
            conn,
            options,
            url: shown,
        };
        // A foreign value under the epoch key is refused at once.
        backend.current_epoch().await.map_err(|e| match e {
            EpochError::Foreign(detail) => RedisConnectError::Foreign {
                key: backend.key("epoch"),
                detail,
            },
            EpochError::Redis(source) => classify_connect(&backend.url, tls, source),
        })?;
        Ok(backend)
    }

    /// The options in use.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// A [`RedisWriteBuffer`] on this connection.
    pub fn write_buffer(&self) -> RedisWriteBuffer {
        RedisWriteBuffer::new(self.clone())
    }

    /// A [`RedisLock`] on this connection.
    pub fn lock(&self) -> RedisLock {
        RedisLock::new(self.clone())
    }

    /// A [`RedisQueue`] on this connection.
    pub fn queue(&self) -> RedisQueue {
        RedisQueue::new(self.clone(), None)
    }

    /// A [`RedisQueue`] that, when it finds Redis lost its data, re-enqueues
    /// `store`'s queued runs at once and its running runs after
    /// [`RedisOptions::recovery_grace`] (enqueue is a no-op for a job that
    /// exists, so a live worker that restored its lease keeps it).
    pub fn queue_with_recovery(
        &self,
        store: std::sync::Arc<dyn edward_core::RunStore>,
    ) -> RedisQueue {
        RedisQueue::new(self.clone(), Some(store))
    }

    /// A [`RedisNotifier`]: opens its own subscriber connection and returns
    /// once it is subscribed.
    pub async fn notifier(&self) -> Result<RedisNotifier, RedisConnectError> {
        RedisNotifier::start(self.clone()).await
    }

    /// `{prefix}{name}`.
    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}{}", self.options.prefix, name)
    }

    /// A connection handle (cheap clone of the manager).
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The current epoch, writing a fresh one when Redis has none.
    pub(crate) async fn current_epoch(&self) -> Result<String, EpochError> {
        let mut conn = self.conn();
        let epoch: redis::Value = redis::Script::new(ENSURE_EPOCH)
            .key(self.key("epoch"))
            .arg(new_epoch())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| {
                if is_wrong_type(&e) {
                    EpochError::Foreign(e.to_string())
                } else {
                    EpochError::Redis(e)
                }
            })?;
        match epoch {
            redis::Value::BulkString(b) => String::from_utf8(b)
                .map_err(|_| EpochError::Foreign("a non-UTF-8 epoch".to_owned())),
            other => Err(EpochError::Foreign(format!("{other:?}"))),
        }
    }
}

pub(crate) enum EpochError {
    Foreign(String),
    Redis(RedisError),
}

const ENSURE_EPOCH: &str = r"
local cur = redis.call('GET', KEYS[1])
if not cur then redis.call('SET', KEYS[1], ARGV[1]); cur = ARGV[1] end
return cur
";

/// Lua shared by the scripts. `KEYS[1]` is always the epoch key; `ARGV[1]`
/// the epoch the caller expects (`''` = none) and `ARGV[2]` a fresh epoch to
/// write if Redis has none. `epoch()` returns the current epoch and whether
/// it differs from the expected one (data was lost).
pub(crate) const LUA_PRELUDE: &str = r"
local function epoch()
  local cur = redis.call('GET', KEYS[1])
  if not cur then redis.call('SET', KEYS[1], ARGV[2]); cur = ARGV[2] end
  return cur, (ARGV[1] ~= '' and ARGV[1] ~= cur)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Strictly increasing, and never below the server clock in microseconds:
-- a Redis restarted empty still hands out fences newer than before.
local function next_fence(key)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local f = redis.call('INCR', key)
  if f < now_us then
    f = now_us
    redis.call('SET', key, string.format('%.0f', f))
  end
  return f
end
";

/// A fresh random epoch id.
pub(crate) fn new_epoch() -> String {
    Uuid::new_v4().simple().to_string()
}

/// `url` with any password replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

fn classify_connect(url: &str, tls: bool, source: RedisError) -> RedisConnectError {
    let url = url.to_owned();
    let code = source.code().unwrap_or("");
    if source.kind() == ErrorKind::AuthenticationFailed
        || matches!(code, "WRONGPASS" | "NOAUTH" | "NOPERM")
    {
        return RedisConnectError::Auth { url, source };
    }
    if source.kind() == ErrorKind::InvalidClientConfig {
        return RedisConnectError::Config(format!("{url}: {source}"));
    }
    if source.is_connection_refusal() || source.is_timeout() {
        return RedisConnectError::Unavailable { url, source };
    }
    if tls || source.is_connection_dropped() {
        // A TLS client meeting a plain server fails its handshake; a TLS
        // server hangs up on a plain-text hello.
        return RedisConnectError::Tls { url, source };
    }
    if source.is_io_error() {
        return RedisConnectError::Unavailable { url, source };
    }
    RedisConnectError::Protocol { url, source }
}

/// Whether a plain TCP connection to the client's address succeeds.
async fn tcp_reachable(client: &redis::Client) -> bool {
    let (host, port) = match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        _ => return false,
    };
    matches!(
        tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect((host.as_str(), port))
        )
        .await,
        Ok(Ok(_))
    )
}

/// A `WRONGTYPE` reply: one of our keys holds another kind of value.
pub(crate) fn is_wrong_type(err: &RedisError) -> bool {
    err.code() == Some("WRONGTYPE") || err.to_string().contains("WRONGTYPE")
}

/// Whether retrying the same call may succeed after `err`.
pub(crate) fn is_retryable(err: &RedisError) -> bool {
    if is_wrong_type(err) {
        return false;
    }
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || matches!(
            err.retry_method(),
            redis::RetryMethod::Reconnect
                | redis::RetryMethod::WaitAndRetry
                | redis::RetryMethod::RetryImmediately
        )
}

/// Describe `err`, naming foreign values as such.
fn describe(prefix: &str, err: &RedisError) -> String {
    if is_wrong_type(err) {
        format!("a Redis key under `{prefix}` holds a value Edward did not write: {err}")
    } else {
        format!("redis: {err}")
    }
}

pub(crate) fn infra_err(prefix: &str, err: RedisError) -> InfraError {
    InfraError::Backend {
        message: describe(prefix, &err),
        retryable: is_retryable(&err),
    }
}

pub(crate) fn queue_err(prefix: &str, err: RedisError) -> QueueError {
    QueueError::Backend {
        message: describe(prefix, &err),
        retryable: is_retryable(&err),
    }
}

pub(crate) fn foreign_infra(what: impl std::fmt::Display) -> InfraError {
    InfraError::Backend {
        message: format!("unexpected data in Redis (not written by Edward?): {what}"),
        retryable: false,
    }
}

pub(crate) fn foreign_queue(what: impl std::fmt::Display) -> QueueError {
    QueueError::Backend {
        message: format!("unexpected data in Redis (not written by Edward?): {what}"),
        retryable: false,
    }
}

/// Reply helpers: scripts return flat arrays of bulk strings and integers.
pub(crate) mod reply {
    use redis::Value;

    /// The items of an array reply.
    pub(crate) fn array(v: Value) -> Result<Vec<Value>, String> {
        match v {
            Value::Array(items) => Ok(items),
            other => Err(format!("expected an array, got {other:?}")),
        }
    }

    /// A string item.
    pub(crate) fn string(v: &Value) -> Result<String, String> {
        match v {
            Value::BulkString(b) => {
                String::from_utf8(b.clone()).map_err(|_| "a non-UTF-8 string".to_owned())
            }
            Value::SimpleString(s) => Ok(s.clone()),
            Value::Int(n) => Ok(n.to_string()),
            other => Err(format!("expected a string, got {other:?}")),
        }
    }

    /// An integer item (or a string holding one).
    pub(crate) fn int(v: &Value) -> Result<i64, String> {
        match v {
            Value::Int(n) => Ok(*n),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| {
                    format!("expected an integer, got {:?}", String::from_utf8_lossy(b))
                }),
            other => Err(format!("expected an integer, got {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_the_password() {
        assert_eq!(redact("redis://:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://u:secret@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
