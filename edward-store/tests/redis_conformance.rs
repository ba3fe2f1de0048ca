//! The `edward_core::testkit` conformance suites against the Redis adapters
//! on a real Redis (`EDWARD_TEST_REDIS_URL`, started by `scripts/test.sh` /
//! `scripts/redis.sh`). Each test works under a fresh key prefix, so tests
//! running in parallel never see each other's keys. Also: large files,
//! bounded key counts, fences, and typed errors for bad servers and foreign
//! values.
#![cfg(feature = "redis")]

#[path = "common/redis.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use edward_core::testkit::{lock, notifier, run_queue, write_buffer};
use edward_core::{
    FlushPolicy, Lock, Notifier, PendingFile, RetryPolicy, RunId, RunQueue, SandboxKey,
    SandboxPath, WriteBuffer,
};
use edward_store::{
    RedisBackend, RedisConnectError, RedisLock, RedisNotifier, RedisOptions, RedisQueue,
    RedisWriteBuffer,
};
use support::{backend, backend_with, fresh_prefix, keys_under, raw, redis_url};

async fn redis_write_buffer() -> RedisWriteBuffer {
    backend().await.write_buffer()
}

async fn redis_lock() -> RedisLock {
    backend().await.lock()
}

async fn redis_queue() -> RedisQueue {
    backend().await.queue()
}

async fn redis_notifier() -> RedisNotifier {
    backend().await.notifier().await.expect("notifier")
}

macro_rules! checks {
    ($make:ident as $tr:ident: $($name:ident => $check:path, $arg:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let adapter: Arc<dyn $tr> = Arc::new($make().await);
            checks!(@call $check, $arg, adapter);
        }
    )*};
    (@call $check:path, arc, $s:ident) => { $check(Arc::clone(&$s)).await };
    (@call $check:path, r#ref, $s:ident) => { $check(&*$s).await };
}

checks! { redis_write_buffer as WriteBuffer:
    buffer_put_take_whole_files => write_buffer::check_put_take_whole_files, r#ref;
    buffer_due_debounce_and_max_wait => write_buffer::check_due_debounce_and_max_wait, r#ref;
    buffer_due_order_and_limit => write_buffer::check_due_order_and_limit, r#ref;
    buffer_take_removes_index_entry => write_buffer::check_take_removes_index_entry, r#ref;
    buffer_keys_isolated => write_buffer::check_keys_isolated, r#ref;
    buffer_put_back_keeps_newer_writes => write_buffer::check_put_back_keeps_newer_writes, r#ref;
    buffer_run_all => write_buffer::run_all, arc;
}

checks! { redis_queue as RunQueue:
    queue_enqueue_claim_ack => run_queue::check_enqueue_claim_ack, r#ref;
    queue_claim_order => run_queue::check_claim_order, r#ref;
    queue_claim_skips_leased => run_queue::check_claim_skips_leased, r#ref;
    queue_concurrent_claims_exclusive => run_queue::check_concurrent_claims_exclusive, arc;
    queue_claim_many => run_queue::check_claim_many, arc;
    queue_heartbeat_extends => run_queue::check_heartbeat_extends, r#ref;
    queue_expired_lease_reclaimed => run_queue::check_expired_lease_reclaimed, r#ref;
    queue_same_owner_reclaim_needs_new_fence => run_queue::check_same_owner_reclaim_needs_new_fence, r#ref;
    queue_retry_backoff => run_queue::check_retry_backoff, r#ref;
    queue_dead_letter => run_queue::check_dead_letter, r#ref;
    queue_enqueue_idempotent => run_queue::check_enqueue_idempotent, r#ref;
    queue_run_all => run_queue::run_all, arc;
}

checks! { redis_notifier as Notifier:
    notifier_subscribe_then_notify => notifier::check_subscribe_then_notify, r#ref;
    notifier_per_run_isolation => notifier::check_per_run_isolation, r#ref;
    notifier_notify_without_subscribers => notifier::check_notify_without_subscribers, r#ref;
    notifier_cancel_broadcast => notifier::check_cancel_broadcast, r#ref;
    notifier_run_all => notifier::run_all, arc;
}

checks! { redis_lock as Lock:
    lock_acquire_renew_release => lock::check_acquire_renew_release, r#ref;
    lock_expiry => lock::check_expiry, r#ref;
    lock_renew_extends => lock::check_renew_extends, r#ref;
    lock_concurrent_acquire => lock::check_concurrent_acquire, arc;
    lock_run_all => lock::run_all, arc;
}

/// The suites also pass on the default prefix `edward:`, as a deployment
/// would run them (they only assert on what they create).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suites_on_default_prefix() {
    let redis = RedisBackend::connect(&redis_url()).await.expect("connect");
    assert_eq!(redis.options().prefix, "edward:");
    write_buffer::run_all(Arc::new(redis.write_buffer())).await;
    lock::run_all(Arc::new(redis.lock())).await;
}

fn policy() -> FlushPolicy {
    FlushPolicy::default()
}

/// A 20 MB file goes in and comes out byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_megabyte_file_round_trips() {
    let buffer = redis_write_buffer().await;
    let key = write_buffer::fresh_key();
    let content: Vec<u8> = (0..20 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let content = Bytes::from(content);
    let file = PendingFile {
        path: SandboxPath::new("big/blob.bin").expect("path"),
        content: content.clone(),
    };
    buffer
        .put(&key, vec![file], Utc::now(), policy())
        .await
        .expect("put 20 MB");
    let taken = buffer.take(&key).await.expect("take");
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].content.len(), content.len());
    assert!(taken[0].content == content, "content differs");
}

/// Keys do not grow: 200 put/take cycles on distinct sandboxes, 200
/// enqueue/claim/ack jobs, 200 lock acquire/release and a few dead letters
/// leave only the fixed bookkeeping keys behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_unbounded_key_growth() {
    let prefix = fresh_prefix();
    let redis = backend_with(RedisOptions::default().prefix(&prefix).dead_letter_cap(3)).await;
    let (buffer, queue, lock) = (redis.write_buffer(), redis.queue(), redis.lock());
    for i in 0..200 {
        let key = SandboxKey(format!("sbx-{i}"));
        buffer
            .put(
                &key,
                vec![write_buffer::file("a.txt", "x")],
                Utc::now(),
                policy(),
            )
            .await
            .expect("put");
        assert_eq!(buffer.take(&key).await.expect("take").len(), 1);

        let run = RunId::new();
        queue.enqueue(run).await.expect("enqueue");
        let lease = queue
            .claim("w", Duration::from_secs(30))
            .await
            .expect("claim")
            .expect("a job");
        assert_eq!(lease.run_id, run);
        if i % 40 == 0 {
            let dead = RetryPolicy {
                max_attempts: 1,
                base_delay_ms: 0,
                max_delay_ms: 0,
            };
            queue
                .retry(&lease, "boom", dead)
                .await
                .expect("dead-letter");
        } else {
            queue.ack(&lease).await.expect("ack");
        }

        let guard = lock
            .try_acquire(&format!("lock-{i}"), "w", Duration::from_secs(30))
            .await
            .expect("acquire")
            .expect("free");
        assert!(lock.release(&guard).await.expect("release"));
    }
    // Expired pending files: the due index forgets them too.
    let short = backend_with(
        RedisOptions::default()
            .prefix(&prefix)
            .pending_ttl(Duration::from_millis(50)),
    )
    .await
    .write_buffer();
    let stale = SandboxKey("abandoned".into());
    short
        .put(
            &stale,
            vec![write_buffer::file("a", "1")],
            Utc::now(),
            policy(),
        )
        .await
        .expect("put");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        short
            .due(Utc::now() + chrono::TimeDelta::days(1), 100)
            .await
            .expect("due")
            .is_empty()
    );

    let keys = keys_under(&redis_url(), &prefix).await;
    let expected: Vec<String> = ["epoch", "fence", "q:dead", "q:seq"]
        .iter()
        .map(|k| format!("{prefix}{k}"))
        .collect();
    assert_eq!(keys, expected, "only bookkeeping keys remain");
    let mut conn = raw(&redis_url()).await;
    let dead: i64 = redis::cmd("LLEN")
        .arg(format!("{prefix}q:dead"))
        .query_async(&mut conn)
        .await
        .expect("llen");
    assert_eq!(dead, 3, "dead letters are capped");
}

/// Lock fences grow across acquisitions of different locks, and the queue
/// and lock share one monotonic counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_monotonic_across_locks_and_queue() {
    let redis = backend().await;
    let (lock, queue) = (redis.lock(), redis.queue());
    let mut last = 0u64;
    for i in 0..20 {
        let guard = lock
            .try_acquire(&format!("l{i}"), "w", Duration::from_secs(5))
            .await
            .expect("acquire")
            .expect("free");
        assert!(guard.fence > last);
        last = guard.fence;
        let run = RunId::new();
        queue.enqueue(run).await.expect("enqueue");
        let lease = queue
            .claim("w", Duration::from_secs(5))
            .await
            .expect("claim")
            .expect("job");
        assert!(lease.fence.0 > last);
        last = lease.fence.0;
        queue.ack(&lease).await.expect("ack");
    }
    // The counter never goes below the clock: a wiped Redis stays ahead.
    let now_us = u64::try_from(Utc::now().timestamp_micros()).expect("time");
    assert!(last > now_us - 60_000_000, "fence {last} is clock-based");
}

/// `acquire` waits (backoff + jitter) until the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_for_release() {
    let lock = redis_lock().await;
    let name = edward_core::testkit::unique("lock");
    let held = lock
        .try_acquire(&name, "a", Duration::from_secs(30))
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        lock.acquire(
            &name,
            "b",
            Duration::from_secs(30),
            Duration::from_millis(100)
        )
        .await
        .expect("acquire")
        .is_none(),
        "still held after the wait"
    );
    let releaser = {
        let lock = lock.clone();
        let held = held.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            lock.release(&held).await.expect("release")
        })
    };
    let got = lock
        .acquire(&name, "b", Duration::from_secs(30), Duration::from_secs(10))
        .await
        .expect("acquire")
        .expect("acquired once released");
    assert!(releaser.await.expect("task"));
    assert!(got.fence > held.fence);
    assert!(lock.release(&got).await.expect("release"));
}

// ------------------------------------------------------------ typed errors

#[tokio::test]
async fn unavailable_at_start_is_a_typed_retryable_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let err = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens there");
    assert!(
        matches!(err, RedisConnectError::Unavailable { .. }),
        "got {err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("unavailable"), "{err}");
}

#[tokio::test]
async fn wrong_password_is_a_typed_error() {
    let url = redis_url();
    let mut conn = raw(&url).await;
    let user = edward_core::testkit::unique("edward-user");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">right-password")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut conn)
        .await
        .expect("acl setuser");
    let hostport = url.trim_start_matches("redis://");
    let wrong = format!("redis://{user}:wrong-password@{hostport}");
    let err = RedisBackend::connect(&wrong)
        .await
        .expect_err("wrong password");
    assert!(matches!(err, RedisConnectError::Auth { .. }), "got {err:?}");
    assert!(!err.is_retryable());
    assert!(
        !err.to_string().contains("wrong-password"),
        "password leaked: {err}"
    );
    let right = format!("redis://{user}:right-password@{hostport}");
    RedisBackend::connect(&right).await.expect("right password");
    let _: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut conn)
        .await
        .expect("acl deluser");
}

#[tokio::test]
async fn tls_against_a_plain_server_is_a_typed_error() {
    let url = redis_url().replacen("redis://", "rediss://", 1);
    let options = RedisOptions::default().connect_timeout(Duration::from_secs(2));
    let err = RedisBackend::connect_with(&url, options)
        .await
        .expect_err("the server does not speak TLS");
    assert!(matches!(err, RedisConnectError::Tls { .. }), "got {err:?}");
}

#[tokio::test]
async fn a_bad_url_is_a_config_error() {
    let err = RedisBackend::connect("http://nowhere")
        .await
        .expect_err("bad url");
    assert!(matches!(err, RedisConnectError::Config(_)), "got {err:?}");
}

/// Run a raw command on the shared server (planting foreign values).
async fn plant(args: &[&str]) {
    let mut conn = raw(&redis_url()).await;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(&mut conn).await.expect("plant");
}

/// Values Edward did not write under its keys give typed errors, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_typed_errors() {
    let url = redis_url();

    // A hash where the epoch string should be: refused at connect.
    let prefix = fresh_prefix();
    plant(&["HSET", &format!("{prefix}epoch"), "x", "y"]).await;
    let err = RedisBackend::connect_with(&url, RedisOptions::default().prefix(&prefix))
        .await
        .expect_err("foreign epoch");
    assert!(
        matches!(err, RedisConnectError::Foreign { .. }),
        "got {err:?}"
    );

    // Strings where the sorted sets should be.
    let redis = backend().await;
    let prefix = redis.options().prefix.clone();
    plant(&["SET", &format!("{prefix}wb:due"), "nonsense"]).await;
    plant(&["SET", &format!("{prefix}q:idx"), "nonsense"]).await;
    let buffer = redis.write_buffer();
    let key = SandboxKey("s".into());
    let err = buffer
        .put(
            &key,
            vec![write_buffer::file("a", "1")],
            Utc::now(),
            policy(),
        )
        .await
        .expect_err("wb:due is not a sorted set");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("did not write"), "{err}");
    assert!(buffer.due(Utc::now(), 10).await.is_err());
    let queue = redis.queue();
    let err = queue
        .enqueue(RunId::new())
        .await
        .expect_err("q:idx is not a sorted set");
    assert!(!err.is_retryable(), "{err}");
    assert!(queue.claim("w", Duration::from_secs(1)).await.is_err());

    // A pending "file" whose path is not a sandbox path.
    let redis = backend().await;
    let prefix = redis.options().prefix.clone();
    plant(&[
        "HSET",
        &format!("{prefix}wb:files:s"),
        "../../etc/passwd",
        "x",
    ])
    .await;
    let err = redis.write_buffer().take(&key).await.expect_err("bad path");
    assert!(err.to_string().contains("etc/passwd"), "{err}");

    // Garbage dead letters, and a job whose index member is not a run id.
    plant(&["LPUSH", &format!("{prefix}q:dead"), "{not json"]).await;
    assert!(redis.queue().dead_letters(10).await.is_err());
    let member = "00000000000000000001:not-a-run";
    plant(&["ZADD", &format!("{prefix}q:idx"), "0", member]).await;
    plant(&["HSET", &format!("{prefix}q:job:not-a-run"), "m", member]).await;
    let err = redis
        .queue()
        .claim("w", Duration::from_secs(1))
        .await
        .expect_err("not a run id");
    assert!(err.to_string().contains("not-a-run"), "{err}");

    // A string where a job hash should be: claim refuses it with a typed error.
    let redis = backend().await;
    let prefix = redis.options().prefix.clone();
    let run = RunId::new();
    redis.queue().enqueue(run).await.expect("enqueue");
    plant(&["SET", &format!("{prefix}q:job:{run}"), "nonsense"]).await;
    let err = redis
        .queue()
        .claim("w", Duration::from_secs(1))
        .await
        .expect_err("a string job");
    assert!(err.to_string().contains("did not write"), "{err}");
}
